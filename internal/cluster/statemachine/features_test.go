package statemachine

import (
	"errors"
	"testing"
)

// TestVDICopiesGatedByLevel: below LevelVDICopies a create's copies field
// is ignored, exactly as a binary older than the field (which drops it)
// applies the entry, so every node's state stays the same; once the level
// is raised the VDI gets its own copies. The level never falls.
func TestVDICopiesGatedByLevel(t *testing.T) {
	h := newHarness(t)
	for _, id := range []string{"a", "b", "c"} {
		h.join(id, "", "1")
	}
	if _, err := h.apply(commandFormat, formatCommand{Copies: 3, ObjectSize: 4 << 20, Time: t0}); err != nil {
		t.Fatal(err)
	}
	if level := h.state().Level(); level != LevelBase {
		t.Fatalf("a new cluster is at level %d, want %d", level, LevelBase)
	}
	v, err := h.apply(commandVDICreate, vdiCreateCommand{Name: "early", Size: 1 << 30, Copies: 2, Time: t0})
	if err != nil {
		t.Fatal(err)
	}
	if copies := v.(VDI).Copies; copies != 3 {
		t.Fatalf("at level 1 a create with copies 2 made a VDI with %d copies; an older binary makes 3", copies)
	}

	if _, err := h.apply(commandFeatureLevel, featureLevelCommand{Level: LevelVDICopies, Time: t0}); err != nil {
		t.Fatal(err)
	}
	v, err = h.apply(commandVDICreate, vdiCreateCommand{Name: "two", Size: 1 << 30, Copies: 2, Time: t0})
	if err != nil {
		t.Fatal(err)
	}
	if copies := v.(VDI).Copies; copies != 2 {
		t.Fatalf("at level 2 a create with copies 2 made a VDI with %d copies", copies)
	}
	if _, err := h.apply(commandVDICreate, vdiCreateCommand{Name: "four", Size: 1 << 30, Copies: 4, Time: t0}); !errors.Is(err, ErrTooFewNodes) {
		t.Fatalf("4 copies on 3 nodes: %v, want ErrTooFewNodes", err)
	}
	if _, err := h.apply(commandVDICreate, vdiCreateCommand{Name: "many", Size: 1 << 30, Copies: MaxCopies + 1, Time: t0}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("%d copies: %v, want ErrInvalid", MaxCopies+1, err)
	}
	// Snapshots and clones keep the VDI's copies.
	if _, err := h.apply(commandVDISnapshot, vdiSnapshotCommand{Name: "two", Tag: "s1", Time: t0}); err != nil {
		t.Fatal(err)
	}
	c, err := h.apply(commandVDIClone, vdiCloneCommand{Snapshot: "two@s1", Name: "child", Time: t0})
	if err != nil {
		t.Fatal(err)
	}
	if copies := c.(VDI).Copies; copies != 2 || h.state().VDIs["two"].Copies != 2 {
		t.Fatalf("clone has %d copies, the snapshotted VDI %d; want 2 and 2", copies, h.state().VDIs["two"].Copies)
	}

	for _, level := range []int{LevelBase, LevelVDICopies} {
		if _, err := h.apply(commandFeatureLevel, featureLevelCommand{Level: level, Time: t0}); !errors.Is(err, ErrInvalid) {
			t.Fatalf("setting level %d at level %d: %v, want refused (never falls, never set twice)", level, LevelVDICopies, err)
		}
	}
	if err := checkState(h.state()); err != nil {
		t.Fatal(err)
	}
}
