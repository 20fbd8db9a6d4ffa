package gateway

import (
	"bytes"
	"context"
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
	const objectSize = 1 << 20
	w := newWorldWith(t, 6, 3, objectSize)
	g := w.gateway("node00")
	t.Cleanup(g.Close)
	s, err := ec.Parse(scheme)
	if err != nil {
		t.Fatal(err)
	}
	conf, err := g.ecOf(cluster.VDI{Name: "v", EC: scheme, Copies: s.M + 1, ObjectSize: objectSize})
	if err != nil {
		t.Fatal(err)
	}
	return &ecFixture{t: t, w: w, g: g, conf: conf, oid: object.DataOID(9, 3), model: make([]byte, objectSize)}
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
