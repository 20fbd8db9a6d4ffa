package placement

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
)

func TestNewRejectsBadNodeSets(t *testing.T) {
	tests := []struct {
		name  string
		nodes []Node
		want  error
	}{
		{"empty", nil, ErrNoNodes},
		{"empty id", []Node{{ID: "a", Weight: 1}, {ID: "", Weight: 1}}, ErrEmptyNodeID},
		{"duplicate", []Node{{ID: "a", Weight: 1}, {ID: "b", Weight: 1}, {ID: "a", Weight: 2}}, ErrDuplicateNode},
		{"zero weight", []Node{{ID: "a", Weight: 1}, {ID: "b"}}, ErrZeroWeight},
		{"overflow", []Node{{ID: "a", Weight: 1 << 63}, {ID: "b", Weight: 1 << 63}}, ErrWeightOverflow},
	}
	for _, test := range tests {
		t.Run(test.name, func(t *testing.T) {
			ring, err := New(test.nodes)
			if !errors.Is(err, test.want) || ring != nil {
				t.Fatalf("New = %v, %v; want nil, %v", ring, err, test.want)
			}
			if !strings.HasPrefix(err.Error(), "placement: ") {
				t.Errorf("error %q lacks the package prefix", err)
			}
		})
	}
}

func TestNewAcceptsExtremeWeights(t *testing.T) {
	for _, nodes := range [][]Node{
		{{ID: "only", Weight: 1}},
		{{ID: "a", Weight: 1}, {ID: "b", Weight: 1<<64 - 2}},
		{{ID: "a", Weight: 1}, {ID: "b", Weight: 1}, {ID: "c", Weight: 1 << 62}},
		{{ID: "a", Weight: 1, Zone: "x"}, {ID: "b", Weight: 1 << 40, Zone: "y"}, {ID: "c", Weight: 3, Zone: "z"}},
	} {
		ring := mustNew(t, nodes)
		if err := ring.Check(); err != nil {
			t.Fatalf("%v: %v", nodes, err)
		}
		for copies := 1; copies <= len(nodes)+1; copies++ {
			for oid := range uint64(200) {
				got := ring.Replicas(oid, copies)
				if want := min(copies, ring.MaxCopies()); len(got) != want || hasDuplicates(got) {
					t.Fatalf("%v copies=%d: %v", nodes, copies, got)
				}
			}
		}
	}
}

func hasDuplicates(ids []string) bool {
	sorted := slices.Clone(ids)
	slices.Sort(sorted)
	return len(slices.Compact(sorted)) != len(ids)
}

func TestReplicasAreDistinctNodes(t *testing.T) {
	for _, count := range []int{1, 2, 3, 4, 10, 100} {
		for _, pattern := range []weightPattern{equalWeights, mixedWeights} {
			ring := mustNew(t, testNodes(count, pattern, 0, 2))
			if ring.MaxCopies() != count {
				t.Fatalf("MaxCopies = %d for %d nodes without zones", ring.MaxCopies(), count)
			}
			for copies := 1; copies <= 5; copies++ {
				for oid := range uint64(2000) {
					got := ring.Replicas(oid, copies)
					if len(got) != min(copies, count) || hasDuplicates(got) {
						t.Fatalf("%d nodes, copies=%d, oid %d: %v", count, copies, oid, got)
					}
				}
			}
		}
	}
}

func TestReplicasPanicsOnNoCopies(t *testing.T) {
	ring := mustNew(t, testNodes(3, equalWeights, 0, 1))
	for _, copies := range []int{0, -1} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("Replicas(_, %d) did not panic", copies)
				}
			}()
			ring.Replicas(1, copies)
		}()
	}
}

func TestReplicasAreInDistinctZones(t *testing.T) {
	nodes := testNodes(30, mixedWeights, 4, 3)
	nodes[7].Zone = "" // the empty zone is a zone of its own once zones are used
	ring := mustNew(t, nodes)
	if ring.MaxCopies() != 5 {
		t.Fatalf("MaxCopies = %d, want 5 (4 zones and the empty one)", ring.MaxCopies())
	}
	zoneOf := map[string]string{}
	for _, node := range nodes {
		zoneOf[node.ID] = node.Zone
	}
	seenZones := map[string]bool{}
	for copies := 1; copies <= 7; copies++ {
		for oid := range uint64(5000) {
			got := ring.Replicas(oid, copies)
			if len(got) != min(copies, 5) || hasDuplicates(got) {
				t.Fatalf("copies=%d oid %d: %v", copies, oid, got)
			}
			zones := make([]string, len(got))
			for i, id := range got {
				zones[i] = zoneOf[id]
				seenZones[zones[i]] = true
			}
			if hasDuplicates(zones) {
				t.Fatalf("copies=%d oid %d: zones %q repeat", copies, oid, zones)
			}
		}
	}
	if len(seenZones) != 5 {
		t.Errorf("only zones %v ever chosen", seenZones)
	}
}

func TestReplicasIgnoreInputOrder(t *testing.T) {
	for _, zones := range []int{0, 3} {
		nodes := testNodes(50, mixedWeights, zones, 4)
		first := mustNew(t, nodes)
		for seed := range uint64(5) {
			other := mustNew(t, shuffled(nodes, seed))
			if !slices.Equal(first.Nodes(), other.Nodes()) {
				t.Fatalf("Nodes differ after shuffling")
			}
			for copies := 1; copies <= 3; copies++ {
				for oid := range uint64(1000) {
					a, b := first.Replicas(oid, copies), other.Replicas(oid, copies)
					if !slices.Equal(a, b) {
						t.Fatalf("zones=%d seed %d copies=%d oid %d: %v vs %v", zones, seed, copies, oid, a, b)
					}
				}
			}
		}
	}
}

func TestReplicasMatchReference(t *testing.T) {
	type setup struct {
		count, zones int
		pattern      weightPattern
	}
	setups := []setup{
		{1, 0, equalWeights}, {2, 0, mixedWeights}, {3, 0, equalWeights}, {7, 0, mixedWeights},
		{40, 0, mixedWeights}, {40, 3, mixedWeights}, {200, 0, equalWeights}, {200, 7, mixedWeights},
		{12, 12, mixedWeights}, // one node per zone
		// A zone much larger than the others: its share is capped.
		{6, 2, func(i int) uint64 { return uint64(1 + 20*(i%2)) }},
	}
	objects := uint64(150)
	if quick() {
		objects = 25
	}
	for _, s := range setups {
		ring := mustNew(t, testNodes(s.count, s.pattern, s.zones, 5))
		for copies := 1; copies <= min(4, s.count)+1; copies++ {
			for oid := range objects {
				oid := oid * 0x1000193 // spread over the id space
				got := ring.Replicas(oid, copies)
				want := referenceReplicas(ring, oid, copies)
				if !slices.Equal(got, want) {
					t.Fatalf("%d nodes %d zones copies=%d oid %#x: got %v, reference %v", s.count, s.zones, copies, oid, got, want)
				}
			}
		}
	}
}

func TestAppendReplicasAppends(t *testing.T) {
	ring := mustNew(t, testNodes(20, equalWeights, 0, 6))
	dst := []string{"keep"}
	got := ring.AppendReplicas(dst, 42, 3)
	if len(got) != 4 || got[0] != "keep" || !slices.Equal(got[1:], ring.Replicas(42, 3)) {
		t.Fatalf("AppendReplicas = %v", got)
	}
	allocations := testing.AllocsPerRun(100, func() {
		got = ring.AppendReplicas(got[:0], 43, 3)
	})
	if allocations != 0 {
		t.Errorf("AppendReplicas allocates %.1f times per call", allocations)
	}
}

func TestManyCopies(t *testing.T) {
	// Above the inline limit and above the table limit.
	ring := mustNew(t, testNodes(40, mixedWeights, 0, 7))
	for _, copies := range []int{16, 17, 25, 40, 41} {
		for oid := range uint64(100) {
			got := ring.Replicas(oid, copies)
			if len(got) != min(copies, 40) || hasDuplicates(got) {
				t.Fatalf("copies=%d: %v", copies, got)
			}
			if want := referenceReplicas(ring, oid, copies); !slices.Equal(got, want) {
				t.Fatalf("copies=%d oid %d: got %v, reference %v", copies, oid, got, want)
			}
		}
	}
}

// TestPlacementIsPinned pins the placement function: a digest of the
// replicas of many objects on fixed node sets. If it changes, every
// existing cluster would find its objects on the wrong nodes after an
// upgrade; change it only together with a cluster format version.
func TestPlacementIsPinned(t *testing.T) {
	digest := sha256.New()
	for _, zones := range []int{0, 3} {
		ring := mustNew(t, testNodes(37, mixedWeights, zones, 8))
		for copies := 1; copies <= 3; copies++ {
			for oid := range uint64(2000) {
				var buffer [8]byte
				binary.LittleEndian.PutUint64(buffer[:], oid)
				digest.Write(buffer[:])
				for _, id := range ring.Replicas(oid*0x9e3779b1, copies) {
					fmt.Fprintf(digest, "%s,", id)
				}
			}
		}
	}
	const want = "deedba2b82504af8c5c72933ef471a8a53397c4c5777c066009bfb0b040f0fbb"
	if got := hex.EncodeToString(digest.Sum(nil)); got != want {
		t.Fatalf("placement digest %s, want %s: the placement function changed", got, want)
	}
}

func TestCheckAcceptsNewRings(t *testing.T) {
	for _, count := range []int{1, 2, 3, 10, 100, 1000} {
		for _, zones := range []int{0, 1, 3} {
			ring := mustNew(t, testNodes(count, mixedWeights, zones, 9))
			if err := ring.Check(); err != nil {
				t.Fatalf("%d nodes %d zones: %v", count, zones, err)
			}
		}
	}
}

func TestCheckFindsDamage(t *testing.T) {
	damages := map[string]func(*Ring){
		"unsorted":       func(r *Ring) { r.nodes[0], r.nodes[1] = r.nodes[1], r.nodes[0] },
		"zero weight":    func(r *Ring) { r.nodes[2].Weight = 0 },
		"key":            func(r *Ring) { r.keys[3]++ },
		"total":          func(r *Ring) { r.totalWeight++ },
		"domain":         func(r *Ring) { r.domainOf[4] = 99 },
		"domain weight":  func(r *Ring) { r.domainWeights[0]-- },
		"domain size":    func(r *Ring) { r.domainSizes[1]++ },
		"domain sizes":   func(r *Ring) { r.domainSizes = r.domainSizes[:2] },
		"zone flag":      func(r *Ring) { r.zoned = !r.zoned },
		"tables":         func(r *Ring) { r.weightsByCopies = r.weightsByCopies[:1] },
		"zero effective": func(r *Ring) { r.weightsByCopies[0] = slices.Clone(r.weightsByCopies[0]); r.weightsByCopies[0][5] = 0 },
		"order": func(r *Ring) {
			table := slices.Clone(r.weightsByCopies[2])
			// nodes 0 and 3 are in the same zone with different weights
			table[0], table[3] = table[3], table[0]
			r.weightsByCopies[2] = table
		},
	}
	for name, damage := range damages {
		t.Run(name, func(t *testing.T) {
			nodes := testNodes(12, mixedWeights, 3, 10)
			nodes[3].Weight = nodes[0].Weight * 2
			ring := mustNew(t, nodes)
			damage(ring)
			if err := ring.Check(); !errors.Is(err, ErrInvariant) {
				t.Fatalf("Check = %v after damage", err)
			}
		})
	}
}

func TestNodesIsACopy(t *testing.T) {
	ring := mustNew(t, testNodes(5, equalWeights, 0, 11))
	nodes := ring.Nodes()
	nodes[0].ID = "changed"
	if ring.Nodes()[0].ID == "changed" || ring.Check() != nil {
		t.Fatal("Nodes exposes the ring's own slice")
	}
	if !slices.IsSortedFunc(nodes[1:], func(a, b Node) int { return strings.Compare(a.ID, b.ID) }) {
		t.Fatal("Nodes is not sorted by id")
	}
}
