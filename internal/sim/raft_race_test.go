//go:build race

package sim

// defaultRaftSeeds under the race detector, several times slower.
const defaultRaftSeeds = 4
