package statemachine

import (
	"errors"
	"testing"
)

// TestLayerMergeAndFlatten: a deleted snapshot with one child is a merge
// job until the merged entry takes it out of the chain and frees it; one
// with two children is kept; a flatten is a job until flattened, which
// also frees a deleted parent left without children. The command is
// refused below its feature level.
func TestLayerMergeAndFlatten(t *testing.T) {
	h := newHarness(t)
	h.join("a", "", "1")
	h.apply(commandFormat, formatCommand{Copies: 1, ObjectSize: 4 << 20})
	h.apply(commandVDICreate, vdiCreateCommand{Name: "vm", Size: 1 << 30, Time: t0})
	snap := func(tag string) SnapshotResult {
		r, err := h.apply(commandVDISnapshot, vdiSnapshotCommand{Name: "vm", Tag: tag, Time: t0})
		if err != nil {
			t.Fatal(err)
		}
		return r.(SnapshotResult)
	}
	b1 := snap("b1")
	b2 := snap("b2")
	if _, err := h.apply(commandVDILayer, vdiLayerCommand{Op: layerFlatten, Name: "vm"}); !errors.Is(err, ErrUpgradeRequired) {
		t.Fatalf("below the level: %v", err)
	}
	if _, err := h.apply(commandFeatureLevel, featureLevelCommand{Level: LevelSecurity, Time: t0}); err != nil {
		t.Fatal(err)
	}
	if jobs := h.state().LayerJobs(); len(jobs) != 0 {
		t.Fatalf("jobs without a deleted layer: %+v", jobs)
	}
	if _, err := h.apply(commandVDIDelete, vdiDeleteCommand{Name: "vm@b1"}); err != nil {
		t.Fatal(err)
	}
	jobs := h.state().LayerJobs()
	if len(jobs) != 1 || jobs[0].Layer != b1.Snapshot.ID || jobs[0].Child.ID != b2.Snapshot.ID || jobs[0].Holder != "" {
		t.Fatalf("merge job: %+v", jobs)
	}
	// A wrong child, or a layer that is not deleted, is refused.
	if _, err := h.apply(commandVDILayer, vdiLayerCommand{Op: layerMerged, ID: b1.Snapshot.ID, Child: b2.VDI.ID}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("merge into a grandchild: %v", err)
	}
	if _, err := h.apply(commandVDILayer, vdiLayerCommand{Op: layerMerged, ID: b2.Snapshot.ID, Child: b2.VDI.ID}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("merge of a live snapshot: %v", err)
	}
	if _, err := h.apply(commandVDILayer, vdiLayerCommand{Op: layerMerged, ID: b1.Snapshot.ID, Child: b2.Snapshot.ID}); err != nil {
		t.Fatal(err)
	}
	s := h.state()
	if s.Snapshots[b1.Snapshot.ID] != nil || s.Snapshots[b2.Snapshot.ID].Parent != 0 || len(s.Garbage) != 1 || s.Garbage[0].ID != b1.Snapshot.ID {
		t.Fatalf("after the merge: snapshots %v, garbage %+v", s.Snapshots, s.Garbage)
	}
	if got := s.Chain(b2.VDI.ID); len(got) != 2 {
		t.Fatalf("chain after the merge: %v", got)
	}
	if _, err := h.apply(commandVDILayer, vdiLayerCommand{Op: layerMerged, ID: b1.Snapshot.ID, Child: b2.Snapshot.ID}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("merged twice: %v", err)
	}

	// Two children: kept, no job, until one goes.
	if _, err := h.apply(commandVDIClone, vdiCloneCommand{Snapshot: "vm@b2", Name: "clone", Time: t0}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.apply(commandVDIDelete, vdiDeleteCommand{Name: "vm@b2"}); err != nil {
		t.Fatal(err)
	}
	if jobs := h.state().LayerJobs(); len(jobs) != 0 {
		t.Fatalf("a layer with two children is no merge: %+v", jobs)
	}
	if kids := h.state().KeptBecause(b2.Snapshot.ID); len(kids) != 2 {
		t.Fatalf("kept because: %+v", kids)
	}
	// Flatten the clone: the layer is then read by vm alone, but the
	// flatten is the job for the clone, and the merge waits.
	h.apply(commandLockAcquire, lockCommand{Key: vdiLockKey("clone"), Node: "a", Incarnation: "1", Session: "g"})
	r, err := h.apply(commandVDILayer, vdiLayerCommand{Op: layerFlatten, Name: "clone", Time: t0})
	if err != nil || !r.(VDI).Flatten {
		t.Fatalf("flatten: %+v %v", r, err)
	}
	jobs = h.state().LayerJobs()
	if len(jobs) != 1 || !jobs[0].Flatten || jobs[0].Child.Name != "clone" || jobs[0].Holder != "a" || len(jobs[0].Sources) != 1 || jobs[0].Sources[0] != b2.Snapshot.ID {
		t.Fatalf("flatten job: %+v", jobs)
	}
	clone := h.state().VDIs["clone"]
	if _, err := h.apply(commandVDILayer, vdiLayerCommand{Op: layerFlattened, ID: 999, Child: clone.ID}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("flattened from another parent: %v", err)
	}
	if _, err := h.apply(commandVDILayer, vdiLayerCommand{Op: layerFlattened, ID: b2.Snapshot.ID, Child: clone.ID}); err != nil {
		t.Fatal(err)
	}
	s = h.state()
	if c := s.VDIs["clone"]; c.Parent != 0 || c.Flatten {
		t.Fatalf("flattened clone: %+v", c)
	}
	// b2 is deleted and has one child left (vm): a merge job again.
	jobs = s.LayerJobs()
	if len(jobs) != 1 || jobs[0].Layer != b2.Snapshot.ID || jobs[0].Child.ID != b2.VDI.ID {
		t.Fatalf("merge after the flatten: %+v", jobs)
	}
	// Flatten vm too: its only deleted ancestor leaves the tree at once.
	if _, err := h.apply(commandVDILayer, vdiLayerCommand{Op: layerFlatten, Name: "vm", Time: t0}); err != nil {
		t.Fatal(err)
	}
	if jobs := h.state().LayerJobs(); len(jobs) != 1 || !jobs[0].Flatten {
		t.Fatalf("flatten supersedes the merge: %+v", jobs)
	}
	if _, err := h.apply(commandVDILayer, vdiLayerCommand{Op: layerFlattened, ID: b2.Snapshot.ID, Child: b2.VDI.ID}); err != nil {
		t.Fatal(err)
	}
	s = h.state()
	if len(s.Snapshots) != 0 || len(s.Garbage) != 2 || len(s.LayerJobs()) != 0 {
		t.Fatalf("after flattening both: snapshots %v garbage %+v", s.Snapshots, s.Garbage)
	}
}
