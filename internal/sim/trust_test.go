package sim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/herd-storage/herd/internal/cluster"
)

// rotationsResult is what one run of runRotations did.
type rotationsResult struct {
	Notes      []string
	Clients    []string // the clients' first errors
	Writes     int64
	Errors     int64          // client operations that failed
	Checked    int            // node checks of the trust after the steps
	Handshakes map[string]int // by the CAs presented (dialer>server)
	Err        error
}

// rotationStep is one step of the rotations scenario: done at At (since
// the clients started), then checked.
type rotationStep struct {
	At time.Duration
	Do func(w *World, tw *trustWorld) error
}

// runRotations runs the rotations scenario on seed's world: 4 nodes, 2
// copies, 2 clients writing and reading throughout. Each step is applied,
// the world settles, and the invariants are checked: the simulator's
// (its violations, including any peer request a handshake of the trust
// model refused, and the stores), and the trust of every node that runs,
// reaches the leader and applied the whole log (trustWorld.checkTrust:
// it must come to equal the log's within trustSettle). At the end the
// faults heal, the clients stop and read everything back, and every node
// must end up trusting the log's CA alone and holding its gossip key
// alone.
func runRotations(seed uint64, dir string, steps []rotationStep) (r rotationsResult) {
	cfg := Config{Nodes: 4, Copies: 2, MaxFaulty: 1, ObjectSize: 64 << 10, VDISize: 1 << 20, Clients: 2, Lanes: 3}
	w := newWorld(context.Background(), seed, cfg, dir)
	defer func() {
		w.notesMu.Lock()
		r.Notes = append(r.Notes, w.notes...)
		w.notesMu.Unlock()
		for _, c := range w.clients {
			r.Writes += c.writes.Load()
			r.Errors += c.failures.Load()
		}
		r.Clients = w.firstErrors()
	}()
	defer w.close()
	fail := func(format string, args ...any) rotationsResult {
		r.Err = fmt.Errorf("seed %d at t=%.2fs: %s", seed, w.elapsed().Seconds(), fmt.Sprintf(format, args...))
		return r
	}
	if err := w.start(); err != nil {
		return fail("setting up: %v", err)
	}
	tw, err := newTrustWorld(w)
	if err != nil {
		return fail("setting up the trust: %v", err)
	}
	defer func() {
		tw.mu.Lock()
		r.Handshakes = tw.handshakes
		tw.mu.Unlock()
	}()
	for i := 0; i < cfg.Clients; i++ {
		c := newClient(w, i)
		v, err := w.log.VDI(c.vdi)
		if err != nil {
			return fail("setting up: %v", err)
		}
		c.start(v.ID)
		w.clients = append(w.clients, c)
	}
	stop := make(chan struct{})
	var lanes sync.WaitGroup
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		w.cancel()
		lanes.Wait()
	}()
	for _, c := range w.clients {
		for lane := 0; lane < cfg.Lanes; lane++ {
			lanes.Add(1)
			go func() {
				defer lanes.Done()
				c.lane(lane, stop)
			}()
		}
	}
	check := func(what string) error {
		synctest.Wait()
		if problems := append(w.takeViolations(), w.checkStores()...); len(problems) > 0 {
			return fmt.Errorf("%s: %s", what, strings.Join(problems, "; "))
		}
		deadline := time.Now().Add(trustSettle)
		for {
			problems, checked := tw.checkTrust()
			if len(problems) == 0 {
				r.Checked += checked
				return nil
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("%s: the trust did not follow the log within %v: %s", what, trustSettle, strings.Join(problems, "; "))
			}
			time.Sleep(trustTurn / 2)
		}
	}
	begin := w.elapsed()
	for i, s := range steps {
		time.Sleep(begin + s.At - w.elapsed())
		if err := s.Do(w, tw); err != nil {
			return fail("step %d: %v", i+1, err)
		}
		if err := check(fmt.Sprintf("after step %d", i+1)); err != nil {
			return fail("%v", err)
		}
	}
	w.note("heal everything; clients stop")
	if err := w.healAll(); err != nil {
		return fail("healing: %v", err)
	}
	close(stop)
	stopped := make(chan struct{})
	go func() { lanes.Wait(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(clientsStopLimit):
		return fail("the clients did not stop within %v", clientsStopLimit)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		ok, why := tw.settled()
		if healthy, whyNot := w.healthy(); ok && healthy {
			break
		} else if why == "" {
			why = whyNot
		}
		if time.Now().After(deadline) {
			return fail("a minute after the heal: %s", why)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := check("after the heal"); err != nil {
		return fail("%v", err)
	}
	for _, c := range w.clients {
		if err := c.finalRead(finalReadLimit); err != nil {
			return fail("%v", err)
		}
	}
	if err := check("after the final reads"); err != nil {
		return fail("%v", err)
	}
	return r
}

// trustSettle is how long a node that runs, reaches the leader and
// applied the whole log may take to trust what the log does: a few
// turns of its loops (and, for a certificate, the holder's answer).
const trustSettle = time.Second

// refusedUnchanged runs an operator's command that must be refused with
// an error of kind saying want, and checks that record (what the command
// would have changed in the log) reads the same before and after.
func refusedUnchanged(what string, record func() any, do func() error, kind error, want string) error {
	before, _ := json.Marshal(record())
	err := do()
	if !errors.Is(err, kind) || !strings.Contains(err.Error(), want) {
		return fmt.Errorf("%s: %v, want %v saying %q", what, err, kind, want)
	}
	if after, _ := json.Marshal(record()); string(after) != string(before) {
		return fmt.Errorf("%s was refused but changed the log:\n%s\n%s", what, before, after)
	}
	return nil
}

// waitUntil waits (fake time) until cond holds, at most limit.
func waitUntil(limit time.Duration, what string, cond func() bool) error {
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: not within %v", what, limit)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return nil
}

// rotationSteps: n3 is killed, and misses the start of a CA rotation to
// CA1 made on n0 (a second rotate-ca is refused, so is --finish while n3
// has no certificate from CA1); n3 restarts on its old trust and log,
// catches up, gets its certificate from n0, and the finish goes through.
// Then a gossip key rotation to K1 starts on n1 (a second one is
// refused); n2 is paused as soon as it installed K1, so the switch
// leaves it behind (the end is refused while it is alive in the log and
// does not use K1); the failure detector takes it out, the rotation ends
// without it, and n2 resumes holding K0 as the key it sends with. All
// the while the clients write through n0 and n1.
func rotationSteps() []rotationStep {
	// What a refused command would have changed (reports of other
	// nodes land meanwhile: the FSM unit tests compare whole states).
	ca := func(w *World) any {
		s := w.log.CA()
		out := []any{s.Fingerprint, s.Since, s.Retired}
		if r := s.Rotation; r != nil {
			out = append(out, r.Fingerprint, r.Holder, r.Started)
		}
		return out
	}
	keys := func(w *World) any {
		s := w.log.GossipKeyState()
		out := []any{s.Primary, s.Rotated}
		if r := s.Rotation; r != nil {
			out = append(out, r.Key, r.Old, r.Phase, r.Holder, r.Started)
		}
		return out
	}
	finished := false
	finish := func(w *World, tw *trustWorld) error {
		if finished {
			return nil
		}
		if _, err := w.log.FinishCARotation(false); err != nil {
			if !errors.Is(err, cluster.ErrBusy) {
				return fmt.Errorf("rotate-ca --finish: %v", err)
			}
			w.note("log: rotate-ca --finish refused: %v", err)
			return nil
		}
		finished = true
		w.note("log: rotate-ca --finish: CA1 is the cluster's")
		return nil
	}
	return []rotationStep{
		{At: time.Second, Do: func(w *World, tw *trustWorld) error {
			w.note("kill n3")
			return w.apply(Event{Kind: Kill, Node: 3})
		}},
		{At: 1500 * time.Millisecond, Do: func(w *World, tw *trustWorld) error {
			w.note("lag: n1 and n2 apply the log 300ms and 700ms late")
			if err := w.apply(Event{Kind: Lag, Node: 1, Lag: 300 * time.Millisecond}); err != nil {
				return err
			}
			return w.apply(Event{Kind: Lag, Node: 2, Lag: 700 * time.Millisecond})
		}},
		{At: 2 * time.Second, Do: func(w *World, tw *trustWorld) error {
			w.note("rotate-ca on n0: CA1")
			if err := tw.rotateCA("n0", "CA1"); err != nil {
				return err
			}
			return refusedUnchanged("a second rotate-ca during the rotation", func() any { return ca(w) }, func() error { return tw.rotateCA("n1", "CA2") }, cluster.ErrBusy, "is under way")
		}},
		{At: 4 * time.Second, Do: func(w *World, tw *trustWorld) error {
			return refusedUnchanged("rotate-ca --finish while n3 has no certificate from CA1", func() any { return ca(w) }, func() error { _, err := w.log.FinishCARotation(false); return err }, cluster.ErrBusy, "n3")
		}},
		{At: 7 * time.Second, Do: func(w *World, tw *trustWorld) error {
			w.note("restart n3 (catching up on the log after 300ms)")
			return w.apply(Event{Kind: Restart, Node: 3, CatchUp: 300 * time.Millisecond})
		}},
		{At: 10 * time.Second, Do: finish},
		{At: 11 * time.Second, Do: finish},
		{At: 12 * time.Second, Do: func(w *World, tw *trustWorld) error {
			if !finished {
				return errors.New("rotate-ca --finish was still refused 5 s after n3 restarted")
			}
			for _, n := range []int{1, 2} {
				if err := w.apply(Event{Kind: Lag, Node: n}); err != nil {
					return err
				}
			}
			w.note("rotate-gossip-key on n1: K1")
			if err := tw.rotateGossipKey("n1", "K1"); err != nil {
				return err
			}
			if err := refusedUnchanged("a second rotate-gossip-key during the rotation", func() any { return keys(w) }, func() error { return tw.rotateGossipKey("n0", "K2") }, cluster.ErrBusy, "is under way"); err != nil {
				return err
			}
			if err := waitUntil(2*time.Second, "n2 installs K1", func() bool {
				r := w.log.GossipKeyState().Rotation
				return r != nil && strings.Contains(strings.Join(r.Installed, ","), "n2")
			}); err != nil {
				return err
			}
			w.note("pause n2")
			if err := w.apply(Event{Kind: Pause, Node: 2}); err != nil {
				return err
			}
			if err := waitUntil(2*time.Second, "the switch to K1", func() bool {
				r := w.log.GossipKeyState().Rotation
				return r != nil && r.Phase == cluster.GossipKeyUse
			}); err != nil {
				return err
			}
			return refusedUnchanged("the end of the gossip key rotation while n2 does not use K1", func() any { return keys(w) }, func() error { return w.log.CommitGossipKeyStep("done") }, cluster.ErrBusy, "n2")
		}},
		{At: 20 * time.Second, Do: func(w *World, tw *trustWorld) error {
			if r := w.log.GossipKeyState(); r.Rotation != nil {
				return fmt.Errorf("the gossip key rotation did not end without n2, paused: %+v", *r.Rotation)
			}
			w.note("resume n2 (catching up on the log after 1s)")
			return w.apply(Event{Kind: Resume, Node: 2, CatchUp: time.Second})
		}},
		{At: 25 * time.Second, Do: func(w *World, tw *trustWorld) error { return nil }},
	}
}

// TestScenarioRotations: the trust state machine in the simulator
// (trust.go): a CA rotation with a node down across its start, and a
// gossip key rotation with a node paused across its switch and end,
// while clients write. The simulator has no TLS and no gossip: the log's
// side is real (cluster.Local's commands and FSMs, each node deciding
// peers by its own applied prefix), each node's trust is modelled from
// the log it applied as server/trust.go and cluster/gossipkeys.go derive
// it, and every request between nodes is a handshake of that model.
// After every step every node that is caught up trusts exactly the log's
// CAs and holds the log's gossip keys, no request between two nodes is
// refused, and no client operation fails; the refused commands change
// nothing; at the end every node trusts CA1 alone and holds K1 alone, and
// certificates of both CAs were used.
func TestScenarioRotations(t *testing.T) {
	if seededBug != "" {
		t.Skipf("seeded bug %q is on", seededBug)
	}
	dir := scratch(t)
	for seed := uint64(1); seed <= 6; seed++ {
		var r rotationsResult
		simulateWith(t, func() { r = runRotations(seed, filepath.Join(dir, "s"+itoa(seed)), rotationSteps()) })
		if r.Err != nil {
			t.Fatalf("%v\nstep log:\n%s\nclients:\n%s", r.Err, strings.Join(r.Notes, "\n"), strings.Join(r.Clients, "\n"))
		}
		if r.Errors != 0 {
			t.Fatalf("seed %d: %d client operations failed:\n%s\nstep log:\n%s", seed, r.Errors, strings.Join(r.Clients, "\n"), strings.Join(r.Notes, "\n"))
		}
		if r.Writes == 0 || r.Checked == 0 || r.Handshakes["CA0>CA0"] == 0 || r.Handshakes["CA1>CA1"] == 0 {
			t.Fatalf("seed %d: %d writes, %d node checks, handshakes %v: the scenario did not exercise both CAs", seed, r.Writes, r.Checked, r.Handshakes)
		}
		t.Logf("seed %d: %d writes, %d node checks of the trust, handshakes %v", seed, r.Writes, r.Checked, r.Handshakes)
	}
}
