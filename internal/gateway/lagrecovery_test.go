package gateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/layout"
	"github.com/herd-storage/herd/internal/object"
	"github.com/herd-storage/herd/internal/recovery"
)

// failpointReplicas are the real replicas of a fake world with a
// failpoint before every write: hook may hold the write or fail it.
type failpointReplicas struct {
	*realReplicas
	mu   sync.Mutex
	hook func(node string, epoch object.Epoch, oid object.OID) error
}

func (f *failpointReplicas) setHook(hook func(node string, epoch object.Epoch, oid object.OID) error) {
	f.mu.Lock()
	f.hook = hook
	f.mu.Unlock()
}

func (f *failpointReplicas) Write(ctx context.Context, node cluster.Node, epoch object.Epoch, oid object.OID, p []byte, offset uint32, flags object.Flags) error {
	f.mu.Lock()
	hook := f.hook
	f.mu.Unlock()
	if hook != nil {
		if err := hook(node.ID, epoch, oid); err != nil {
			return err
		}
	}
	return f.realReplicas.Write(ctx, node, epoch, oid, p, offset, flags)
}

// recoveryView is the world's log as recovery sees it: no maintenance
// windows.
type recoveryView struct{ *fakeCluster }

func (recoveryView) MaintenanceHold(now time.Time) (time.Time, []string) { return time.Time{}, nil }

// VDICopies is the VDI's own copies, as the real log keeps them.
func (v recoveryView) VDICopies(id uint32) (int, bool) {
	vdi, ok := v.VDIByID(id)
	return vdi.Copies, ok && vdi.Copies > 0
}

// recoveryPeers reach the real replicas as recovery does (replica.Client).
type recoveryPeers struct{ real *realReplicas }

func (p recoveryPeers) Stat(ctx context.Context, node cluster.Node, epoch object.Epoch, oid object.OID) (object.Epoch, uint64, error) {
	return p.real.nodes[node.ID].Stat(ctx, epoch, oid)
}

func (p recoveryPeers) Fetch(ctx context.Context, node cluster.Node, epoch object.Epoch, oid object.OID, data []byte) (object.Epoch, error) {
	return p.real.nodes[node.ID].Fetch(ctx, epoch, oid, data)
}

func (p recoveryPeers) Flush(ctx context.Context, node cluster.Node, epoch object.Epoch) error {
	return p.real.nodes[node.ID].Flush(ctx, epoch)
}

func (p recoveryPeers) List(ctx context.Context, node cluster.Node, epoch object.Epoch) (map[object.OID]object.Epoch, error) {
	out := map[object.OID]object.Epoch{}
	err := p.real.nodes[node.ID].List(func(oid object.OID, stamp object.Epoch) error {
		out[oid] = stamp
		return nil
	})
	return out, err
}

var errFarLost = errors.New("failpoint: the far part of the write is lost")

// TestZoneAckFailedFarPartSurvivesStaleRecovery: in zone mode a write is
// acknowledged once node00 (zone a, the writer) has it; its far part to
// node01 (zone b) fails. An epoch change follows, in which recovery
// (the real one, internal/recovery, on real replicas and stores) restamps
// node01's copy first, which missed the write but carries the same stamp
// as node00's, and then makes node00 current from it: node00 fetches the
// stale copy. The next FLUSH (or read) repairs the object: it must bring
// back the acknowledged write, never write the stale copy everywhere.
//
// The cases order the same steps differently: the far part fails in its
// own epoch, before the change ("fails first"); it is still pending when
// the epoch changes, node01 is restamped, and it fails in the new epoch
// before node00 recovered ("fails in the new epoch"); or node00 fetched
// the stale copy before the far part's round in the new epoch, which
// writes node00 again before failing on node01 ("near fetched first").
// Each runs with the FLUSH first and with a read first. Before the far
// parts that failed were kept (lag.go, rule 6), the first two orders
// lost the write: the repair read node00's copy, fetched from node01,
// wrote it everywhere, and the FLUSH succeeded.
func TestZoneAckFailedFarPartSurvivesStaleRecovery(t *testing.T) {
	for _, order := range []string{"fails first", "fails in the new epoch", "near fetched first"} {
		for _, first := range []string{"flush", "read"} {
			t.Run(order+", "+first+" first", func(t *testing.T) {
				zoneAckStaleRecovery(t, order, first)
			})
		}
	}
}

// zoneWorld is two nodes in two zones, node00 (zone a) writing a VDI in
// zone mode, on real replicas and stores, each node with its real
// recovery, and a failpoint before every write.
type zoneWorld struct {
	w          *fakeWorld
	real       *realReplicas
	replicas   *failpointReplicas
	recoveries map[string]*recovery.Recovery
	g          *Gateway
	e          *Disk
	oid        object.OID // the object written, data object 0
	m          model
	old        []byte // what both zones hold, flushed, at the start
}

func newZoneWorld(t *testing.T) *zoneWorld {
	t.Helper()
	w := newWorld(t, 2, 2)
	w.cluster.setZone("node00", "a")
	w.cluster.setZone("node01", "b")
	w.cluster.addVDI("disk", 1, objectSize)
	ack := cluster.AckZone
	w.cluster.setVDI("disk", cluster.VDISettings{Ack: &ack})

	z := &zoneWorld{w: w, real: newRealReplicas(t, w), recoveries: map[string]*recovery.Recovery{}, oid: object.DataOID(1, 0), m: make(model, objectSize)}
	logger := quiet()
	for id, side := range z.real.nodes {
		z.recoveries[id] = recovery.New(recoveryView{w.cluster}, layout.NewHistory(w.cluster, logger), recoveryPeers{z.real}, side, id, logger)
		z.real.recoverers[id] = z.recoveries[id].RecoverObject
	}
	z.replicas = &failpointReplicas{realReplicas: z.real}
	c := w.cluster.member("node00")
	z.g = New(c, layout.NewHistory(c, logger), z.replicas, logger, Options{})
	t.Cleanup(z.g.Close)
	z.e = open(t, z.g, "disk")
	if _, nodes, err := z.g.ReplicasOf(z.oid, 2); err != nil || len(nodes) != 2 {
		t.Fatalf("replicas of the object: %v, %v", nodes, err)
	}
	// Both zones hold the old data, flushed, stamped with this epoch.
	ctx := context.Background()
	z.old = pattern(1, 8192)
	z.write(t, z.old, 0)
	if err := z.e.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	z.stores(t, "the old data")
	return z
}

// write writes p at off, acknowledged: it must never be lost.
func (z *zoneWorld) write(t *testing.T, p []byte, off uint64) {
	t.Helper()
	if err := z.e.WriteAt(context.Background(), p, off, false); err != nil {
		t.Fatal(err)
	}
	z.m.write(p, off)
}

// stores checks that every node's copy holds the model's first 8 KiB.
func (z *zoneWorld) stores(t *testing.T, what string) {
	t.Helper()
	want := z.m[:8192]
	for id, s := range z.real.stores {
		data := make([]byte, len(want))
		info, err := s.Read(z.oid, data, 0)
		if err != nil || !bytes.Equal(data, want) {
			t.Fatalf("node %s's copy (stamp %d, %v) does not hold %s", id, info.Epoch, err, what)
		}
	}
}

// recover runs node's recovery of the object in the current epoch, as
// its background pass does.
func (z *zoneWorld) recover(t *testing.T, node string) {
	t.Helper()
	if err := z.recoveries[node].RecoverObject(context.Background(), object.Epoch(z.w.cluster.epoch()), z.oid); err != nil {
		t.Fatalf("%s recovering the object: %v", node, err)
	}
}

// staleRecovery is the epoch change of the sequence: node01's recovery
// comes first and, its copy carrying the same stamp as node00's,
// restamps its own, which missed the write; node00's then finds it the
// newest and fetches it (unless fetch is false).
func (z *zoneWorld) staleRecovery(t *testing.T, fetch bool) {
	t.Helper()
	z.w.cluster.setNodes("node00", "node01")
	z.recover(t, "node01")
	if fetch {
		z.fetchNear(t)
	}
}

// fetchNear has node00 fetch node01's stale copy, and checks it did.
func (z *zoneWorld) fetchNear(t *testing.T) {
	t.Helper()
	z.recover(t, "node00")
	if data := readStore(t, z.real, "node00", z.oid, 4096); !bytes.Equal(data, z.old[:4096]) {
		t.Fatal("the sequence did not happen: node00 did not fetch node01's stale copy")
	}
}

// check reads the disk (a FLUSH first, or after) and every copy: every
// acknowledged write is there.
func (z *zoneWorld) check(t *testing.T, first string) {
	t.Helper()
	ctx := context.Background()
	flush := func() {
		t.Helper()
		if err := z.e.Flush(ctx); err != nil {
			t.Fatalf("FLUSH after the far part failed and node01 answers again: %v", err)
		}
	}
	if first == "flush" {
		flush()
	}
	got := make([]byte, len(z.m))
	if err := z.e.ReadAt(ctx, got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, z.m) {
		if bytes.Equal(got[:4096], z.old[:4096]) {
			t.Fatal("an acknowledged write is lost: the disk reads the data it overwrote (node01's stale copy, made current by recovery, was written everywhere)")
		}
		verify(t, z.e, z.m)
	}
	if first != "flush" {
		flush()
	}
	z.stores(t, "every acknowledged write")
	z.g.lag.mu.Lock()
	kept := len(z.g.lag.failed)
	z.g.lag.mu.Unlock()
	if z.g.heal.isSuspect(z.oid) || kept > 0 {
		t.Errorf("after a FLUSH that completed, the object is suspect (%v) or %d objects have far parts kept for their repair", z.g.heal.isSuspect(z.oid), kept)
	}
}

func zoneAckStaleRecovery(t *testing.T, order, first string) {
	z := newZoneWorld(t)
	ctx := context.Background()
	before := object.Epoch(z.w.cluster.epoch())
	// The failpoint: node01's part of the next write is held (the other
	// cases) or fails at once (a far zone unreachable for the whole
	// retry budget ends the same way, later).
	held, release := make(chan struct{}), make(chan struct{})
	var holdOnce, fired sync.Once
	failed := make(chan struct{})
	z.replicas.setHook(func(node string, epoch object.Epoch, oid object.OID) error {
		if node != "node01" || oid != z.oid {
			return nil
		}
		if order != "fails first" && epoch == before {
			holdOnce.Do(func() {
				close(held)
				<-release
			})
			return nil // it meets the new epoch and is retried there
		}
		fired.Do(func() { close(failed) })
		return errFarLost
	})
	z.write(t, pattern(2, 4096), 0)

	switch order {
	case "fails first":
		<-failed
		if err := await(ctx, z.g.lag.all()); err != nil {
			t.Fatal(err)
		}
		z.staleRecovery(t, true)
	case "fails in the new epoch", "near fetched first":
		<-held
		z.staleRecovery(t, order == "near fetched first")
		close(release)
		<-failed
		if err := await(ctx, z.g.lag.all()); err != nil {
			t.Fatal(err)
		}
	}
	z.replicas.setHook(nil) // node01 answers again
	if now := object.Epoch(z.w.cluster.epoch()); now != before+1 {
		t.Fatalf("epoch %d, want %d", now, before+1)
	}
	z.check(t, first)
}

// TestZoneAckRepairKeepsLaterWritesOver: a far part A fails while a
// later write C over part of it is pending; C's far part lands after A
// failed. Then the stale recovery of the sequence above makes node01's
// copy (the old data and C, without A) current on node00 too. The
// repair must write A and then C over it: A alone would undo C where
// they overlap, C alone would lose A.
func TestZoneAckRepairKeepsLaterWritesOver(t *testing.T) {
	for _, first := range []string{"flush", "read"} {
		t.Run(first+" first", func(t *testing.T) {
			z := newZoneWorld(t)
			ctx := context.Background()
			held, release := make(chan struct{}), make(chan struct{})
			var once sync.Once
			z.replicas.setHook(func(node string, epoch object.Epoch, oid object.OID) error {
				if node != "node01" || oid != z.oid {
					return nil
				}
				fail := false
				once.Do(func() {
					close(held)
					<-release
					fail = true
				})
				if fail {
					return errFarLost // A's far part; C's lands
				}
				return nil
			})
			z.write(t, pattern(2, 4096), 0) // A
			<-held
			z.write(t, pattern(3, 2048), 2048) // C, over A's second half
			close(release)
			if err := await(ctx, z.g.lag.all()); err != nil {
				t.Fatal(err)
			}
			z.replicas.setHook(nil)
			want := append(slices.Clone(z.old[:2048]), z.m[2048:8192]...) // node01: old, then C
			if data := readStore(t, z.real, "node01", z.oid, 8192); !bytes.Equal(data, want) {
				t.Fatal("the sequence did not happen: node01 does not hold C without A")
			}
			z.w.cluster.setNodes("node00", "node01")
			z.recover(t, "node01")
			z.recover(t, "node00")
			if data := readStore(t, z.real, "node00", z.oid, 8192); !bytes.Equal(data, want) {
				t.Fatal("the sequence did not happen: node00 did not fetch node01's copy")
			}
			z.check(t, first)
		})
	}
}

// readStore reads the first n bytes of node's copy of oid, whatever its
// stamp.
func readStore(t *testing.T, real *realReplicas, node string, oid object.OID, n int) []byte {
	t.Helper()
	data := make([]byte, n)
	if _, err := real.stores[node].Read(oid, data, 0); err != nil {
		t.Fatal(fmt.Errorf("node %s's copy: %w", node, err))
	}
	return data
}
