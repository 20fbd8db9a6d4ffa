package gateway

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/layout"
	"github.com/herd-storage/herd/internal/object"
	"github.com/herd-storage/herd/internal/recovery"
)

// TestInFlightWriteNeverReadOldAfterNew replays TestRobustness's failure
// of seed 1795775375793526552 (client 3, block 587, object
// 0000000300000000) on real replicas, stores and recovery, with
// failpoints instead of faults:
//
//   - epoch E1, replicas node00 (the writer's node here; in the run the
//     writer's node 0 was no replica, epoch 17 placed the object on
//     nodes 2, 3 and 4), node01 and node02, all holding OLD (write 5230
//     in the run). The writer writes NEW (7041); it reaches node00 and
//     node01, and node02 is dead (node 2 killed -9 at 10:30:39.75, 4 ms
//     before the write was sent). The gateway does not fail the write:
//     it waits for the next epoch and retries.
//   - a reader through node01 (ro/, its own copy first) reads NEW
//     (the run: the reader, moved to node 3 by node 2's death, read
//     node 3's own copy at 10:30:40.06). A ro/ reader now waits for
//     every replica to agree (agree.go); this test keeps the rule for
//     a read of one copy (the writer's, failing over), checked on
//     node02's copy itself.
//   - E2 drops node02; the writer's round there never completes (the
//     run: node 4 was cut off and stayed a replica of epochs 18 and 19,
//     so every round waited for the next epoch, and no recovery of the
//     object ran).
//   - E3 brings node02 back (restarted, its copy stamped E1 without
//     NEW). Recovery on node02 finds the newest stamp, E1, on every node,
//     its own among them, and restamps its own copy: copies of one stamp
//     are taken for identical (recovery.go makeCurrentLocked). The
//     writer's retry has not landed yet (the run: 6 s more).
//   - a reader through node02 reads OLD (the run: the reader, back on
//     the restarted node 2 after its read through node 3 timed out on
//     the cut-off node 4, read node 2's own copy at 10:30:50.52: epoch
//     20 placed the object on nodes 2, 3 and 1), after NEW
//     was read, while the write that wrote NEW is still in flight:
//     not linearizable.
//
// The writer's retry then lands and every copy ends with NEW, so the
// final checks of TestRobustness (every block, identical copies) pass.
//
// node02's recovery runs on demand (RecoverObject, as a RECOVER from a
// gateway) or as its background pass (Run): both restamp its copy.
func TestInFlightWriteNeverReadOldAfterNew(t *testing.T) {
	t.Parallel()
	for _, path := range []string{"on demand", "background pass"} {
		t.Run(path, func(t *testing.T) { inFlightWriteReadOldAfterNew(t, path) })
	}
}

func inFlightWriteReadOldAfterNew(t *testing.T, path string) {
	t.Parallel() // it waits 2.5 s for a node's leave (world.leave)
	w := newWorld(t, 3, 3)
	w.cluster.addVDI("disk", 1, objectSize)
	real := newRealReplicas(t, w)
	logger := quiet()
	recoveries := map[string]*recovery.Recovery{}
	for id, side := range real.nodes {
		// The real recovery answers RECOVER on every node from now on.
		recoveries[id] = recovery.New(recoveryView{w.cluster}, layout.NewHistory(w.cluster, logger), recoveryPeers{real}, side, id, logger)
		real.recoverers[id] = recoveries[id].RecoverObject
	}
	replicas := &failpointReplicas{realReplicas: real}
	gatewayOn := func(self string) *Gateway {
		c := w.cluster.member(self)
		g := New(c, layout.NewHistory(c, logger), replicas, logger, Options{})
		t.Cleanup(g.Close)
		return g
	}
	writer := open(t, gatewayOn("node00"), "disk")
	readerOn := map[string]*Disk{
		"node02": open(t, gatewayOn("node02"), "ro/disk"),
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	oid := object.DataOID(1, 0)
	const block = 4096
	oldData, newData := pattern(1, block), pattern(2, block)
	if err := writer.WriteAt(ctx, oldData, 0, false); err != nil {
		t.Fatal(err)
	}
	e1 := object.Epoch(w.cluster.epoch())

	// The failpoints. In E1 node02 never applies the write (its round
	// ends with the epoch, as a dead node's does). In E2 no round
	// completes. In E3 the writes wait for release.
	var mu sync.Mutex
	var events []string
	note := func(format string, args ...any) {
		mu.Lock()
		events = append(events, fmt.Sprintf(format, args...))
		mu.Unlock()
	}
	heldE1, heldE2, heldE3 := make(chan struct{}), make(chan struct{}), make(chan struct{})
	var onceE1, onceE2, onceE3 sync.Once
	release := make(chan struct{})
	replicas.setHook(func(node string, epoch object.Epoch, hookOID object.OID) error {
		if hookOID != oid {
			return nil
		}
		switch {
		case epoch == e1 && node == "node02":
			onceE1.Do(func() { close(heldE1) })
			w.cluster.WaitEpoch(ctx, uint64(e1)) // node02 is dead: no answer in E1
			return fmt.Errorf("%w: node02 killed", object.ErrUnavailable)
		case epoch == e1+1:
			onceE2.Do(func() { close(heldE2) })
			w.cluster.WaitEpoch(ctx, uint64(e1+1)) // a silent replica holds every round of E2
			return fmt.Errorf("%w: no answer in epoch %d", object.ErrUnavailable, epoch)
		case epoch == e1+2:
			onceE3.Do(func() { close(heldE3) })
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	})

	done := make(chan error, 1)
	go func() { done <- writer.WriteAt(ctx, newData, 0, false) }()
	<-heldE1
	inflightWait(t, "node00 and node01 to apply the write in flight", func() bool {
		return bytes.Equal(readStore(t, real, "node00", oid, block), newData) && bytes.Equal(readStore(t, real, "node01", oid, block), newData)
	})
	if !bytes.Equal(readStore(t, real, "node02", oid, block), oldData) {
		t.Fatal("the sequence did not happen: node02 applied the write")
	}

	// A read of node01's copy alone returns NEW now: in the run, a ro/
	// reader's (ro/ readers now wait for every replica to agree,
	// agree.go; a read of one copy is still the writer's, failing over).
	note("node01's copy holds NEW in epoch %d (the write in flight): a read of it alone returns NEW", e1)

	w.cluster.setNodes("node00", "node01") // E2: node02 dropped
	<-heldE2
	w.cluster.setNodes("node00", "node01", "node02") // E3: node02 back
	<-heldE3
	e3 := object.Epoch(w.cluster.epoch())
	// node02's recovery, as a RECOVER or its background pass does.
	switch path {
	case "on demand":
		if err := recoveries["node02"].RecoverObject(ctx, e3, oid); err != nil {
			t.Fatalf("node02 recovering the object in epoch %d: %v", e3, err)
		}
	case "background pass":
		run, stop := context.WithCancel(ctx)
		ran := make(chan struct{})
		go func() {
			defer close(ran)
			recoveries["node02"].Run(run)
		}()
		inflightWait(t, "node02's background pass of epoch "+fmt.Sprint(e3), func() bool {
			s := recoveries["node02"].Status()
			return s.Epoch == e3 && s.State == "done"
		})
		stop()
		<-ran
	}
	if info, err := real.stores["node02"].Read(oid, make([]byte, block), 0); err != nil || info.Epoch != e3 {
		t.Fatalf("the sequence did not happen: node02's copy is not current in epoch %d (stamp %d, %v)", e3, info.Epoch, err)
	}
	select {
	case err := <-done:
		t.Fatalf("the sequence did not happen: the write completed (%v) before the second read", err)
	default:
	}
	if copy := readStore(t, real, "node02", oid, block); !bytes.Equal(copy, newData) {
		t.Errorf("node02's copy, made current in epoch %d, lacks the write in flight that node01's copy holds: a read of it alone returns the older data", e3)
	}
	got := make([]byte, block)
	if err := readerOn["node02"].ReadAt(ctx, got, 0); err != nil {
		t.Fatal(err)
	}
	switch {
	case bytes.Equal(got, newData):
		note("reader through node02 read NEW in epoch %d", e3)
	case bytes.Equal(got, oldData):
		note("reader through node02 read OLD in epoch %d, the write still in flight", e3)
		t.Errorf("not linearizable: a reader read the write in flight, then a later read (through node02, whose copy recovery made current in epoch %d) returned the data it overwrote", e3)
	default:
		t.Errorf("the reader through node02 read neither the old nor the new data")
	}

	close(release)
	if err := <-done; err != nil {
		t.Fatalf("the write in flight failed: %v", err)
	}
	for id := range real.stores {
		if data := readStore(t, real, id, oid, block); !bytes.Equal(data, newData) {
			t.Errorf("node %s's copy does not hold the acknowledged write", id)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for _, e := range events {
		t.Log(e)
	}
}

func inflightWait(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// digestPeers are recoveryPeers that count fetches of object oid and,
// with noDigests, report no content digest (a cluster below
// cluster.LevelCopyDigests, or a herd before digests).
type digestPeers struct {
	recoveryPeers
	noDigests bool
	oid       object.OID
	fetches   *atomic.Int64
	// beforeStat, if set, runs before a STAT of object oid.
	beforeStat func(node string)
}

func (p digestPeers) Stat(ctx context.Context, node cluster.Node, epoch object.Epoch, oid object.OID) (object.Epoch, uint64, error) {
	if p.beforeStat != nil && oid == p.oid {
		p.beforeStat(node.ID)
	}
	stamp, digest, err := p.recoveryPeers.Stat(ctx, node, epoch, oid)
	if p.noDigests {
		digest = 0
	}
	return stamp, digest, err
}

func (p digestPeers) Fetch(ctx context.Context, node cluster.Node, epoch object.Epoch, oid object.OID, data []byte) (object.Epoch, error) {
	if oid == p.oid {
		p.fetches.Add(1)
	}
	return p.recoveryPeers.Fetch(ctx, node, epoch, oid, data)
}

// TestReturningNodeRestampsUnchangedTiedCopy: the other side of
// TestInFlightWriteNeverReadOldAfterNew. node02 leaves (E2) and returns
// (E3) with its copy unchanged, stamped E1 like the others, which no
// write touched meanwhile. It did not stay a member since E1, so its copy
// is not taken for current by its stamp alone: its content digest equals
// that of the first holder that stayed (node00), so it restamps it and
// copies nothing, on demand and in its background pass (the "down, not
// out" promise: e2e TestStoppedNodeIsDownNotOut, TestMaintenanceWindow).
// Without digests (a cluster below LevelCopyDigests) it fetches the copy
// instead: a copy, never other data. "holder restamped first": node00's
// own pass restamps its copy with E3 after node02's pass listed the
// stamps and before node02 asks node00 for its digest (both passes leave
// the objects they share with a node back from a stop for the same
// grace, so they meet; e2e TestStoppedNodeIsDownNotOut copied 24 of 25
// objects when only a digest of the listed stamp was taken): the same
// content as a copy current in E3 is current too.
func TestReturningNodeRestampsUnchangedTiedCopy(t *testing.T) {
	t.Parallel()
	for _, digests := range []bool{true, false} {
		for _, path := range []string{"on demand", "background pass", "holder restamped first"} {
			t.Run(fmt.Sprintf("%s, digests %v", path, digests), func(t *testing.T) {
				returningNodeTiedCopy(t, path, digests)
			})
		}
	}
}

func returningNodeTiedCopy(t *testing.T, path string, digests bool) {
	t.Parallel() // it waits 2.5 s for a node's leave (world.leave)
	w := newWorld(t, 3, 3)
	w.cluster.addVDI("disk", 1, objectSize)
	real := newRealReplicas(t, w)
	logger := quiet()
	oid := object.DataOID(1, 0)
	var fetches atomic.Int64
	peers := digestPeers{recoveryPeers: recoveryPeers{real}, noDigests: !digests, oid: oid, fetches: &fetches}
	var restamped atomic.Bool
	if path == "holder restamped first" {
		peers.beforeStat = func(node string) {
			if node == "node00" && restamped.CompareAndSwap(false, true) {
				if err := real.stores["node00"].SetEpoch(object.Epoch(w.cluster.epoch()), oid); err != nil {
					t.Error(err)
				}
			}
		}
	}
	rec := recovery.New(recoveryView{w.cluster}, layout.NewHistory(w.cluster, logger), peers, real.nodes["node02"], "node02", logger)
	real.recoverers["node02"] = rec.RecoverObject
	c := w.cluster.member("node00")
	g := New(c, layout.NewHistory(c, logger), real, logger, Options{})
	t.Cleanup(g.Close)
	writer := open(t, g, "disk")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	data := pattern(3, 3*4096+10)
	if err := writer.WriteAt(ctx, data, 0, false); err != nil {
		t.Fatal(err)
	}
	w.cluster.setNodes("node00", "node01")           // E2: node02 away
	w.cluster.setNodes("node00", "node01", "node02") // E3: back
	e3 := object.Epoch(w.cluster.epoch())
	switch path {
	case "on demand":
		if err := rec.RecoverObject(ctx, e3, oid); err != nil {
			t.Fatal(err)
		}
	case "background pass", "holder restamped first":
		run, stop := context.WithCancel(ctx)
		ran := make(chan struct{})
		go func() {
			defer close(ran)
			rec.Run(run)
		}()
		inflightWait(t, "node02's background pass", func() bool {
			s := rec.Status()
			return s.Epoch == e3 && s.State == "done"
		})
		stop()
		<-ran
	}
	if info, err := real.stores["node02"].Read(oid, make([]byte, 1), 0); err != nil || info.Epoch != e3 {
		t.Fatalf("node02's copy: stamp %d, %v; want current in epoch %d", info.Epoch, err, e3)
	}
	if got := readStore(t, real, "node02", oid, len(data)); !bytes.Equal(got, data) {
		t.Fatal("node02's copy changed")
	}
	want := int64(0)
	if !digests {
		want = 1
	}
	if n := fetches.Load(); n != want {
		t.Errorf("node02 fetched the object %d times, want %d", n, want)
	}
	if path == "holder restamped first" && digests && !restamped.Load() {
		t.Error("the sequence did not happen: node02 did not ask node00 for its digest")
	}
}
