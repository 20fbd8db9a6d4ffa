package gateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/cluster"

	"github.com/herd-storage/herd/internal/object"
)

// crashBeforeData makes the next write of a whole block to the fixture's
// object fail on every replica (as if the writer died after its entry
// write), once.
func (f *ecFixture) crashBeforeData() {
	var once sync.Once
	f.w.replicas.beforeWrite = func(node string, oid object.OID) {
		f.w.replicas.mu.Lock()
		data := oid == f.oid && f.w.replicas.lastLen == 4096
		f.w.replicas.mu.Unlock()
		if data {
			once.Do(func() {
				f.w.replicas.mu.Lock()
				for _, n := range f.w.cluster.nodeIDs() {
					f.w.replicas.unavailable[n] = true
				}
				f.w.replicas.mu.Unlock()
			})
		}
	}
}

func (f *ecFixture) recover() {
	f.w.replicas.mu.Lock()
	f.w.replicas.beforeWrite = nil
	clear(f.w.replicas.unavailable)
	f.w.replicas.mu.Unlock()
}

// A kill -9 of the writer between the entry write and the block write of
// an overwrite of a block already in the overlay (entries go first): the
// replicas hold the new entry over the old bytes, which read as the old
// content (its Prev). Then once more, over an entry with a Prev.
func TestErasureCodedOverwriteCrashAfterItsEntry(t *testing.T) {
	f := newECFixtureWith(t, "4+2", Options{RetryTimeout: 200 * time.Millisecond})
	ctx := context.Background()
	blk := func(b byte) []byte { return bytes.Repeat([]byte{b}, 4096) }
	f.write(blk(0xd0), 8192, object.FlagCreate|object.FlagFresh)
	f.fold() // D0 in the chunks of generation 1
	f.write(blk(0xd1), 8192, object.FlagSync)
	other := f.w.gateway("node02")
	t.Cleanup(other.Close)
	for _, next := range []byte{0xd2, 0xd3} {
		f.crashBeforeData()
		if err := f.g.ecWrite(ctx, nil, f.conf, f.oid, blk(next), 8192, 0); err == nil {
			t.Fatalf("the write of %#x succeeded with every replica gone", next)
		}
		f.recover()
		// What the replicas hold, read by a gateway that knows nothing of
		// the failed write (the writer's own would repair it first, as
		// applied): the old content.
		got := make([]byte, 4096)
		err := other.ecRead(ctx, nil, f.conf, f.oid, got, 8192, false, false)
		if err != nil || got[0] != next-1 {
			t.Fatalf("after a crash between the entry and the bytes of %#x: reads %#x (%v), want the old %#x", next, got[0], err, next-1)
		}
		// The writer goes on (as the next writer would): the write again.
		f.write(blk(next), 8192, object.FlagSync)
		f.check(fmt.Sprintf("%#x written again", next))
	}
}

// A fold inside ecWrite (a whole-object write) whose head write fails
// after reaching some replicas: the failed head may resolve as applied
// (suspect repair), so the writer drops its view of generation g and
// loads the head again; a later write is seen by every reader (before
// the fix, it was tagged for a stale generation and lost to them).
func TestErasureCodedFailedFoldDropsTheView(t *testing.T) {
	const objectSize = 1 << 20
	w := newWorldWith(t, 6, 3, objectSize)
	g := w.gatewayWith("node00", slog.New(slog.NewTextHandler(io.Discard, nil)), Options{RetryTimeout: 200 * time.Millisecond})
	t.Cleanup(g.Close)
	w.cluster.finalize(cluster.LevelErasureCoding)
	vdi, err := w.cluster.CreateVDIWithScheme("v", 4*objectSize, false, "4+2")
	if err != nil {
		t.Fatal(err)
	}
	w.cluster.sync()
	conf, err := g.ecOf(vdi)
	if err != nil {
		t.Fatal(err)
	}
	oid := object.DataOID(object.VDIID(vdi.ID), 0)
	ctx := context.Background()
	blk := func(b byte, n int) []byte { return bytes.Repeat([]byte{b}, n) }
	if err := g.ecWrite(ctx, nil, conf, oid, blk(0xa0, 4096), 0, object.FlagCreate|object.FlagFresh); err != nil {
		t.Fatal(err)
	}
	var failNode string
	w.replicas.beforeWrite = func(node string, o object.OID) {
		// the head's write (HeadSize bytes) to one replica of the overlay
		w.replicas.mu.Lock()
		defer w.replicas.mu.Unlock()
		if o == oid && failNode == "" && w.replicas.lastLen == int(conf.layout.HeadSize()) {
			failNode = node
			w.replicas.unavailable[node] = true
		}
	}
	err = g.ecWrite(ctx, nil, conf, oid, blk(0xb0, objectSize), 0, 0)
	t.Logf("whole-object write: %v (failed on %s)", err, failNode)
	w.replicas.beforeWrite = nil
	w.replicas.mu.Lock()
	w.replicas.unavailable[failNode] = false
	w.replicas.mu.Unlock()
	if err == nil {
		t.Skip("the head write did not fail")
	}
	// An acknowledged write afterwards.
	if err := g.ecWrite(ctx, nil, conf, oid, blk(0xcc, 4096), 5*4096, object.FlagSync); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 4096)
	if err := g.ecRead(ctx, nil, conf, oid, got, 5*4096, true, false); err != nil {
		t.Fatal(err)
	}
	t.Logf("the writer reads %#x", got[0])
	if err := g.ecRead(ctx, nil, conf, oid, got, 5*4096, false, false); err != nil {
		t.Fatal(err)
	}
	t.Logf("a reader elsewhere reads %#x", got[0])
	if got[0] != 0xcc {
		t.Fatalf("an acknowledged write reads %#x elsewhere, want 0xcc", got[0])
	}
}

// A ro/ reader (live) racing with an overwrite of an overlaid block,
// its entries' write held on every replica: it returns the old or the
// new content (before entries went first, it returned the chunks' older
// content).
func TestErasureCodedLiveReaderDuringOverwrite(t *testing.T) {
	f := newECFixture(t, "4+2")
	ctx := context.Background()
	blk := func(b byte) []byte { return bytes.Repeat([]byte{b}, 4096) }
	f.write(blk(0xd0), 8192, object.FlagCreate|object.FlagFresh)
	f.fold()
	f.write(blk(0xd1), 8192, 0)
	held := make(chan struct{})
	release := make(chan struct{})
	var mu sync.Mutex
	n := 0
	f.w.replicas.before = func(op, node string, oid object.OID, p []byte) {
		if op == "write" && oid == f.oid && len(p) == 16 {
			mu.Lock()
			n++
			if n == f.conf.copies {
				close(held)
			}
			mu.Unlock()
			<-release
		}
	}
	done := make(chan error, 1)
	go func() { done <- f.g.ecWrite(ctx, nil, f.conf, f.oid, blk(0xd2), 8192, 0) }()
	<-held
	got := make([]byte, 4096)
	err := f.g.ecRead(ctx, nil, f.conf, f.oid, got, 8192, false, true)
	close(release)
	if werr := <-done; werr != nil {
		t.Fatal(werr)
	}
	t.Logf("live reader read %#x (err %v); old 0xd1, new 0xd2", got[0], err)
	if err != nil || (got[0] != 0xd1 && got[0] != 0xd2) {
		t.Fatalf("a live read during an overwrite returned %#x, %v", got[0], err)
	}
}

// node00's writer (or steward) scans for refolds after an epoch change;
// meanwhile node01 took the writer lock over. node00's refold must do
// nothing (errNotWriter): before the check, it wrote K+M chunks
// (unfenced) into the free slot, which node01's own fold of the object
// had just made current.
func TestErasureCodedNoRefoldAfterHandover(t *testing.T) {
	const objectSize = 1 << 20
	w := newWorldWith(t, 8, 3, objectSize)
	w.cluster.finalize(cluster.LevelErasureCoding)
	vdi, err := w.cluster.CreateVDIWithScheme("disk", 4*objectSize, false, "4+2")
	if err != nil {
		t.Fatal(err)
	}
	w.cluster.sync()
	// Chunk writes while counting: set before any gateway runs (the
	// fake reads the hook without its lock).
	var mu sync.Mutex
	counting, chunkWrites := false, 0
	w.replicas.beforeWrite = func(node string, o object.OID) {
		if _, _, _, ok := object.ChunkOf(o); ok {
			mu.Lock()
			if counting {
				chunkWrites++
			}
			mu.Unlock()
		}
	}
	ctx := context.Background()
	ga, gb := w.gateway("node00"), w.gateway("node01")
	t.Cleanup(ga.Close)
	t.Cleanup(gb.Close)
	a := open(t, ga, "disk")
	if err := a.WriteAt(ctx, pattern(1, objectSize), 0, false); err != nil { // folded: generation 1
		t.Fatal(err)
	}
	b := open(t, gb, "disk")
	if err := b.WriteAt(ctx, pattern(2, 4096), 8192, false); err != nil { // takes the lock over
		t.Fatal(err)
	}
	conf, _ := ga.ecOf(vdi)
	oid := object.DataOID(object.VDIID(vdi.ID), 0)
	v, err := ga.ecLoad(ctx, conf, oid)
	if err != nil || !v.hasHead {
		t.Fatal(err)
	}
	// A chunk's home leaves: the object must be refolded, by its writer.
	for _, id := range v.head.Homes {
		if id != "node00" && id != "node01" {
			w.cluster.leave(id)
			break
		}
	}
	w.cluster.sync()
	rv, _ := ga.layouts.Current()
	// node01's own folder may refold it meanwhile (its chunk writes
	// would count too): node00's must return at once without any.
	mu.Lock()
	counting = true
	mu.Unlock()
	moved, err := ga.ecPlace(rv, a.state, conf, oid) // node00 no longer holds the lock
	mu.Lock()
	counting = false
	mu.Unlock()
	if moved || !errors.Is(err, errNotWriter) {
		t.Fatalf("node00's refold without the lock: moved %v, err %v; want nothing done, errNotWriter", moved, err)
	}
	// node01, the writer, writes a whole object (folded at once) and
	// reads it back.
	model := pattern(3, objectSize)
	if err := b.WriteAt(ctx, model, 0, false); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, objectSize)
	if err := b.ReadAt(ctx, got, 0); err != nil || !bytes.Equal(got, model) {
		t.Fatalf("the writer's acknowledged whole-object write reads back: err %v, first diff %d", err, firstDiff(got, model))
	}
}

// Power loss twice. 1: block b's first write since the fold (D1) keeps
// its entry and loses its data: b reads D0 from the chunks. 2: the next
// write (D2) must not record Prev = CRC(D1), which the overlay never
// held (it did, taken from the entry): a power loss that keeps that
// entry and loses D2 then left the block matching neither, EIO for
// good, where D0 (old) was right.
func TestErasureCodedPrevIsWhatTheOverlayHolds(t *testing.T) {
	f := newECFixture(t, "4+2")
	ctx := context.Background()
	blk := func(b byte) []byte { return bytes.Repeat([]byte{b}, 4096) }
	f.write(blk(0xd0), 8192, object.FlagCreate|object.FlagFresh)
	f.fold()
	lose := func() { // the block's data never reached any replica's disk
		f.w.replicas.mu.Lock()
		for _, objects := range f.w.replicas.objects {
			if data, ok := objects[f.oid]; ok {
				clear(data[8192 : 8192+4096])
			}
		}
		f.w.replicas.mu.Unlock()
	}
	f.write(blk(0xd1), 8192, 0)
	lose()
	// The cluster restarts: a new gateway, its views loaded afresh.
	g2 := f.w.gateway("node01")
	t.Cleanup(g2.Close)
	got := make([]byte, 4096)
	if err := g2.ecRead(ctx, nil, f.conf, f.oid, got, 8192, true, false); err != nil || got[0] != 0xd0 {
		t.Fatalf("after the first power loss: %#x %v", got[0], err)
	}
	if err := g2.ecWrite(ctx, nil, f.conf, f.oid, blk(0xd2), 8192, 0); err != nil {
		t.Fatal(err)
	}
	lose()
	g3 := f.w.gateway("node02")
	t.Cleanup(g3.Close)
	err := g3.ecRead(ctx, nil, f.conf, f.oid, got, 8192, false, false)
	t.Logf("after the second power loss: %#x, %v (old 0xd0, new 0xd2)", got[0], err)
	if err != nil || (got[0] != 0xd0 && got[0] != 0xd2) {
		t.Fatalf("reads neither old nor new: %#x, %v", got[0], err)
	}
}
