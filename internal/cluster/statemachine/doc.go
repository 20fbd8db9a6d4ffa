// Package statemachine is the cluster's replicated state machine: the
// state every node applies from the log (format, nodes, epochs, VDIs,
// locks, credentials, rotations), its invariants (State.Check), its
// events, every command with its encoding and its apply function, and the
// FSM that applies committed entries, takes snapshots and restores them.
//
// It imports no raft, no gossip and no network package (TestNoRuntimeImports):
// the runtime (internal/cluster) drives it. Raft's FSM there is a thin
// adapter over FSM.ApplyEntries, Snapshot and Restore; the simulator's log
// (cluster.Local) applies the same entries. Commands builds every command
// once and proposes it through a Proposer that Cluster (raft) and the
// simulator's members implement, so no command is written twice.
//
// Apply is deterministic (hashicorp/raft's FSM contract): it depends only
// on the state and the entry, never on the clock, the node or the
// network. The encoding of the log's entries and of snapshots is what
// rolling upgrades read: command type bytes, JSON field names and the
// binary lock command never change meaning.
package statemachine
