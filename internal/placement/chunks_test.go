package placement

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"sort"
	"strings"
	"testing"
)

// referenceChunks is the naive statement of Chunks: score every
// (position, node) pair as an exact fraction, sort all pairs (ties to the
// lower node index, then the lower position) and walk them, taking a pair
// when its position has no node, its node none, and (with zones) its zone
// fewer than perZone chunks. It shares only the hash and the effective
// weight tables with the Ring.
func referenceChunks(ring *Ring, key uint64, n, perZone int) []string {
	weights := ring.weights(n)
	type pair struct {
		score          *big.Rat
		position, node int
	}
	var pairs []pair
	for c := range n {
		object := chunkKey(key, c)
		for i, node := range ring.nodes {
			score := new(big.Rat).SetFrac(
				new(big.Int).SetUint64(logScoreBitwise(pairHash(object, nodeKey(node.ID)))),
				new(big.Int).SetUint64(weights[i]))
			pairs = append(pairs, pair{score, c, i})
		}
	}
	sort.SliceStable(pairs, func(a, b int) bool {
		if c := pairs[a].score.Cmp(pairs[b].score); c != 0 {
			return c < 0
		}
		if pairs[a].node != pairs[b].node {
			return pairs[a].node < pairs[b].node
		}
		return pairs[a].position < pairs[b].position
	})
	result := make([]string, n)
	used := map[int]bool{}
	inZone := map[string]int{}
	for _, p := range pairs {
		zone := ring.nodes[p.node].Zone
		if result[p.position] != "" || used[p.node] || (ring.zoned && inZone[zone] >= perZone) {
			continue
		}
		result[p.position] = ring.nodes[p.node].ID
		used[p.node] = true
		inZone[zone]++
	}
	return result
}

// checkChunks checks the properties every placement of chunks has.
func checkChunks(t testing.TB, ring *Ring, key uint64, n, perZone int, got []string) {
	t.Helper()
	if len(got) != n || hasDuplicates(got) {
		t.Fatalf("key %#x n=%d perZone=%d: %v", key, n, perZone, got)
	}
	zoneOf := map[string]string{}
	for _, node := range ring.nodes {
		zoneOf[node.ID] = node.Zone
	}
	inZone := map[string]int{}
	for _, id := range got {
		zone, ok := zoneOf[id]
		if !ok {
			t.Fatalf("key %#x: chunk on %q, not a node of the ring", key, id)
		}
		inZone[zone]++
		if ring.zoned && inZone[zone] > perZone {
			t.Fatalf("key %#x n=%d perZone=%d: zone %q holds %d chunks: %v", key, n, perZone, zone, inZone[zone], got)
		}
	}
}

func mustChunks(t testing.TB, ring *Ring, key uint64, n, perZone int) []string {
	t.Helper()
	got, err := ring.Chunks(key, n, perZone)
	if err != nil {
		t.Fatalf("Chunks(%#x, %d, %d): %v", key, n, perZone, err)
	}
	checkChunks(t, ring, key, n, perZone, got)
	return got
}

func TestChunksMatchReference(t *testing.T) {
	type setup struct {
		count, zones int
		pattern      weightPattern
	}
	setups := []setup{
		{1, 0, equalWeights}, {2, 0, mixedWeights}, {6, 0, equalWeights}, {7, 0, mixedWeights},
		{12, 0, mixedWeights}, {12, 3, mixedWeights}, {12, 4, equalWeights}, {40, 0, mixedWeights},
		{40, 5, mixedWeights}, {11, 11, mixedWeights}, {200, 7, mixedWeights},
		// A zone much larger than the others.
		{9, 2, func(i int) uint64 { return uint64(1 + 20*(i%2)) }},
	}
	keys := uint64(60)
	if quick() {
		keys = 8
	}
	for _, s := range setups {
		ring := mustNew(t, testNodes(s.count, s.pattern, s.zones, 30))
		counts := []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}
		if s.count >= 100 {
			counts = []int{3, 6, 11} // the reference is slow
		}
		perZones := []int{1, 2, 3}
		if s.zones == 0 {
			perZones = []int{1} // no zone rule
		}
		for _, n := range counts {
			for _, perZone := range perZones {
				if ring.canPlaceChunks(n, perZone) != nil {
					continue
				}
				for key := range keys {
					key := key * 0x1000193
					got := mustChunks(t, ring, key, n, perZone)
					if want := referenceChunks(ring, key, n, perZone); !slices.Equal(got, want) {
						t.Fatalf("%d nodes %d zones n=%d perZone=%d key %#x: got %v, reference %v", s.count, s.zones, n, perZone, key, got, want)
					}
				}
			}
		}
	}
}

func TestChunksRejectsWhatCannotBePlaced(t *testing.T) {
	plain := mustNew(t, testNodes(5, equalWeights, 0, 31))
	zoned := mustNew(t, testNodes(7, equalWeights, 3, 31)) // zones of 3, 2 and 2 nodes
	tests := []struct {
		name       string
		ring       *Ring
		n, perZone int
		want       error
		message    string
	}{
		{"no chunks", plain, 0, 1, ErrChunkCount, "0 chunks, want 1 to 16"},
		{"negative", plain, -3, 1, ErrChunkCount, "-3 chunks"},
		{"too many", plain, MaxChunks + 1, 1, ErrChunkCount, "17 chunks"},
		{"no zone room", plain, 3, 0, ErrChunkCount, "at most 0 chunks per zone"},
		{"more chunks than nodes", plain, 6, 2, ErrTooFewNodes, "6 chunks on 5 nodes"},
		{"zones too small", zoned, 6, 1, ErrTooFewNodes, "6 chunks at most 1 per zone, but the 3 zones of 7 nodes take only 3"},
		{"zones just too small", zoned, 7, 2, ErrTooFewNodes, "take only 6"},
	}
	for _, test := range tests {
		t.Run(test.name, func(t *testing.T) {
			got, err := test.ring.Chunks(1, test.n, test.perZone)
			if !errors.Is(err, test.want) || got != nil {
				t.Fatalf("Chunks = %v, %v; want nil, %v", got, err, test.want)
			}
			if !strings.HasPrefix(err.Error(), "placement: ") || !strings.Contains(err.Error(), test.message) {
				t.Errorf("error %q lacks the package prefix or %q", err, test.message)
			}
		})
	}
	// The limits themselves are fine.
	mustChunks(t, plain, 1, 5, 1)   // every node, no zone rule without zones
	mustChunks(t, zoned, 1, 6, 2)   // 2+2+2
	mustChunks(t, zoned, 1, 7, 3)   // every node
	mustChunks(t, zoned, 1, 3, 1)   // one per zone
	mustChunks(t, plain, 1, 1, 100) // a perZone above the nodes is no limit
}

func TestChunksKeepTheZoneRule(t *testing.T) {
	nodes := testNodes(30, mixedWeights, 4, 32)
	nodes[7].Zone = "" // the empty zone is a zone of its own once zones are used
	ring := mustNew(t, nodes)
	perPosition := make([]map[string]int, 11) // zone -> chunks at that position
	for c := range perPosition {
		perPosition[c] = map[string]int{}
	}
	for _, scheme := range [][2]int{{2, 1}, {4, 2}, {8, 3}, {3, 3}} {
		n, perZone := scheme[0]+scheme[1], scheme[1]
		for key := range uint64(3000) {
			got := mustChunks(t, ring, key*0x9e3779b1, n, perZone)
			for c, id := range got {
				perPosition[c][nodes[slices.IndexFunc(nodes, func(node Node) bool { return node.ID == id })].Zone]++
			}
		}
	}
	// Every position is spread over every zone, the empty one included.
	for c, zones := range perPosition {
		if len(zones) != 5 {
			t.Errorf("position %d only ever in zones %v", c, zones)
		}
	}
	// Exactly full: 3 zones, 2 per zone, 6 chunks: each zone holds 2.
	tight := mustNew(t, testNodes(9, mixedWeights, 3, 33))
	for key := range uint64(2000) {
		got := mustChunks(t, tight, key, 6, 2)
		zones := map[string]int{}
		for _, id := range got {
			zones[tight.nodes[slices.IndexFunc(tight.nodes, func(node Node) bool { return node.ID == id })].Zone]++
		}
		if len(zones) != 3 {
			t.Fatalf("key %d: zones %v, want 2 chunks in each of 3", key, zones)
		}
	}
}

func TestChunksIgnoreInputOrder(t *testing.T) {
	for _, zones := range []int{0, 3} {
		nodes := testNodes(30, mixedWeights, zones, 34)
		first := mustNew(t, nodes)
		for seed := range uint64(3) {
			other := mustNew(t, shuffled(nodes, seed))
			for key := range uint64(500) {
				a, b := mustChunks(t, first, key, 6, 2), mustChunks(t, other, key, 6, 2)
				if !slices.Equal(a, b) {
					t.Fatalf("zones=%d seed %d key %d: %v vs %v", zones, seed, key, a, b)
				}
			}
		}
	}
}

// TestChunksArePositions checks that the positions are not a ranking:
// chunk 0 is not Replicas' first choice more often than chance, and the
// first n-1 positions of a stripe are not those of the stripe of n-1.
func TestChunksArePositions(t *testing.T) {
	ring := mustNew(t, testNodes(20, equalWeights, 0, 35))
	const keys = 4000
	sameAsReplica, samePrefix := 0, 0
	for key := range uint64(keys) {
		got := mustChunks(t, ring, key, 6, 2)
		if got[0] == ring.Replicas(key, 1)[0] {
			sameAsReplica++
		}
		if slices.Equal(got[:5], mustChunks(t, ring, key, 5, 2)) {
			samePrefix++
		}
	}
	// Chance: 1/20 of keys, 200 ± 14.
	if sameAsReplica > 300 {
		t.Errorf("chunk 0 is the first replica in %d of %d keys", sameAsReplica, keys)
	}
	// The stripe of 5 is the stripe of 6 without chunk 5 unless chunk 5
	// took a node one of the first five wanted: most keys.
	if samePrefix < keys/2 {
		t.Errorf("only %d of %d keys keep their first five homes with a sixth chunk", samePrefix, keys)
	}
}

// chunkMoves compares the stripes of keys on before and after (after has
// one node fewer, subject) and counts the keys where subject held a chunk
// and the keys where a chunk not on subject moved.
func chunkMoves(before, after *Ring, subject string, keys, n, perZone int) (held, collateral int) {
	type counter struct{ held, collateral int }
	states := forObjects(keys, func() *counter { return &counter{} }, func(c *counter, key uint64) {
		key *= 0x9e3779b97f4a7c15
		old, errOld := before.Chunks(key, n, perZone)
		now, errNow := after.Chunks(key, n, perZone)
		if errOld != nil || errNow != nil {
			panic(fmt.Sprint(errOld, errNow)) // the callers size the rings
		}
		moved := false
		for position, id := range old {
			if id == subject {
				c.held++
			} else if now[position] != id {
				moved = true
			}
		}
		if moved {
			c.collateral++
		}
	})
	for _, state := range states {
		held += state.held
		collateral += state.collateral
	}
	return held, collateral
}

// TestChunksStability removes one node at a time and measures the keys
// where chunks not on it move (see Chunks: a chain from the leaving
// node's position). Measured without zones, 20,000 keys, removing nodes
// 0, 1, 2 and the last one of testNodes (seed 36), as "keys where other
// chunks move (keys with a chunk on the leaving node)":
//
//	nodes  weights  4+2               8+3
//	12     equal     7.3%  (50%)      47%    (92%)
//	12     1x2x4x   38%    (59%)      83%    (94%)
//	20     equal     2.3%  (30%)      10%    (55%)
//	20     1x2x4x    5.6%  (30%)      62%    (55%)
//	50     equal     0.33% (12%)       1.2%  (22%)
//	50     1x2x4x    0.66% (12%)       2.6%  (21%)
//	100    equal     0.07% (5.9%)      0.31% (11%)
//	100    1x2x4x    0.12% (5.2%)      0.54% (9.3%)
//
// A stripe that covers much of the ring cannot keep its other positions:
// the leaving node's position takes a node the stripe holds about n/N of
// the time, and wins it about a quarter of those. With mixed weights the
// effective weights (weight.go) shift too when a stripe is a large part
// of the ring: with capacities as they are, 1x2x4x at 12 nodes would move
// other chunks in 10.5% of keys (4+2) but give the 1x nodes 1.30 times
// their share of chunks per byte and the 4x nodes 0.86. Position by
// position with redraws (a position's draw refused when a lower position
// holds its node) moved other chunks in 17.5% of keys at 12 nodes and
// 1.2% at 50, equal weights.
//
// With zones the zone rule adds chains (the leaving node's position may
// take the last place of another zone): 4+2 at most 2 per zone, equal
// weights, 50 nodes in 5 zones 2.8% (12% held), 100 nodes in 3 zones
// 2.7% (5.9%), in 5 zones 1.3% (5.9%); position by position with redraws,
// 4.5%, 4.4% and 2.4%.
//
// The test keeps the shapes an erasure-coded cluster is meant for.
func TestChunksStability(t *testing.T) {
	type shape struct {
		nodes, zones int
		pattern      weightPattern
		weights      string
		n, perZone   int
		limit        float64 // of the keys, with collateral moves
	}
	shapes := []shape{
		{12, 0, equalWeights, "equal", 6, 2, 0.10},
		{20, 0, equalWeights, "equal", 6, 2, 0.04},
		{50, 0, equalWeights, "equal", 6, 2, 0.01},
		{50, 0, mixedWeights, "1x2x4x", 6, 2, 0.01},
		{50, 0, mixedWeights, "1x2x4x", 11, 3, 0.04},
		{100, 0, mixedWeights, "1x2x4x", 6, 2, 0.005},
		{100, 5, equalWeights, "equal", 6, 2, 0.03},
	}
	keys := 20_000
	if quick() {
		keys = 3_000
	}
	for _, s := range shapes {
		t.Run(fmt.Sprintf("nodes=%d/zones=%d/weights=%s/n=%d", s.nodes, s.zones, s.weights, s.n), func(t *testing.T) {
			nodes := testNodes(s.nodes, s.pattern, s.zones, 36)
			ring := mustNew(t, nodes)
			held, collateral, total := 0, 0, 0
			for _, leaving := range []int{0, 1, 2, s.nodes - 1} {
				after := mustNew(t, slices.Delete(slices.Clone(nodes), leaving, leaving+1))
				h, c := chunkMoves(ring, after, nodes[leaving].ID, keys, s.n, s.perZone)
				held, collateral, total = held+h, collateral+c, total+keys
			}
			share := float64(collateral) / float64(total)
			t.Logf("keys with a chunk on the leaving node %.2f%%, keys where other chunks move %.3f%%", 100*float64(held)/float64(total), 100*share)
			if held == 0 {
				t.Fatal("the leaving nodes held no chunk")
			}
			if share > s.limit {
				t.Errorf("other chunks move in %.3f%% of keys > %.1f%%", 100*share, 100*s.limit)
			}
		})
	}
}

// TestChunksFollowWeights counts chunks per unit of capacity over many
// keys: a node with twice the weight gets about twice the chunks.
func TestChunksFollowWeights(t *testing.T) {
	type shape struct {
		nodes, zones, n, perZone int
		limit                    float64 // largest |chunks per capacity / mean - 1| of a weight class
	}
	shapes := []shape{
		{12, 0, 6, 2, 0.04},
		{30, 0, 6, 2, 0.04},
		{30, 0, 11, 3, 0.04},
		{30, 5, 6, 2, 0.10}, // zones are not corrected (weight.go)
	}
	keys := 60_000
	if quick() {
		keys = 20_000
	}
	for _, s := range shapes {
		t.Run(fmt.Sprintf("nodes=%d/zones=%d/n=%d", s.nodes, s.zones, s.n), func(t *testing.T) {
			ring := mustNew(t, testNodes(s.nodes, mixedWeights, s.zones, 37))
			index := map[string]int{}
			for i, node := range ring.nodes {
				index[node.ID] = i
			}
			type counter struct{ counts []int }
			states := forObjects(keys, func() *counter { return &counter{make([]int, len(ring.nodes))} }, func(c *counter, key uint64) {
				ids, err := ring.Chunks(key*0x9e3779b97f4a7c15, s.n, s.perZone)
				if err != nil {
					panic(err)
				}
				for _, id := range ids {
					c.counts[index[id]]++
				}
			})
			perClass := map[uint64]int{} // weight in units -> chunks
			capacity := map[uint64]uint64{}
			for _, state := range states {
				for i, count := range state.counts {
					perClass[ring.nodes[i].Weight/unitBytes] += count
				}
			}
			for _, node := range ring.nodes {
				capacity[node.Weight/unitBytes] += node.Weight / unitBytes
			}
			mean := float64(keys*s.n) / float64(ring.totalWeight/unitBytes)
			for _, class := range []uint64{1, 2, 4} {
				ratio := float64(perClass[class]) / float64(capacity[class]) / mean
				t.Logf("weight %dx: %.4f of its share", class, ratio)
				if ratio < 1-s.limit || ratio > 1+s.limit {
					t.Errorf("nodes of weight %dx get %.4f of their share of chunks, want within %.0f%%", class, ratio, 100*s.limit)
				}
			}
		})
	}
}

func TestChunksDoNotAllocateBeyondTheResult(t *testing.T) {
	ring := mustNew(t, testNodes(100, mixedWeights, 5, 38))
	allocations := testing.AllocsPerRun(100, func() {
		if _, err := ring.Chunks(42, 11, 3); err != nil {
			t.Fatal(err)
		}
	})
	if allocations != 1 {
		t.Errorf("Chunks allocates %.1f times per call, want 1 (the result)", allocations)
	}
}

// TestChunksArePinned pins the chunk placement like TestPlacementIsPinned
// pins Replicas. A stripe's head records its homes, so a change would not
// lose data, but every stripe would move at its next rebalancing: change
// it only on purpose.
func TestChunksArePinned(t *testing.T) {
	digest := sha256.New()
	for _, zones := range []int{0, 4} {
		ring := mustNew(t, testNodes(37, mixedWeights, zones, 8))
		for _, scheme := range [][2]int{{2, 1}, {4, 2}, {8, 3}} {
			for key := range uint64(1000) {
				ids := mustChunks(t, ring, key*0x9e3779b1, scheme[0]+scheme[1], scheme[1])
				fmt.Fprintf(digest, "%d:%s;", key, strings.Join(ids, ","))
			}
		}
	}
	const want = "00219a182afbdce77bb9631f5599bc829bdf6f81ee0e942827d5d412fe93d272"
	if got := hex.EncodeToString(digest.Sum(nil)); got != want {
		t.Fatalf("chunk placement digest %s, want %s: the chunk placement function changed", got, want)
	}
}
