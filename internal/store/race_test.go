//go:build race

package store

// raceEnabled: the race detector makes the crash test's iterations about
// ten times slower; scripts/test.sh runs the full count without it.
const raceEnabled = true
