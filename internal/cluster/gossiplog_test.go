package cluster

import (
	"bytes"
	"strings"
	"testing"

	"github.com/herd-storage/herd/internal/logging"
)

// TestGossipRefusalsBounded: memberlist's lines about packets and streams
// from an address (what anyone reaching the gossip port can make it
// write, once per packet) are bounded refusal lines: one per address and
// kind per interval, values cut; its other lines pass as they are.
func TestGossipRefusalsBounded(t *testing.T) {
	var b bytes.Buffer
	logger, err := logging.New(&b, "text", 0)
	if err != nil {
		t.Fatal(err)
	}
	w := newGossipLogger(logger)
	label := strings.Repeat("L", 4096)
	for i := range 200 {
		w.Printf("[ERR] memberlist: Decrypt packet failed: No installed keys could decrypt the message from=10.9.0.1:%d", 1000+i)
		w.Printf("[ERR] memberlist: discarding packet with unacceptable label %q: from=10.9.0.2:%d", label, 1000+i)
		w.Printf("[ERR] memberlist: failed to receive: %s from=10.9.0.3:%d", label, 1000+i)
	}
	w.Printf("[WARN] memberlist: Was able to connect to n2 over TCP but UDP probes failed, network may be misconfigured")
	out := b.String()
	if n := strings.Count(out, "\n"); n != 4 || len(out) > 4096 {
		t.Fatalf("600 refused packets from 3 addresses: %d lines, %d bytes:\n%s", n, len(out), out)
	}
	for _, want := range []string{
		"gossip: refused a message from a process without this cluster's token\" from=10.9.0.1:1000",
		"msg=\"memberlist: discarding packet with unacceptable label\" from=10.9.0.2:1000",
		"msg=\"memberlist: failed to receive\" from=10.9.0.3:1000",
		"UDP probes failed",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in:\n%s", want, out)
		}
	}
	if gossipReason("memberlist: Received invalid msgType (7) from=10.0.0.1:3") != "memberlist: Received invalid msgType" {
		t.Errorf("reason: %q", gossipReason("memberlist: Received invalid msgType (7) from=10.0.0.1:3"))
	}
}
