package sim

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing/synctest"
	"time"

	"github.com/herd-storage/herd/internal/object"
)

// Bounds of the phase after the faults, in fake time. Past them the run
// fails: the cluster did not recover (liveness).
const (
	clientsStopLimit = 3 * time.Minute
	healthyLimit     = time.Minute
	finalReadLimit   = 3 * time.Minute
	convergeLimit    = 3 * time.Minute
	// lateRun is how long the client of the VDI created after the upgrade
	// writes before the clients stop when the finalize had to wait for
	// the heal.
	lateRun = 5 * time.Second
)

// Result is what one seed's run did.
type Result struct {
	Seed     uint64
	Config   Config
	Steps    int
	FakeTime time.Duration
	Epoch    object.Epoch   // the final epoch
	Faults   map[string]int // events applied, by kind
	Ops      int64          // client operations (reads, writes, flushes)
	Reads    int64
	Writes   int64
	Errors   int64    // operations that failed (allowed: a fault may cause them)
	Held     int      // steps at which a node's recovery waited for a maintenance window
	Notes    []string // the step log
	Clients  []string // each client's first errors, then each reader's
	Err      error    // a *Failure, or nil

	// ReaderReads are the reads the readers (reader.go) completed and
	// checked; ReaderErrors those that failed (allowed).
	ReaderReads, ReaderErrors int64

	// Finalized is the fake time since the start at which the rolling
	// upgrade (Config.OldNodes) was finalized (0: none);
	// FinalizeRefused counts the finalizes refused while an old node
	// was a member, as they must be.
	Finalized       time.Duration
	FinalizeRefused int

	// Config.Layers: the layers the merge runners merged away, the VDIs
	// they flattened and the objects they copied (every process's, the
	// killed ones' up to their death), and each client's final chain
	// (its VDI first), and the merges and flattens the log still waits
	// for at the end.
	Merged, Flattened, Copied int
	Chains                    [][]uint32
	LayerJobs                 int

	// Config.ClientEC: how many times the gateways passed each step of
	// an erasure-coded write or fold (gateway.ECStep), and how many
	// nodes were killed there (crash points), by step.
	ECPassed, ECCrashed map[string]int
}

// Failure is a broken invariant (or a cluster that did not recover),
// with everything needed to understand and replay it.
type Failure struct {
	Seed uint64
	Bug  string // the seeded bug switched on, if any
	// Exclusive: the run's VDIs were exclusive (Options.Exclusive).
	Exclusive bool
	// EC: which seeds had an erasure-coded VDI (Options.EC).
	EC       ECSeeds
	Step     int
	At       time.Duration
	Problems []string
	Notes    []string // the step log up to the failure
	Logs     []string // the nodes' last log lines
	Clients  []string // each client's first errors, then each reader's
}

// ReplayCommand is how to run one seed again with options (their Bug:
// the seeded bug switched on, recovery.SetSeededBug, build tag simbugs;
// their Exclusive and EC).
func ReplayCommand(seed uint64, options Options) string {
	flags := ""
	if options.Exclusive {
		flags += " -sim.exclusive"
	}
	if options.EC != ECSometimes {
		flags += " -sim.ec=" + options.EC.String()
	}
	if options.Bug != "" {
		return fmt.Sprintf("go test -tags simbugs ./internal/sim -run TestSimulate -sim.bug=%s -sim.seed=%d%s -v", options.Bug, seed, flags)
	}
	return fmt.Sprintf("go test ./internal/sim -run TestSimulate -sim.seed=%d%s -v", seed, flags)
}

// Options are a run's surroundings, not part of its schedule.
type Options struct {
	Dir string // a fresh directory: the nodes' disks
	// Bug names the seeded bug switched on, if any (for the replay
	// command in a failure).
	Bug string
	// Exclusive makes the clients' VDIs exclusive (vdi create
	// --exclusive): a client that reconnects through another node waits
	// for the lock of the previous one to go, where by default it takes
	// the writer lock over (handover).
	Exclusive bool
	// EC says which seeds have an erasure-coded VDI: a third of them
	// (the default), every one with crash points often (and so no
	// rolling upgrade: the search for the seeded bugs of erasure
	// coding), or none (the seeds that replay what they found before
	// erasure-coded VDIs).
	EC ECSeeds
}

func (f *Failure) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "sim: seed %d failed at step %d (t=%.2fs):\n", f.Seed, f.Step, f.At.Seconds())
	for _, p := range f.Problems {
		fmt.Fprintf(&b, "  %s\n", p)
	}
	fmt.Fprintf(&b, "steps:\n")
	for _, n := range f.Notes {
		fmt.Fprintf(&b, "  %s\n", n)
	}
	if len(f.Clients) > 0 {
		fmt.Fprintf(&b, "client errors (first ones):\n")
		for _, c := range f.Clients {
			fmt.Fprintf(&b, "  %s\n", c)
		}
	}
	fmt.Fprintf(&b, "last node log lines:\n")
	for _, l := range f.Logs {
		fmt.Fprintf(&b, "  %s\n", l)
	}
	fmt.Fprintf(&b, "sim: seed %d failed; replay: %s\n", f.Seed, ReplayCommand(f.Seed, Options{Bug: f.Bug, Exclusive: f.Exclusive, EC: f.EC}))
	return b.String()
}

// Run simulates one seed. It must run inside a synctest bubble
// (synctest.Test): the whole world runs on the bubble's fake clock.
func Run(seed uint64, options Options) Result {
	return RunSchedule(newSchedule(seed, options.EC), options)
}

// RunSchedule simulates a schedule: one drawn from a seed, or one
// written by hand for a scenario test (its Seed still seeds the clients
// and the network).
func RunSchedule(schedule Schedule, options Options) (r Result) {
	seed := schedule.Seed
	r = Result{Seed: seed, Config: schedule.Config}
	w := newWorld(context.Background(), seed, schedule.Config, options.Dir)
	w.exclusive = options.Exclusive
	step := 0
	fail := func(problems ...string) Result {
		f := &Failure{Seed: seed, Bug: options.Bug, Exclusive: options.Exclusive, EC: options.EC, Step: step, At: w.elapsed(), Problems: problems, Logs: w.logs.last()}
		w.notesMu.Lock()
		f.Notes = append(f.Notes, w.notes...)
		w.notesMu.Unlock()
		f.Clients = w.firstErrors()
		r.Err = f
		return r
	}
	defer w.close()
	w.note("seed %d: %d nodes, %d copies%s, at most %d faulty at once, %d clients with %d lanes on %d-byte vdis of %d-byte objects, %v of faults%s",
		seed, schedule.Config.Nodes, schedule.Config.Copies, schedule.Config.ownCopies(), schedule.Config.MaxFaulty, schedule.Config.Clients, schedule.Config.Lanes, schedule.Config.VDISize, schedule.Config.ObjectSize, schedule.Config.Faults, schedule.Config.upgrade())
	if err := w.start(); err != nil {
		return fail("setting up: " + err.Error())
	}
	for i := 0; i < schedule.Config.Clients; i++ {
		c := newClient(w, i)
		v, err := w.log.VDI(c.vdi)
		if err != nil {
			return fail("setting up: " + err.Error())
		}
		c.start(v.ID)
		w.clients = append(w.clients, c)
	}
	if schedule.Config.UpgradeCopies != 0 {
		// The client of the VDI created once the upgrade is finalized:
		// its lanes (and the readers of its VDI) wait until then.
		w.late = newClient(w, schedule.Config.Clients)
		w.clients = append(w.clients, w.late)
	}
	for i := range w.nodes {
		w.readers = append(w.readers, newReader(w, i))
	}
	defer func() {
		r.Steps, r.FakeTime, r.Epoch, r.Faults = step, w.elapsed(), object.Epoch(w.log.Epoch()), w.counts
		r.Finalized, r.FinalizeRefused = w.finalized, w.refused
		w.layerResult(&r)
		r.ECPassed, r.ECCrashed = w.crashCounts()
		for _, c := range w.clients {
			r.Ops += c.ops.Load()
			r.Reads += c.reads.Load()
			r.Writes += c.writes.Load()
			r.Errors += c.failures.Load()
		}
		for _, rd := range w.readers {
			r.ReaderReads += rd.reads.Load()
			r.ReaderErrors += rd.failures.Load()
		}
		w.notesMu.Lock()
		r.Notes = append(r.Notes, w.notes...)
		w.notesMu.Unlock()
		r.Clients = w.firstErrors()
	}()

	// check settles the world and checks every invariant: the reads the
	// clients checked since the last step (a), the disks (b, c).
	check := func() []string {
		synctest.Wait()
		problems := w.takeViolations()
		return append(problems, w.checkStores()...)
	}

	stop := make(chan struct{})
	var lanes sync.WaitGroup
	defer func() {
		// On a failure the clients are still running: stop them (their
		// operations end with their processes) before the world closes.
		select {
		case <-stop:
		default:
			close(stop)
		}
		w.cancel()
		lanes.Wait()
	}()
	for _, c := range w.clients {
		for lane := 0; lane < w.cfg.Lanes; lane++ {
			lanes.Add(1)
			go func() {
				defer lanes.Done()
				c.lane(lane, stop)
			}()
		}
	}
	for _, rd := range w.readers {
		var readerLanes sync.WaitGroup
		for lane, timeout := range readerTimeouts {
			readerLanes.Add(1)
			go func() {
				defer readerLanes.Done()
				rd.lane(lane, timeout, stop)
			}()
		}
		lanes.Add(1)
		go func() {
			defer lanes.Done()
			readerLanes.Wait()
			rd.close()
		}()
	}
	begin := w.elapsed()
	for _, e := range schedule.Events {
		time.Sleep(begin + e.At - w.elapsed())
		step++
		if err := w.restartCrashed(); err != nil {
			return fail("restarting a node after its crash: " + err.Error())
		}
		if e.Kind != Check {
			w.note("%s", e)
		}
		if err := w.apply(e); err != nil {
			return fail(fmt.Sprintf("applying %s: %v", e, err))
		}
		if e.Kind != Finalize {
			// A finalize refused while a node is down: the operator
			// tries again.
			if err := w.finalize(); err != nil {
				return fail(err.Error())
			}
		}
		if problems := check(); len(problems) > 0 {
			return fail(problems...)
		}
		if w.held() {
			r.Held++
		}
	}

	time.Sleep(begin + schedule.Config.Faults - w.elapsed())
	// Faults stop; the clients finish what they are doing.
	step++
	w.note("heal everything; clients stop")
	if err := w.healAll(); err != nil {
		return fail("healing: " + err.Error())
	}
	if w.late != nil && !w.late.running() {
		// The finalize was refused to the end of the faults (a node was
		// down): the operator tries until every node is back, and the
		// new VDI's client writes a while before the clients stop.
		w.finalizing = true
		deadline := time.Now().Add(healthyLimit)
		for !w.late.running() {
			if err := w.finalize(); err != nil {
				return fail(err.Error())
			}
			if w.late.running() {
				break
			}
			if time.Now().After(deadline) {
				return fail(fmt.Sprintf("finalize-upgrade was still refused %v after the heal", healthyLimit))
			}
			time.Sleep(100 * time.Millisecond)
		}
		if problems, _ := w.waitFor(lateRun, nil, check, &step); len(problems) > 0 {
			return fail(problems...)
		}
	}
	close(stop)
	stopped := make(chan struct{})
	go func() { lanes.Wait(); close(stopped) }()
	if problems, finished := w.waitFor(clientsStopLimit, stopped, check, &step); len(problems) > 0 {
		return fail(problems...)
	} else if !finished {
		return fail("clients did not finish their operations within " + clientsStopLimit.String() + " of the heal")
	}
	// The cluster agrees on every node again.
	healthyAt := time.Now().Add(healthyLimit)
	for {
		ok, why := w.healthy()
		if ok {
			break
		}
		if time.Now().After(healthyAt) {
			return fail(fmt.Sprintf("not every node was back in the log within %v of the heal: %s", healthyLimit, why))
		}
		time.Sleep(100 * time.Millisecond)
	}
	step++
	w.note("cluster healthy: epoch %d", w.log.Epoch())
	if problems := check(); len(problems) > 0 {
		return fail(problems...)
	}
	// Every block reads back as the model says (d), through a new export.
	for _, c := range w.clients {
		if err := c.finalRead(finalReadLimit); err != nil {
			return fail(err.Error())
		}
	}
	step++
	w.note("final reads done")
	if problems := check(); len(problems) > 0 {
		return fail(problems...)
	}
	// Every VDI's whole history, its writer's operations and every
	// reader's, is linearizable (porcupine: internal/linearize).
	if problems := w.checkHistories(); len(problems) > 0 {
		return fail(problems...)
	}
	// Recovery makes every object exactly `copies` identical current
	// copies (d).
	deadline := time.Now().Add(convergeLimit)
	for {
		step++
		if problems := check(); len(problems) > 0 {
			return fail(problems...)
		}
		problems := w.converged()
		if len(problems) == 0 {
			break
		}
		if time.Now().After(deadline) {
			return fail(append([]string{fmt.Sprintf("recovery did not converge within %v of the final reads:", convergeLimit)}, w.recoveryStatus(problems)...)...)
		}
		time.Sleep(2 * time.Second)
	}
	w.note("converged: every object has its vdi's copies (the format's %d%s), identical, stamped %d", w.cfg.Copies, w.cfg.ownCopies(), w.log.Epoch())
	return r
}

// firstErrors are each client's first errors, then each reader's.
func (w *World) firstErrors() []string {
	var out []string
	for _, c := range w.clients {
		c.mu.Lock()
		out = append(out, c.errs...)
		c.mu.Unlock()
	}
	for _, rd := range w.readers {
		rd.mu.Lock()
		out = append(out, rd.errs...)
		rd.mu.Unlock()
	}
	return out
}

// waitFor waits until done closes, checking the invariants every second;
// it reports what broke, or whether done closed within limit.
func (w *World) waitFor(limit time.Duration, done <-chan struct{}, check func() []string, step *int) (problems []string, finished bool) {
	deadline := time.After(limit)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-done:
			return nil, true
		case <-deadline:
			return nil, false
		case <-tick.C:
			*step++
			if problems := check(); len(problems) > 0 {
				return problems, false
			}
		}
	}
}

// recoveryStatus describes what is left and where recovery stands.
func (w *World) recoveryStatus(problems []string) []string {
	out := problems
	if len(out) > 20 {
		out = append(out[:20:20], fmt.Sprintf("... and %d more", len(problems)-20))
	}
	var ids []string
	for _, n := range w.nodes {
		s := n.proc.recovery.Status()
		ids = append(ids, fmt.Sprintf("recovery of %s: epoch %d %s, %d objects, %d left, %d unavailable, %d surplus, last error %q", n.id, s.Epoch, s.State, s.Objects, s.Remaining, s.Unavailable, s.Surplus, s.LastError))
	}
	sort.Strings(ids)
	return append(out, ids...)
}

// historyTimeout bounds the linearizability check of one client's
// history; a check that runs out counts as a failure. The bubble's clock
// only moves while every goroutine waits, so on a busy machine this is
// less than it looks.
const historyTimeout = time.Minute

// checkHistories checks every client's history of writes and reads for
// linearizability; a failing one leaves porcupine's HTML visualization in
// the system's temporary directory, named in the problem.
func (w *World) checkHistories() []string {
	dir := os.TempDir()
	var problems []string
	for _, c := range w.clients {
		visualization := filepath.Join(dir, fmt.Sprintf("herd-sim-%d-client%d.html", w.seed, c.id))
		if err := c.history.Check(historyTimeout, visualization); err != nil {
			problems = append(problems, fmt.Sprintf("client %d (%s): %v (a read returned a write no order of the operations allows)", c.id, c.vdi, err))
		}
	}
	return problems
}
