package sim

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/herd-storage/herd/internal/gateway"
)

var (
	seedFlag  = flag.Uint64("sim.seed", 0, "run only this seed (0: run -sim.seeds seeds from -sim.start)")
	exclusive = flag.Bool("sim.exclusive", false, "the clients' vdis are exclusive: a client that reconnects through another node waits for the previous lock to go instead of taking it over (Options.Exclusive)")
	seedsFlag = flag.Int("sim.seeds", defaultSeeds, "how many seeds TestSimulate runs")
	startFlag = flag.Uint64("sim.start", 1, "the first seed TestSimulate runs")
	ecFlag    = flag.String("sim.ec", "", "which seeds have an erasure-coded vdi: sometimes (a third, the default), always (with crash points often, and no rolling upgrade) or never (Options.EC)")
)

// scratch returns a directory for the nodes' disks: in memory (/dev/shm)
// when there is one, since every flush is an fdatasync.
func scratch(t *testing.T) string {
	base := os.Getenv("HERD_SIM_DIR")
	if base == "" {
		if info, err := os.Stat("/dev/shm"); err == nil && info.IsDir() {
			base = "/dev/shm"
		}
	}
	if base == "" {
		return t.TempDir()
	}
	dir, err := os.MkdirTemp(base, "herd-sim-")
	if err != nil {
		return t.TempDir()
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// seededBug is the seeded bug switched on for TestSimulate (-sim.bug,
// only in builds with the tag simbugs: seededbug_test.go).
var seededBug string

// simulate runs one seed in its own synctest bubble and returns its result.
func simulate(t *testing.T, seed uint64, dir string) Result {
	return simulateEC(t, seed, dir, ecSeeds(t))
}

// ecSeeds is -sim.ec.
func ecSeeds(t *testing.T) ECSeeds {
	mode, err := ParseECSeeds(*ecFlag)
	if err != nil {
		t.Fatal(err)
	}
	return mode
}

// simulateEC is simulate, with the erasure-coded VDIs mode says
// (Options.EC).
func simulateEC(t *testing.T, seed uint64, dir string, mode ECSeeds) Result {
	options := Options{Dir: dir, Bug: seededBug, Exclusive: *exclusive, EC: mode}
	// A seed whose world never settles (a goroutine spinning) would hang
	// in synctest.Wait until go test's timeout, which does not name it.
	watchdog := time.AfterFunc(hangLimit, func() {
		panic(fmt.Sprintf("sim: seed %d has run for %v of real time: hung? replay: %s", seed, hangLimit, ReplayCommand(seed, options)))
	})
	defer watchdog.Stop()
	var r Result
	simulateWith(t, func() { r = Run(seed, options) })
	return r
}

// hangLimit is far above a seed's real time (about 0.2 s, 1 s under -race,
// a few seconds on a loaded machine).
const hangLimit = 5 * time.Minute

// simulateWith runs fn in a synctest bubble: the world it builds runs on
// the bubble's fake clock.
func simulateWith(t *testing.T, fn func()) {
	synctest.Test(t, func(t *testing.T) { fn() })
}

func TestSimulate(t *testing.T) {
	if seededBug != "" {
		t.Logf("seeded bug %q switched on", seededBug)
	}
	if *seedFlag != 0 {
		seed := *seedFlag
		r := simulate(t, seed, scratch(t))
		for _, n := range r.Notes {
			t.Log(n)
		}
		for _, e := range r.Clients {
			t.Log(e)
		}
		logResult(t, r)
		if r.Err != nil {
			t.Fatal(r.Err)
		}
		return
	}
	seeds := *seedsFlag
	if testing.Short() {
		seeds = min(seeds, 20)
	}
	dir := scratch(t)
	started := time.Now()
	var failed atomic.Int64
	var mu sync.Mutex
	var ops, faults, stops, held, readerReads int64
	var upgraded, finalized, refused int64
	var ecSeeds int64
	ecPassed, ecCrashed := map[string]int{}, map[string]int{}
	t.Run("seeds", func(t *testing.T) {
		for i := 0; i < seeds; i++ {
			seed := *startFlag + uint64(i)
			t.Run("", func(t *testing.T) {
				t.Parallel()
				seedDir := filepath.Join(dir, "s"+itoa(seed))
				r := simulate(t, seed, seedDir)
				os.RemoveAll(seedDir)
				mu.Lock()
				ops += r.Ops
				held += int64(r.Held)
				readerReads += r.ReaderReads
				if len(r.Config.OldNodes) > 0 {
					upgraded++
				}
				if r.Finalized > 0 && r.Finalized < r.Config.Faults {
					finalized++
				}
				refused += int64(r.FinalizeRefused)
				if r.Config.hasEC() {
					ecSeeds++
				}
				for step, n := range r.ECPassed {
					ecPassed[step] += n
				}
				for step, n := range r.ECCrashed {
					ecCrashed[step] += n
				}
				for _, n := range r.Faults {
					faults += int64(n)
				}
				stops += int64(r.Faults[Stop.String()])
				mu.Unlock()
				if r.Err != nil {
					failed.Add(1)
					t.Fatal(r.Err)
				}
			})
		}
	})
	// A third of the other kills are clean stops: some seeds must stop a
	// node cleanly (or the stops test nothing).
	if seeds >= 20 && stops == 0 {
		t.Errorf("in %d seeds no node was stopped cleanly", seeds)
	}
	// A third of the kills open a maintenance window first: over many
	// seeds, some recovery must have waited for one (or the windows test
	// nothing).
	if seeds >= 100 && held == 0 {
		t.Errorf("in %d seeds no node's recovery ever waited for a maintenance window", seeds)
	}
	// Readers through other nodes than the writers' must read something,
	// or they check nothing.
	if seeds >= 10 && readerReads == 0 {
		t.Errorf("in %d seeds no reader through another node completed a read", seeds)
	}
	// A quarter of the seeds upgrade nodes from an older herd: some must
	// have seen a finalize refused and one succeed during the faults (or
	// the upgrades test nothing).
	if seeds >= 100 && (refused == 0 || finalized == 0) {
		t.Errorf("in %d seeds (%d with a rolling upgrade) %d finalizes were refused while an old node was a member and %d seeds finalized during the faults; want some of each", seeds, upgraded, refused, finalized)
	}
	// A third of the seeds write an erasure-coded VDI, killing nodes
	// inside its writes and folds: some must have (or the crash points
	// test nothing).
	crashes := 0
	for _, n := range ecCrashed {
		crashes += n
	}
	if seeds >= 100 && (ecSeeds == 0 || ecPassed[gateway.ECHeadWritten.String()] == 0 || crashes == 0) {
		t.Errorf("in %d seeds (%d with an erasure-coded vdi) no node was killed at a crash point of a write or a fold (steps passed %v, crashes %v)", seeds, ecSeeds, ecPassed, ecCrashed)
	}
	for _, step := range gateway.ECSteps {
		what := "write"
		if step.Fold() {
			what = "fold"
		}
		t.Logf("erasure coding: %d passes, %d nodes killed inside a %s: %s", ecPassed[step.String()], ecCrashed[step.String()], what, step)
	}
	elapsed := time.Since(started)
	t.Logf("%d seeds from %d in %v (%v per seed, %.1f seeds/s on %d cores): %d client operations, %d reads by readers on every node, %d scheduled events (%d clean stops), %d steps with copies held for a maintenance window, %d rolling upgrades (%d finalized during the faults, %d finalizes refused while an old node was a member), %d with an erasure-coded vdi (%d nodes killed at its crash points); %d failed",
		seeds, *startFlag, elapsed.Round(time.Millisecond), (elapsed / time.Duration(max(seeds, 1))).Round(time.Microsecond), float64(seeds)/elapsed.Seconds(), parallelism(), ops, readerReads, faults, stops, held, upgraded, finalized, refused, ecSeeds, crashes, failed.Load())
}

func logResult(t *testing.T, r Result) {
	t.Logf("seed %d: %+v; %d steps, %v of fake time, final epoch %d, events %v, %d operations (%d reads, %d writes), %d failed (allowed under faults); readers on every node: %d reads, %d failed; erasure coding's steps passed %v, nodes killed there %v",
		r.Seed, r.Config, r.Steps, r.FakeTime.Round(time.Millisecond), r.Epoch, r.Faults, r.Ops, r.Reads, r.Writes, r.Errors, r.ReaderReads, r.ReaderErrors, r.ECPassed, r.ECCrashed)
}

// TestSimulateExclusive runs seeds with the clients' VDIs exclusive (vdi
// create --exclusive): a client that reconnects through another node is
// refused until the previous writer's lock is gone (its node died, or it
// released), where TestSimulate's take it over by handover. Every
// invariant is checked after every step. Seed 384 is the one that found
// vdi check --repair writing a placed copy older than the newest one over
// a recovered replica: it runs here, with handover, too.
func TestSimulateExclusive(t *testing.T) {
	if seededBug != "" || *seedFlag != 0 || *exclusive {
		t.Skip("TestSimulate covers a single seed, a seeded bug and -sim.exclusive")
	}
	seeds := defaultSeeds / 4 // 100; 20 under the race detector
	if testing.Short() {
		seeds = 10
	}
	dir := scratch(t)
	for seed := uint64(1); seed <= uint64(seeds); seed++ {
		var r Result
		simulateWith(t, func() {
			r = Run(seed, Options{Dir: filepath.Join(dir, "x"+itoa(seed)), Exclusive: true})
		})
		if r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	// The regression seed, in the default (handover) mode.
	var r Result
	simulateWith(t, func() { r = Run(384, Options{Dir: filepath.Join(dir, "h384")}) })
	if r.Err != nil {
		t.Fatal(r.Err)
	}
}
