package gateway

import (
	"errors"
	"testing"
)

// The paper's Fig. 4 on the epoch history alone: an object written on
// B and C moves to D and E when they join, is written there, and D and E
// die. B's and C's copies are older than what D and E acknowledged: the
// proof must refuse them, and accept D's copy once D returns.
func TestProveCurrentFigure4(t *testing.T) {
	w := newWorld(t, 3, 2) // node00..node02: A, B, C; epoch 1
	g := w.gateway("node00")
	w.cluster.setNodes("node00", "node01", "node02", "node03")           // epoch 2: D joins
	w.cluster.setNodes("node00", "node01", "node02", "node03", "node04") // epoch 3: E joins
	w.cluster.setNodes("node00", "node01", "node02")                     // epoch 4: D and E die
	w.cluster.setNodes("node00", "node01", "node02", "node03")           // epoch 5: D returns
	epochs := w.cluster.Epochs()
	// An object that lives on D and E in epoch 3 and whose epoch-2
	// replicas include one of A, B, C.
	var oid uint64
	for candidate := uint64(1); ; candidate++ {
		r3 := g.ringAt(epochs[2]).replicasOf(candidate, 2)
		if (r3[0].ID == "node03" || r3[0].ID == "node04") && (r3[1].ID == "node03" || r3[1].ID == "node04") {
			oid = candidate
			break
		}
		if candidate > 1<<20 {
			t.Fatal("no object placed on D and E in epoch 3")
		}
	}
	up := func(ids ...string) func(string) bool {
		return func(id string) bool {
			for _, x := range ids {
				if x == id {
					return true
				}
			}
			return false
		}
	}
	// In epoch 4, A, B and C answer; the newest copy they have is from
	// epoch 1 (B and C), but epoch 3's replicas D and E are all down.
	err := g.proveCurrent(oid, 2, 4, 1, up("node00", "node01", "node02"))
	if !errors.Is(err, ErrNoCopy) {
		t.Fatalf("epoch-1 copy accepted in epoch 4 with D and E down: %v", err)
	}
	// In epoch 5 D answers with its epoch-3 copy: epoch 4 had replicas
	// among A, B, C, which answered with older stamps, so no write can
	// have happened in epoch 4 and D's copy is current.
	if err := g.proveCurrent(oid, 2, 5, 3, up("node00", "node01", "node02", "node03")); err != nil {
		t.Fatalf("D's epoch-3 copy refused in epoch 5: %v", err)
	}
	// Had D and E been written in epoch 3 and the object then recovered
	// onto A, B, C in epoch 4 (stamp 4), nothing is missing in epoch 5.
	if err := g.proveCurrent(oid, 2, 5, 4, up("node00", "node01", "node02")); err != nil {
		t.Fatalf("epoch-4 copy refused in epoch 5: %v", err)
	}
	// A copy from the previous epoch needs no proof.
	if err := g.proveCurrent(oid, 2, 4, 3, up("node00")); err != nil {
		t.Fatalf("previous-epoch copy refused: %v", err)
	}
}
