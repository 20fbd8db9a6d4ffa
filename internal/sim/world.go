package sim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/gateway"
	"github.com/herd-storage/herd/internal/layout"
	"github.com/herd-storage/herd/internal/maintenance"
	"github.com/herd-storage/herd/internal/object"
	"github.com/herd-storage/herd/internal/recovery"
	"github.com/herd-storage/herd/internal/replica"
	"github.com/herd-storage/herd/internal/store"
)

// Failure detection, as the leader's reconcile loop sees it: a node
// unreachable from the majority is committed as gone after its suspicion
// time (gossip: about 3-4 s, cluster.go), a node reachable again is
// committed as alive after joinDelay.
const (
	detectInterval = 300 * time.Millisecond
	suspicionMin   = 2500 * time.Millisecond
	suspicionMax   = 4500 * time.Millisecond
	joinDelay      = 800 * time.Millisecond
)

// World is one simulated cluster: its nodes, the log they share and the
// network between them, with the faults in force.
type World struct {
	seed uint64
	cfg  Config
	dir  string
	// exclusive: the clients' VDIs are exclusive (Options.Exclusive).
	exclusive bool
	log       *cluster.Local
	logs      *ring
	ctx       context.Context // ends with the world
	cancel    context.CancelFunc
	started   time.Time // fake time at which the world was made

	mu           sync.Mutex // guards the fault state: nodes' flags, cut, network, changed
	changed      chan struct{}
	nodes        []*node
	cut          map[int]bool // nodes cut off from the others
	dropPerMille int
	delayMax     time.Duration
	// catchUp is the catch-up delay of the nodes the event being applied
	// connects again (Event.CatchUp).
	catchUp time.Duration

	wg sync.WaitGroup // background goroutines: recovery runs, failure detector

	notesMu    sync.Mutex // guards notes and violations
	notes      []string   // the step log
	violations []string   // found since the last check

	clients []*client
	readers []*reader
	stamps  map[stampKey]object.Epoch // invariant (c); only the step loop uses it
	oids    []object.OID              // every object the clients' VDIs can have
	counts  map[string]int            // faults injected, by kind
	// trust is the model of every node's trust (trust.go; nil: none):
	// every request between two nodes is a handshake of it. Guarded by
	// mu.
	trust *trustWorld

	// The rolling upgrade (Config.OldNodes); only the step loop uses
	// these. late is the client of the VDI created once the level is
	// raised (Config.UpgradeCopies), finalizing says a finalize is due
	// (retried at every step until it succeeds), finalized is the fake
	// time it did (0: not yet), refused counts the finalizes refused while
	// an old node was a member.
	late       *client
	finalizing bool
	finalized  time.Duration
	refused    int
	waitNoted  bool // the step log said why a finalize waits

	// layerProcs are every process that ran a merge runner
	// (Config.Layers; guarded by mu).
	layerProcs []*process

	// Crash points (Config.ECCrashes; guarded by mu): crashing
	// says they may kill (during the faults), passes counts each
	// object's passes of each step (a crash's draw), passed each step's
	// passes and crashed the kills at each.
	crashing bool
	passes   map[crashKey]int
	passed   map[gateway.ECStep]int
	crashed  map[gateway.ECStep]int

	// ecInfos are the VDIs' erasure-coding configurations, by VDI id
	// (nil: copies); only the step loop uses it (ec.go).
	ecInfos map[uint32]*ecInfo
}

type crashKey struct {
	oid  object.OID
	step gateway.ECStep
}

type stampKey struct {
	node int
	oid  object.OID
}

// node is one machine: its disk outlives its processes.
type node struct {
	index int
	id    string
	dir   string
	lag   time.Duration
	// old: its processes run an older herd, of feature level 1, until an
	// Upgrade (Config.OldNodes). Only the step loop changes it.
	old bool

	// Guarded by World.mu.
	proc      *process // the current (or last, if killed) process
	starts    int
	killed    bool
	paused    bool
	stopping  bool      // a clean stop is under way (stop.go)
	reachable bool      // from the leader: connected to the majority
	since     time.Time // when reachable last changed
	suspicion time.Duration
	// crashed: killed at a crash point at crashedAt, and to be started
	// again by the step loop (restartCrashed), not by the schedule.
	crashed   bool
	crashedAt time.Time
}

// process is one run of a node's server: the real store, replica side,
// gateway and recovery, on the node's member of the log.
type process struct {
	w           *World
	node        *node
	incarnation string
	ctx         context.Context // ends when the process dies
	cancel      context.CancelFunc
	member      *cluster.LocalMember
	store       *store.Store
	replica     *replica.Replica
	served      replica.Served // replica and recovery: what other nodes reach
	gateway     *gateway.Gateway
	recovery    *recovery.Recovery
	maintenance *maintenance.Maintenance
	dead        bool  // guarded by World.mu
	drain       drain // its NBD server's requests, for a clean stop (stop.go)
}

func newWorld(ctx context.Context, seed uint64, cfg Config, dir string) *World {
	w := &World{seed: seed, cfg: cfg, dir: dir, log: cluster.NewLocal(), logs: newRing(400), changed: make(chan struct{}), cut: map[int]bool{}, stamps: map[stampKey]object.Epoch{}, counts: map[string]int{},
		passes: map[crashKey]int{}, passed: map[gateway.ECStep]int{}, crashed: map[gateway.ECStep]int{}, ecInfos: map[uint32]*ecInfo{}}
	w.ctx, w.cancel = context.WithCancel(ctx)
	w.started = w.logs.start
	return w
}

// elapsed is the fake time since the world was made.
func (w *World) elapsed() time.Duration { return time.Since(w.started) }

// note adds a line to the step log.
func (w *World) note(format string, args ...any) {
	line := fmt.Sprintf("t=%6.2fs ", w.elapsed().Seconds()) + fmt.Sprintf(format, args...)
	w.notesMu.Lock()
	w.notes = append(w.notes, line)
	w.notesMu.Unlock()
}

// violation records a broken invariant; the step loop reports it.
func (w *World) violation(format string, args ...any) {
	line := fmt.Sprintf("t=%6.2fs ", w.elapsed().Seconds()) + fmt.Sprintf(format, args...)
	w.notesMu.Lock()
	w.violations = append(w.violations, line)
	w.notesMu.Unlock()
}

func (w *World) takeViolations() []string {
	w.notesMu.Lock()
	defer w.notesMu.Unlock()
	v := w.violations
	w.violations = nil
	return v
}

// start builds the nodes, commits them, the format and the clients' VDIs
// as the leader would, and starts every process.
func (w *World) start() error {
	suspicions := newSplitMix(w.seed ^ 0xdead)
	for i := 0; i < w.cfg.Nodes; i++ {
		n := &node{index: i, id: fmt.Sprintf("n%d", i), suspicion: suspicionMin + time.Duration(suspicions.next()%uint64(suspicionMax-suspicionMin))}
		n.dir = filepath.Join(w.dir, n.id)
		n.old = slices.Contains(w.cfg.OldNodes, i)
		if err := os.MkdirAll(n.dir, 0o700); err != nil {
			return err
		}
		w.nodes = append(w.nodes, n)
	}
	for _, n := range w.nodes {
		if err := w.startProcess(n); err != nil {
			return err
		}
	}
	for _, n := range w.nodes {
		if _, err := w.log.NodeJoin(w.record(n)); err != nil {
			return err
		}
	}
	if _, err := w.log.Format(w.cfg.Copies, w.cfg.ObjectSize); err != nil {
		return err
	}
	if w.cfg.Layers {
		// Merges and flattens need the level (a new cluster starts at
		// the highest; the simulator's log at the lowest).
		level, err := w.log.FinalizeUpgrade(cluster.FeatureLayerMerge.Level)
		if err != nil {
			return err
		}
		w.note("log: cluster finalized at feature level %d", level)
	}
	for _, copies := range w.cfg.ClientCopies {
		if copies != 0 && copies != w.cfg.Copies {
			level, err := w.log.FinalizeUpgrade(cluster.LevelVDICopies)
			if err != nil {
				return err
			}
			w.note("log: cluster finalized at feature level %d", level)
			break
		}
	}
	if w.cfg.hasEC() {
		level, err := w.log.FinalizeUpgrade(cluster.FeatureErasureCoding.Level)
		if err != nil {
			return err
		}
		w.note("log: cluster finalized at feature level %d", level)
	}
	for i := 0; i < w.cfg.Clients; i++ {
		name := fmt.Sprintf("vdi%d", i)
		if scheme := w.cfg.clientEC(i); scheme != "" {
			v, err := w.log.CreateVDIWithScheme(name, w.cfg.VDISize, w.exclusive, scheme)
			if err != nil {
				return err
			}
			w.note("log: vdi %s created erasure-coded %s (%d copies of its replicated objects)", v.Name, v.EC, v.Copies)
			continue
		}
		if _, err := w.log.CreateVDIWithCopies(name, w.cfg.VDISize, w.exclusive, w.cfg.clientCopies(i)); err != nil {
			return err
		}
	}
	w.mu.Lock()
	w.crashing = true
	w.mu.Unlock()
	if err := w.waitApplied(time.Minute); err != nil {
		return err
	}
	w.wg.Add(1)
	go w.detect()
	return nil
}

// record is the node as the log records it.
func (w *World) record(n *node) cluster.Node {
	return cluster.Node{ID: n.id, Address: n.id, PeerAddr: n.id, Capacity: 1 << 40, Incarnation: n.proc.incarnation}
}

// waitApplied waits until every running process applied the whole log.
func (w *World) waitApplied(limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		length := w.log.Len()
		behind := ""
		w.mu.Lock()
		for _, n := range w.nodes {
			if p := n.proc; !p.dead && p.member.Applied() < length {
				behind += fmt.Sprintf(" %s at %d of %d", n.id, p.member.Applied(), length)
			}
		}
		w.mu.Unlock()
		if behind == "" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the log was not applied everywhere within %v:%s", limit, behind)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// startProcess starts a new process of n on its disk: the store reopened,
// the log replayed as far as the last process had applied it (a node
// keeps its raft log on disk), then the replica side, gateway and
// recovery, each the production code.
func (w *World) startProcess(n *node) error {
	var from uint64
	if old := n.proc; old != nil {
		from = old.member.Applied()
		if err := old.store.Close(); err != nil && !errors.Is(err, store.ErrClosed) {
			w.note("closing the store of the killed process of %s: %v", n.id, err)
		}
	}
	n.starts++
	logger := slog.New(w.logs.handler()).With("node", n.id)
	st, err := store.Open(store.Options{Disks: []store.Disk{{Path: n.dir, Weight: 1}}, Logger: logger, ReserveBytes: -1, OpenFiles: 64})
	if err != nil {
		return fmt.Errorf("opening the store of %s: %w", n.id, err)
	}
	p := &process{w: w, node: n, incarnation: fmt.Sprintf("%s.%d", n.id, n.starts), store: st}
	p.ctx, p.cancel = context.WithCancel(w.ctx)
	w.log.SetBuild(n.id, w.build(n))
	p.member = w.log.Member(n.id, p.incarnation, from)
	p.member.SetLag(n.lag)
	p.replica = replica.New(epochSource(p.member), replica.LocalStore{Store: st})
	tr := &transport{w: w, from: p}
	layouts := layout.NewHistory(p.member, logger)
	p.recovery = recovery.New(p.member, layouts, tr, p.replica, n.id, logger)
	p.served = replica.Served{Replica: p.replica, Recoverer: p.recovery.RecoverObject}
	p.maintenance = maintenance.New(p.member, layouts, tr, p.recovery.Proof(), logger)
	p.gateway = gateway.New(p.member, layouts, tr, logger, gateway.Options{Repair: func(ctx context.Context, g *gateway.Gateway, vdi cluster.VDI) error {
		return p.maintenance.RepairUnclean(ctx, g, vdi)
	}})
	w.mu.Lock()
	n.proc = p
	n.killed = false
	n.crashed = false
	w.updateLocked()
	w.mu.Unlock()
	gateways.Store(p.gateway, p)
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		p.recovery.Run(p.ctx)
	}()
	if w.cfg.Layers {
		w.startLayerRunners(p)
	}
	return nil
}

// updateLocked recomputes who reaches the majority after a fault changed,
// tells the members, and wakes requests waiting on the network.
func (w *World) updateLocked() {
	now := time.Now()
	for _, n := range w.nodes {
		if n.proc == nil {
			continue
		}
		connected := w.connectedLocked(n)
		if connected != n.reachable {
			n.reachable, n.since = connected, now
		}
		n.proc.member.SetCatchUp(w.catchUp)
		n.proc.member.SetConnected(connected)
	}
	close(w.changed)
	w.changed = make(chan struct{})
}

// connectedLocked says whether n's process runs and is on the side of
// the network where a majority of all nodes runs (the leader's side).
func (w *World) connectedLocked(n *node) bool {
	if n.killed || n.paused {
		return false
	}
	up := 0
	for _, m := range w.nodes {
		if !m.killed && !m.paused && w.cut[m.index] == w.cut[n.index] {
			up++
		}
	}
	return up*2 > len(w.nodes)
}

// detect is the leader's failure detector and reconcile loop: it commits
// NodeLeave for a node the majority has not reached for its suspicion
// time, and NodeJoin for a node (or a new process of it) the majority
// reaches again. Without a majority nothing is committed.
func (w *World) detect() {
	defer w.wg.Done()
	ticker := time.NewTicker(detectInterval)
	defer ticker.Stop()
	for {
		select {
		case <-w.ctx.Done():
			return
		case <-ticker.C:
		}
		now := time.Now()
		var joins []cluster.Node
		var leaves []string
		leader := false
		w.mu.Lock()
		for _, n := range w.nodes {
			leader = leader || n.reachable
			logged, ok := w.log.Node(n.id)
			alive := ok && logged.State == cluster.NodeAlive
			switch {
			case n.reachable && now.Sub(n.since) >= joinDelay && (!alive || logged.Incarnation != n.proc.incarnation):
				if w.trust != nil && !w.trust.gossipSees(n) {
					continue // gossip drops its packets (trust.go)
				}
				joins = append(joins, w.record(n))
			case !n.reachable && alive && now.Sub(n.since) >= n.suspicion:
				leaves = append(leaves, n.id)
			}
		}
		w.mu.Unlock()
		if !leader {
			continue
		}
		for _, n := range joins {
			epoch, err := w.log.NodeJoin(n)
			w.note("log: %s (process %s) joined: epoch %d %v", n.ID, n.Incarnation, epoch, errText(err))
		}
		for _, id := range leaves {
			epoch, err := w.log.NodeLeave(id, "failure detected")
			w.note("log: %s left: epoch %d %v", id, epoch, errText(err))
		}
	}
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return "(" + err.Error() + ")"
}

// apply carries out one scheduled event.
func (w *World) apply(e Event) error {
	w.counts[e.Kind.String()]++
	w.mu.Lock()
	w.catchUp = e.CatchUp
	w.mu.Unlock()
	defer func() {
		w.mu.Lock()
		w.catchUp = 0
		w.mu.Unlock()
	}()
	switch e.Kind {
	case Check:
	case Kill, Stop:
		n := w.nodes[e.Node]
		w.mu.Lock()
		down := n.killed
		n.crashed = false // down (now), it waits for the schedule's restart
		w.mu.Unlock()
		switch {
		case down:
			w.note("%s is down already (it crashed): it stays down until the schedule restarts it", n.id)
		case e.Kind == Kill:
			w.kill(n)
		default:
			w.stop(n)
		}
	case Restart:
		n := w.nodes[e.Node]
		w.mu.Lock()
		running := !n.killed
		w.mu.Unlock()
		if running {
			// Killed at a crash point while the schedule stopped it,
			// and started again since.
			w.note("%s runs already (restarted after its crash)", n.id)
			return nil
		}
		return w.startProcess(n)
	case Pause, Resume:
		w.mu.Lock()
		w.nodes[e.Node].paused = e.Kind == Pause
		w.updateLocked()
		w.mu.Unlock()
	case Partition:
		w.mu.Lock()
		clear(w.cut)
		for _, n := range e.Nodes {
			w.cut[n] = true
		}
		w.updateLocked()
		w.mu.Unlock()
	case Heal:
		w.mu.Lock()
		clear(w.cut)
		w.updateLocked()
		w.mu.Unlock()
	case Network:
		w.mu.Lock()
		w.dropPerMille, w.delayMax = e.DropPerMille, e.DelayMax
		w.mu.Unlock()
	case Maintenance:
		if _, err := w.log.SetMaintenance(w.nodes[e.Node].id, e.Window); err != nil {
			return fmt.Errorf("maintenance window for %s: %w", w.nodes[e.Node].id, err)
		}
	case Lag:
		n := w.nodes[e.Node]
		w.mu.Lock()
		n.lag = e.Lag
		p := n.proc
		w.mu.Unlock()
		p.member.SetLag(e.Lag)
	case Upgrade:
		return w.upgrade(w.nodes[e.Node])
	case Finalize:
		w.finalizing = true
		return w.finalize()
	case Snapshot, DeleteSnapshot, Flatten:
		return w.applyLayer(e)
	}
	return nil
}

// build is what n's processes report about their binary (gossip's
// metadata): an older herd's, of feature level 1, until it is upgraded.
func (w *World) build(n *node) cluster.Build {
	if n.old {
		return cluster.Build{Version: "sim-old", Level: cluster.LevelBase}
	}
	return cluster.Build{Version: "sim", Level: cluster.SupportedLevel}
}

// upgrade restarts n's process on this herd, as a rolling upgrade does
// (the simulator's restarts are kill -9's): a paused process is killed
// and the new one runs (a later Resume finds it running), one cut off
// stays cut off; a node that is down starts on it when it is restarted.
func (w *World) upgrade(n *node) error {
	n.old = false
	w.mu.Lock()
	killed := n.killed
	n.paused = false
	w.mu.Unlock()
	if killed {
		w.log.SetBuild(n.id, w.build(n))
		return nil
	}
	w.kill(n)
	return w.startProcess(n)
}

// finalize is the operator's `herd cluster finalize-upgrade` and, once it
// succeeds, the creation of a VDI of its own copies, whose client starts.
// While an old node is a member, the finalize and a VDI of its own copies
// must be refused, naming it (a violation otherwise); once every node
// runs this herd it may still be refused while one is down (its version
// unknown): finalizing stays set and the step loop tries again.
func (w *World) finalize() error {
	if !w.finalizing {
		return nil
	}
	var old []string
	for _, n := range w.nodes {
		if n.old {
			old = append(old, n.id)
		}
	}
	level, err := w.log.FinalizeUpgrade(cluster.LevelVDICopies)
	if len(old) > 0 {
		w.finalizing = false // the operator tries again later (a Finalize event)
		if err == nil {
			w.violation("finalize-upgrade raised the cluster to level %d while %v run an older herd", level, old)
			return nil
		}
		for _, id := range old {
			if !errors.Is(err, cluster.ErrUpgradeRequired) || !strings.Contains(err.Error(), id+" (") {
				w.violation("finalize-upgrade with %v on an older herd was refused without naming %s: %v", old, id, err)
			}
		}
		if w.late != nil {
			if _, err := w.log.CreateVDIWithCopies(w.late.vdi, w.cfg.VDISize, w.exclusive, w.cfg.UpgradeCopies); !errors.Is(err, cluster.ErrUpgradeRequired) {
				w.violation("vdi create --copies %d below the level it needs: %v, want refused", w.cfg.UpgradeCopies, err)
			}
		}
		w.refused++
		w.note("log: finalize-upgrade refused while %v run an older herd, as it must be", old)
		return nil
	}
	if err != nil {
		if !errors.Is(err, cluster.ErrUpgradeRequired) {
			return fmt.Errorf("finalize-upgrade: %w", err)
		}
		if !w.waitNoted {
			w.waitNoted = true
			w.note("log: finalize-upgrade refused, every node upgraded (tried again at every step): %v", err)
		}
		return nil // a node is down: again at the next step
	}
	w.finalizing = false
	w.finalized = w.elapsed()
	w.note("log: finalize-upgrade: the cluster is at feature level %d", level)
	if w.late == nil {
		return nil
	}
	v, err := w.log.CreateVDIWithCopies(w.late.vdi, w.cfg.VDISize, w.exclusive, w.cfg.UpgradeCopies)
	if err != nil {
		return fmt.Errorf("vdi create %s --copies %d after the finalize: %w", w.late.vdi, w.cfg.UpgradeCopies, err)
	}
	if v.Copies != w.cfg.UpgradeCopies {
		w.violation("vdi create %s --copies %d made a VDI of %d copies", w.late.vdi, w.cfg.UpgradeCopies, v.Copies)
	}
	w.note("log: vdi %s created with %d copies of its own (the format's: %d)", v.Name, v.Copies, w.cfg.Copies)
	w.late.start(v.ID)
	w.oids = nil // its objects are checked from now on
	return nil
}

// held reports whether a running node's recovery waits for a
// maintenance window.
func (w *World) held() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, n := range w.nodes {
		if !n.killed && n.proc != nil && n.proc.recovery.Status().Deferred > 0 {
			return true
		}
	}
	return false
}

// kill ends n's process as kill -9 does: nothing more runs, requests to
// it are refused, its member of the log stops. Its files stay (the store
// object too, closed when the node restarts: the invariants read it).
func (w *World) kill(n *node) {
	w.mu.Lock()
	p := n.proc
	w.killLocked(p)
	n.crashed = false // the schedule's kill: its restart is the schedule's
	w.mu.Unlock()
	p.end()
}

// killLocked marks p dead and its node killed.
func (w *World) killLocked(p *process) {
	p.dead = true
	p.node.killed = true
	w.updateLocked()
}

// end ends a process killLocked marked dead: its context, its gateway's
// goroutines, its member of the log.
func (p *process) end() {
	gateways.Delete(p.gateway)
	p.cancel()
	p.gateway.Close()
	p.member.Stop()
}

// healAll ends every fault: killed nodes restart, paused ones resume,
// the partition heals, the network is clean and nobody lags.
func (w *World) healAll() error {
	w.mu.Lock()
	var restart []*node
	w.crashing = false // faults stop, crash points too
	for _, n := range w.nodes {
		n.paused = false
		n.crashed = false
		n.lag = 0
		n.proc.member.SetLag(0)
		if n.killed {
			restart = append(restart, n)
		}
	}
	clear(w.cut)
	w.dropPerMille, w.delayMax = 0, 0
	w.updateLocked()
	w.mu.Unlock()
	for _, n := range restart {
		if err := w.startProcess(n); err != nil {
			return err
		}
	}
	return nil
}

// healthy says whether the log has every node alive as its current
// process and every process applied all of it.
func (w *World) healthy() (bool, string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	length := w.log.Len()
	for _, n := range w.nodes {
		logged, ok := w.log.Node(n.id)
		if !ok || logged.State != cluster.NodeAlive || logged.Incarnation != n.proc.incarnation {
			return false, fmt.Sprintf("the log does not have %s's process %s alive yet", n.id, n.proc.incarnation)
		}
		if applied := n.proc.member.Applied(); applied < length {
			return false, fmt.Sprintf("%s applied %d of %d log entries", n.id, applied, length)
		}
	}
	return true, ""
}

// close stops everything: processes, members, background goroutines,
// stores.
func (w *World) close() {
	w.cancel()
	for _, n := range w.nodes {
		if n.proc != nil {
			gateways.Delete(n.proc.gateway)
			n.proc.gateway.Close()
		}
	}
	w.log.Close()
	w.wg.Wait()
	for _, n := range w.nodes {
		if n.proc != nil {
			n.proc.store.Close()
		}
	}
}

// ring keeps the last lines the nodes logged, for failure reports.
type ring struct {
	mu    sync.Mutex
	lines []string
	next  int
	full  bool
	start time.Time
}

func newRing(n int) *ring { return &ring{lines: make([]string, n), start: time.Now()} }

func (r *ring) Write(p []byte) (int, error) {
	r.mu.Lock()
	for _, line := range strings.Split(strings.TrimRight(string(p), "\n"), "\n") {
		r.lines[r.next] = line
		r.next = (r.next + 1) % len(r.lines)
		r.full = r.full || r.next == 0
	}
	r.mu.Unlock()
	return len(p), nil
}

func (r *ring) handler() slog.Handler {
	return slog.NewTextHandler(r, &slog.HandlerOptions{Level: slog.LevelInfo, ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
		if a.Key == slog.TimeKey && len(groups) == 0 {
			return slog.String("t", fmt.Sprintf("%.3fs", a.Value.Time().Sub(r.start).Seconds()))
		}
		return a
	}})
}

// last returns the logged lines, oldest first.
func (r *ring) last() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	if r.full {
		out = append(out, r.lines[r.next:]...)
	}
	out = append(out, r.lines[:r.next]...)
	return out
}

// splitMix is a tiny deterministic generator (SplitMix64) for values
// drawn from hashes of a message.
type splitMix struct{ state uint64 }

func newSplitMix(seed uint64) *splitMix { return &splitMix{state: seed} }

func (s *splitMix) next() uint64 {
	s.state += 0x9E3779B97F4A7C15
	z := s.state
	z = (z ^ z>>30) * 0xBF58476D1CE4E5B9
	z = (z ^ z>>27) * 0x94D049BB133111EB
	return z ^ z>>31
}
