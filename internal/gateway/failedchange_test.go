package gateway

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"testing"
	"time"
)

// TestFailedChangeResolvesAsApplied: a change fails after reaching
// node01 and node02 but not node00, the writer's own node, whose copy
// the repair reads first (local). The repair applies the failed change
// over that copy, so every replica ends with it: a reader that read it
// through node01 never reads the older data afterwards. Before, the
// repair wrote node00's copy, without the change, everywhere.
func TestFailedChangeResolvesAsApplied(t *testing.T) {
	for _, change := range []string{"write", "zero"} {
		t.Run(change, func(t *testing.T) {
			w := newWorld(t, 3, 3)
			w.cluster.addVDI("disk", 1, objectSize)
			logger := slog.New(slog.NewTextHandler(io.Discard, nil))
			g := w.gatewayWith("node00", logger, Options{RetryTimeout: 200 * time.Millisecond})
			e := open(t, g, "disk")
			ctx := context.Background()
			if err := e.WriteAt(ctx, []byte("old!"), 4096, false); err != nil {
				t.Fatal(err)
			}
			setUnavailable := func(down bool) {
				w.replicas.mu.Lock()
				w.replicas.unavailable["node00"] = down
				w.replicas.mu.Unlock()
			}
			want := []byte("new!")
			setUnavailable(true)
			var err error
			switch change {
			case "write":
				err = e.WriteAt(ctx, want, 4096, false)
			case "zero":
				want = make([]byte, 4)
				err = e.WriteZeroes(ctx, 4096, 4, false, false)
			}
			if err == nil {
				t.Fatalf("a %s with a replica unreachable for longer than RetryTimeout succeeded", change)
			}
			w.replicas.mu.Lock()
			node00, node01 := bytes.Clone(w.replicas.objects["node00"][1<<32][4096:4100]), bytes.Clone(w.replicas.objects["node01"][1<<32][4096:4100])
			w.replicas.mu.Unlock()
			if string(node00) != "old!" || !bytes.Equal(node01, want) {
				t.Fatalf("the failed %s should have reached node01 and not node00: %q, %q", change, node00, node01)
			}
			setUnavailable(false)
			buf := make([]byte, 4)
			if err := e.ReadAt(ctx, buf, 4096); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(buf, want) {
				t.Fatalf("read %q after the repair of a failed %s of %q over old!: the change reached node01, where a reader may have read it", buf, change, want)
			}
			replicasIdentical(t, w, g, 3)
		})
	}
}
