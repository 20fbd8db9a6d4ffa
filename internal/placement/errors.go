package placement

import "errors"

// Errors returned by New, Chunks and Check. Most are wrapped with the offending
// node's id or other detail, so test with errors.Is.
var (
	// ErrNoNodes: the node set is empty, so no object has a home.
	ErrNoNodes = errors.New("placement: no nodes")
	// ErrEmptyNodeID: a node has an empty id.
	ErrEmptyNodeID = errors.New("placement: empty node id")
	// ErrDuplicateNode: two nodes share an id.
	ErrDuplicateNode = errors.New("placement: duplicate node id")
	// ErrZeroWeight: a node has no capacity; it could never receive a replica
	// and would only make callers believe it holds some.
	ErrZeroWeight = errors.New("placement: zero node weight")
	// ErrTooManyNodes: more nodes than a ring indexes (2³¹-1).
	ErrTooManyNodes = errors.New("placement: too many nodes")
	// ErrWeightOverflow: the sum of all weights does not fit in 64 bits.
	ErrWeightOverflow = errors.New("placement: total weight overflows 64 bits")
	// ErrNodeKeyCollision: two distinct ids hash to the same 64-bit node key,
	// so the two nodes would draw identical random numbers for every object.
	// The chance is about n²/2⁶⁵ for n nodes; the caller should give the
	// joining node a new id.
	ErrNodeKeyCollision = errors.New("placement: node id hash collision")
	// ErrChunkCount: Chunks was asked for a number of chunks outside 1 to
	// MaxChunks, or for fewer than one chunk per zone.
	ErrChunkCount = errors.New("placement: bad chunk count")
	// ErrTooFewNodes: the ring cannot place the chunks Chunks was asked
	// for on distinct nodes within the per-zone limit.
	ErrTooFewNodes = errors.New("placement: too few nodes for the chunks")
	// ErrInvariant: Check found a ring that New could not have built. This is
	// a bug (or memory corruption), never an operating error.
	ErrInvariant = errors.New("placement: invariant violated")
)
