package statemachine

import (
	"errors"
	"testing"
)

// TestCopiesOfEveryVDI: a VDI's copies are found by id for a writable
// VDI, a snapshot and a deleted VDI waiting to be freed (its garbage
// record), and not for an id never handed out or freed for good.
func TestCopiesOfEveryVDI(t *testing.T) {
	h := newHarness(t)
	for _, id := range []string{"a", "b", "c", "d"} {
		h.join(id, "", "1")
	}
	if _, err := h.apply(commandFormat, formatCommand{Copies: 3, ObjectSize: 4 << 20, Time: t0}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.apply(commandFeatureLevel, featureLevelCommand{Level: LevelVDICopies, Time: t0}); err != nil {
		t.Fatal(err)
	}
	create := func(name string, copies int) VDI {
		t.Helper()
		v, err := h.apply(commandVDICreate, vdiCreateCommand{Name: name, Size: 1 << 30, Copies: copies, Time: t0})
		if err != nil {
			t.Fatal(err)
		}
		return v.(VDI)
	}
	two, four, plain := create("two", 2), create("four", 4), create("plain", 0)
	snap, err := h.apply(commandVDISnapshot, vdiSnapshotCommand{Name: "two", Tag: "s1", Time: t0})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.apply(commandVDIDelete, vdiDeleteCommand{Name: "four"}); err != nil {
		t.Fatal(err)
	}
	s := h.state()
	for _, c := range []struct {
		what   string
		id     uint32
		copies int
		ok     bool
	}{
		{"the snapshotted VDI (a snapshot now)", two.ID, 2, true},
		{"its writable child", snap.(SnapshotResult).Snapshot.ID, 2, true},
		{"the VDI continuing the name", s.VDIs["two"].ID, 2, true},
		{"a deleted VDI waiting to be freed", four.ID, 4, true},
		{"a VDI of the format's copies", plain.ID, 3, true},
		{"an id not handed out yet", s.NextVDIID, 0, false},
	} {
		if copies, ok := s.CopiesOf(c.id); copies != c.copies || ok != c.ok {
			t.Errorf("%s (id %d): %d copies, known %v; want %d, %v", c.what, c.id, copies, ok, c.copies, c.ok)
		}
	}
	if got := s.largestCopies(); got != 4 {
		t.Errorf("largest copies with a garbage record of 4: %d", got)
	}
	if _, err := h.apply(commandGarbageDone, garbageDoneCommand{ID: four.ID}); err != nil {
		t.Fatal(err)
	}
	if copies, ok := h.state().CopiesOf(four.ID); ok {
		t.Errorf("a VDI freed for good is still known, with %d copies", copies)
	}
	if got := h.state().largestCopies(); got != 3 {
		t.Errorf("largest copies once the VDI of 4 is freed: %d, want the format's 3", got)
	}
}

// TestDrainKeepsTheLargestVDIsCopies: a drain (and a zone change) must
// leave enough nodes (zones) for the VDI of the most copies, a deleted one
// waiting to be freed too, not only for the format's.
func TestDrainKeepsTheLargestVDIsCopies(t *testing.T) {
	h := newHarness(t)
	for _, id := range []string{"a", "b", "c", "d", "e"} {
		h.join(id, "", "1")
	}
	if _, err := h.apply(commandFormat, formatCommand{Copies: 3, ObjectSize: 4 << 20, Time: t0}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.apply(commandFeatureLevel, featureLevelCommand{Level: LevelVDICopies, Time: t0}); err != nil {
		t.Fatal(err)
	}
	v, err := h.apply(commandVDICreate, vdiCreateCommand{Name: "four", Size: 1 << 30, Copies: 4, Time: t0})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.apply(commandNodeDrain, nodeDrainCommand{ID: "e", Drain: true, Time: t0}); err != nil {
		t.Fatalf("draining one of five nodes with a VDI of 4 copies: %v", err)
	}
	if _, err := h.apply(commandNodeDrain, nodeDrainCommand{ID: "d", Drain: true, Time: t0}); !errors.Is(err, ErrTooFewNodes) {
		t.Fatalf("draining a second node, leaving 3 for a VDI of 4 copies: %v, want ErrTooFewNodes", err)
	}
	if _, err := h.apply(commandVDIDelete, vdiDeleteCommand{Name: "four"}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.apply(commandNodeDrain, nodeDrainCommand{ID: "d", Drain: true, Time: t0}); !errors.Is(err, ErrTooFewNodes) {
		t.Fatalf("draining a second node while the VDI of 4 copies waits to be freed: %v, want ErrTooFewNodes", err)
	}
	if _, err := h.apply(commandGarbageDone, garbageDoneCommand{ID: v.(VDI).ID}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.apply(commandNodeDrain, nodeDrainCommand{ID: "d", Drain: true, Time: t0}); err != nil {
		t.Fatalf("draining a second node once the VDI of 4 copies is freed (3 left for the format's 3): %v", err)
	}

	// Zones: four zones for a VDI of 4 copies; moving a node into
	// another's zone leaves 3.
	z := newHarness(t)
	for i, id := range []string{"a", "b", "c", "d"} {
		z.join(id, "z"+string(rune('1'+i)), "1")
	}
	if _, err := z.apply(commandFormat, formatCommand{Copies: 3, ObjectSize: 4 << 20, Time: t0}); err != nil {
		t.Fatal(err)
	}
	if _, err := z.apply(commandFeatureLevel, featureLevelCommand{Level: LevelVDICopies, Time: t0}); err != nil {
		t.Fatal(err)
	}
	if _, err := z.apply(commandVDICreate, vdiCreateCommand{Name: "four", Size: 1 << 30, Copies: 4, Time: t0}); err != nil {
		t.Fatal(err)
	}
	zone := "z1"
	if _, err := z.apply(commandNodeSet, nodeSetCommand{ID: "d", Settings: NodeSettings{Zone: &zone}, Time: t0}); !errors.Is(err, ErrTooFewNodes) {
		t.Fatalf("a zone change leaving 3 zones for a VDI of 4 copies: %v, want ErrTooFewNodes", err)
	}
	if err := checkState(z.state()); err != nil {
		t.Fatal(err)
	}
}
