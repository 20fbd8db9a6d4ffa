package gateway

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/object"
)

// A write that reaches some replicas and then fails leaves replicas that
// differ under the same stamp. The gateway repairs the object before its
// next use, and a VDI given up with such an object unrepaired is marked
// unclean for its next writer.
func TestFailedWriteLeavesNoDivergentReplicas(t *testing.T) {
	for _, close := range []bool{false, true} {
		w := newWorld(t, 3, 3)
		w.cluster.addVDI("disk", 1, objectSize)
		logger := slog.New(slog.NewTextHandler(io.Discard, nil))
		g := w.gatewayWith("node00", logger, Options{RetryTimeout: 200 * time.Millisecond})
		e, err := g.Open(context.Background(), "disk")
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		if err := e.WriteAt(ctx, []byte("old!"), 4096, false); err != nil {
			t.Fatal(err)
		}
		setUnavailable := func(down bool) {
			w.replicas.mu.Lock()
			w.replicas.unavailable["node02"] = down
			w.replicas.mu.Unlock()
		}
		setUnavailable(true)
		if err := e.WriteAt(ctx, []byte("new!"), 4096, false); err == nil {
			t.Fatal("a write with a replica unreachable for longer than RetryTimeout succeeded")
		}
		w.replicas.mu.Lock()
		node00, node02 := string(w.replicas.objects["node00"][1<<32][4096:4100]), string(w.replicas.objects["node02"][1<<32][4096:4100])
		w.replicas.mu.Unlock()
		if node00 != "new!" || node02 != "old!" {
			t.Fatalf("the failed write should have reached node00 only and not node02: %q, %q", node00, node02)
		}
		if !close {
			setUnavailable(false)
			buf := make([]byte, 4)
			if err := e.ReadAt(ctx, buf, 4096); err != nil {
				t.Fatal(err)
			}
			if string(buf) != "new!" && string(buf) != "old!" {
				t.Fatalf("read %q after a failed write of new! over old!", buf)
			}
			replicasIdentical(t, w, g, 3)
			if err := e.Close(); err != nil {
				t.Fatal(err)
			}
			if v, _ := w.cluster.VDI("disk"); v.Unclean {
				t.Fatal("vdi marked unclean although its suspect object was repaired")
			}
			continue
		}
		// Given up while the object cannot be repaired: unclean.
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
		if v, _ := w.cluster.VDI("disk"); !v.Unclean {
			t.Fatal("vdi given up with an unrepaired suspect object is not marked unclean")
		}
	}
}

// A first write to an object that a replica holds already, unreferenced
// (an orphan left by a failed first write or remove whose gateway died),
// starts the object afresh on every replica: none of the orphan's bytes
// show, and the replicas are identical.
func TestFirstWriteOverAnOrphanCopy(t *testing.T) {
	w := newWorld(t, 3, 3)
	w.cluster.addVDI("disk", 1, 2*objectSize)
	oid := object.DataOID(1, 0)
	w.replicas.mu.Lock()
	w.replicas.objects["node01"] = map[object.OID][]byte{oid: bytes.Repeat([]byte{0xee}, objectSize)}
	w.replicas.stamps["node01"] = map[object.OID]object.Epoch{oid: object.Epoch(w.cluster.epoch())}
	w.replicas.mu.Unlock()
	g := w.gateway("node00")
	e := open(t, g, "disk")
	ctx := context.Background()
	if err := e.WriteAt(ctx, []byte("abc"), 4096, false); err != nil {
		t.Fatal(err)
	}
	m := make(model, 2*objectSize)
	m.write([]byte("abc"), 4096)
	verify(t, e, m)
	replicasIdentical(t, w, g, 3)
}
