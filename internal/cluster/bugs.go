//go:build !simbugs

package cluster

// Seeded bugs: old bugs from docs/TESTING.md's table, which the
// simulator's raft mode (internal/sim, -sim.raft) must keep finding. They
// are compiled in only with the build tag simbugs (bugs_simbugs.go,
// SetSeededBug); in every other build they are these constants, false,
// and the compiler drops the code they guard.
const (
	// bugDemoteHealthyVoter: the voter rule before clean stops were
	// departures (voters.go): a stopping node counted as healthy until it
	// left gossip, a healthy voter was demoted to reach the target
	// however the other voters stood, and gossip's "dead" of a node
	// that said it was stopping waited for the leader's raft to lose it
	// (reconcile.go, leaveConfirmed). A clean stop of one node of three:
	// the node leaves gossip while its raft still answers, the leader sees
	// two healthy nodes, wants one voter and demotes the other healthy
	// one; the stopping node stops, and the voters left, the leader and
	// the stopped node, are no majority.
	bugDemoteHealthyVoter = false
	// bugServeByContact: a node served data while it had contact with
	// the leader (HasQuorum), with no lease: a node paused past failure
	// detection and resumed had contact as soon as a heartbeat held in
	// its socket arrived, before it applied the epochs that dropped it,
	// and served in the epoch it left (LeaseValid).
	bugServeByContact = false
)
