package export

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/nbd"
)

// TestOpenWaitsForLeader: a writable open through a node that has no
// leader for a moment (its lock acquisitions fail with no quorum, as for
// a few seconds after the leader died) waits within the handshake's time
// and succeeds once the cluster answers.
func TestOpenWaitsForLeader(t *testing.T) {
	gw, c := newTestGateway(t)
	c.leaderless = 3
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	e, err := Backend{Gateway: gw}.Open(ctx, "beta", nbd.Session{})
	if err != nil {
		t.Fatalf("open while the cluster has no leader for 3 attempts: %v", err)
	}
	e.Close()
	if _, locking := c.counts(); locking != 4 {
		t.Fatalf("%d lock acquisitions, want 4 (3 without a leader, then the one granted)", locking)
	}
}

// TestOpenWithoutLeaderIsNotUnknown: when the cluster has no leader for
// the whole handshake, an open of a VDI this node knows, and of a name it
// misses (which may have been created through another node), is refused
// as not ready, naming the missing quorum, and in time for the refusal to
// reach the client: never as an unknown export.
func TestOpenWithoutLeaderIsNotUnknown(t *testing.T) {
	gw, c := newTestGateway(t)
	c.leaderless = -1
	for _, name := range []string{"beta", "delta"} {
		timeout := 3 * time.Second
		ctx, cancel := context.WithTimeout(t.Context(), timeout)
		started := time.Now()
		e, err := Backend{Gateway: gw}.Open(ctx, name, nbd.Session{})
		elapsed := time.Since(started)
		cancel()
		if err == nil {
			e.Close()
			t.Fatalf("open of %s without a leader succeeded", name)
		}
		if errors.Is(err, nbd.ErrUnknownExport) || !errors.Is(err, nbd.ErrNotReady) || !strings.Contains(err.Error(), "no quorum") {
			t.Errorf("open of %s without a leader: %v; want ErrNotReady naming no quorum, not ErrUnknownExport", name, err)
		}
		if elapsed < timeout-openReplyMargin-2*openRetryInterval || elapsed > timeout-openReplyMargin/2 {
			t.Errorf("open of %s without a leader gave up after %v; want it to wait until %v before the handshake's end (%v)", name, elapsed, openReplyMargin, timeout)
		}
	}
	// Without a deadline there is no bound to wait within: one attempt.
	if _, err := (Backend{Gateway: gw}).Open(context.Background(), "beta", nbd.Session{}); !errors.Is(err, nbd.ErrNotReady) {
		t.Errorf("open without a deadline and without a leader: %v, want ErrNotReady", err)
	}
}
