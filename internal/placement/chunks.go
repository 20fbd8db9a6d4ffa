package placement

import (
	"fmt"
	"slices"
)

// MaxChunks is the largest number of chunks Chunks places for one key.
const MaxChunks = maxInlineCopies

// chunkSalt separates the positions' keys from each other and from the
// object keys of Replicas: the first 64 bits of the fractional part of
// √2 (SHA-256's first initial value).
const chunkSalt = 0x6a09e667f3bcc908

// chunkKey is the object half of the hash for chunk position c of key:
// mix64(objectKey(key) ⊕ mix64(c + chunkSalt)). mix64 is a bijection, so
// the n positions of a key have n distinct keys, and none is a function
// of another that the node keys could undo.
func chunkKey(key uint64, position int) uint64 {
	return mix64(objectKey(key) ^ mix64(uint64(position)+chunkSalt))
}

// Chunks returns the ids of the nodes holding the n chunks of an
// erasure-coded stripe (n = K+M) keyed by key: element c is the home of
// chunk c. The homes are distinct nodes and, when the ring has zones, no
// zone holds more than perZone of them (perZone = M, so that losing a
// zone loses at most M chunks; without zones the rule does not apply).
//
// Each position c ranks the nodes by straw2 with its own key,
// chunkKey(key, c), as Replicas ranks them for an object, and takes its
// best node; when two positions want the same node (or the last place in
// a zone), the node goes to the position whose score on it is better and
// the other takes its next best. Formally: all (position, node) pairs
// are walked in increasing score/weight (ties to the lower node index,
// then the lower position), and a pair is taken when its position has no
// node yet, its node none, and (with zones) its node's zone fewer than
// perZone chunks. The weights
// are those Replicas uses for n copies (corrected without zones, see
// weight.go), so a node's share of chunks follows its capacity.
//
// Positions draw independently, as in CRUSH's "indep" mode: when a node
// leaves, the chunks it held move and, unlike a ranking cut into n, the
// other positions keep their homes, except when the leaving node's
// position takes, as its next best, a node whose score beats the
// position holding it, or the last place of a zone, and the position
// that had it moves too (a chain). This is rare when the stripe is a
// small part of the ring: see TestChunksStability for the figures.
//
// The ring's nodes are all eligible, as for Replicas: full and draining
// nodes are left out of the ring by its caller, and a ring has no node of
// weight zero.
//
// Chunks returns an error wrapping ErrChunkCount when n is not between 1
// and MaxChunks or perZone is below 1, and one wrapping ErrTooFewNodes
// when the ring cannot place n chunks: fewer than n nodes, or zones that
// together take fewer than n (the sum over zones of min(perZone, the
// zone's nodes)). Both are checked before any draw, and the walk
// examines each position's ranking at most once per chunk placed, so it
// always ends.
func (r *Ring) Chunks(key uint64, n, perZone int) ([]string, error) {
	if err := r.canPlaceChunks(n, perZone); err != nil {
		return nil, err
	}
	var storage [MaxChunks]int32
	homes := storage[:n]
	if err := r.placeChunks(homes, key, perZone); err != nil {
		return nil, err
	}
	ids := make([]string, n)
	for c, node := range homes {
		ids[c] = r.nodes[node].ID
	}
	return ids, nil
}

// canPlaceChunks checks Chunks' arguments against the ring.
func (r *Ring) canPlaceChunks(n, perZone int) error {
	switch {
	case n < 1 || n > MaxChunks:
		return fmt.Errorf("%w: %d chunks, want 1 to %d", ErrChunkCount, n, MaxChunks)
	case perZone < 1:
		return fmt.Errorf("%w: at most %d chunks per zone, want at least 1", ErrChunkCount, perZone)
	case n > len(r.nodes):
		return fmt.Errorf("%w: %d chunks on %d nodes", ErrTooFewNodes, n, len(r.nodes))
	}
	if !r.zoned {
		return nil
	}
	room := 0
	for _, size := range r.domainSizes {
		room += min(perZone, int(size))
		if room >= n {
			return nil
		}
	}
	return fmt.Errorf("%w: %d chunks at most %d per zone, but the %d zones of %d nodes take only %d",
		ErrTooFewNodes, n, perZone, len(r.domainSizes), len(r.nodes), room)
}

// placeChunks fills homes (one entry per position) with node indexes, as
// Chunks documents, once canPlaceChunks has accepted len(homes) and
// perZone. It is the lazy form of the walk over all pairs: each position
// keeps its best eligible candidate; the best of those is the next pair
// the walk takes, since every better pair has a filled position or a node
// that is no longer eligible (and eligibility only ever ends). Taking it
// may make other positions' candidates ineligible; those rank again.
func (r *Ring) placeChunks(homes []int32, key uint64, perZone int) error {
	n := len(homes)
	weights := r.weights(n)
	var objects [MaxChunks]uint64
	var best [MaxChunks]candidate
	for c := range homes {
		homes[c] = -1
		objects[c] = chunkKey(key, c)
	}
	for c := range homes {
		// Nothing is placed yet: every node is eligible.
		best[c] = r.bestChunkNode(objects[c], weights, homes[:0], perZone)
	}
	for range n {
		winner := -1
		for c := range homes {
			if homes[c] >= 0 {
				continue
			}
			if best[c].node < 0 || !r.chunkEligible(int(best[c].node), homes, perZone) {
				best[c] = r.bestChunkNode(objects[c], weights, homes, perZone)
			}
			if best[c].node < 0 {
				// canPlaceChunks guarantees a free place: the zones'
				// remaining room is at least the positions left.
				return invariant("no eligible node for chunk %d of %d (at most %d per zone) with homes %v", c, n, perZone, slices.Clone(homes))
			}
			// Strictly better only: equal candidates go to the lower position.
			if winner < 0 || before(&best[c], &best[winner]) {
				winner = c
			}
		}
		homes[winner] = best[winner].node
	}
	return nil
}

// chunkEligible says whether node can take a chunk besides homes (-1 for
// positions not placed yet): it holds none yet and, with zones, its zone
// holds fewer than perZone.
func (r *Ring) chunkEligible(node int, homes []int32, perZone int) bool {
	inZone := 0
	for _, home := range homes {
		switch {
		case home < 0:
		case int(home) == node:
			return false
		case r.zoned && r.domainOf[home] == r.domainOf[node]:
			inZone++
		}
	}
	return !r.zoned || inZone < perZone
}

// bestChunkNode returns the best eligible candidate for the position with
// object key object, or one with node -1 if none is eligible. Like choose,
// it skips with one multiplication the nodes whose hash cannot beat the
// best so far.
func (r *Ring) bestChunkNode(object uint64, weights []uint64, homes []int32, perZone int) candidate {
	best := candidate{node: -1}
	var limitFactor uint64
	skipping := false
	for node := 0; node < len(r.keys); node++ {
		if skipping {
			node = scan(r.keys, weights, object, limitFactor, node)
			if node == len(r.keys) {
				break
			}
		}
		if !r.chunkEligible(node, homes, perZone) {
			continue
		}
		next := candidate{
			score:  logScore(pairHash(object, r.keys[node])),
			weight: weights[node],
			node:   int32(node),
			domain: r.domainOf[node],
		}
		if best.node < 0 || before(&next, &best) {
			best = next
			limitFactor, skipping = skipFactor(&best)
		}
	}
	return best
}
