package recovery

import (
	"errors"
	"slices"
	"testing"

	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/object"
	"github.com/herd-storage/herd/internal/placement"
)

// The paper's Fig. 4 on the epoch history alone: an object written on
// B and C moves to D and E when they join, is written there, and D and E
// die. B's and C's copies are older than what D and E acknowledged: the
// proof must refuse them, and accept D's copy once D returns.
func TestProveCurrentFigure4(t *testing.T) {
	w := newLog(3, 2) // node00..node02: A, B, C; epoch 1
	g := w.proof()
	w.setNodes("node00", "node01", "node02", "node03")           // epoch 2: D joins
	w.setNodes("node00", "node01", "node02", "node03", "node04") // epoch 3: E joins
	w.setNodes("node00", "node01", "node02")                     // epoch 4: D and E die
	w.setNodes("node00", "node01", "node02", "node03")           // epoch 5: D returns
	epochs := w.Epochs()
	// An object that lives on D and E in epoch 3 and whose epoch-2
	// replicas include one of A, B, C.
	var oid object.OID
	for candidate := uint64(1); ; candidate++ {
		r3 := g.layouts.At(epochs[2]).ReplicasOf(object.OID(candidate), 2)
		if (r3[0].ID == "node03" || r3[0].ID == "node04") && (r3[1].ID == "node03" || r3[1].ID == "node04") {
			oid = object.OID(candidate)
			break
		}
		if candidate > 1<<20 {
			t.Fatal("no object placed on D and E in epoch 3")
		}
	}
	// In epoch 4, A, B and C answer; the newest copy they have is from
	// epoch 1 (B and C), but epoch 3's replicas D and E are all down.
	err := g.Current(oid, 2, g.layouts.At(epochs[3]), 1, up("node00", "node01", "node02"))
	if !errors.Is(err, object.ErrNoCopy) {
		t.Fatalf("epoch-1 copy accepted in epoch 4 with D and E down: %v", err)
	}
	// In epoch 5 D answers with its epoch-3 copy: epoch 4 had replicas
	// among A, B, C, which answered with older stamps, so no write can
	// have happened in epoch 4 and D's copy is current.
	if err := g.Current(oid, 2, g.layouts.At(epochs[4]), 3, up("node00", "node01", "node02", "node03")); err != nil {
		t.Fatalf("D's epoch-3 copy refused in epoch 5: %v", err)
	}
	// Had D and E been written in epoch 3 and the object then recovered
	// onto A, B, C in epoch 4 (stamp 4), nothing is missing in epoch 5.
	if err := g.Current(oid, 2, g.layouts.At(epochs[4]), 4, up("node00", "node01", "node02")); err != nil {
		t.Fatalf("epoch-4 copy refused in epoch 5: %v", err)
	}
	// A copy from the previous epoch needs no proof.
	if err := g.Current(oid, 2, g.layouts.At(epochs[3]), 3, up("node00")); err != nil {
		t.Fatalf("previous-epoch copy refused: %v", err)
	}
}

func up(ids ...string) func(string) bool {
	return func(id string) bool { return slices.Contains(ids, id) }
}

// As CI saw it: the first epochs of a cluster are its nodes
// joining one by one, before it is formatted, so epoch 1 may hold one
// node alone. When that node is down, an object nobody has written yet
// (a map object's first access) or whose copies are all on silent nodes
// walked back to epoch 1 and was refused (EIO) although no write to it
// can be older than its VDI. The walk starts at the epoch in which the
// VDI was created.
func TestProveCurrentStartsAtTheVDIsEpoch(t *testing.T) {
	w := newLog(4, 2)
	w.epochs = []cluster.Epoch{{Number: 1, Nodes: []string{"node03"}, Members: []cluster.Member{{ID: "node03", Weight: 1 << 40}}}} // node03 joined first, alone
	w.setNodes("node00", "node01", "node02", "node03")                                                                             // epoch 2: the rest joined
	w.addVDI(7)                                                                                                                    // created in epoch 2
	w.setNodes("node00", "node01", "node02")                                                                                       // epoch 3: node03 died
	g := w.proof()
	rv, err := g.layouts.Current()
	if err != nil {
		t.Fatal(err)
	}
	// Every node of epoch 3 answered; none holds the map object.
	if err := g.Current(object.MapOID(7, 0), 2, rv, 0, up("node00", "node01", "node02")); err != nil {
		t.Fatalf("an object of a VDI created in epoch 2 refused for lack of a witness of epoch 1: %v", err)
	}
	// An object of a VDI of unknown age still needs every epoch.
	if err := g.Current(object.MapOID(99, 0), 2, rv, 0, up("node00", "node01", "node02")); !errors.Is(err, object.ErrNoCopy) {
		t.Fatalf("object of unknown age proven without a witness of epoch 1 (node03 down): %v", err)
	}
}

// And: a replica of a past epoch that is a member of
// the current one but did not answer the survey (paused, cut off, busy,
// just restarted) is no evidence that data is lost: the proof fails with
// a retryable error, and only replicas that are out of the epoch (down)
// make the object unavailable.
func TestProveCurrentRetriesSilentMembers(t *testing.T) {
	w := newLog(4, 2) // epoch 1: node00..node03
	w.addVDI(7)
	w.setNodes("node00", "node01", "node02")           // epoch 2: node03 left
	w.setNodes("node00", "node01", "node02", "node03") // epoch 3: back
	g := w.proof()
	epochs := w.Epochs()
	// An object whose epoch-2 replicas are node01 and node02.
	var oid object.OID
	for i := uint32(0); ; i++ {
		r := g.layouts.At(epochs[1]).ReplicasOf(object.DataOID(7, i), 2)
		if r[0].ID != "node00" && r[1].ID != "node00" {
			oid = object.DataOID(7, i)
			break
		}
	}
	rv, err := g.layouts.Current()
	if err != nil {
		t.Fatal(err)
	}
	// Epoch 3: node00 and node03 answered; node01 and node02 are members
	// that were silent. The newest answer is from epoch 1.
	err = g.Current(oid, 2, rv, 1, up("node00", "node03"))
	if !errors.Is(err, object.ErrUnavailable) || errors.Is(err, object.ErrNoCopy) {
		t.Fatalf("silent members of the epoch made the object unavailable: %v", err)
	}
	if !object.Retryable(err) {
		t.Fatalf("not retried: %v", err)
	}
	// Once they are out of the epoch, it is unavailable for real.
	w.setNodes("node00", "node03") // epoch 4
	rv, err = g.layouts.Current()
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Current(oid, 2, rv, 1, up("node00", "node03")); !errors.Is(err, object.ErrNoCopy) {
		t.Fatalf("epoch-2 replicas both down, yet: %v", err)
	}
}

// An epoch fixes its placement by itself. A node that comes
// back (a quick restart, inside the failure detector's window) with
// another capacity begins a new epoch, and the placement of the epochs
// before it stays what it was: computed from today's node table, the
// proof of currency would ask the wrong nodes for witnesses and could
// pass off a stale copy, or none, as current.
func TestPastPlacementIsFixedByItsEpoch(t *testing.T) {
	w := newLog(4, 2) // epoch 1: node00..node03, equal weights
	w.addVDI(7)
	g := w.proof()
	epoch1 := w.Epochs()[0]
	before := map[uint64][]string{}
	for i := uint32(0); i < 2000; i++ {
		before[uint64(object.DataOID(7, i))] = ids(g.layouts.At(epoch1).ReplicasOf(object.DataOID(7, i), 2))
	}
	w.rejoin("node03", 1<<30) // epoch 2: node03 back with 1/1024 of its weight
	g = w.proof()             // a gateway that never cached epoch 1
	epochs := w.Epochs()
	for oid, want := range before {
		if got := ids(g.layouts.At(epochs[0]).ReplicasOf(object.OID(oid), 2)); !slices.Equal(got, want) {
			t.Fatalf("epoch 1's placement of %016x changed with the node table: %v, was %v", oid, got, want)
		}
	}
	// The stale-copy scenario: an object written in epoch 1 on node03
	// and P; in epoch 3 only the other two nodes, Q and R, are alive and
	// neither holds it. Epoch 1's real replicas are down, so the object
	// is unavailable; epoch 1's placement recomputed with node03's new
	// weight would name Q or R as a witness and call "no copy anywhere"
	// current: the acknowledged writes would read as zeros.
	wrong, err := placement.New([]placement.Node{{ID: "node00", Weight: 1 << 40}, {ID: "node01", Weight: 1 << 40}, {ID: "node02", Weight: 1 << 40}, {ID: "node03", Weight: 1 << 30}})
	if err != nil {
		t.Fatal(err)
	}
	var oid object.OID
	var others []string
	for i := uint32(0); oid == 0; i++ {
		if i > 100000 {
			t.Fatal("no object for the scenario")
		}
		candidate := object.DataOID(7, i)
		real1 := before[uint64(candidate)]
		if real1 == nil {
			real1 = ids(g.layouts.At(epochs[0]).ReplicasOf(candidate, 2))
		}
		if !slices.Contains(real1, "node03") {
			continue
		}
		var rest []string
		for _, id := range []string{"node00", "node01", "node02", "node03"} {
			if !slices.Contains(real1, id) {
				rest = append(rest, id)
			}
		}
		misnamed := slices.ContainsFunc(wrong.Replicas(uint64(candidate), 2), func(id string) bool { return slices.Contains(rest, id) })
		epoch2 := ids(g.layouts.At(epochs[1]).ReplicasOf(candidate, 2))
		witnessed2 := slices.ContainsFunc(epoch2, func(id string) bool { return slices.Contains(rest, id) })
		if misnamed && witnessed2 {
			oid, others = candidate, rest
		}
	}
	w.setNodes(others...) // epoch 3
	rv, err := g.layouts.Current()
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Current(oid, 2, rv, 0, up(others...)); !errors.Is(err, object.ErrNoCopy) {
		t.Fatalf("object %016x written on epoch 1's replicas, both down, passed as never written: %v", oid, err)
	}
}

func ids(nodes []cluster.Node) []string {
	out := make([]string, 0, len(nodes))
	for _, n := range nodes {
		out = append(out, n.ID)
	}
	return out
}
