package gateway

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/ec"
	"github.com/herd-storage/herd/internal/object"
)

// ecFixture is one erasure-coded object written through a gateway of a
// six-node world, with a model of its bytes.
type ecFixture struct {
	t     *testing.T
	w     *world
	g     *Gateway
	conf  *ecConf
	oid   object.OID
	model []byte
}

func newECFixture(t *testing.T, scheme string) *ecFixture {
	t.Helper()
	return newECFixtureWith(t, scheme, Options{})
}

func newECFixtureWith(t *testing.T, scheme string, options Options) *ecFixture {
	t.Helper()
	const objectSize = 1 << 20
	w := newWorldWith(t, 6, 3, objectSize)
	g := w.gatewayWith("node00", quiet(), options)
	t.Cleanup(g.Close)
	// The VDI is in the log (a repair of a suspect object looks it up);
	// the tests write its object 3 below its Disks.
	w.cluster.finalize(cluster.LevelErasureCoding)
	v, err := w.cluster.CreateVDIWithScheme("v", 8*objectSize, false, scheme)
	if err != nil {
		t.Fatal(err)
	}
	w.cluster.sync()
	conf, err := g.ecOf(v)
	if err != nil {
		t.Fatal(err)
	}
	return &ecFixture{t: t, w: w, g: g, conf: conf, oid: object.DataOID(object.VDIID(v.ID), 3), model: make([]byte, objectSize)}
}

func (f *ecFixture) write(p []byte, offset uint32, flags object.Flags) {
	f.t.Helper()
	if err := f.g.ecWrite(context.Background(), nil, f.conf, f.oid, p, offset, flags); err != nil {
		f.t.Fatalf("write [%d, +%d): %v", offset, len(p), err)
	}
	copy(f.model[offset:], p)
}

// check reads the whole object back, as the writer and as a reader
// elsewhere, in pieces, and compares with the model.
func (f *ecFixture) check(what string) {
	f.t.Helper()
	for _, writer := range []bool{true, false} {
		got := make([]byte, len(f.model))
		for off := 0; off < len(got); off += 96 << 10 {
			end := min(off+96<<10, len(got))
			if err := f.g.ecRead(context.Background(), nil, f.conf, f.oid, got[off:end], uint32(off), writer, false); err != nil {
				f.t.Fatalf("%s: read [%d, %d) (writer %v): %v", what, off, end, writer, err)
			}
		}
		if i := firstDiff(got, f.model); i >= 0 {
			f.t.Fatalf("%s: byte %d reads %d, want %d (writer %v)", what, i, got[i], f.model[i], writer)
		}
	}
}

func firstDiff(a, b []byte) int {
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return -1
}

func (f *ecFixture) fold() {
	f.t.Helper()
	o, unlock, err := f.g.ecObjectOf(context.Background(), nil, f.conf, f.oid, true)
	if err != nil {
		f.t.Fatal(err)
	}
	defer unlock()
	content := make([]byte, len(f.model))
	if err := f.g.ecReadView(context.Background(), f.conf, f.oid, o.view, content, 0, true); err != nil {
		f.t.Fatal(err)
	}
	if err := f.g.ecFold(context.Background(), f.conf, f.oid, o.view, content, false); err != nil {
		f.t.Fatalf("fold: %v", err)
	}
}

func (f *ecFixture) head() ec.Head {
	f.t.Helper()
	v, err := f.g.ecLoad(context.Background(), f.conf, f.oid)
	if err != nil || !v.hasHead {
		f.t.Fatalf("head: %v (has %v)", err, v != nil && v.hasHead)
	}
	return v.head
}

func TestErasureCodedObjectReadsWhatWasWritten(t *testing.T) {
	f := newECFixture(t, "4+2")
	rng := rand.New(rand.NewPCG(1, 2))
	random := func(n int) []byte {
		p := make([]byte, n)
		for i := range p {
			p[i] = byte(rng.Uint32())
		}
		return p
	}
	f.write(random(8192), 4096, object.FlagCreate|object.FlagFresh)
	f.check("overlay only, before any fold")
	f.write(random(1000), 5000, 0)  // a partial block in the overlay
	f.write(random(700), 300000, 0) // a partial block in no overlay
	f.check("partial blocks")
	f.fold()
	h := f.head()
	if h.Generation != 1 {
		t.Fatalf("after a fold: generation %d, want 1", h.Generation)
	}
	f.check("after the fold")
	// The chunks hold the data: the overlay was trimmed.
	f.write(random(3*4096), 700000, 0)
	f.check("overlay over chunks")
	f.fold()
	f.check("after a second fold")
	if h := f.head(); h.Generation != 2 {
		t.Fatalf("generation %d, want 2", h.Generation)
	}
	// The old slot's chunks are gone.
	for c := range 6 {
		if holders := f.w.replicas.holders(object.ChunkOID(f.oid, c, 1)); len(holders) != 0 {
			t.Fatalf("chunk %d of generation 1 still on %v", c, holders)
		}
		if holders := f.w.replicas.holders(object.ChunkOID(f.oid, c, 0)); len(holders) != 1 {
			t.Fatalf("chunk %d of generation 2 on %v, want one node", c, holders)
		}
	}
	// A whole object is a full stripe: no overlay.
	f.write(random(len(f.model)), 0, 0)
	f.check("a whole object written")
}

func TestErasureCodedObjectSurvivesMLostChunks(t *testing.T) {
	f := newECFixture(t, "4+2")
	p := make([]byte, len(f.model))
	for i := range p {
		p[i] = byte(i*7 + i>>12)
	}
	f.write(p, 0, object.FlagCreate|object.FlagFresh)
	h := f.head()
	// Two chunks' homes unreachable (data chunks 0 and 2): every byte
	// decodes from the other four.
	f.w.replicas.mu.Lock()
	f.w.replicas.unavailable[h.Homes[0]] = true
	f.w.replicas.unavailable[h.Homes[2]] = true
	f.w.replicas.mu.Unlock()
	f.check("two chunks unreachable")
	f.w.replicas.mu.Lock()
	f.w.replicas.unavailable[h.Homes[0]] = false
	f.w.replicas.unavailable[h.Homes[2]] = false
	// A block of chunk 1 rots: the read decodes it and the writer
	// rewrites it.
	rotten := f.w.replicas.objects[h.Homes[1]][object.ChunkOID(f.oid, 1, 1)]
	rotten[4096*3+17] ^= 0x40
	f.w.replicas.mu.Unlock()
	f.check("a rotten chunk block")
	f.w.replicas.mu.Lock()
	fixed := bytes.Clone(f.w.replicas.objects[h.Homes[1]][object.ChunkOID(f.oid, 1, 1)][4096*3:][:4096])
	f.w.replicas.mu.Unlock()
	if ec.Checksum(fixed) != h.Sums[1][3] {
		t.Fatal("the rotten chunk block was not rewritten")
	}
	// Three chunks lost is one more than 4+2 survives: an error, not
	// wrong bytes.
	f.w.replicas.mu.Lock()
	for _, c := range []int{0, 1, 4} {
		f.w.replicas.unavailable[h.Homes[c]] = true
	}
	f.w.replicas.mu.Unlock()
	got := make([]byte, 4096)
	err := f.g.ecRead(context.Background(), nil, f.conf, f.oid, got, 0, false, false)
	if err == nil {
		t.Fatal("a read with three of six chunks lost succeeded")
	}
	t.Logf("three chunks lost: %v", err)
}

// TestErasureCodedVDIThroughDisks: a 4+2 VDI written through the
// writer's Disk on node00, then on node01 (the writer lock handed over:
// node00's views of the objects are stale and must be loaded again),
// then node00 again, with folds between (a whole object, a close), a
// snapshot, and reads through every node, ro/ and the snapshot.
func TestErasureCodedVDIThroughDisks(t *testing.T) {
	w := newWorldWith(t, 6, 3, objectSize)
	w.cluster.finalize(cluster.LevelErasureCoding)
	if _, err := w.cluster.CreateVDIWithScheme("disk", 4*objectSize, false, "4+2"); err != nil {
		t.Fatal(err)
	}
	w.cluster.sync()
	ctx := context.Background()
	model := make([]byte, 4*objectSize)
	gateways := []*Gateway{w.gateway("node00"), w.gateway("node01"), w.gateway("node02")}
	for _, g := range gateways {
		t.Cleanup(g.Close)
	}
	write := func(d *Disk, p []byte, off uint64) {
		t.Helper()
		if err := d.WriteAt(ctx, p, off, false); err != nil {
			t.Fatalf("write [%d, +%d): %v", off, len(p), err)
		}
		copy(model[off:], p)
	}
	check := func(what string, d *Disk, want []byte) {
		t.Helper()
		got := make([]byte, len(want))
		for off := 0; off < len(got); off += 128 << 10 {
			if err := d.ReadAt(ctx, got[off:off+128<<10], uint64(off)); err != nil {
				t.Fatalf("%s: read at %d: %v", what, off, err)
			}
		}
		if i := firstDiff(got, want); i >= 0 {
			t.Fatalf("%s: byte %d reads %d, want %d", what, i, got[i], want[i])
		}
	}
	a := open(t, gateways[0], "disk")
	write(a, pattern(1, 8192), 4096)
	write(a, pattern(2, objectSize), objectSize) // a whole object: folded at once
	write(a, pattern(3, 100), 2*objectSize+5)
	check("the first writer", a, model)
	b := open(t, gateways[1], "disk")
	write(b, pattern(4, 4096), 0) // takes the lock over
	write(b, pattern(5, 3*4096), objectSize+8192)
	check("the second writer", b, model)
	write(a, pattern(6, 4096), 3*objectSize) // and back
	check("the first writer again", a, model)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil { // the last writer's close folds
		t.Fatal(err)
	}
	for i, g := range gateways {
		ro := open(t, g, "ro/disk")
		check(fmt.Sprintf("ro/ through node%02d", i), ro, model)
		ro.Close()
	}
	c := open(t, gateways[2], "disk")
	check("a writer on node02", c, model)
	if _, err := gateways[2].Snapshot(ctx, "disk", "s1"); err != nil {
		t.Fatal(err)
	}
	frozen := bytes.Clone(model)
	write(c, pattern(7, 4096), 4096)
	check("after the snapshot", c, model)
	snap := open(t, gateways[0], "disk@s1")
	check("the snapshot", snap, frozen)
	snap.Close()
	c.Close()
	// Every object of the snapshot has a head now (the close folded
	// them), and its six chunks match it.
	var s1 cluster.VDI
	for _, v := range w.cluster.Tree() {
		if v.Snapshot && v.Tag == "s1" {
			s1 = v
		}
	}
	for index := range uint32(4) {
		checked, bad, _, problems, err := gateways[0].CheckChunks(ctx, s1, object.DataOID(object.VDIID(s1.ID), index), false)
		if err != nil || checked != 6 || bad != 0 || len(problems) != 0 {
			t.Fatalf("object %d of the snapshot: %d chunks checked, %d bad: %v %v", index, checked, bad, problems, err)
		}
	}
}
