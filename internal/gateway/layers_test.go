package gateway

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/herd-storage/herd/internal/cluster"
)

// TestLayers: the depth of the chain member defining each object, read
// through the maps (Gateway.Layers) and through an open's cache
// (Disk.Layers), for a chain three deep with a whole-object TRIM after
// the last snapshot.
func TestLayers(t *testing.T) {
	w := newWorld(t, 3, 2)
	w.cluster.addVDI("disk", 1, 6*objectSize)
	g := w.gateway("node00")
	e := open(t, g, "disk")
	ctx := context.Background()
	write := func(index int) {
		t.Helper()
		if err := e.WriteAt(ctx, pattern(int64(index), 4096), uint64(index)*objectSize+100, false); err != nil {
			t.Fatal(err)
		}
	}
	write(0)
	write(1)
	if _, err := g.Snapshot(ctx, "disk", "s1"); err != nil {
		t.Fatal(err)
	}
	write(2)
	if _, err := g.Snapshot(ctx, "disk", "s2"); err != nil {
		t.Fatal(err)
	}
	write(3)
	if err := e.Trim(ctx, 1*objectSize, objectSize, false); err != nil {
		t.Fatal(err)
	}
	// object: 0 (s1's), 1 (s1's, then trimmed in disk), 2 (s2's), 3 (disk's), 4 and 5 never written.
	want := []Layer{{Depth: 3}, {Depth: 1, Zero: true}, {Depth: 2}, {Depth: 1}, {}, {}}
	v, err := w.cluster.VDI("disk")
	if err != nil {
		t.Fatal(err)
	}
	got, err := g.Layers(ctx, v, 0)
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("Layers: %v %v, want %v", got, err, want)
	}
	// Down to s2 (depth 2): object 0, defined deeper, reads as undefined.
	if got, _ := g.Layers(ctx, v, 2); !slices.Equal(got, []Layer{{}, {Depth: 1, Zero: true}, {Depth: 2}, {Depth: 1}, {}, {}}) {
		t.Fatalf("Layers to depth 2: %v", got)
	}
	extents, err := e.Layers(ctx, 0, 6*objectSize)
	if err != nil {
		t.Fatal(err)
	}
	wantExtents := []LayerExtent{
		{objectSize, Layer{Depth: 3}}, {objectSize, Layer{Depth: 1, Zero: true}}, {objectSize, Layer{Depth: 2}},
		{objectSize, Layer{Depth: 1}}, {2 * objectSize, Layer{}},
	}
	if !slices.Equal(extents, wantExtents) {
		t.Fatalf("Disk.Layers: %v, want %v", extents, wantExtents)
	}
	// Changed since s1 (depth 3): objects 1, 2, 3; since s2: 1 and 3.
	s1, depth, err := e.Ancestor("s1")
	if err != nil || s1.Tag != "s1" || depth != 3 {
		t.Fatalf("Ancestor(s1): %+v %d %v", s1, depth, err)
	}
	var changed []int
	for i, l := range got {
		if l.Owned(depth) {
			changed = append(changed, i)
		}
	}
	if got, _ := g.Layers(ctx, v, 0); !slices.Equal(changed, []int{1, 2, 3}) {
		t.Fatalf("changed since s1: %v (layers %v)", changed, got)
	}
	if _, depth, err := e.Ancestor("disk@s2"); err != nil || depth != 2 {
		t.Fatalf("Ancestor(disk@s2): %d %v", depth, err)
	}
	if _, _, err := e.Ancestor("nope"); !errors.Is(err, cluster.ErrNotFound) {
		t.Fatalf("Ancestor(nope): %v", err)
	}
	// The same as a Diff: object 1 zeroed, 2 and 3 data; since s2 only 1
	// and 3; s2 since s1: object 2.
	d, err := g.Diff(ctx, "disk", "s1")
	if err != nil || !slices.Equal(d.Extents, []DiffExtent{{objectSize, objectSize, true}, {2 * objectSize, 2 * objectSize, false}}) ||
		d.ChangedBytes != 3*objectSize || d.ZeroBytes != objectSize || d.Since != "disk@s1" {
		t.Fatalf("Diff since s1: %+v %v", d, err)
	}
	if d, err := g.Diff(ctx, "disk", "disk@s2"); err != nil || !slices.Equal(d.Extents, []DiffExtent{{objectSize, objectSize, true}, {3 * objectSize, objectSize, false}}) {
		t.Fatalf("Diff since s2: %+v %v", d, err)
	}
	if d, err := g.Diff(ctx, "disk@s2", "s1"); err != nil || !slices.Equal(d.Extents, []DiffExtent{{2 * objectSize, objectSize, false}}) {
		t.Fatalf("Diff of s2 since s1: %+v %v", d, err)
	}
	if _, err := g.Diff(ctx, "disk@s1", "s2"); !errors.Is(err, cluster.ErrNotFound) {
		t.Fatalf("Diff of s1 since the later s2: %v", err)
	}
}

// TestPreferNear: a read tries this node, then its zone, then the others.
func TestPreferNear(t *testing.T) {
	nodes := []cluster.Node{{ID: "b1", Zone: "b"}, {ID: "a2", Zone: "a"}, {ID: "b2", Zone: "b"}, {ID: "self", Zone: "a"}, {ID: "a3", Zone: "a"}}
	preferNear(nodes, "self", "a")
	var got []string
	for _, n := range nodes {
		got = append(got, n.ID)
	}
	if !slices.Equal(got, []string{"self", "a2", "a3", "b2", "b1"}) {
		t.Fatalf("order %v", got)
	}
}
