package sim

import (
	"path/filepath"
	"testing"
	"time"
)

// figure4 is the Sheepdog paper's Fig. 4 as a schedule: n0 is killed, and
// the objects it held move to other nodes, where the clients rewrite them;
// then n0 returns at the moment n1 and n2, which hold the newest copies
// of some of those objects, are killed. n0's copies of them are stale and
// must never be served, nor copied over the newest ones when n1 and n2
// return: until then those objects are refused (I/O errors, allowed).
func figure4(seed uint64) Schedule {
	return Schedule{
		Seed:   seed,
		Config: Config{Nodes: 5, Copies: 2, MaxFaulty: 2, ObjectSize: 64 << 10, VDISize: 1 << 20, Clients: 2, Lanes: 3, Faults: 20 * time.Second},
		Events: []Event{
			{At: time.Second, Kind: Kill, Node: 0},
			{At: 8 * time.Second, Kind: Restart, Node: 0},
			{At: 8 * time.Second, Kind: Kill, Node: 1},
			{At: 8 * time.Second, Kind: Kill, Node: 2},
		},
	}
}

// runScenario runs a hand-written schedule in its own bubble.
func runScenario(t *testing.T, s Schedule, dir string) Result {
	var r Result
	simulateWith(t, func() { r = RunSchedule(s, Options{Dir: dir, Bug: seededBug}) })
	return r
}

func TestScenarioFigure4(t *testing.T) {
	if seededBug != "" {
		t.Skipf("seeded bug %q is on", seededBug)
	}
	dir := scratch(t)
	for seed := uint64(1); seed <= 3; seed++ {
		r := runScenario(t, figure4(seed), filepath.Join(dir, "s"+itoa(seed)))
		if r.Err != nil {
			t.Fatal(r.Err)
		}
		t.Logf("seed %d: %d operations, %d failed (the objects whose newest copies were on n1 and n2 are refused while they are down)", seed, r.Ops, r.Errors)
	}
}

// TestFailedWritesLeaveNoDivergentReplicas replays the seeds that, before
// the gateway repaired suspect objects, ended with replicas that differed
// (a write reached some replicas of an object and then failed).
func TestFailedWritesLeaveNoDivergentReplicas(t *testing.T) {
	dir := scratch(t)
	for _, seed := range []uint64{230, 358, 784, 860, 1081} {
		if r := simulate(t, seed, filepath.Join(dir, "s"+itoa(seed))); r.Err != nil {
			t.Error(r.Err)
		}
	}
}
