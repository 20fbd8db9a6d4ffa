//go:build race

package testcluster

// raceEnabled: the test binary, and so the fake herd, runs under the race
// detector, so the fake herd can provoke a real race report (see
// provokeRace).
const raceEnabled = true
