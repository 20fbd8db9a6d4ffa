//go:build !simbugs

package gateway

// Seeded bugs: old behaviour of the gateway that the simulator
// (internal/sim) must keep finding. They are compiled in only with the
// build tag simbugs (bugs_simbugs.go, SetSeededBug); in every other build
// they are these constants, false, and the compiler drops the code they
// guard.
const (
	// bugOneReplicaReads: a ro/ open of a live VDI read one replica, the
	// nearest, like the writer, without syncing with the leader first: a reader through one node could read a
	// write in flight (or the map entry of an object's first write) from
	// a replica it had reached, and a later reader through another node
	// the older data from one it had not yet (found by the simulator's
	// read floor and its linearizability check; agree.go).
	bugOneReplicaReads = false
	// bugECHeadBeforeChunks: a fold of an erasure-coded object wrote its
	// new head before its chunks, so a crash (or a chunk write that
	// failed) between them left a current head naming chunks never
	// written, and the overlay's blocks it made stale were lost.
	bugECHeadBeforeChunks = false
	// bugECTrimBeforeHead: a fold trimmed the overlay before writing its
	// new head, so a crash (or a head write that failed) between them
	// left the old head current with the overlay's blocks gone.
	bugECTrimBeforeHead = false
)
