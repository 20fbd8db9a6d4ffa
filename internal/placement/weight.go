package placement

import (
	"math/bits"
	"slices"
)

// Effective weights: why the weight a node competes with differs from its
// capacity when copies > 1.
//
// With one copy, rendezvous hashing with exponential scores gives node i the
// object with probability exactly w_i/W. With k copies the k smallest scores
// win, and that is sampling without replacement: the heavier a node, the
// more often its second-best chance is "used up" by itself, so heavy nodes
// end up with less than k·w_i/W of the replicas and light ones with more.
// At 10 nodes of weights 1, 2 and 4 and three copies the lightest node gets
// 12% too many replicas per byte, above the 10% the design allows.
//
// The correction is Rosén's for "successive sampling" (B. Rosén, "Asymptotic
// theory for successive sampling with varying probabilities without
// replacement", Ann. Math. Statist. 1972): if the k-th smallest score is
// treated as a constant τ, node i is chosen with probability 1-e^(-v_i·τ),
// so to make that equal the target λ_i = k·w_i/W the node must compete with
// v_i ∝ -ln(1-λ_i). Targets above 1 are impossible (a node cannot hold two
// replicas of one object), so the largest ones are capped at 1 first and the
// rest share the remaining copies (water filling); capped nodes get a rate
// so high that they are in practically every replica set.
//
// Zones are not corrected: a zoned ring uses the capacities as they are.
// The correction would be applied to zones (node shares inside a zone are
// exact already: a zone's best node is the minimum of its nodes'
// exponential scores), but a node joining a zone changes that zone's
// weight, hence its corrected rate per byte relative to the other zones,
// and objects then move between the zone's old nodes and other zones too.
// Measured at 100 nodes in 5 zones, 3 copies: 1.31x the minimum movement
// with the correction, exactly 1.00x without. Without zones a joining node
// is a new domain and the others' weights do not change, which is why the
// correction is cheap there. The cost of not correcting zones: a zone's
// share of replicas follows its capacity only as closely as the zones are
// equal in size (with 5 zones and 3 copies, a zone 20% larger than the
// other four gets 5% fewer replicas per byte than its share, and they 1.5%
// more: exact figures), and no zone can hold more than one replica per
// object whatever its size. Keep zones of similar capacity.
//
// Measured effect without zones (exact inclusion probabilities, 10 nodes of
// weights 1,2,4,…): three copies, max/mean per byte goes from 1.119 to
// 1.022; two copies from 1.055 to 1.026. Equal weights need no correction
// and get none (all v_i stay equal). The price is movement: the v_i of the
// existing nodes shift a little when W changes, so with mixed weights a
// join or leave at 10 nodes moves 3-8% more than the minimum instead of
// 0%. At 100 nodes and above both effects are below 1%. Order sampling
// with Pareto ranks balances better (1.007) but moved up to 13.5% more than
// the minimum, too close to the 15% allowed.

// correctedCopiesLimit bounds the number of precomputed weight tables:
// copy counts above it use the table of this many copies (whose correction
// is close; and at such copy counts balance is limited by distinctness).
const correctedCopiesLimit = 16

// cappedRate is -log2(1-λ) for λ = 1-2⁻²⁴: the rate of a zone (or node)
// whose target share is a replica of every object. Any λ above 1-2⁻²⁴ is
// capped too.
const cappedRate = 24

// cappedShare is 1-2⁻²⁴ in 64-bit fixed point.
const cappedShare = 1<<64 - 1<<(64-cappedRate)

// softFloat is a number mantissa·2^exponent with the mantissa's top bit set:
// a tiny floating point made of integer operations, deterministic on every
// machine. Operations round down.
type softFloat struct {
	mantissa uint64
	exponent int
}

// newSoftFloat returns value·2^exponent; value must not be zero.
func newSoftFloat(value uint64, exponent int) softFloat {
	shift := bits.LeadingZeros64(value)
	return softFloat{mantissa: value << shift, exponent: exponent - shift}
}

func (a softFloat) multiply(b softFloat) softFloat {
	high, low := bits.Mul64(a.mantissa, b.mantissa)
	if high>>63 == 1 {
		return softFloat{mantissa: high, exponent: a.exponent + b.exponent + 64}
	}
	return softFloat{mantissa: high<<1 | low>>63, exponent: a.exponent + b.exponent + 63}
}

func (a softFloat) divide(b softFloat) softFloat {
	if a.mantissa >= b.mantissa {
		quotient, _ := bits.Div64(a.mantissa>>1, a.mantissa<<63, b.mantissa)
		return softFloat{mantissa: quotient, exponent: a.exponent - b.exponent - 63}
	}
	quotient, _ := bits.Div64(a.mantissa, 0, b.mantissa)
	return softFloat{mantissa: quotient, exponent: a.exponent - b.exponent - 64}
}

// greater reports whether a > b.
func (a softFloat) greater(b softFloat) bool {
	if a.exponent != b.exponent {
		return a.exponent > b.exponent
	}
	return a.mantissa > b.mantissa
}

// fixed returns the value times 2^fractionBits, rounded down; the caller
// knows it fits in 64 bits.
func (a softFloat) fixed(fractionBits int) uint64 {
	shift := a.exponent + fractionBits
	switch {
	case shift >= 0:
		return a.mantissa << shift
	case shift <= -64:
		return 0
	default:
		return a.mantissa >> -shift
	}
}

var log2ESoft = softFloat{mantissa: log2E63, exponent: -63}

// domainRate returns -log2(1-λ) for 0 < λ < 1.
func domainRate(share softFloat) softFloat {
	if share.exponent+64 < -16 {
		// λ < 2⁻¹⁶: the logarithm of 1-λ would lose relative precision,
		// use -ln(1-λ) = λ·(1 + λ/2 + λ²/3 + …); the next term is below 2⁻⁴⁸.
		shareFixed := share.fixed(62)
		square, _ := bits.Mul64(shareFixed<<2, shareFixed) // λ²·2⁶²
		series := 1<<62 + shareFixed/2 + square/3
		return share.multiply(newSoftFloat(series, -62)).multiply(log2ESoft)
	}
	shareFixed := share.fixed(64) // below 2⁶⁴ because λ < 1
	if shareFixed > cappedShare {
		return newSoftFloat(cappedRate, 0)
	}
	// 1-λ as a hash value; logScore is -log2 of it.
	return newSoftFloat(logScore(-shareFixed), -scoreFractionBits)
}

// effectiveWeights returns the weight each node competes with when copies
// replicas are chosen, scaled so that the largest lies in [2⁶², 2⁶³) and
// none is zero. domainWeights[d] is the total weight of domain d (a zone, or
// a single node without zones); total is their sum. correct selects the
// correction (off for zones, see above).
func effectiveWeights(weights []uint64, domainOf []int32, domainWeights []uint64, total uint64, copies int, correct bool) []uint64 {
	perUnit := make([]softFloat, len(domainWeights)) // rate of a domain per unit of weight
	if !correct || copies == 1 || copies >= len(domainWeights) {
		// One copy: exponential races are exact, no correction. Copies at
		// least the number of domains: every domain is in every replica set
		// and only the split inside a domain matters, which is by weight.
		for domain := range perUnit {
			perUnit[domain] = newSoftFloat(1, 0)
		}
	} else {
		computeDomainRates(perUnit, domainWeights, total, copies)
	}

	scaled := make([]softFloat, len(weights))
	largest := softFloat{}
	for node, weight := range weights {
		scaled[node] = newSoftFloat(weight, 0).multiply(perUnit[domainOf[node]])
		if node == 0 || scaled[node].greater(largest) {
			largest = scaled[node]
		}
	}
	result := make([]uint64, len(weights))
	for node, value := range scaled {
		// Shift so that largest becomes largest.mantissa>>1 in [2⁶², 2⁶³).
		shift := largest.exponent - value.exponent + 1
		if shift < 64 {
			result[node] = value.mantissa >> shift
		}
		if result[node] == 0 {
			result[node] = 1 // a node with weight must be able to win
		}
	}
	return result
}

// computeDomainRates fills perUnit[d] with V_d/W_d, where V_d is the
// corrected rate of domain d described at the top of this file, for
// 1 < copies < number of domains. (Written for domains in general although
// only rings without zones, where a domain is a node, use it.)
func computeDomainRates(perUnit []softFloat, domainWeights []uint64, total uint64, copies int) {
	// Water filling: cap the largest domains whose target share reaches 1.
	order := make([]int, len(domainWeights))
	for domain := range order {
		order[domain] = domain
	}
	slices.SortStableFunc(order, func(a, b int) int {
		switch {
		case domainWeights[a] > domainWeights[b]:
			return -1
		case domainWeights[a] < domainWeights[b]:
			return 1
		}
		return 0
	})
	capped := make([]bool, len(domainWeights))
	copiesLeft, weightLeft := uint64(copies), total
	for _, domain := range order {
		high, low := bits.Mul64(copiesLeft, domainWeights[domain])
		if high == 0 && low < weightLeft {
			break // target below 1; all smaller domains are below too
		}
		capped[domain] = true
		copiesLeft--
		weightLeft -= domainWeights[domain]
		if copiesLeft == 0 {
			break // only when every domain is capped, so copies >= domains
		}
	}

	for domain, weight := range domainWeights {
		weightSoft := newSoftFloat(weight, 0)
		rate := newSoftFloat(cappedRate, 0)
		if !capped[domain] {
			// copiesLeft > 0 and weightLeft > 0: an uncapped domain remains.
			share := newSoftFloat(copiesLeft, 0).multiply(weightSoft).divide(newSoftFloat(weightLeft, 0)) // λ < 1
			rate = domainRate(share)
		}
		perUnit[domain] = rate.divide(weightSoft)
	}
}
