package gateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/object"
)

const objectSize = 1 << 20

func open(t *testing.T, g *Gateway, name string) *Disk {
	t.Helper()
	e, err := g.Open(context.Background(), name)
	if err != nil {
		t.Fatalf("open %s: %v", name, err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

func pattern(seed int64, n int) []byte {
	b := make([]byte, n)
	rand.New(rand.NewSource(seed)).Read(b)
	return b
}

// model is a plain byte slice of the whole disk, for comparison.
type model []byte

func (m model) write(p []byte, off uint64) { copy(m[off:], p) }

func verify(t *testing.T, e *Disk, m model) {
	t.Helper()
	got := make([]byte, len(m))
	if err := e.ReadAt(context.Background(), got, 0); err != nil {
		t.Fatalf("read whole disk: %v", err)
	}
	if !bytes.Equal(got, m) {
		for i := range got {
			if got[i] != m[i] {
				t.Fatalf("disk differs from the model first at byte %d", i)
			}
		}
	}
}

// replicasIdentical checks that every object has exactly `copies` holders
// in the current placement with identical content.
func replicasIdentical(t *testing.T, w *fakeWorld, g *Gateway, copies int) int {
	t.Helper()
	rv, err := g.layouts.Current()
	if err != nil {
		t.Fatal(err)
	}
	w.replicas.mu.Lock()
	defer w.replicas.mu.Unlock()
	all := map[uint64]bool{}
	for _, objects := range w.replicas.objects {
		for oid := range objects {
			all[uint64(oid)] = true
		}
	}
	for oid := range all {
		var first []byte
		for i, n := range rv.ReplicasOf(object.OID(oid), copies) {
			data, ok := w.replicas.objects[n.ID][object.OID(oid)]
			if !ok {
				t.Fatalf("object %016x missing on replica %s", oid, n.ID)
			}
			if i == 0 {
				first = data
			} else if !bytes.Equal(bytes.TrimRight(first, "\x00"), bytes.TrimRight(data, "\x00")) {
				t.Fatalf("object %016x differs between replicas", oid)
			}
		}
	}
	return len(all)
}

func TestWriteReadAcrossObjects(t *testing.T) {
	w := newWorld(t, 5, 3)
	w.cluster.addVDI("disk", 7, 8*objectSize+4096)
	g := w.gateway("node00")
	e := open(t, g, "disk")
	m := make(model, 8*objectSize+4096)
	ctx := context.Background()
	writes := []struct{ off, n uint64 }{
		{0, 512}, {1, 7}, {objectSize - 100, 200}, {3*objectSize + 5, 2*objectSize + 10}, {8*objectSize + 4096 - 513, 513}, {5 * objectSize, 4096},
	}
	for i, wr := range writes {
		p := pattern(int64(i), int(wr.n))
		if err := e.WriteAt(ctx, p, wr.off, i%2 == 0); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
		m.write(p, wr.off)
	}
	verify(t, e, m)
	// Another node's gateway sees the same data (after this one closes).
	e.Close()
	other := open(t, w.gateway("node03"), "disk")
	verify(t, other, m)
	if n := replicasIdentical(t, w, g, 3); n == 0 {
		t.Fatal("no objects written")
	}
	// Unwritten objects are holes; written ones are data.
	extents, err := other.Extents(ctx, 0, 8*objectSize)
	if err != nil {
		t.Fatal(err)
	}
	var holes, data uint64
	for _, x := range extents {
		if x.Hole {
			holes += x.Length
		} else {
			data += x.Length
		}
	}
	if data != 5*objectSize || holes != 3*objectSize { // objects 0,3,4,5,... written: 0,3,4,5 and 8
		t.Fatalf("block status: %d data, %d holes: %+v", data, holes, extents)
	}
	if err := other.ReadAt(ctx, make([]byte, 2), 8*objectSize+4095); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("read past the end: %v", err)
	}
}

func TestWriteRetriesAcrossEpochChange(t *testing.T) {
	t.Parallel() // it waits 2.5 s for a node's leave (world.leave)
	w := newWorld(t, 4, 3)
	w.cluster.addVDI("disk", 1, 4*objectSize)
	g := w.gateway("node00")
	e := open(t, g, "disk")
	m := make(model, 4*objectSize)
	ctx := context.Background()
	first := pattern(1, 4*objectSize)
	if err := e.WriteAt(ctx, first, 0, false); err != nil {
		t.Fatal(err)
	}
	m.write(first, 0)
	// A node becomes unreachable; the cluster takes a moment to commit an
	// epoch without it. Writes meanwhile must wait and land on the new
	// placement, and objects it must now hold are copied to new replicas.
	w.replicas.mu.Lock()
	w.replicas.unavailable["node02"] = true
	w.replicas.mu.Unlock()
	go func() {
		time.Sleep(50 * time.Millisecond) // the "failure detector" in this fake
		w.cluster.setNodes("node00", "node01", "node03")
	}()
	second := pattern(2, 3*objectSize)
	if err := e.WriteAt(ctx, second, objectSize/2, true); err != nil {
		t.Fatalf("write across the epoch change: %v", err)
	}
	m.write(second, objectSize/2)
	verify(t, e, m)
	replicasIdentical(t, w, g, 3)
	if err := e.Flush(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestStaleEpochIsRetriedNotLost(t *testing.T) {
	w := newWorld(t, 3, 2)
	w.cluster.addVDI("disk", 1, 2*objectSize)
	g := w.gateway("node00")
	e := open(t, g, "disk")
	// The first write meets an epoch change: the replica has moved on.
	var change sync.Once
	w.replicas.beforeWrite = func(node string, oid object.OID) {
		change.Do(func() { w.cluster.setNodes("node00", "node01", "node02", "node03") })
	}
	p := pattern(3, 8192)
	if err := e.WriteAt(context.Background(), p, 100, false); err != nil {
		t.Fatal(err)
	}
	w.replicas.beforeWrite = nil
	m := make(model, 2*objectSize)
	m.write(p, 100)
	verify(t, e, m)
	replicasIdentical(t, w, g, 2)
}

// An exclusive VDI refuses a second writer (the rule before handovers).
func TestWriterLockAndReadOnlyOpens(t *testing.T) {
	w := newWorld(t, 3, 3)
	w.cluster.addVDI("disk", 1, objectSize)
	w.cluster.setExclusive("disk", true)
	a, b := w.gateway("node00"), w.gateway("node01")
	ctx := context.Background()
	first, err := a.Open(ctx, "disk")
	if err != nil {
		t.Fatal(err)
	}
	second, err := a.Open(ctx, "disk") // multi-conn through the same node
	if err != nil {
		t.Fatalf("second connection through the same node: %v", err)
	}
	_, err = b.Open(ctx, "disk")
	if !errors.Is(err, ErrBusy) || !strings.Contains(err.Error(), "node00") {
		t.Fatalf("writer through another node: %v, want busy naming node00", err)
	}
	reader, err := b.Open(ctx, ReadOnlyPrefix+"disk")
	if err != nil {
		t.Fatalf("read-only open: %v", err)
	}
	if err := reader.WriteAt(ctx, []byte{1}, 0, false); !errors.Is(err, ErrReadOnly) {
		t.Fatalf("write through read-only export: %v", err)
	}
	// The reader sees what the writer writes, even after caching a hole.
	buf := make([]byte, 4)
	if err := reader.ReadAt(ctx, buf, 0); err != nil || !bytes.Equal(buf, make([]byte, 4)) {
		t.Fatalf("read before write: %v %v", buf, err)
	}
	if err := first.WriteAt(ctx, []byte("herd"), 0, false); err != nil {
		t.Fatal(err)
	}
	if err := reader.ReadAt(ctx, buf, 0); err != nil || string(buf) != "herd" {
		t.Fatalf("reader after write: %q %v", buf, err)
	}
	first.Close()
	if _, err := b.Open(ctx, "disk"); !errors.Is(err, ErrBusy) {
		t.Fatalf("lock released while a connection is still open: %v", err)
	}
	second.Close()
	third, err := b.Open(ctx, "disk")
	if err != nil {
		t.Fatalf("writer after the first left: %v", err)
	}
	// A refused writer leaves no trace: after every open closed, the
	// gateways hold no state.
	if _, err := a.Open(ctx, "disk"); !errors.Is(err, ErrBusy) {
		t.Fatalf("writer through node00 while node01 holds it: %v", err)
	}
	third.Close()
	reader.Close()
	if len(a.open) != 0 || len(b.open) != 0 {
		t.Fatalf("open vdi state left behind: %d on a, %d on b", len(a.open), len(b.open))
	}
	if _, err := a.Open(ctx, "nope"); !errors.Is(err, ErrUnknownVDI) {
		t.Fatalf("unknown vdi: %v", err)
	}
}

func TestUnavailableReplicaFailsOverOnRead(t *testing.T) {
	w := newWorld(t, 3, 3)
	w.cluster.addVDI("disk", 1, objectSize)
	g := w.gateway("node00")
	e := open(t, g, "disk")
	ctx := context.Background()
	if err := e.WriteAt(ctx, []byte("data"), 10, false); err != nil {
		t.Fatal(err)
	}
	w.replicas.mu.Lock()
	w.replicas.unavailable["node00"] = true
	w.replicas.mu.Unlock()
	buf := make([]byte, 4)
	if err := e.ReadAt(ctx, buf, 10); err != nil || string(buf) != "data" {
		t.Fatalf("read with the local replica down: %q %v", buf, err)
	}
}

func TestFlushReachesEveryWrittenReplica(t *testing.T) {
	w := newWorld(t, 4, 2)
	w.cluster.addVDI("disk", 1, 4*objectSize)
	g := w.gateway("node00")
	e := open(t, g, "disk")
	ctx := context.Background()
	if err := e.WriteAt(ctx, pattern(1, 4*objectSize), 0, false); err != nil {
		t.Fatal(err)
	}
	if err := e.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	rv, _ := g.layouts.Current()
	written := map[string]bool{}
	oids := []uint64{uint64(object.MapOID(1, 0))} // first writes also write the object map
	for i := uint32(0); i < 4; i++ {
		oids = append(oids, uint64(object.DataOID(1, i)))
	}
	for _, oid := range oids {
		for _, n := range rv.ReplicasOf(object.OID(oid), 2) {
			written[n.ID] = true
		}
	}
	for n := range written {
		if w.replicas.flushes[n] != 1 {
			t.Fatalf("node %s holds written objects but was flushed %d times", n, w.replicas.flushes[n])
		}
	}
	// Nothing written since: a second flush asks nobody.
	before := len(w.replicas.flushes)
	if err := e.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	total := 0
	for _, n := range w.replicas.flushes {
		total += n
	}
	if total != len(written) || len(w.replicas.flushes) != before {
		t.Fatalf("an idle flush asked nodes again: %v", w.replicas.flushes)
	}
}

func readAll(t *testing.T, e *Disk, n int) []byte {
	t.Helper()
	got := make([]byte, n)
	if err := e.ReadAt(context.Background(), got, 0); err != nil {
		t.Fatalf("read: %v", err)
	}
	return got
}

// TestSnapshotCopyOnWrite: A, snapshot s1, B over half, snapshot s2, C
// over a quarter: s1 = A, s2 = A+B, the VDI = A+B+C; a clone of s1
// diverges without touching either.
func TestSnapshotCopyOnWrite(t *testing.T) {
	w := newWorld(t, 3, 3)
	const size = 4*objectSize + 4096
	w.cluster.addVDI("disk", 1, size)
	g := w.gateway("node00")
	e := open(t, g, "disk")
	ctx := context.Background()
	m := make(model, size)
	write := func(seed int64, off, n int) {
		p := pattern(seed, n)
		if err := e.WriteAt(ctx, p, uint64(off), false); err != nil {
			t.Fatal(err)
		}
		m.write(p, uint64(off))
	}
	write(1, 0, size)
	if _, err := g.Snapshot(ctx, "disk", "s1"); err != nil {
		t.Fatalf("snapshot while open: %v", err)
	}
	a := append(model(nil), m...)
	write(2, 1000, size/2) // unaligned: copy-on-write of partial objects
	if _, err := g.Snapshot(ctx, "disk", "s2"); err != nil {
		t.Fatal(err)
	}
	ab := append(model(nil), m...)
	write(3, objectSize+17, size/4)
	verify(t, e, m)
	s1 := open(t, g, "disk@s1")
	s2 := open(t, g, "disk@s2")
	verify(t, s1, a)
	verify(t, s2, ab)
	if err := s1.WriteAt(ctx, []byte{1}, 0, false); !errors.Is(err, ErrReadOnly) {
		t.Fatalf("write to a snapshot: %v", err)
	}
	// A clone of s1 diverges from both.
	snap, _ := w.cluster.VDI("disk@s1")
	w.cluster.clone(snap.ID, "copy")
	c := open(t, w.gateway("node01"), "copy")
	verify(t, c, a)
	p := pattern(4, 3*objectSize)
	if err := c.WriteAt(ctx, p, 500, true); err != nil {
		t.Fatal(err)
	}
	ca := append(model(nil), a...)
	ca.write(p, 500)
	verify(t, c, ca)
	verify(t, s1, a)
	verify(t, e, m)
	// A whole-object trim on the clone hides the inherited data only there.
	if err := c.Trim(ctx, 3*objectSize, objectSize, false); err != nil {
		t.Fatal(err)
	}
	clear(ca[3*objectSize : 4*objectSize])
	verify(t, c, ca)
	verify(t, s1, a)
}

// TestSnapshotCutsBetweenWrites: writes racing a snapshot land either
// wholly before it (in the snapshot) or wholly after (not in it).
func TestSnapshotCutsBetweenWrites(t *testing.T) {
	w := newWorld(t, 3, 2)
	w.cluster.addVDI("disk", 1, 2*objectSize)
	g := w.gateway("node00")
	e := open(t, g, "disk")
	ctx := context.Background()
	const blocks = 64
	var wg sync.WaitGroup
	done := make(chan struct{})
	var acknowledged sync.Map // block -> generation acknowledged before the snapshot returned
	for b := 0; b < blocks; b++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for gen := byte(1); gen != 0; gen++ { // stops at 255: generations must not wrap
				select {
				case <-done:
					return
				default:
				}
				block := bytes.Repeat([]byte{gen}, 4096)
				if err := e.WriteAt(ctx, block, uint64(b)*4096*7, false); err != nil {
					t.Errorf("write: %v", err)
					return
				}
				acknowledged.Store(b, gen)
			}
		}()
	}
	// Take the snapshot once every block has been written at least once.
	deadline := time.Now().Add(10 * time.Second)
	for {
		n := 0
		acknowledged.Range(func(any, any) bool { n++; return true })
		if n == blocks {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d blocks written after 10 s", n, blocks)
		}
		runtime.Gosched()
	}
	before := map[int]byte{}
	acknowledged.Range(func(k, v any) bool { before[k.(int)] = v.(byte); return true })
	if _, err := g.Snapshot(ctx, "disk", "cut"); err != nil {
		t.Fatal(err)
	}
	close(done)
	wg.Wait()
	s := open(t, g, "disk@cut")
	for b := 0; b < blocks; b++ {
		got := make([]byte, 4096)
		if err := s.ReadAt(ctx, got, uint64(b)*4096*7); err != nil {
			t.Fatal(err)
		}
		for _, x := range got[1:] {
			if x != got[0] {
				t.Fatalf("block %d torn in the snapshot", b)
			}
		}
		if got[0] < before[b] {
			t.Fatalf("block %d: snapshot has generation %d, but %d was acknowledged before the snapshot", b, got[0], before[b])
		}
	}
}

// TestConcurrentWritesDuringCopy: after a replica of an object dies, the
// new replica lacks it; many writes to that object at once must leave
// every replica identical (the whole-object copy is ordered against the
// writes, never overwriting one of them with older data).
func TestConcurrentWritesDuringCopy(t *testing.T) {
	t.Parallel() // it waits 2.5 s for a node's leave (world.leave)
	w := newWorld(t, 5, 3)
	w.cluster.addVDI("disk", 1, objectSize)
	g := w.gateway("node00")
	e := open(t, g, "disk")
	ctx := context.Background()
	m := make(model, objectSize)
	first := pattern(1, objectSize)
	if err := e.WriteAt(ctx, first, 0, false); err != nil {
		t.Fatal(err)
	}
	m.write(first, 0)
	rv, _ := g.layouts.Current()
	holders := rv.ReplicasOf(object.DataOID(1, 0), 3)
	victim := holders[0].ID
	if victim == "node00" {
		victim = holders[1].ID
	}
	var alive []string
	for i := 0; i < 5; i++ {
		if id := fmt.Sprintf("node%02d", i); id != victim {
			alive = append(alive, id)
		}
	}
	w.replicas.mu.Lock()
	delete(w.replicas.objects, victim)
	w.replicas.mu.Unlock()
	w.cluster.setNodes(alive...)
	var wg sync.WaitGroup
	for i := 0; i < 32; i++ {
		p := pattern(int64(100+i), 4096)
		m.write(p, uint64(i)*8192)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := e.WriteAt(ctx, p, uint64(i)*8192, false); err != nil {
				t.Errorf("write %d: %v", i, err)
			}
		}()
	}
	wg.Wait()
	verify(t, e, m)
	// The data object's new replicas match the model. (Objects nobody
	// wrote since the epoch change, like the map object, wait for
	// background recovery.)
	rv, _ = g.layouts.Current()
	w.replicas.mu.Lock()
	defer w.replicas.mu.Unlock()
	for _, n := range rv.ReplicasOf(object.DataOID(1, 0), 3) {
		data, ok := w.replicas.objects[n.ID][object.DataOID(1, 0)]
		if !ok || !bytes.Equal(data, m) {
			t.Fatalf("replica %s of the data object differs from the model (present %v)", n.ID, ok)
		}
	}
}

// A node that answered "not found" in one epoch and left the placement
// before the copy could start (it was paused, and writes stuck on it held
// the object's lock until the epoch change) must not get a copy: CI saw
// the copy wait 30 s on a paused node and fail fio with EIO.
func TestCopyMissingSkipsNodesThatLeftThePlacement(t *testing.T) {
	t.Parallel() // it waits 2.5 s for a node's leave (world.leave)
	w := newWorld(t, 5, 3)
	w.cluster.addVDI("disk", 1, objectSize)
	g := w.gateway("node00")
	e := open(t, g, "disk")
	ctx := context.Background()
	if err := e.WriteAt(ctx, pattern(1, 4096), 0, false); err != nil {
		t.Fatal(err)
	}
	oid := object.DataOID(1, 0)
	rv, _ := g.layouts.Current()
	victim := rv.ReplicasOf(oid, 3)[0]
	w.replicas.mu.Lock()
	delete(w.replicas.objects[victim.ID], oid)
	w.replicas.mu.Unlock()
	var alive []string
	for i := 0; i < 5; i++ {
		if id := fmt.Sprintf("node%02d", i); id != victim.ID {
			alive = append(alive, id)
		}
	}
	w.cluster.setNodes(alive...)
	if err := g.recoverMissing(ctx, oid, 3, []cluster.Node{victim}); err != nil {
		t.Fatalf("recoverMissing: %v", err)
	}
	for _, h := range w.replicas.holders(oid) {
		if h == victim.ID {
			t.Fatalf("%s left the placement but was given a copy", victim.ID)
		}
	}
}

// A replica whose copy is damaged (bad header, EIO) does not fail a
// read: another replica serves it, and the damaged copy is replaced.
func TestDamagedCopyServedElsewhereAndReplaced(t *testing.T) {
	w := newWorld(t, 3, 3)
	w.cluster.addVDI("disk", 1, objectSize)
	g := w.gateway("node00")
	e := open(t, g, "disk")
	ctx := context.Background()
	data := pattern(7, 8192)
	if err := e.WriteAt(ctx, data, 0, false); err != nil {
		t.Fatal(err)
	}
	w.replicas.mu.Lock()
	w.replicas.damaged["node00"] = true // the local replica, read first
	w.replicas.mu.Unlock()
	got := make([]byte, len(data))
	if err := e.ReadAt(ctx, got, 0); err != nil {
		t.Fatalf("read with a damaged local copy: %v", err)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("read returned wrong data")
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		w.replicas.mu.Lock()
		damaged := w.replicas.damaged["node00"]
		copy := w.replicas.objects["node00"][object.DataOID(1, 0)]
		copyOK := len(copy) >= len(data) && bytes.Equal(copy[:len(data)], data)
		w.replicas.mu.Unlock()
		if !damaged && copyOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("damaged copy not replaced (damaged %v, content ok %v)", damaged, copyOK)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A request waits while the cluster keeps moving to new epochs (a run of
// faults that each clear), and fails only after RetryTimeout without one
// (a robustness flake: writes that failed while the cluster
// went through epochs 10, 11, 12 and 13 in 30 s).
func TestRetryBudgetRenewsOnEachEpoch(t *testing.T) {
	const timeout = 300 * time.Millisecond
	w := newWorld(t, 3, 3)
	w.cluster.addVDI("disk", 1, objectSize)
	g := w.gatewayWith("node00", quiet(), Options{RetryTimeout: timeout})
	e := open(t, g, "disk")
	ctx := context.Background()
	setUnavailable := func(down bool) {
		w.replicas.mu.Lock()
		w.replicas.unavailable["node02"] = down
		w.replicas.mu.Unlock()
	}
	// Unreachable for 3x the timeout, with a new epoch every third of it.
	setUnavailable(true)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 9 {
			time.Sleep(timeout / 3)
			w.cluster.rejoin("node01", 1<<40+uint64(i+1))
		}
		setUnavailable(false)
	}()
	started := time.Now()
	if err := e.WriteAt(ctx, []byte("patient"), 0, false); err != nil {
		t.Fatalf("write while the cluster kept changing, after %v: %v", time.Since(started), err)
	}
	<-done
	// No new epoch: it fails after the timeout, naming it.
	setUnavailable(true)
	started = time.Now()
	err := e.WriteAt(ctx, []byte("stuck"), 0, false)
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("write to a still, broken cluster: %v after %v, want ErrTimeout after about %v", err, time.Since(started), timeout)
	}
}
