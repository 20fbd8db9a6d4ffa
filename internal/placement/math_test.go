package placement

import (
	"math"
	"math/bits"
	"math/rand/v2"
	"testing"
)

// interestingHashes returns edge values and random ones.
func interestingHashes(random *rand.Rand, count int) []uint64 {
	hashes := []uint64{1, 2, 3, math.MaxUint64, math.MaxUint64 - 1, 1 << 63, 1<<63 - 1, 1<<63 + 1}
	for shift := range 64 {
		hashes = append(hashes, 1<<shift, (1<<shift)-1, ^uint64(0)>>shift)
	}
	for i := range 256 {
		// the start and end of every table interval, near 2⁶⁴
		start := uint64(256+i) << 55
		hashes = append(hashes, start, start-1, start+1, start>>17)
	}
	for range count {
		hashes = append(hashes, random.Uint64(), random.Uint64()>>random.IntN(64), ^(random.Uint64() >> random.IntN(64)))
	}
	return hashes
}

func TestLogScoreIsAccurate(t *testing.T) {
	random := rand.New(rand.NewPCG(1, 2))
	const unit = 1.0 / (1 << scoreFractionBits)
	for _, hash := range interestingHashes(random, 100_000) {
		fast, slow := logScore(hash), logScoreBitwise(hash)
		// Against the bit-by-bit logarithm: within 2⁻⁵² (16 units).
		if difference := int64(fast - slow); difference > 16 || difference < -16 {
			t.Fatalf("hash %#x: logScore %d, bitwise %d", hash, fast, slow)
		}
		// Against float64. Near 2⁶⁴ (the winners) use log1p of the exact
		// distance to 2⁶⁴, relative error about 2⁻⁵²; elsewhere split off the
		// exponent so that float64 only sees the fraction, absolute error
		// about 2⁻⁵².
		var want, tolerance float64
		if distance := ^hash + 1; hash > 1<<63 && distance < 1<<52 {
			want = -math.Log1p(-float64(distance)/(1<<64)) / math.Ln2
			tolerance = 1e-15*want + 4*unit
		} else {
			length := bits.Len64(hash)
			fraction := float64(hash<<(64-length)) / (1 << 63)
			want = float64(65-length) - math.Log2(fraction)
			tolerance = 1e-15*want + 1.0/(1<<50)
		}
		got := float64(fast) * unit
		if math.Abs(got-want) > tolerance {
			t.Fatalf("hash %#x: logScore %.20g, math %.20g", hash, got, want)
		}
	}
	if logScore(0) != scoreInfinite {
		t.Fatal("logScore(0) is not infinite")
	}
}

func TestLogScoreIsMonotone(t *testing.T) {
	random := rand.New(rand.NewPCG(3, 4))
	for range 200_000 {
		a := random.Uint64() >> random.IntN(64)
		b := a + random.Uint64()>>random.IntN(64)
		if a == 0 || b < a {
			continue
		}
		// Larger hash, smaller score, up to rounding (2 units).
		if logScore(b) > logScore(a)+2 {
			t.Fatalf("logScore(%#x) = %d > logScore(%#x) = %d", b, logScore(b), a, logScore(a))
		}
	}
}

// TestSkipNeverDropsABetterNode checks the claim of skipFactor: whenever
// the fast test skips a node, the node's exact comparison says it ranks
// after the last kept candidate.
func TestSkipNeverDropsABetterNode(t *testing.T) {
	random := rand.New(rand.NewPCG(5, 6))
	skipped := 0
	for range 1_000_000 {
		last := candidate{
			score:  logScore(^(random.Uint64() >> random.IntN(64))),
			weight: random.Uint64()>>random.IntN(64) | 1,
		}
		factor, ok := skipFactor(&last)
		if !ok {
			continue
		}
		// Node hashes near the limit are the interesting ones.
		weight := random.Uint64()>>random.IntN(64) | 1
		limit, _ := bits.Mul64(factor, weight)
		var hash uint64
		switch random.IntN(3) {
		case 0:
			hash = random.Uint64()
		case 1:
			hash = ^(limit + skipMargin + 1 + random.Uint64()>>random.IntN(64))
		default:
			hash = ^(limit + skipMargin + 1 + uint64(random.IntN(1000)))
		}
		if ^hash <= limit+skipMargin || limit+skipMargin < limit {
			continue // not skipped (or the limit wrapped around: also not skipped in choose? see below)
		}
		skipped++
		node := candidate{score: logScore(hash), weight: weight, node: 1}
		if before(&node, &last) {
			t.Fatalf("skipped hash %#x weight %d ranks before last %+v", hash, weight, last)
		}
	}
	if skipped < 100_000 {
		t.Fatalf("only %d skips exercised", skipped)
	}
}

func TestSoftFloat(t *testing.T) {
	random := rand.New(rand.NewPCG(7, 8))
	for range 100_000 {
		a := random.Uint64()>>random.IntN(64) | 1
		b := random.Uint64()>>random.IntN(64) | 1
		x, y := newSoftFloat(a, -3), newSoftFloat(b, 5)
		value := func(s softFloat) float64 { return math.Ldexp(float64(s.mantissa), s.exponent) }
		if x.mantissa>>63 != 1 || value(x) != math.Ldexp(float64(a), -3) {
			t.Fatalf("newSoftFloat(%d) = %+v", a, x)
		}
		checkClose := func(name string, got softFloat, want float64) {
			if got.mantissa>>63 != 1 || math.Abs(value(got)-want) > 1e-15*want {
				t.Fatalf("%s(%d, %d) = %g, want %g", name, a, b, value(got), want)
			}
		}
		checkClose("multiply", x.multiply(y), value(x)*value(y))
		checkClose("divide", x.divide(y), value(x)/value(y))
		if x.greater(y) != (value(x) > value(y)) {
			t.Fatalf("greater(%d, %d) wrong", a, b)
		}
	}
}

func TestEffectiveWeightsMatchFormula(t *testing.T) {
	patterns := []weightPattern{equalWeights, mixedWeights,
		func(i int) uint64 { return uint64(1 + i%7*i%5) },
		func(i int) uint64 { return map[bool]uint64{true: 50, false: 1}[i == 0] }, // one node over 1/k of the total
	}
	for _, count := range []int{2, 3, 5, 10, 100} {
		for _, zones := range []int{0, 2, 4} {
			for _, pattern := range patterns {
				nodes := testNodes(count, pattern, zones, 12)
				ring := mustNew(t, nodes)
				for copies := 1; copies <= min(ring.MaxCopies(), correctedCopiesLimit); copies++ {
					want := referenceEffectiveWeights(ring.nodes, copies)
					got := ring.weights(copies)
					for i := range got {
						value := float64(got[i]) / float64(slicesMax(got))
						if math.Abs(value-want[i]) > 1e-9*want[i]+1e-15 {
							t.Fatalf("%d nodes %d zones copies=%d node %d: %g, formula %g", count, zones, copies, i, value, want[i])
						}
					}
				}
			}
		}
	}
}

func slicesMax(values []uint64) uint64 {
	var largest uint64
	for _, value := range values {
		largest = max(largest, value)
	}
	return largest
}

// TestHashPairsAreIndependent checks that the hash does not favour some
// pairs of nodes: with equal weights every pair of nodes should share
// objects equally often (recovery after a node loss then pulls from all
// other nodes evenly).
func TestHashPairsAreIndependent(t *testing.T) {
	const count, objects = 12, 300_000
	ring := mustNew(t, testNodes(count, equalWeights, 0, 13))
	index := map[string]int{}
	for i, node := range ring.nodes {
		index[node.ID] = i
	}
	var pairs [count][count]int
	dst := make([]string, 0, 2)
	for oid := range uint64(objects) {
		dst = ring.AppendReplicas(dst[:0], oid, 2)
		a, b := index[dst[0]], index[dst[1]]
		pairs[min(a, b)][max(a, b)]++
	}
	expected := float64(objects) / (count * (count - 1) / 2)
	chiSquare := 0.0
	for a := range count {
		for b := a + 1; b < count; b++ {
			difference := float64(pairs[a][b]) - expected
			chiSquare += difference * difference / expected
		}
	}
	// 65 degrees of freedom: mean 65, standard deviation 11.4; the result
	// is deterministic, so a generous bound does not hide a flaky test.
	if chiSquare > 120 {
		t.Fatalf("pair counts deviate: chi-square %.1f over 65 degrees of freedom", chiSquare)
	}
	t.Logf("pair chi-square %.1f (65 degrees of freedom)", chiSquare)
}
