package gateway

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/layout"
	"github.com/herd-storage/herd/internal/object"
	"github.com/herd-storage/herd/internal/replica"
	"github.com/herd-storage/herd/internal/store"
)

// realReplicas are the real replica side (internal/replica over a real
// store) of every node of a fake world, reached directly: the gateway's
// requests meet the replica's admission and fence as they are.
type realReplicas struct {
	nodes  map[string]*replica.Replica
	stores map[string]*store.Store
	// recoverers serve each node's RECOVER (replica.Served): a node's
	// recovery.Recovery where a test makes one.
	recoverers map[string]func(ctx context.Context, epoch object.Epoch, oid object.OID) error
	// stale counts the requests refused as from a stale epoch.
	stale atomic.Int64
	// onStale, if set, runs after each such refusal.
	onStale func()
}

// replicaView is the world's log as a replica sees it: the node always
// holds a lease and every epoch is active.
type replicaView struct{ *fakeCluster }

func (replicaView) LeaseValid() bool                                   { return true }
func (replicaView) LeaseValidMonotonic() bool                          { return true }
func (replicaView) WaitLease(ctx context.Context) error                { return nil }
func (replicaView) WaitActive(ctx context.Context, epoch uint64) error { return nil }

func newRealReplicas(t *testing.T, w *fakeWorld) *realReplicas {
	t.Helper()
	r := &realReplicas{nodes: map[string]*replica.Replica{}, stores: map[string]*store.Store{}, recoverers: map[string]func(ctx context.Context, epoch object.Epoch, oid object.OID) error{}}
	for _, id := range w.cluster.nodeIDs() {
		s, err := store.Open(store.Options{Disks: []store.Disk{{Path: t.TempDir(), Weight: 1}}, ReserveBytes: -1, OpenFiles: 16})
		if err != nil {
			t.Fatal(err)
		}
		side := replica.New(replicaView{w.cluster}, replica.LocalStore{Store: s})
		// Recovery without a proof (the fake keeps no history): every
		// node holds every object here, so a node restamps its own copy.
		r.recoverers[id] = func(ctx context.Context, epoch object.Epoch, oid object.OID) error {
			return side.Exclusive(oid, func(stamp object.Epoch, found bool) error {
				if !found {
					return object.ErrNotFound
				}
				return side.Store().SetEpoch(epoch, oid)
			})
		}
		r.nodes[id], r.stores[id] = side, s
	}
	return r
}

func (r *realReplicas) answer(err error) error {
	if errors.Is(err, object.ErrStaleEpoch) {
		r.stale.Add(1)
		if r.onStale != nil {
			r.onStale()
		}
	}
	return err
}

func (r *realReplicas) Read(ctx context.Context, node cluster.Node, epoch object.Epoch, oid object.OID, p []byte, offset uint32) (object.Epoch, error) {
	stamp, err := r.nodes[node.ID].Read(ctx, epoch, oid, p, offset)
	return stamp, r.answer(err)
}

func (r *realReplicas) Write(ctx context.Context, node cluster.Node, epoch object.Epoch, oid object.OID, p []byte, offset uint32, flags object.Flags) error {
	return r.answer(r.nodes[node.ID].Write(ctx, epoch, oid, p, offset, flags))
}

func (r *realReplicas) Zero(ctx context.Context, node cluster.Node, epoch object.Epoch, oid object.OID, offset, length uint32, flags object.Flags) error {
	return r.answer(r.nodes[node.ID].Zero(ctx, epoch, oid, offset, length, flags))
}

func (r *realReplicas) Remove(ctx context.Context, node cluster.Node, epoch object.Epoch, oid object.OID) error {
	return r.answer(r.nodes[node.ID].Remove(ctx, epoch, oid))
}

func (r *realReplicas) Flush(ctx context.Context, node cluster.Node, epoch object.Epoch) error {
	return r.answer(r.nodes[node.ID].Flush(ctx, epoch))
}

func (r *realReplicas) Recover(ctx context.Context, node cluster.Node, epoch object.Epoch, oid object.OID) error {
	served := replica.Served{Replica: r.nodes[node.ID], Recoverer: r.recoverers[node.ID]}
	return r.answer(served.Recover(ctx, epoch, oid))
}

// TestCopyStampedAheadIsRetriedInItsEpoch: the gateway, in epoch E, writes
// to an object one of whose replicas holds a copy stamped E+3 (recovered in
// an epoch that replica's node, a restarted one replaying its log, has
// not applied again yet). The replica refuses as from a stale epoch; the
// gateway waits for the newer epochs and writes there: the client sees
// no error (the robustness run saw EIO: "stamp 7 would go back from 10"),
// and every copy ends with the write, stamped with the newest epoch.
func TestCopyStampedAheadIsRetriedInItsEpoch(t *testing.T) {
	w := newWorld(t, 3, 3)
	w.cluster.addVDI("disk", 1, objectSize)
	real := newRealReplicas(t, w)
	logger := quiet()
	c := w.cluster.member("node00")
	g := New(c, layout.NewHistory(c, logger), real, logger, Options{})
	e := open(t, g, "disk")
	ctx := context.Background()
	m := make(model, objectSize)
	first := pattern(1, 8192)
	if err := e.WriteAt(ctx, first, 0, false); err != nil {
		t.Fatal(err)
	}
	m.write(first, 0)

	epoch := object.Epoch(w.cluster.epoch())
	oid := object.DataOID(1, 0)
	if err := real.stores["node02"].SetEpoch(epoch+3, oid); err != nil {
		t.Fatal(err)
	}
	var advance sync.Once
	real.onStale = func() {
		advance.Do(func() {
			for range 3 {
				w.cluster.setNodes("node00", "node01", "node02")
			}
		})
	}
	second := pattern(2, 4096)
	if err := e.WriteAt(ctx, second, 100, false); err != nil {
		t.Fatalf("write in epoch %d over a copy stamped %d: %v", epoch, epoch+3, err)
	}
	m.write(second, 100)
	if real.stale.Load() == 0 {
		t.Fatal("no replica refused the write as from a stale epoch: the test set up nothing")
	}
	if now := object.Epoch(w.cluster.epoch()); now != epoch+3 {
		t.Fatalf("epoch %d, want %d", now, epoch+3)
	}
	verify(t, e, m)
	want := m[:8192]
	for id, s := range real.stores {
		data := make([]byte, len(want))
		info, err := s.Read(oid, data, 0)
		if err != nil || info.Epoch != epoch+3 || !bytes.Equal(data, want) {
			t.Errorf("node %s's copy: stamp %d (want %d), %v, holds the writes: %v", id, info.Epoch, epoch+3, err, bytes.Equal(data, want))
		}
	}
}
