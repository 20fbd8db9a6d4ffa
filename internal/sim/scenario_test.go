package sim

import (
	"path/filepath"
	"strings"
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
		// As the seeds were then: 358 and 784 have an erasure-coded
		// VDI since.
		if r := simulateEC(t, seed, filepath.Join(dir, "s"+itoa(seed)), ECNever); r.Err != nil {
			t.Error(r.Err)
		}
	}
}

// resumed is the stale read that leases prevent, as a schedule: n4 is
// paused long enough to be dropped from the epoch while the writers go
// on, and resumes catching up on the log a second late; then n3 is cut
// off as long, and the cut heals as late. Both have contact with the
// leader at once when they return, and apply the old epoch for a
// second: with the node's contact as its lease (the seeded bug
// lease-by-contact), the readers on n4 and n3 read their own old copies
// then.
func resumed(seed uint64) Schedule {
	return Schedule{
		Seed:   seed,
		Config: Config{Nodes: 5, Copies: 2, MaxFaulty: 1, ObjectSize: 64 << 10, VDISize: 1 << 20, Clients: 2, Lanes: 3, Faults: 20 * time.Second},
		Events: []Event{
			{At: time.Second, Kind: Pause, Node: 4},
			{At: 8 * time.Second, Kind: Resume, Node: 4, CatchUp: time.Second},
			{At: 10 * time.Second, Kind: Partition, Nodes: []int{3}},
			{At: 17 * time.Second, Kind: Heal, CatchUp: time.Second},
		},
	}
}

func TestScenarioResumedNode(t *testing.T) {
	if seededBug != "" {
		t.Skipf("seeded bug %q is on", seededBug)
	}
	dir := scratch(t)
	for seed := uint64(1); seed <= 3; seed++ {
		r := runScenario(t, resumed(seed), filepath.Join(dir, "s"+itoa(seed)))
		if r.Err != nil {
			t.Fatal(r.Err)
		}
		t.Logf("seed %d: %d reads by readers on every node, %d failed (a node without a lease answers nothing)", seed, r.ReaderReads, r.ReaderErrors)
	}
}

// TestReturningNodesServeNoStaleRead replays the seeds that, with the
// seeded bug lease-by-contact (a node serves while it has contact with
// the leader: no lease, no activation), end with a stale read by a reader
// on a node that returned (resumed, restarted) and had not applied the
// epochs it missed yet (TestSimulatorFindsSeededBugLeaseByContact finds
// them under -tags simbugs). With leases they pass.
func TestReturningNodesServeNoStaleRead(t *testing.T) {
	if seededBug != "" {
		t.Skipf("seeded bug %q is on", seededBug)
	}
	dir := scratch(t)
	for _, seed := range returningSeeds {
		// As the seeds were then: 49 and 83 have an erasure-coded VDI
		// since.
		if r := simulateEC(t, seed, filepath.Join(dir, "s"+itoa(seed)), ECNever); r.Err != nil {
			t.Error(r.Err)
		}
	}
}

// returningSeeds are the first seeds that fail with lease-by-contact
// (seeds 1-160: also 28, 54, 80, 100, 101, 108, 115, 124 and 130).
var returningSeeds = []uint64{16, 23, 49, 64, 78, 83, 91, 92}

// vdiCopies is a cluster formatted with 3 copies holding a VDI of 2
// copies and one of 4 (vdi create --copies, after the upgrade is
// finalized), on 5 nodes: nodes are killed and restarted one at a time,
// so every object's replica set changes and recovery runs. Recovery must
// give each object its VDI's copies: no third copy of the VDI of 2, and
// the fourth copy of the VDI of 4 neither skipped nor deleted as surplus
// (the final check: exactly the VDI's copies, where the final epoch
// places them, identical).
func vdiCopies(seed uint64) Schedule {
	return Schedule{
		Seed:   seed,
		Config: Config{Nodes: 5, Copies: 3, ClientCopies: []int{2, 4}, MaxFaulty: 1, ObjectSize: 64 << 10, VDISize: 1 << 20, Clients: 2, Lanes: 3, Faults: 20 * time.Second},
		Events: []Event{
			{At: time.Second, Kind: Kill, Node: 1},
			{At: 7 * time.Second, Kind: Restart, Node: 1},
			{At: 10 * time.Second, Kind: Kill, Node: 3},
			{At: 16 * time.Second, Kind: Restart, Node: 3, CatchUp: 300 * time.Millisecond},
		},
	}
}

func TestScenarioVDIsOwnCopies(t *testing.T) {
	if seededBug != "" {
		t.Skipf("seeded bug %q is on", seededBug)
	}
	dir := scratch(t)
	for seed := uint64(1); seed <= 3; seed++ {
		r := runScenario(t, vdiCopies(seed), filepath.Join(dir, "s"+itoa(seed)))
		if r.Err != nil {
			t.Fatal(r.Err)
		}
		t.Logf("seed %d: %d operations, %d failed, final epoch %d", seed, r.Ops, r.Errors, r.Epoch)
	}
}

// rollingUpgrade: every node of 4 starts on an older herd (feature level
// 1); the operator's finalize is refused at once and again with one node
// left to upgrade; the nodes are restarted on this herd one by one (one
// of them killed meanwhile, so it comes back upgraded); the finalize
// that follows succeeds, and a VDI of 2 copies (the format's: 3) is
// created and written, read by the readers, and must converge to 2
// copies.
func rollingUpgrade(seed uint64) Schedule {
	return Schedule{
		Seed:   seed,
		Config: Config{Nodes: 4, Copies: 3, MaxFaulty: 1, ObjectSize: 64 << 10, VDISize: 1 << 20, Clients: 2, Lanes: 3, Faults: 20 * time.Second, OldNodes: []int{0, 1, 2, 3}, UpgradeCopies: 2},
		Events: []Event{
			{At: time.Second, Kind: Finalize},
			{At: 2 * time.Second, Kind: Upgrade, Node: 0, CatchUp: 300 * time.Millisecond},
			{At: 3 * time.Second, Kind: Kill, Node: 2},
			{At: 4 * time.Second, Kind: Upgrade, Node: 1},
			{At: 5 * time.Second, Kind: Upgrade, Node: 2},
			{At: 6 * time.Second, Kind: Finalize},
			{At: 8 * time.Second, Kind: Restart, Node: 2, CatchUp: time.Second},
			{At: 9 * time.Second, Kind: Upgrade, Node: 3, CatchUp: 50 * time.Millisecond},
			{At: 11 * time.Second, Kind: Finalize},
		},
	}
}

func TestScenarioRollingUpgrade(t *testing.T) {
	if seededBug != "" {
		t.Skipf("seeded bug %q is on", seededBug)
	}
	dir := scratch(t)
	for seed := uint64(1); seed <= 3; seed++ {
		r := runScenario(t, rollingUpgrade(seed), filepath.Join(dir, "s"+itoa(seed)))
		if r.Err != nil {
			t.Fatal(r.Err)
		}
		if r.FinalizeRefused != 2 || r.Finalized == 0 || r.Finalized > r.Config.Faults {
			t.Fatalf("seed %d: %d finalizes refused while old nodes were members (want 2), finalized at %v (want during the faults)\n%s", seed, r.FinalizeRefused, r.Finalized, strings.Join(r.Notes, "\n"))
		}
		t.Logf("seed %d: finalized at %v; %d operations, %d failed", seed, r.Finalized, r.Ops, r.Errors)
	}
}
