package placement

import (
	"fmt"
	"math"
	"math/big"
	"math/bits"
	"math/rand/v2"
	"slices"
	"sort"
)

// weightPattern gives node i's weight in units.
type weightPattern func(i int) uint64

func equalWeights(int) uint64 { return 1 }

// mixedWeights cycles 1x, 2x, 4x.
func mixedWeights(i int) uint64 { return 1 << (i % 3) }

// unitBytes is one weight unit, a realistic disk size, so tests exercise
// large weights.
const unitBytes = 4 << 40

// testNodes returns count nodes with 16-hex-digit ids derived from seed,
// and zones zone-0 … zone-(zones-1) round robin when zones > 0.
func testNodes(count int, pattern weightPattern, zones int, seed uint64) []Node {
	nodes := make([]Node, count)
	for i := range nodes {
		nodes[i] = Node{
			ID:     fmt.Sprintf("%016x", mix64(seed*1_000_003+uint64(i)+1)),
			Weight: pattern(i) * unitBytes,
		}
		if zones > 0 {
			nodes[i].Zone = fmt.Sprintf("zone-%d", i%zones)
		}
	}
	return nodes
}

func mustNew(t interface{ Fatalf(string, ...any) }, nodes []Node) *Ring {
	ring, err := New(nodes)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return ring
}

func shuffled(nodes []Node, seed uint64) []Node {
	result := slices.Clone(nodes)
	random := rand.New(rand.NewPCG(seed, seed^0x5555))
	random.Shuffle(len(result), func(i, j int) { result[i], result[j] = result[j], result[i] })
	return result
}

// logScoreBitwise is logScore with the slow bit-by-bit logarithm.
func logScoreBitwise(hash uint64) uint64 {
	if hash == 0 {
		return scoreInfinite
	}
	length := bits.Len64(hash)
	return uint64(65-length)<<scoreFractionBits - log2FractionBitwise(hash<<(64-length))>>(64-scoreFractionBits)
}

// referenceReplicas is the naive statement of the placement function:
// score every node as an exact fraction, sort everything, walk in order
// taking the first node of each failure domain. It shares only the hash and
// the effective weight tables with the Ring (those are tested on their own).
func referenceReplicas(ring *Ring, oid uint64, copies int) []string {
	count := min(copies, ring.MaxCopies())
	weights := ring.weights(count)
	type entry struct {
		score  *big.Rat
		index  int
		id     string
		domain string
	}
	entries := make([]entry, len(ring.nodes))
	for i, node := range ring.nodes {
		hash := pairHash(objectKey(oid), nodeKey(node.ID))
		score := new(big.Rat).SetFrac(
			new(big.Int).SetUint64(logScoreBitwise(hash)),
			new(big.Int).SetUint64(weights[i]))
		domain := "node:" + node.ID
		if ring.zoned {
			domain = "zone:" + node.Zone
		}
		entries[i] = entry{score: score, index: i, id: node.ID, domain: domain}
	}
	sort.SliceStable(entries, func(a, b int) bool {
		if c := entries[a].score.Cmp(entries[b].score); c != 0 {
			return c < 0
		}
		return entries[a].index < entries[b].index
	})
	var result []string
	taken := map[string]bool{}
	for _, e := range entries {
		if len(result) == count {
			break
		}
		if taken[e.domain] {
			continue
		}
		taken[e.domain] = true
		result = append(result, e.id)
	}
	return result
}

// referenceEffectiveWeights computes the effective weights in float64
// (fine for a test: it only needs to be close, not bit-identical) straight
// from the formulas in weight.go, normalized to a maximum of 1.
func referenceEffectiveWeights(nodes []Node, copies int) []float64 {
	zoned := false
	for _, node := range nodes {
		zoned = zoned || node.Zone != ""
	}
	domainOf := func(node Node) string {
		if zoned {
			return node.Zone
		}
		return node.ID
	}
	domainWeight := map[string]float64{}
	total := 0.0
	for _, node := range nodes {
		domainWeight[domainOf(node)] += float64(node.Weight)
		total += float64(node.Weight)
	}
	rate := map[string]float64{} // V_d / W_d
	if zoned || copies == 1 || copies >= len(domainWeight) {
		for domain := range domainWeight {
			rate[domain] = 1
		}
	} else {
		var domains []string
		for domain := range domainWeight {
			domains = append(domains, domain)
		}
		sort.Slice(domains, func(a, b int) bool { return domainWeight[domains[a]] > domainWeight[domains[b]] })
		capped := map[string]bool{}
		left, weightLeft := float64(copies), total
		for _, domain := range domains {
			if left*domainWeight[domain] < weightLeft {
				break
			}
			capped[domain] = true
			left--
			weightLeft -= domainWeight[domain]
		}
		for domain, weight := range domainWeight {
			value := float64(cappedRate)
			if !capped[domain] {
				share := left * weight / weightLeft
				value = math.Min(-math.Log2(1-share), cappedRate)
			}
			rate[domain] = value / weight
		}
	}
	result := make([]float64, len(nodes))
	largest := 0.0
	for i, node := range nodes {
		result[i] = float64(node.Weight) * rate[domainOf(node)]
		largest = math.Max(largest, result[i])
	}
	for i := range result {
		result[i] /= largest
	}
	return result
}
