package sim

// The raft mode of the simulator: the real cluster runtime of three
// nodes (five in a quarter of the seeds) in one bubble. Each node's
// process is a cluster.Cluster started by cluster.StartSim:
// hashicorp/raft with herd's configuration on in-memory stores that
// outlive the process (its disk), the production
// FSM, memberlist with herd's configuration, the leader's reconcile loop
// with the voter management, leases, the rejoin loop, Depart and Close,
// all over the simulator's network (raftnet.go) on the bubble's fake
// clock. The data path is not in it (the other mode's world.go runs the
// data path over cluster.Local); what it checks is what the control
// path promises the data path:
//
//	(Q) Quorum: with at most one node faulty (killed, stopped
//	    cleanly, paused, cut off), the cluster commits: a probe (a lock
//	    taken through each node, forwarded to the leader) succeeds at
//	    least every quorumGap. A clean stop must not take the quorum
//	    with it, nor a pause, a partition or a kill beyond an election.
//	(S) No stale epoch: a node serves (its lease is valid before and
//	    after it reads its applied epoch, as the replica side checks)
//	    only in an epoch the cluster has not left without it: no epoch
//	    after the one it serves in, and without it, was applied by any
//	    node before the read.
//	(L) Liveness: after each fault ends the cluster settles (every node
//	    alive in the leader's log with its current process, a voter,
//	    applying the leader's epoch, holding a lease) within settleLimit,
//	    and again once everything healed at the end.
//
// The schedule (faults, victims, durations, drops and delays) is a pure
// function of the seed, but hashicorp/raft draws its election timeouts,
// and memberlist its probe order, from math/rand: a seed does not replay
// bit for bit. A failure is reported with how many of raftReplays
// replays of its seed fail again.

import (
	"bytes"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/herd-storage/herd/internal/cluster"
)

const (
	raftNodes      = 3 // most seeds; a quarter have raftNodesLarge
	raftNodesLarge = 5
	quorumGap      = 12 * time.Second // (Q): the longest a healthy majority may go without a commit
	settleLimit    = 45 * time.Second // (L)
	probeEvery     = 500 * time.Millisecond
	readEvery      = 100 * time.Millisecond
	logLines       = 60 // kept per node for a failure's report
)

// RaftResult is the outcome of one raft-mode run.
type RaftResult struct {
	Seed     uint64
	Steps    []string // what the schedule did, with fake times
	Problems []string // broken invariants; empty: passed
	Logs     string   // the nodes' last log lines, when it failed
	Commits  int      // probes committed
	Served   int      // reads served under a lease
}

// Failed says whether an invariant broke.
func (r RaftResult) Failed() bool { return len(r.Problems) > 0 }

// raftFault is one fault of the schedule.
type raftFault struct {
	kind     string // kill, stop, pause, partition
	victim   int    // node index; -1: the leader at that moment
	duration time.Duration
	gap      time.Duration // quiet time before it, once the cluster settled
}

// raftSchedule is the seed's schedule.
type raftSchedule struct {
	nodes        int
	faults       []raftFault
	dropPerMille int
	delayMax     time.Duration
}

func newRaftSchedule(seed uint64) raftSchedule {
	r := newSplitMix(seed)
	// The cluster's size comes from a stream of its own, so that the
	// three-node seeds kept the schedules they had before five-node
	// ones existed; so do a five-node seed's victims.
	size := newSplitMix(seed ^ 0x6e6f646573)
	between := func(lo, hi time.Duration) time.Duration {
		steps := uint64((hi-lo)/(250*time.Millisecond)) + 1
		return lo + time.Duration(r.next()%steps)*250*time.Millisecond
	}
	s := raftSchedule{nodes: raftNodes}
	if size.next()%4 == 0 {
		s.nodes = raftNodesLarge
	}
	s.dropPerMille = []int{0, 0, 2, 10}[r.next()%4]
	s.delayMax = []time.Duration{0, 2 * time.Millisecond, 10 * time.Millisecond, 30 * time.Millisecond}[r.next()%4]
	n := 3 + int(r.next()%2)
	for range n {
		f := raftFault{kind: []string{"kill", "stop", "pause", "partition"}[r.next()%4], victim: int(r.next() % raftNodes)}
		if s.nodes != raftNodes {
			f.victim = int(size.next() % uint64(s.nodes))
		}
		if r.next()%3 == 0 {
			f.victim = -1
		}
		switch f.kind {
		case "kill":
			f.duration = between(3*time.Second, 15*time.Second)
		case "stop":
			// Long enough that a stop which took the quorum away shows
			// (Depart takes up to 5 s, then quorumGap).
			f.duration = between(20*time.Second, 28*time.Second)
		case "pause":
			if r.next()%3 == 0 {
				f.duration = between(time.Second, 3*time.Second)
			} else {
				f.duration = between(7*time.Second, 14*time.Second) // past failure detection and the lease
			}
		case "partition":
			f.duration = between(2*time.Second, 12*time.Second)
		}
		f.gap = between(0, 3*time.Second)
		s.faults = append(s.faults, f)
	}
	return s
}

// raftNode is a simulated node: its disk and its current process.
type raftNode struct {
	index       int
	id, ip      string
	zone        string
	stores      *cluster.SimStores
	incarnation int
	started     bool // its first process ran (node 0 bootstraps only then)
	log         *logRing

	// The current process, nil while none runs.
	proc *netProc
	c    *cluster.Cluster
	gone chan struct{} // closed once the current process has ended
}

func (n *raftNode) process() string { return fmt.Sprintf("%s.%d", n.id, n.incarnation) }

// seenEpoch is an epoch as first applied by some node.
type seenEpoch struct {
	nodes []string
	at    time.Duration
	by    string
}

type raftWorld struct {
	seed     uint64
	net      *simNet
	nodes    []*raftNode
	start    time.Time
	done     chan struct{} // the run is over: workers stop
	failedCh chan struct{} // closed at the first problem

	mu         sync.Mutex
	steps      []string
	problems   []string
	epochs     map[uint64]seenEpoch
	lastCommit time.Time
	commits    int
	served     int
	expectQ    bool // (Q) applies: at most one node faulty
}

func (w *raftWorld) since() time.Duration { return time.Since(w.start) }

func (w *raftWorld) stamp() string { return fmt.Sprintf("%7.2fs", w.since().Seconds()) }

func (w *raftWorld) step(format string, args ...any) {
	w.mu.Lock()
	w.steps = append(w.steps, w.stamp()+" "+fmt.Sprintf(format, args...))
	w.mu.Unlock()
}

func (w *raftWorld) problem(format string, args ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.problems) == 0 {
		close(w.failedCh)
	}
	if len(w.problems) < 10 {
		w.problems = append(w.problems, w.stamp()+" "+fmt.Sprintf(format, args...))
	}
}

func (w *raftWorld) failed() bool {
	select {
	case <-w.failedCh:
		return true
	default:
		return false
	}
}

// verboseRaft keeps the nodes' logs of a run that passed too (a replay
// with -v).
var verboseRaft bool

// RunRaft runs one seed of the raft mode. Call it inside a
// testing/synctest bubble, after cluster.UseSimClock.
func RunRaft(seed uint64) RaftResult {
	w := &raftWorld{seed: seed, net: newSimNet(seed), start: time.Now(), done: make(chan struct{}), failedCh: make(chan struct{}), epochs: map[uint64]seenEpoch{}}
	sched := newRaftSchedule(seed)
	for i := range sched.nodes {
		w.nodes = append(w.nodes, &raftNode{index: i, id: fmt.Sprintf("n%d", i), ip: fmt.Sprintf("10.0.0.%d", i+1), zone: fmt.Sprintf("z%d", i),
			stores: cluster.NewSimStores(), log: &logRing{}})
	}
	w.step("seed %d: %d nodes, drops %d‰, delays up to %v", seed, sched.nodes, sched.dropPerMille, sched.delayMax)
	for _, n := range w.nodes {
		w.startProcess(n)
		if n.index == 0 {
			w.sleep(2 * time.Second) // the first node leads before the others join
		}
	}
	w.mu.Lock()
	w.lastCommit = time.Now()
	w.mu.Unlock()
	go w.monitor()
	if w.settle("the cluster to form") {
		w.net.setFaults(sched.dropPerMille, sched.delayMax)
		w.mu.Lock()
		w.expectQ = true
		w.mu.Unlock()
		for _, f := range sched.faults {
			if w.failed() {
				break
			}
			w.sleep(f.gap)
			w.inject(f)
			if !w.settle("the cluster to settle after the " + f.kind) {
				break
			}
		}
	}
	w.net.setFaults(0, 0)
	if !w.failed() {
		w.sleep(2 * time.Second)
	}
	w.step("end: every process killed")
	close(w.done)
	for _, n := range w.nodes {
		w.kill(n)
	}
	for _, n := range w.nodes {
		if n.gone != nil {
			<-n.gone
		}
	}
	w.net.close()
	// memberlist leaves its probes to end on their own timers after its
	// Shutdown: the bubble ends only once every goroutine has.
	time.Sleep(10 * time.Second)
	w.mu.Lock()
	defer w.mu.Unlock()
	r := RaftResult{Seed: seed, Steps: w.steps, Problems: w.problems, Commits: w.commits, Served: w.served}
	if r.Failed() || verboseRaft {
		var b strings.Builder
		for _, n := range w.nodes {
			fmt.Fprintf(&b, "--- %s, last %d log lines:\n%s", n.id, logLines, n.log.String())
		}
		r.Logs = b.String()
	}
	return r
}

// sleep waits d of fake time (less if the run fails meanwhile).
func (w *raftWorld) sleep(d time.Duration) {
	if d <= 0 {
		return
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
	case <-w.failedCh:
	}
}

// startProcess starts node n's next process (its node waits for the
// previous one to end first).
func (w *raftWorld) startProcess(n *raftNode) {
	if n.gone != nil {
		<-n.gone
	}
	n.incarnation++
	p := w.net.newProc(n.ip)
	var join []string
	if n.started || n.index != 0 {
		for _, o := range w.nodes {
			if o != n {
				join = append(join, fmt.Sprintf("%s:%d", o.ip, cluster.SimGossipPort))
			}
		}
	}
	n.started = true
	logger := slog.New(slog.NewTextHandler(n.log, &slog.HandlerOptions{Level: slog.LevelInfo, ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
		if a.Key == slog.TimeKey && len(groups) == 0 {
			return slog.String("t", w.stamp())
		}
		return a
	}})).With("process", n.process())
	c, err := cluster.StartSim(cluster.SimConfig{
		NodeID: n.id, Incarnation: n.process(), Zone: n.zone, Address: n.ip,
		Raft: p.raft, Stores: n.stores, Gossip: p.gossip, Forward: w.net.forwarder(p), Join: join, Logger: logger,
	})
	if err != nil {
		w.problem("process %s did not start: %v", n.process(), err)
		w.net.kill(p)
		n.gone = make(chan struct{})
		close(n.gone)
		return
	}
	w.net.mu.Lock()
	p.node = c
	w.net.mu.Unlock()
	n.proc, n.c, n.gone = p, c, make(chan struct{})
	go w.prober(n, p, c)
	go w.reader(n, p, c)
	go w.watchEpochs(n, p, c)
}

// kill ends node n's process as kill -9 does.
func (w *raftWorld) kill(n *raftNode) {
	if n.proc == nil {
		return
	}
	p, c, gone := n.proc, n.c, n.gone
	n.proc, n.c = nil, nil
	w.net.kill(p)
	go func() {
		c.Kill()
		close(gone)
	}()
}

// stop ends node n's process as SIGTERM does: Close (Depart, gossip's
// leave, raft's shutdown), then the process exits.
func (w *raftWorld) stop(n *raftNode) {
	if n.proc == nil {
		return
	}
	p, c, gone := n.proc, n.c, n.gone
	n.proc, n.c = nil, nil
	go func() {
		began := time.Now()
		c.Close()
		w.net.kill(p)
		w.step("%s: Close returned after %v; the process exits", n.process(), time.Since(began).Round(time.Millisecond))
		close(gone)
	}()
}

// leader returns the node whose live process leads, or nil.
func (w *raftWorld) leader() *raftNode {
	for _, n := range w.nodes {
		if n.c != nil && n.c.RaftState() == "Leader" {
			return n
		}
	}
	return nil
}

// inject applies fault f for its duration, then ends it.
func (w *raftWorld) inject(f raftFault) {
	n := w.nodes[max(f.victim, 0)]
	who := ""
	if f.victim < 0 {
		if l := w.leader(); l != nil {
			n, who = l, " (the leader)"
		}
	}
	w.step("%s %s%s for %v", f.kind, n.process(), who, f.duration)
	switch f.kind {
	case "kill":
		w.kill(n)
		w.sleep(f.duration)
		w.startProcess(n)
		w.step("restart %s", n.process())
	case "stop":
		w.stop(n)
		w.sleep(f.duration)
		w.startProcess(n)
		w.step("restart %s", n.process())
	case "pause":
		w.net.setPaused(n.ip, true)
		w.sleep(f.duration)
		w.net.setPaused(n.ip, false)
		w.step("resume %s", n.process())
	case "partition":
		w.net.partition(map[string]int{n.ip: 1})
		w.sleep(f.duration)
		w.net.partition(nil)
		w.step("heal the partition")
	}
}

// settle waits until (L) holds, or fails the run after settleLimit.
func (w *raftWorld) settle(what string) bool {
	deadline := time.Now().Add(settleLimit)
	began := time.Now()
	for {
		ok, why := w.settled()
		if ok {
			l := w.leader()
			e := l.c.CurrentEpoch()
			w.step("settled in %v: %s leads, voters %v, epoch %d", time.Since(began).Round(10*time.Millisecond), l.process(), l.c.RaftVoters(), e.Number)
			return true
		}
		if w.failed() {
			return false
		}
		if time.Now().After(deadline) {
			w.problem("(L) waited %v for %s: %s", settleLimit, what, why)
			return false
		}
		w.sleep(100 * time.Millisecond)
	}
}

func (w *raftWorld) settled() (bool, string) {
	l := w.leader()
	if l == nil {
		return false, "no leader"
	}
	voters := l.c.RaftVoters()
	if len(voters) != len(w.nodes) {
		return false, fmt.Sprintf("leader %s has voters %v", l.id, voters)
	}
	epoch := l.c.CurrentEpoch()
	for _, n := range w.nodes {
		if n.c == nil {
			return false, n.id + " has no process"
		}
		node, ok := l.c.Node(n.id)
		if !ok || node.State != cluster.NodeAlive || node.Incarnation != n.process() || !slices.Contains(epoch.Nodes, n.id) {
			return false, fmt.Sprintf("leader %s's log has %s as %+v in epoch %d %v, not alive with process %s", l.id, n.id, node.State, epoch.Number, epoch.Nodes, n.process())
		}
		if got := n.c.RaftVoters(); len(got) != len(w.nodes) {
			// The leader's latest configuration is not committed until
			// the others have it: a fault now could leave the servers
			// with different voter sets (the leader killed as it
			// promotes the third voter: no one can be elected).
			return false, fmt.Sprintf("%s has voters %v", n.id, got)
		}
		if e := n.c.CurrentEpoch().Number; e != epoch.Number {
			return false, fmt.Sprintf("%s applies epoch %d, the leader %d", n.id, e, epoch.Number)
		}
		if !n.c.LeaseValid() {
			return false, n.id + " holds no lease"
		}
	}
	return true, ""
}

// monitor checks (Q) every second.
func (w *raftWorld) monitor() {
	ticker := time.NewTicker(time.Second)
	defer ticker.Stop()
	for {
		select {
		case <-w.done:
			return
		case <-ticker.C:
		}
		w.mu.Lock()
		gap, expect := time.Since(w.lastCommit), w.expectQ
		w.mu.Unlock()
		if expect && gap > quorumGap {
			var states []string
			for _, n := range w.nodes {
				if c := n.c; c != nil {
					ok, detail := c.QuorumStatus()
					states = append(states, fmt.Sprintf("%s: %s, voters %v, quorum %v (%s)", n.process(), c.RaftState(), c.RaftVoters(), ok, detail))
				} else {
					states = append(states, n.id+": no process")
				}
			}
			w.problem("(Q) no commit for %v with at most one node of %d faulty: %s", gap.Round(100*time.Millisecond), len(w.nodes), strings.Join(states, "; "))
			return
		}
	}
}

// prober takes a lock of its own through node n's process every
// probeEvery: a log entry forwarded to the leader and committed.
func (w *raftWorld) prober(n *raftNode, p *netProc, c *cluster.Cluster) {
	ticker := time.NewTicker(probeEvery)
	defer ticker.Stop()
	for {
		select {
		case <-p.done:
			return
		case <-w.done:
			return
		case <-ticker.C:
		}
		ctx, cancel := contextUntil(3*time.Second, p.done, w.done)
		_, err := c.AcquireLock(ctx, "sim/probe/"+n.process(), "probe")
		cancel()
		if err == nil {
			w.mu.Lock()
			w.lastCommit = time.Now()
			w.commits++
			w.mu.Unlock()
		}
	}
}

// reader serves reads through node n's process as the replica side
// does: admitted under a lease, the node's applied epoch read, the lease
// checked again before the answer; each read served is checked (S).
func (w *raftWorld) reader(n *raftNode, p *netProc, c *cluster.Cluster) {
	ticker := time.NewTicker(readEvery)
	defer ticker.Stop()
	for {
		select {
		case <-p.done:
			return
		case <-w.done:
			return
		case <-ticker.C:
		}
		if !c.LeaseValid() {
			continue
		}
		e := c.CurrentEpoch()
		if !c.LeaseValid() || !slices.Contains(e.Nodes, n.id) {
			continue // refused, or not a member: it holds no copies to serve
		}
		w.checkRead(n, e)
	}
}

// checkRead is (S) for a read served by node n in epoch e now.
func (w *raftWorld) checkRead(n *raftNode, e cluster.Epoch) {
	now := w.since()
	w.mu.Lock()
	w.served++
	var stale []string
	for number, seen := range w.epochs {
		if number > e.Number && seen.at < now && !slices.Contains(seen.nodes, n.id) {
			stale = append(stale, fmt.Sprintf("epoch %d %v, applied by %s at %.2fs", number, seen.nodes, seen.by, seen.at.Seconds()))
		}
	}
	w.mu.Unlock()
	if len(stale) > 0 {
		slices.Sort(stale)
		w.problem("(S) stale epoch: %s served a read in epoch %d %v under its lease, but the cluster had left that epoch without it: %s",
			n.process(), e.Number, e.Nodes, strings.Join(stale, "; "))
	}
}

// watchEpochs records when each epoch is first applied by any node.
func (w *raftWorld) watchEpochs(n *raftNode, p *netProc, c *cluster.Cluster) {
	for {
		changed := c.EpochChanged()
		epochs := c.Epochs()
		now := w.since()
		w.mu.Lock()
		for _, e := range epochs {
			if _, ok := w.epochs[e.Number]; !ok {
				w.epochs[e.Number] = seenEpoch{nodes: e.Nodes, at: now, by: n.process()}
			}
		}
		w.mu.Unlock()
		select {
		case <-changed:
		case <-p.done:
			return
		case <-w.done:
			return
		}
	}
}

// logRing keeps a node's last log lines.
type logRing struct {
	mu    sync.Mutex
	lines []string
}

func (l *logRing) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, line := range bytes.Split(bytes.TrimRight(p, "\n"), []byte("\n")) {
		l.lines = append(l.lines, string(line))
	}
	if len(l.lines) > 2*logLines {
		l.lines = append([]string(nil), l.lines[len(l.lines)-logLines:]...)
	}
	return len(p), nil
}

func (l *logRing) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	lines := l.lines
	if len(lines) > logLines {
		lines = lines[len(lines)-logLines:]
	}
	return strings.Join(lines, "\n") + "\n"
}
