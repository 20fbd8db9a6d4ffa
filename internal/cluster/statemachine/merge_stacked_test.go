package statemachine

import (
	"errors"
	"testing"
)

// TestStackedMergeRefusedAfterItsLayerChanged: two deleted snapshots
// stacked (b1 <- b2 <- vm, both deleted) are two merge jobs, b1 into b2
// and b2 into vm, which runners may run at once. The job of b2 copies
// what b2 owns; if b1's merge into b2 commits first, b2 then holds
// objects that job passed over, and vm would lose them with b2. So
// `merged` carries the layer's parent as the job saw it and is refused
// once it changed (the simulator's seed 7 of
// TestScenarioMergeAndFlattenUnderFaults lost an acknowledged write that
// way); the job, run again, sees the new parent and commits. An entry
// without the parent (from a build before the check) is not checked.
func TestStackedMergeRefusedAfterItsLayerChanged(t *testing.T) {
	h := newHarness(t)
	h.join("a", "", "1")
	h.apply(commandFormat, formatCommand{Copies: 1, ObjectSize: 4 << 20})
	h.apply(commandVDICreate, vdiCreateCommand{Name: "vm", Size: 1 << 30, Time: t0})
	if _, err := h.apply(commandFeatureLevel, featureLevelCommand{Level: LevelSecurity, Time: t0}); err != nil {
		t.Fatal(err)
	}
	snap := func(tag string) SnapshotResult {
		r, err := h.apply(commandVDISnapshot, vdiSnapshotCommand{Name: "vm", Tag: tag, Time: t0})
		if err != nil {
			t.Fatal(err)
		}
		return r.(SnapshotResult)
	}
	b1, b2 := snap("b1"), snap("b2")
	for _, name := range []string{"vm@b1", "vm@b2"} {
		if _, err := h.apply(commandVDIDelete, vdiDeleteCommand{Name: name}); err != nil {
			t.Fatal(err)
		}
	}
	jobs := h.state().LayerJobs()
	if len(jobs) != 2 {
		t.Fatalf("jobs: %+v", jobs)
	}
	var upper LayerJob // b2 into vm
	for _, j := range jobs {
		if j.Layer == b2.Snapshot.ID {
			upper = j
		}
	}
	if upper.Child.ID != b2.VDI.ID || upper.LayerParent != b1.Snapshot.ID {
		t.Fatalf("the job of b2: %+v, want child %d and layer parent %d", upper, b2.VDI.ID, b1.Snapshot.ID)
	}
	// b1 merges into b2 first.
	zero := uint32(0)
	if _, err := h.apply(commandVDILayer, vdiLayerCommand{Op: layerMerged, ID: b1.Snapshot.ID, Child: b2.Snapshot.ID, Parent: &zero}); err != nil {
		t.Fatal(err)
	}
	// b2's job, begun before, is refused: b2 has another parent now.
	stale := upper.LayerParent
	if _, err := h.apply(commandVDILayer, vdiLayerCommand{Op: layerMerged, ID: b2.Snapshot.ID, Child: b2.VDI.ID, Parent: &stale}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("a merge of a layer merged into meanwhile: %v, want refused", err)
	}
	if s := h.state(); s.Snapshots[b2.Snapshot.ID] == nil || s.VDIs["vm"].Parent != b2.Snapshot.ID {
		t.Fatalf("the refused merge changed the tree: %+v", s.VDIs["vm"])
	}
	// Run again, the job sees the new parent and commits.
	jobs = h.state().LayerJobs()
	if len(jobs) != 1 || jobs[0].Layer != b2.Snapshot.ID || jobs[0].LayerParent != 0 {
		t.Fatalf("jobs after b1's merge: %+v", jobs)
	}
	if _, err := h.apply(commandVDILayer, vdiLayerCommand{Op: layerMerged, ID: b2.Snapshot.ID, Child: b2.VDI.ID, Parent: &jobs[0].LayerParent}); err != nil {
		t.Fatal(err)
	}
	if s := h.state(); s.VDIs["vm"].Parent != 0 || len(s.LayerJobs()) != 0 {
		t.Fatalf("after both merges: vm %+v, jobs %+v", s.VDIs["vm"], s.LayerJobs())
	}

	// Without the parent (an entry of an older build): not checked.
	b3, b4 := snap("b3"), snap("b4")
	for _, name := range []string{"vm@b3", "vm@b4"} {
		if _, err := h.apply(commandVDIDelete, vdiDeleteCommand{Name: name}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := h.apply(commandVDILayer, vdiLayerCommand{Op: layerMerged, ID: b3.Snapshot.ID, Child: b4.Snapshot.ID}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.apply(commandVDILayer, vdiLayerCommand{Op: layerMerged, ID: b4.Snapshot.ID, Child: b4.VDI.ID}); err != nil {
		t.Fatalf("an entry without the parent: %v", err)
	}
}
