package placement

import (
	"fmt"
	"math/bits"
	"slices"
	"strings"
)

// Node is one member of an epoch's node set, as the cluster log records it.
type Node struct {
	// ID is the node's permanent id (for example 16 hexadecimal digits).
	// Placement hashes its bytes, so it must never change for a node.
	ID string
	// Zone is the failure domain (rack, room, site). Empty when unused; if
	// any node of the set has a zone, the empty zone counts as one more zone.
	Zone string
	// Weight is the node's capacity in bytes (any unit works as long as all
	// nodes use the same one). Replicas are spread in proportion to it.
	Weight uint64
}

// Ring answers "which nodes hold the replicas of object oid" for one node
// set. It is immutable after New: every method is safe for concurrent use.
type Ring struct {
	nodes []Node // sorted by ID: the canonical order, ties break to the lower index
	// keys[i] is nodeKey(nodes[i].ID).
	keys []uint64
	// domainOf[i] is the failure domain of node i: its zone's index among
	// the sorted distinct zones, or i itself when no node has a zone.
	domainOf      []int32
	domainWeights []uint64 // total weight of each domain
	domainSizes   []int32  // number of nodes in each domain
	zoned         bool
	totalWeight   uint64
	// weightsByCopies[k-1][i] is the weight node i competes with when k
	// copies are chosen (see weight.go). Tables that would be equal are
	// shared.
	weightsByCopies [][]uint64
}

// maxInlineCopies is the copy count up to which a lookup does not allocate
// (beyond growing dst).
const maxInlineCopies = 16

// New builds the ring of a node set. The order of nodes does not matter:
// the same set gives the same ring, and so the same placement, on every
// machine. The slice is not retained.
func New(nodes []Node) (*Ring, error) {
	if len(nodes) == 0 {
		return nil, ErrNoNodes
	}
	if len(nodes) > 1<<31-1 {
		return nil, fmt.Errorf("%w: %d", ErrTooManyNodes, len(nodes))
	}
	sorted := slices.Clone(nodes)
	slices.SortFunc(sorted, func(a, b Node) int { return strings.Compare(a.ID, b.ID) })

	ring := &Ring{
		nodes:    sorted,
		keys:     make([]uint64, len(sorted)),
		domainOf: make([]int32, len(sorted)),
	}
	for i, node := range sorted {
		switch {
		case node.ID == "":
			return nil, ErrEmptyNodeID
		case i > 0 && node.ID == sorted[i-1].ID:
			return nil, fmt.Errorf("%w: %q", ErrDuplicateNode, node.ID)
		case node.Weight == 0:
			return nil, fmt.Errorf("%w: node %q", ErrZeroWeight, node.ID)
		}
		var carry uint64
		ring.totalWeight, carry = bits.Add64(ring.totalWeight, node.Weight, 0)
		if carry != 0 {
			return nil, fmt.Errorf("%w: at node %q", ErrWeightOverflow, node.ID)
		}
		ring.keys[i] = nodeKey(node.ID)
		if node.Zone != "" {
			ring.zoned = true
		}
	}
	if err := checkKeysDistinct(sorted, ring.keys); err != nil {
		return nil, err
	}

	if ring.zoned {
		zones := make([]string, len(sorted))
		for i, node := range sorted {
			zones[i] = node.Zone
		}
		slices.Sort(zones)
		zones = slices.Compact(zones)
		ring.domainWeights = make([]uint64, len(zones))
		ring.domainSizes = make([]int32, len(zones))
		for i, node := range sorted {
			domain, _ := slices.BinarySearch(zones, node.Zone)
			ring.domainOf[i] = int32(domain)
			ring.domainWeights[domain] += node.Weight // cannot overflow: total did not
			ring.domainSizes[domain]++
		}
	} else {
		ring.domainWeights = make([]uint64, len(sorted))
		ring.domainSizes = make([]int32, len(sorted))
		for i, node := range sorted {
			ring.domainOf[i] = int32(i)
			ring.domainWeights[i] = node.Weight
			ring.domainSizes[i] = 1
		}
	}

	weights := make([]uint64, len(sorted))
	for i, node := range sorted {
		weights[i] = node.Weight
	}
	tables := min(len(ring.domainWeights), correctedCopiesLimit)
	ring.weightsByCopies = make([][]uint64, tables)
	for copies := 1; copies <= tables; copies++ {
		if copies > 1 && ring.zoned {
			// Zoned rings are not corrected: one table for every count.
			ring.weightsByCopies[copies-1] = ring.weightsByCopies[0]
			continue
		}
		table := effectiveWeights(weights, ring.domainOf, ring.domainWeights, ring.totalWeight, copies, !ring.zoned)
		if copies > 1 && slices.Equal(table, ring.weightsByCopies[copies-2]) {
			table = ring.weightsByCopies[copies-2] // equal weights: share
		}
		ring.weightsByCopies[copies-1] = table
	}
	return ring, nil
}

func checkKeysDistinct(nodes []Node, keys []uint64) error {
	seen := make(map[uint64]int, len(keys))
	for i, key := range keys {
		if other, found := seen[key]; found {
			return fmt.Errorf("%w: %q and %q", ErrNodeKeyCollision, nodes[other].ID, nodes[i].ID)
		}
		seen[key] = i
	}
	return nil
}

// MaxCopies is the largest number of replicas the ring can place on
// distinct failure domains: the number of zones when zones are set,
// otherwise the number of nodes. Callers must refuse a copy count above it
// (Replicas would return fewer ids than asked).
func (r *Ring) MaxCopies() int {
	return len(r.domainWeights)
}

// Nodes returns a copy of the node set, sorted by id.
func (r *Ring) Nodes() []Node {
	return slices.Clone(r.nodes)
}

// Replicas returns the ids of the nodes holding the replicas of object oid,
// min(copies, MaxCopies()) distinct nodes in distinct zones (when zones are
// set), best first. It panics if copies < 1: a copy count of zero would let
// a write be acknowledged by no replica, so it is a caller bug.
func (r *Ring) Replicas(oid uint64, copies int) []string {
	return r.AppendReplicas(make([]string, 0, min(max(copies, 0), r.MaxCopies())), oid, copies)
}

// AppendReplicas is Replicas appending to dst, so that a caller reusing dst
// does not allocate (for copies up to 16).
func (r *Ring) AppendReplicas(dst []string, oid uint64, copies int) []string {
	if copies < 1 {
		panic(fmt.Sprintf("placement: copies must be at least 1, got %d", copies))
	}
	count := min(copies, r.MaxCopies())
	var storage [maxInlineCopies]candidate
	chosen := storage[:0]
	if count > len(storage) {
		chosen = make([]candidate, 0, count)
	}
	chosen = r.choose(chosen, oid, count)
	for i := range chosen {
		dst = append(dst, r.nodes[chosen[i].node].ID)
	}
	return dst
}

// weights returns the effective weight table for count copies.
func (r *Ring) weights(count int) []uint64 {
	return r.weightsByCopies[min(count, len(r.weightsByCopies))-1]
}

// candidate is a node competing for one object.
type candidate struct {
	score  uint64 // logScore of the node's hash for the object
	weight uint64 // the node's effective weight
	node   int32
	domain int32
}

// before reports whether a ranks before b: a lower score/weight (compared
// exactly, as score_a·weight_b < score_b·weight_a in 128 bits), ties going
// to the lower node index.
func before(a, b *candidate) bool {
	highA, lowA := bits.Mul64(a.score, b.weight)
	highB, lowB := bits.Mul64(b.score, a.weight)
	if highA != highB {
		return highA < highB
	}
	if lowA != lowB {
		return lowA < lowB
	}
	return a.node < b.node
}

// choose appends to chosen (empty, capacity >= count) the count best
// candidates for oid, at most one per domain, best first.
//
// The function it computes is defined by the reference in the tests: sort
// all nodes by (score/weight, index) and take them in order, skipping
// nodes whose domain is already taken. This loop gets the same result in
// one pass, keeping the best count domains seen so far. Once count are
// kept, a node whose hash is too far from 2⁶⁴ to beat the last of them is
// skipped with one multiplication instead of a logarithm: that is almost
// every node, which is what makes a lookup over 1,000 nodes cheap.
func (r *Ring) choose(chosen []candidate, oid uint64, count int) []candidate {
	weights := r.weights(count)
	object := objectKey(oid)
	var limitFactor uint64
	skipping := false
	for node := 0; node < len(r.keys); node++ {
		if skipping {
			node = scan(r.keys, weights, object, limitFactor, node)
			if node == len(r.keys) {
				break
			}
		}
		next := candidate{
			score:  logScore(pairHash(object, r.keys[node])),
			weight: weights[node],
			node:   int32(node),
			domain: r.domainOf[node],
		}
		chosen = insert(chosen, next, count, r.zoned)
		if len(chosen) == count {
			limitFactor, skipping = skipFactor(&chosen[count-1])
		}
	}
	return chosen
}

// scan returns the first node from start on that the skip test (see
// skipFactor) cannot rule out, or len(keys). It is the hot loop of a
// lookup, kept apart so that its few variables stay in registers.
func scan(keys, weights []uint64, object, limitFactor uint64, start int) int {
	weights = weights[:len(keys)]
	for node := start; node < len(keys); node++ {
		hash := pairHash(object, keys[node])
		limit, _ := bits.Mul64(limitFactor, weights[node])
		if ^hash <= limit+skipMargin {
			return node
		}
	}
	return len(keys)
}

// skipFactor returns the factor q for which a node of effective weight w
// whose hash has ^hash > high64(q·w) + skipMargin ranks after last, and
// false when no such factor fits in 64 bits.
//
// Why: -ln(u) >= 1-u, so the exact score -log2(u) is at least
// (1-u)·log2(e) = (^hash+1)·log2(e)/2⁸ in score units. The node ranks after
// last if its score/w exceeds θ = last.score/last.weight, which holds when
// ^hash·log2(e)/2⁸ exceeds θ·w by more than logScore's rounding, that is
// when ^hash > θ·w·2⁸/log2(e) + skipMargin. q is θ·2⁸/log2(e)·2⁶⁴ rounded
// up; a test checks the claim on random hashes and weights.
func skipFactor(last *candidate) (uint64, bool) {
	switch last.score {
	case 0:
		return 0, true // nothing beats a zero score (ties go to last)
	case scoreInfinite:
		return 0, false
	}
	// Rounding: log2ESoft and multiply round the divisor down, which only
	// makes q larger; divide rounds q down by less than 2⁻⁶², made up for
	// by adding q/2⁴⁰ + 1.
	q := newSoftFloat(last.score, 64+8).divide(newSoftFloat(last.weight, 0).multiply(log2ESoft))
	if q.exponent > 0 {
		return 0, false // q >= 2⁶⁴
	}
	fixed := q.fixed(0)
	rounded, carry := bits.Add64(fixed, fixed>>40+1, 0)
	if carry != 0 {
		return 0, false
	}
	return rounded, true
}

// insert adds next (whose node index is above every kept one) to the
// sorted list chosen of at most count candidates with distinct domains.
func insert(chosen []candidate, next candidate, count int, zoned bool) []candidate {
	if zoned {
		for i := range chosen {
			if chosen[i].domain != next.domain {
				continue
			}
			if !before(&next, &chosen[i]) {
				return chosen // its zone already has a better node
			}
			chosen = slices.Delete(chosen, i, i+1)
			break
		}
	}
	if len(chosen) == count {
		if !before(&next, &chosen[count-1]) {
			return chosen
		}
		chosen = chosen[:count-1]
	}
	position := len(chosen)
	for position > 0 && before(&next, &chosen[position-1]) {
		position--
	}
	return slices.Insert(chosen, position, next)
}
