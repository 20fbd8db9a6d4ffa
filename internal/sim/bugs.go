//go:build !simbugs

package sim

// Seeded bugs of the simulator's own model of the cluster, like
// recovery's (recovery/bugs.go): old behaviour of herd that the
// simulator must keep finding, compiled in only with the build tag
// simbugs (bugs_simbugs.go, setSeededBug). In every other build they
// are these constants, false, and the compiler drops the code they
// guard.
const (
	// bugLeaseByContact: a node served data while it had contact with
	// the leader (cluster.Cluster.HasQuorum), with no lease and no
	// activation of epochs: a node resumed after a pause had contact as
	// soon as a heartbeat arrived, before it applied the epochs that
	// dropped it and took it back, and its gateway read its own copy in
	// the old epoch (found by the e2e TestPausedNodeServesNoStaleRead;
	// fixed by the leases of cluster/lease.go).
	bugLeaseByContact = false
)
