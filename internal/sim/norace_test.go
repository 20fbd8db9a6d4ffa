//go:build !race

package sim

// defaultSeeds sizes TestSimulate for about a minute or two on 2 cores.
const defaultSeeds = 400
