//go:build race

package sim

// defaultSeeds under the race detector, several times slower.
const defaultSeeds = 80
