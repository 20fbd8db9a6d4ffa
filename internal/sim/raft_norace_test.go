//go:build !race

package sim

// defaultRaftSeeds sizes TestSimulateRaft for a few seconds.
const defaultRaftSeeds = 10
