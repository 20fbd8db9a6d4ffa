package sim

import (
	"flag"
	"fmt"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/herd-storage/herd/internal/cluster"
)

var (
	raftSeedFlag    = flag.Uint64("sim.raft.seed", 0, "TestSimulateRaft runs only this seed, and prints its steps")
	raftSeedsFlag   = flag.Int("sim.raft.seeds", defaultRaftSeeds, "how many seeds TestSimulateRaft runs")
	raftStartFlag   = flag.Uint64("sim.raft.start", 1, "the first seed TestSimulateRaft runs")
	raftReplaysFlag = flag.Int("sim.raft.replays", raftReplays, "how many times a failing raft-mode seed is replayed")
)

// raftReplays is how many times a failing seed is replayed: the raft
// mode does not replay bit for bit (raft and memberlist draw from
// math/rand), so a failure counts as reproducible when at least half of
// them fail again.
const raftReplays = 10

var useSimClock sync.Once

// simulateRaft runs one raft-mode seed in a bubble of its own.
func simulateRaft(t *testing.T, seed uint64) RaftResult {
	useSimClock.Do(cluster.UseSimClock)
	watchdog := time.AfterFunc(hangLimit, func() {
		panic(fmt.Sprintf("sim: raft seed %d has run for %v of real time: hung? replay: go test ./internal/sim -run TestSimulateRaft -sim.raft.seed=%d -v", seed, hangLimit, seed))
	})
	defer watchdog.Stop()
	var r RaftResult
	synctest.Test(t, func(t *testing.T) { r = RunRaft(seed) })
	return r
}

// replayRaft runs seed n times (two at a time) and returns how many
// failed, with the first failure's problems.
func replayRaft(t *testing.T, seed uint64, n int) (failed int, first []string) {
	var mu sync.Mutex
	t.Run(fmt.Sprintf("replays-of-%d", seed), func(t *testing.T) {
		for i := range n {
			t.Run(fmt.Sprint(i), func(t *testing.T) {
				t.Parallel()
				r := simulateRaft(t, seed)
				mu.Lock()
				defer mu.Unlock()
				if r.Failed() {
					failed++
					if first == nil {
						first = r.Problems
					}
				}
			})
		}
	})
	return failed, first
}

// report is a failed run's account.
func (r RaftResult) report() string {
	var b strings.Builder
	fmt.Fprintf(&b, "raft-mode seed %d failed:\n", r.Seed)
	for _, p := range r.Problems {
		fmt.Fprintf(&b, "  %s\n", p)
	}
	b.WriteString("steps:\n")
	for _, s := range r.Steps {
		fmt.Fprintf(&b, "  %s\n", s)
	}
	b.WriteString(r.Logs)
	fmt.Fprintf(&b, "replay: go test ./internal/sim -run TestSimulateRaft -sim.raft.seed=%d -v", r.Seed)
	return b.String()
}

// TestSimulateRaft runs seeds of the raft mode (raftworld.go): three
// nodes of the real cluster runtime under kills, clean stops, pauses and
// partitions. A failing seed is replayed raftReplays times, and the test
// says how many of those failed again.
func TestSimulateRaft(t *testing.T) {
	seeds := make([]uint64, 0, *raftSeedsFlag)
	if *raftSeedFlag != 0 {
		seeds = append(seeds, *raftSeedFlag)
		verboseRaft = true
	} else {
		for i := range *raftSeedsFlag {
			seeds = append(seeds, *raftStartFlag+uint64(i))
		}
	}
	began := time.Now()
	var failing []RaftResult
	commits, served := 0, 0
	for _, seed := range seeds {
		r := simulateRaft(t, seed)
		commits += r.Commits
		served += r.Served
		if *raftSeedFlag != 0 {
			for _, s := range r.Steps {
				t.Log(s)
			}
			t.Log("the nodes' logs:\n" + r.Logs)
		}
		if r.Failed() {
			failing = append(failing, r)
		}
	}
	t.Logf("%d raft-mode seeds in %v: %d failed; %d probes committed, %d reads served under a lease", len(seeds), time.Since(began).Round(time.Millisecond), len(failing), commits, served)
	for _, r := range failing {
		failed, _ := replayRaft(t, r.Seed, *raftReplaysFlag)
		t.Errorf("%s\n%d of %d replays of seed %d failed again", r.report(), failed, *raftReplaysFlag, r.Seed)
	}
}
