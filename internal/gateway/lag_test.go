package gateway

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/object"
)

// TestLagOrder: a far part follows the pending parts of its object whose
// ranges overlap it (a CREATE covers the whole object) and the part it
// is told to follow, and nothing else; finished parts leave the table,
// failed ones are kept for their object's repair, with the parts that
// finish after them over them (rule 6), and the pending and kept bytes
// are counted.
func TestLagOrder(t *testing.T) {
	table := newLagTable(64 << 20)
	op := func(oid object.OID, start, end uint32) *lagOp {
		if _, err := table.bytes.acquire(context.Background(), int64(end-start)); err != nil {
			t.Fatal(err)
		}
		return &lagOp{oid: oid, start: start, end: end, data: make([]byte, end-start), copies: 2, done: make(chan struct{})}
	}
	a := op(1, 0, 4096)
	table.add(a, nil)
	b := op(1, 4096, 8192) // beside a: independent
	table.add(b, nil)
	c := op(1, 2048, 6144) // over both
	table.add(c, nil)
	other := op(2, 0, 4096) // another object
	table.add(other, nil)
	create := op(3, 0, 4<<20) // a CREATE covers its object
	table.add(create, nil)
	later := op(3, 8192, 12288)
	table.add(later, nil)
	entry := op(4, 16, 20) // a map entry after its data
	table.add(entry, create)

	deps := func(o *lagOp) []*lagOp { return o.deps }
	for _, check := range []struct {
		name string
		op   *lagOp
		want []*lagOp
	}{
		{"first", a, nil},
		{"beside", b, nil},
		{"over both", c, []*lagOp{a, b}},
		{"other object", other, nil},
		{"after a create", later, []*lagOp{create}},
		{"entry after its data", entry, []*lagOp{create}},
	} {
		if got := deps(check.op); !slices.Equal(got, check.want) {
			t.Errorf("%s: follows %d parts, want %d", check.name, len(got), len(check.want))
		}
	}
	if got, want := table.inFlight.Load(), int64(4096*4+4<<20+4096+4); got != want {
		t.Errorf("pending bytes %d, want %d", got, want)
	}
	if got := table.of(1); len(got) != 3 {
		t.Errorf("object 1: %d pending, want 3", len(got))
	}

	var suspects []uint64
	suspect := func(oid object.OID, err error) { suspects = append(suspects, uint64(oid)) }
	table.finish(a, suspect) // landed before anything failed: not kept
	b.err = errors.New("far zone unreachable")
	table.finish(b, suspect)
	select {
	case <-a.done:
	default:
		t.Fatal("a finished part's done is not closed")
	}
	if got := table.of(1); len(got) != 1 || got[0] != c {
		t.Errorf("object 1 after two finished: %v pending, want only c", len(got))
	}
	if f := table.failed[1]; f == nil || !slices.Equal(f.ops, []*lagOp{b}) || !table.hasFailed(1) {
		t.Error("a failed far part is not kept for its object's repair")
	}
	if !slices.Equal(suspects, []uint64{1}) {
		t.Errorf("objects made suspect: %v, want object 1 once", suspects)
	}
	if got := table.repairOps(1); !slices.Equal(got, []*lagOp{b, c}) {
		t.Errorf("a repair of object 1 writes %d parts, want b then the pending c", len(got))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := await(ctx, []*lagOp{c}); err == nil {
		t.Error("await returned for a part still pending")
	}
	for _, o := range []*lagOp{c, other, create, later, entry} {
		table.finish(o, suspect)
	}
	// c landed after b failed, over it: kept after b, so that a repair
	// writes b and then c. The other objects had no failure: nothing kept.
	if f := table.failed[1]; f == nil || !slices.Equal(f.ops, []*lagOp{b, c}) || len(table.failed) != 1 {
		t.Errorf("kept: %d objects, object 1's %v, want b then c", len(table.failed), f)
	}
	if got, want := table.kept.Load(), int64(2*4096); got != want {
		t.Errorf("kept bytes %d, want %d", got, want)
	}
	// A repair that wrote b only leaves c kept and the object suspect.
	cleared := false
	table.settle(1, []*lagOp{b}, func() { cleared = true })
	if f := table.failed[1]; cleared || f == nil || !slices.Equal(f.ops, []*lagOp{c}) {
		t.Error("a repair that wrote b only cleared object 1, or did not leave c kept")
	}
	table.settle(1, []*lagOp{c}, func() { cleared = true })
	if !cleared || table.hasFailed(1) || table.kept.Load() != 0 {
		t.Errorf("after a repair wrote every kept part: cleared %v, kept %v, %d bytes", cleared, table.hasFailed(1), table.kept.Load())
	}
	// A part a repair wrote while it was pending is not kept when it
	// fails afterwards; a removed object's kept parts are dropped.
	settled := op(5, 0, 4096)
	table.add(settled, nil)
	table.settle(5, table.repairOps(5), func() {})
	settled.err = errors.New("far zone unreachable")
	table.finish(settled, suspect)
	removed := op(6, 0, 4096)
	table.add(removed, nil)
	removed.err = errors.New("far zone unreachable")
	table.finish(removed, suspect)
	table.forget(6)
	if table.hasFailed(5) || table.hasFailed(6) || table.kept.Load() != 0 {
		t.Errorf("kept after a repair wrote it: %v; after its object was removed: %v", table.hasFailed(5), table.hasFailed(6))
	}
	if got := table.inFlight.Load(); got != 0 {
		t.Errorf("pending bytes %d after every part finished", got)
	}
	if table.count.Load() != 0 || len(table.all()) != 0 || len(table.pending) != 0 {
		t.Errorf("parts left: count %d, all %d, objects %d", table.count.Load(), len(table.all()), len(table.pending))
	}
	if err := await(context.Background(), []*lagOp{c, entry}); err != nil {
		t.Errorf("await of finished parts: %v", err)
	}
}
