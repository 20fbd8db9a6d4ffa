//go:build race

package placement

// raceEnabled makes the long simulations quick (see quick).
const raceEnabled = true
