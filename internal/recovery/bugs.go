//go:build !simbugs

package recovery

// Seeded bugs: old bugs from docs/TESTING.md's table, which the
// simulator (internal/sim) must keep finding. They are compiled in only
// with the build tag simbugs (bugs_simbugs.go, SetSeededBug); in every
// other build they are these constants, false, and the compiler drops
// the code they guard.
const (
	// bugEveryNodeWitnesses: background recovery counted every node, not
	// just the nodes of the epoch that answered its listing, as a
	// witness in the proof of currency, and so restamped a stale copy
	// (found by TestStaleCopyNeverServed).
	bugEveryNodeWitnesses = false
)
