package placement

import (
	"math"
	"math/bits"
)

// The hash: every (object, node) pair draws one 64-bit number
// hash = mix64(mix64(oid + objectSalt) ^ nodeKey(id)). nodeKey is FNV-1a
// over the id bytes (as in Sheepdog) followed by mix64, computed once per
// ring; mix64 is the splitmix64 finalizer (Stafford's "Mix13"), a bijection
// with full avalanche, so distinct node keys give distinct hashes for every
// object and structured object ids (type | VDI id | index) are spread out.
//
// Nothing here uses floating point: the hash, the logarithm and every
// comparison are integer operations, so every machine (amd64, arm64, with or
// without fused multiply-add, whatever math.Log is implemented with) computes
// bit-identical results. Placement disagreement between two nodes would
// mean writes that miss replicas, so this matters more than speed.

const (
	fnvOffset64 = 0xcbf29ce484222325
	fnvPrime64  = 0x100000001b3

	// objectSalt is the splitmix64 increment (2⁶⁴/φ); adding it keeps object
	// id 0 away from mix64's fixed point at 0.
	objectSalt = 0x9e3779b97f4a7c15

	// log2E63 is log2(e)·2⁶³, rounded down.
	log2E63 = 0xb8aa3b295c17f0bb

	// scoreFractionBits is the number of fractional bits of a log score.
	scoreFractionBits = 56

	// scoreInfinite is the score of hash 0 (-log2(0) = +Inf): it loses to
	// every other score.
	scoreInfinite = math.MaxUint64

	// skipMargin is added to a lookup's skip limit (see skipFactor) so that
	// logScore's rounding can never make a skipped node the better one.
	// logScore is within 2⁻⁵⁵ of -log2(u); the margin covers 2⁻⁴⁰ of
	// score: 2⁻⁴⁰·2⁶⁴/log2(e) < 2²⁴ units of hash.
	skipMargin = 1 << 24
)

// mix64 is the splitmix64 finalizer.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// nodeKey is the per-node half of the hash.
func nodeKey(id string) uint64 {
	hash := uint64(fnvOffset64)
	for i := 0; i < len(id); i++ {
		hash ^= uint64(id[i])
		hash *= fnvPrime64
	}
	return mix64(hash)
}

// objectKey is the per-object half of the hash.
func objectKey(oid uint64) uint64 {
	return mix64(oid + objectSalt)
}

// pairHash is the number drawn by one (object, node) pair.
func pairHash(objectKey, nodeKey uint64) uint64 {
	return mix64(objectKey ^ nodeKey)
}

// logScore returns -log2(hash/2⁶⁴) in fixed point with 56 fractional bits:
// the hash read as a uniform number u in (0, 1) turned into an exponential
// random variable (in base-2 units). The absolute error is below 2⁻⁵⁵
// (measured against a 300-bit reference: 1.2·2⁻⁵⁶), so the function is
// monotone non-increasing in hash up to that error.
//
// Method: hash = 2^(n-1)·x with x in [1, 2). x is divided by a table value
// close to the start of its 1/256-wide interval, which leaves 1+t with
// 0 <= t < 2⁻⁸, and log(1+t) is six terms of its Taylor series
// (the seventh is below 2⁻⁵⁸).
func logScore(hash uint64) uint64 {
	if hash == 0 {
		return scoreInfinite
	}
	length := bits.Len64(hash)
	fraction := log2Fraction(hash << (64 - length))
	return uint64(65-length)<<scoreFractionBits - fraction>>(64-scoreFractionBits)
}

// log2Fraction returns log2(m/2⁶³)·2⁶⁴ for m in [2⁶³, 2⁶⁴), that is the
// fractional part of a logarithm with 64 bits, rounded down, saturating at
// 2⁶⁴-1.
func log2Fraction(m uint64) uint64 {
	index := (m >> 55) & 0xff
	// z = m·reciprocal/2¹²⁶ lies in [1, 1+2⁻⁸+2⁻⁶³): see reciprocalTable.
	high, low := bits.Mul64(m, reciprocalTable[index])
	t := (high-1<<62)<<2 | low>>62 // (z-1)·2⁶⁴
	naturalLog := logOnePlus(t)
	productHigh, productLow := bits.Mul64(naturalLog, log2E63)
	log2Z := productHigh<<1 | productLow>>63
	sum, carry := bits.Add64(log2Table[index], log2Z, 0)
	if carry != 0 {
		return math.MaxUint64
	}
	return sum
}

// logOnePlus returns ln(1+t)·2⁶⁴ for t = value/2⁶⁴ below about 2⁻⁸.
func logOnePlus(t uint64) uint64 {
	t2, _ := bits.Mul64(t, t)
	t3, _ := bits.Mul64(t2, t)
	t4, _ := bits.Mul64(t3, t)
	t5, _ := bits.Mul64(t4, t)
	t6, _ := bits.Mul64(t5, t)
	// Sum the positive and negative terms apart: each term is smaller than
	// the one before, so the difference cannot go below zero.
	return (t + t3/3 + t5/5) - (t2/2 + t4/4 + t6/6)
}

// reciprocalTable[i] = ceil(2⁶³·256/(256+i)): 2⁶³ divided by the start of
// the i-th 1/256-wide interval of [1, 2), rounded up so that
// m·reciprocalTable[i] >= 2¹²⁶ for every m of that interval.
// log2Table[i] = -log2(reciprocalTable[i]/2⁶³)·2⁶⁴, so that
// log2(m/2⁶³) = log2Table[i] + log2(z).
// Both are computed at start-up with integers only.
var reciprocalTable, log2Table = buildLogTables()

func buildLogTables() (reciprocals, logs [256]uint64) {
	for i := range reciprocals {
		quotient, remainder := bits.Div64(1<<7, 0, uint64(256+i)) // 2⁷¹/(256+i)
		if remainder != 0 {
			quotient++
		}
		reciprocals[i] = quotient
		if i == 0 {
			continue // reciprocal is exactly 2⁶³, log 0
		}
		// reciprocal lies in (2⁶², 2⁶³): its log2 relative to 2⁶³ is
		// log2(2·reciprocal/2⁶³) - 1, so minus that is 2⁶⁴ - fraction.
		logs[i] = -log2FractionBitwise(quotient << 1)
	}
	return reciprocals, logs
}

// log2FractionBitwise is the slow, obviously correct version of
// log2Fraction: one result bit per squaring (the classic binary logarithm
// algorithm). Error below 2⁻⁵⁶. Used to build the table and by tests.
func log2FractionBitwise(m uint64) uint64 {
	var result uint64
	y := m // y/2⁶³ in [1, 2)
	for bit := 63; bit >= 0; bit-- {
		high, low := bits.Mul64(y, y) // y²·2¹²⁶
		if high >= 1<<63 {
			// y² >= 2: the bit is one; continue with y²/2.
			result |= 1 << bit
			y = high
		} else {
			y = high<<1 | low>>63
		}
	}
	return result
}
