//go:build simbugs

package sim

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

var (
	bugFlag      = flag.String("sim.bug", "", "switch this seeded bug on for TestSimulate (see seededBugs: the simulator's and recovery.SeededBugs)")
	bugSeedsFlag = flag.Int("sim.bugseeds", 400, "how many seeds TestSimulatorFindsSeededBug tries before it gives up")
)

func TestMain(m *testing.M) {
	flag.Parse()
	if *bugFlag != "" {
		if err := setSeededBug(*bugFlag, true); err != nil {
			panic(err)
		}
		seededBug = *bugFlag
	}
	os.Exit(m.Run())
}

// TestSimulatorFindsSeededBug shows that the simulator finds a bug class
// on purpose: with an old bug compiled back in (docs/TESTING.md: background
// recovery counted every node as a witness in the proof of currency and
// so restamped a stale copy), it runs seeds until one fails, then replays
// that seed and expects it to fail again (searching on if it does not).
// Built only with -tags simbugs.
func TestSimulatorFindsSeededBug(t *testing.T) {
	findSeededBug(t, "every-node-witnesses", "")
}

// TestSimulatorFindsSeededBugLeaseByContact: with a node's lease its
// contact with the leader again, as before cluster/lease.go, a reader on
// a node that returns (resumed, healed or restarted) and catches up on
// the log late reads the node's own copy in the epoch it left. The
// normal build passes the seeds that find it
// (TestReturningNodesServeNoStaleRead).
//
// The ro/ readers read every replica now (gateway/agree.go), and the
// replicas of the current epoch refuse a request in the epoch the node
// left: that hides the bug from them. So the search runs with ro/ reads
// of one replica too (the seeded bug one-replica-reads), which is how a
// writer's gateway still reads, and looks for a stale read, which that
// bug alone never causes.
func TestSimulatorFindsSeededBugLeaseByContact(t *testing.T) {
	if err := setSeededBug("one-replica-reads", true); err != nil {
		t.Fatal(err)
	}
	defer setSeededBug("one-replica-reads", seededBug == "one-replica-reads")
	findSeededBug(t, "lease-by-contact", "(stale read)")
}

// TestSimulatorFindsSeededBugOneReplicaReads: with a ro/ open of a live
// VDI reading one replica, as before gateway/agree.go, a reader through
// one node reads a write in flight (or the map entry of an object's first
// write) and a later reader through another node the older data. The
// read floor or the linearizability check of the history finds it.
func TestSimulatorFindsSeededBugOneReplicaReads(t *testing.T) {
	findSeededBug(t, "one-replica-reads", "not linearizable")
}

// TestSimulatorFindsSeededBugECHeadBeforeChunks: with a fold of an
// erasure-coded object writing its new head before its chunks, a node
// killed between the two (a crash point) or a chunk write that fails
// leaves a head naming chunks never written, and the overlay's blocks it
// made stale are lost: some acknowledged write is on no node's disk as
// the object's replicated part there presents it (invariant (b)). Every
// seed runs an erasure-coded VDI with crash points often (ECAlways).
func TestSimulatorFindsSeededBugECHeadBeforeChunks(t *testing.T) {
	findSeededBugWith(t, "ec-head-before-chunks", "", ECAlways)
}

// TestSimulatorFindsSeededBugECTrimBeforeHead: with a fold trimming the
// overlay before it writes its new head, a node killed between the two
// (or a head write that fails) leaves the old head current over an
// overlay whose blocks are gone.
func TestSimulatorFindsSeededBugECTrimBeforeHead(t *testing.T) {
	findSeededBugWith(t, "ec-trim-before-head", "", ECAlways)
}

// findSeededBug switches bug on, runs seeds until one fails (with a
// problem that contains want, if want is not empty), then replays that
// seed and expects it to fail again (searching on if it does not).
func findSeededBug(t *testing.T, bug, want string) {
	findSeededBugWith(t, bug, want, ecSeeds(t))
}

// findSeededBugWith is findSeededBug, with the erasure-coded VDIs mode
// says (Options.EC).
func findSeededBugWith(t *testing.T, bug, want string, mode ECSeeds) {
	if err := setSeededBug(bug, true); err != nil {
		t.Fatal(err)
	}
	defer setSeededBug(bug, seededBug == bug)
	saved := seededBug
	seededBug = bug
	defer func() { seededBug = saved }()
	fails := func(r Result) bool { return r.Err != nil && strings.Contains(problems(r.Err), want) }
	dir := scratch(t)
	started := time.Now()
	tried := 0
	// Seeds run in batches, in parallel; the lowest failing seed of a
	// batch is replayed. A seed whose failure does not come back (the
	// simulator's nodes are real goroutines, and a failure can depend on
	// the load of the runs beside it: seen once in CI) is reported and the
	// search goes on; the test fails if no failing seed replays.
	const batch = 8
	next := *startFlag
	for tried < *bugSeedsFlag {
		var found *Result
		for ; tried < *bugSeedsFlag && found == nil; next += batch {
			first := next
			results := make([]Result, batch)
			t.Run(fmt.Sprintf("seeds %d-%d", first, first+batch-1), func(t *testing.T) {
				for i := range results {
					seed := first + uint64(i)
					t.Run(itoa(seed), func(t *testing.T) {
						t.Parallel()
						results[i] = simulateEC(t, seed, filepath.Join(dir, "s"+itoa(seed)), mode)
					})
				}
			})
			tried += batch
			for i := range results {
				if fails(results[i]) {
					found = &results[i]
					break
				}
			}
		}
		if found == nil {
			break
		}
		t.Logf("found the seeded bug %s with seed %d (%d seeds tried in %v):\n%v", bug, found.Seed, tried, time.Since(started).Round(time.Millisecond), found.Err)
		// The replays run in parallel too, as the search did.
		const replays = batch
		outcomes := make([]Result, replays)
		t.Run(fmt.Sprintf("replays of %d", found.Seed), func(t *testing.T) {
			for i := range outcomes {
				t.Run(itoa(uint64(i+1)), func(t *testing.T) {
					t.Parallel()
					outcomes[i] = simulateEC(t, found.Seed, filepath.Join(dir, fmt.Sprintf("replay%d-%d", found.Seed, i)), mode)
				})
			}
		})
		failures := 0
		for i, r := range outcomes {
			if fails(r) {
				failures++
				t.Logf("replay %d of seed %d failed again: %s", i+1, found.Seed, problems(r.Err))
			}
		}
		if failures > 0 {
			t.Logf("seed %d: %d of %d replays failed again", found.Seed, failures, replays)
			return
		}
		t.Logf("seed %d failed once but none of %d replays failed; searching on", found.Seed, replays)
	}
	t.Fatalf("no seed of %d from %d failed in a way its replays repeat (the seeded bug %s was not found, or not reproducibly)", tried, *startFlag, bug)
}

// TestScenarioFigure4FindsSeededBug: the Fig. 4 scenario, which passes on
// the real code (TestScenarioFigure4), fails with the seeded bug.
func TestScenarioFigure4FindsSeededBug(t *testing.T) {
	const bug = "every-node-witnesses"
	if err := setSeededBug(bug, true); err != nil {
		t.Fatal(err)
	}
	defer setSeededBug(bug, seededBug == bug)
	saved := seededBug
	seededBug = bug
	defer func() { seededBug = saved }()
	dir := scratch(t)
	for seed := uint64(1); seed <= 5; seed++ {
		r := runScenario(t, figure4(seed), filepath.Join(dir, "s"+itoa(seed)))
		if r.Err != nil {
			t.Logf("seed %d fails with the seeded bug, as it must: %s", seed, problems(r.Err))
			return
		}
		t.Logf("seed %d passed", seed)
	}
	t.Fatal("the Fig. 4 scenario did not find the seeded bug in 5 seeds")
}

// TestScenarioResumedNodeFindsSeededBug: the resumed-node scenario, which
// passes on the real code (TestScenarioResumedNode), fails with the
// seeded bug lease-by-contact: a stale read by a reader on a returning
// node. As for TestSimulatorFindsSeededBugLeaseByContact, the readers
// read as before gateway/agree.go (one-replica-reads), which otherwise
// hides it.
func TestScenarioResumedNodeFindsSeededBug(t *testing.T) {
	const bug = "lease-by-contact"
	if err := setSeededBug(bug, true); err != nil {
		t.Fatal(err)
	}
	defer setSeededBug(bug, seededBug == bug)
	if err := setSeededBug("one-replica-reads", true); err != nil {
		t.Fatal(err)
	}
	defer setSeededBug("one-replica-reads", seededBug == "one-replica-reads")
	saved := seededBug
	seededBug = bug
	defer func() { seededBug = saved }()
	dir := scratch(t)
	for seed := uint64(1); seed <= 5; seed++ {
		r := runScenario(t, resumed(seed), filepath.Join(dir, "s"+itoa(seed)))
		if r.Err != nil && strings.Contains(problems(r.Err), "(stale read)") {
			t.Logf("seed %d fails with the seeded bug, as it must: %s", seed, problems(r.Err))
			return
		}
		if r.Err != nil {
			t.Logf("seed %d failed otherwise than by a stale read (one-replica-reads alone can): %s", seed, problems(r.Err))
			continue
		}
		t.Logf("seed %d passed", seed)
	}
	t.Fatal("the resumed-node scenario did not find the seeded bug in 5 seeds")
}
