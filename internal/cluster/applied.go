package cluster

// applied is the read side of one node's cluster state: what its FSM has
// applied. Cluster (the raft log) and LocalMember (the log without raft,
// for simulations) embed it, so both answer every read (epochs, nodes,
// VDIs, locks, WaitEpoch) with the same code, in ops.go.
type applied struct{ fsm *FSM }
