package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/raft"
	"github.com/herd-storage/herd/internal/cluster/statemachine"
)

// Local is the cluster log without raft, for simulations (internal/sim):
// one ordered list of committed entries, encoded by encodeCommand and
// applied through the commands table by FSM.ApplyBatch exactly as raft's
// entries are, so every state transition is the production one; and
// members, one per node process, each applying a prefix of it with its
// own FSM.
//
// What raft adds is not simulated: elections, terms, replication and
// snapshots. The list is the committed history, the one every node
// applies sooner or later. A connected member (its process runs and
// reaches the majority) applies each new entry after its lag and may
// commit; a member that is not keeps the prefix it has, so it lags behind
// while it is paused or cut off, and catches up when it is connected
// again, after its catch-up delay (SetCatchUp: the heartbeat that
// reconnects it comes before the entries it missed). Like a raft
// follower without leader contact, a disconnected member reports no
// quorum once quorumContactTimeout has passed.
//
// Leases are the real runtime's (lease.go), on the simulation's clock: a
// member serves data only while it holds a lease it renewed through
// Local (renewal at t0 while connected, the leader's commit index
// applied, valid until t0 + leaseDuration), writes in an epoch wait until
// the epoch is active (the leader's own code, leaseGrants.record and
// activeLocked, on the grants and the floors the members reported), and
// Local commits no NodeLeave of a node until any lease it granted that
// node has run out.
//
// Local itself stands for the leader: its state is the committed one
// (the reads of applied), and its Format, NodeJoin, NodeLeave and
// CreateVDI commit what the leader's reconcile loop and the admin API
// commit in a real cluster. Safe for concurrent use; time is read from
// the time package, so a simulation's fake clock governs it.
type Local struct {
	fsm     *FSM                   // the leader's FSM: applies every entry as it is committed
	applied                        // its reads
	cmds    *statemachine.Commands // what the leader and operators commit (Propose)

	mu      sync.Mutex // guards entries, changed, members
	entries [][]byte
	changed chan struct{} // closed and replaced on every commit
	members map[*LocalMember]bool

	// grants is the leader's record of the leases it granted, its times
	// in nanoseconds since origin on the simulation's clock (the real
	// leader's are CLOCK_BOOTTIME's). Local leads from its creation on,
	// one term: grants.since is 0.
	origin time.Time
	grants leaseGrants

	// builds is what each node's process reports about its binary
	// (gossip's metadata, which Local has not got: SetBuild); a node
	// without one runs this binary. Guarded by mu.
	builds map[string]Build
}

// NewLocal returns an empty log.
func NewLocal() *Local {
	fsm := newFSM()
	l := &Local{fsm: fsm, applied: statemachine.NewReads(fsm.FSM), changed: make(chan struct{}), members: map[*LocalMember]bool{}, origin: time.Now(), builds: map[string]Build{}}
	l.grants.changed = make(chan struct{}) // the maps are made by leaseGrants.record
	l.cmds = statemachine.NewCommands(l, l.fsm.FSM, "", "")
	return l
}

// now is the leader's clock for grants: nanoseconds since origin.
func (l *Local) now() int64 { return int64(time.Since(l.origin)) }

// commit appends an encoded command and returns the result the leader's
// FSM computed for it (as raft's ApplyFuture does) and its index. An entry
// whose apply fails is still committed: every FSM refuses it alike.
func (l *Local) commit(data []byte) (json.RawMessage, uint64, error) {
	if !statemachine.Known(data) {
		return nil, 0, fmt.Errorf("%w: unknown command", ErrInvalid)
	}
	l.mu.Lock()
	l.entries = append(l.entries, data)
	index := uint64(len(l.entries))
	results := l.fsm.ApplyBatch([]*raft.Log{{Index: index, Type: raft.LogCommand, Data: data}})
	close(l.changed)
	l.changed = make(chan struct{})
	l.mu.Unlock()
	res, _ := results[0].(*statemachine.Result)
	if res == nil {
		return nil, index, fmt.Errorf("cluster: log entry produced no result")
	}
	if res.Err != nil {
		return nil, index, res.Err
	}
	value, err := json.Marshal(res.Value)
	return value, index, err
}

// Propose implements Proposer: it commits data as the leader (commit).
func (l *Local) Propose(_ context.Context, data []byte) (json.RawMessage, uint64, error) {
	return l.commit(data)
}

// Len is the number of committed entries.
func (l *Local) Len() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return uint64(len(l.entries))
}

// Format commits the cluster's format, as `herd cluster format` does.
func (l *Local) Format(copies int, objectSize uint64) (Format, error) {
	return l.cmds.Format(context.Background(), copies, objectSize)
}

// NodeJoin commits a node (or its new process: another incarnation) as
// alive, as the leader does when gossip sees it; it returns the epoch.
func (l *Local) NodeJoin(n Node) (uint64, error) {
	return l.cmds.NodeJoin(context.Background(), n)
}

// NodeLeave commits a node as gone, as the leader does when gossip
// declares it dead; it returns the epoch. As the real leader does
// (Cluster.awaitDrop), it first waits until any lease granted to the node
// has run out: leaseDuration + leaseMargin after the last grant, or after
// the leader began to lead.
func (l *Local) NodeLeave(id, reason string) (uint64, error) {
	if wait := l.dropWait(id); wait > 0 {
		time.Sleep(wait)
	}
	return l.cmds.NodeLeave(context.Background(), id, reason)
}

// SetMaintenance commits a maintenance window of length d for node id,
// as `herd node maintenance` does.
func (l *Local) SetMaintenance(id string, d time.Duration) (Node, error) {
	now := time.Now().UTC()
	return l.cmds.SetMaintenance(context.Background(), id, now, now.Add(d))
}

// CreateVDI commits a new VDI, as `herd vdi create` does.
func (l *Local) CreateVDI(name string, size uint64) (VDI, error) {
	return l.CreateVDIWith(name, size, false)
}

// CreateVDIWith commits a new VDI, exclusive or not (`--exclusive`).
func (l *Local) CreateVDIWith(name string, size uint64, exclusive bool) (VDI, error) {
	return l.CreateVDIWithCopies(name, size, exclusive, 0)
}

// CreateVDIWithCopies commits a new VDI with its own number of copies
// (`--copies`; 0: the cluster's), refused below FeatureVDICopies's level
// as Cluster.CreateVDIWith refuses it.
func (l *Local) CreateVDIWithCopies(name string, size uint64, exclusive bool, copies int) (VDI, error) {
	return l.cmds.CreateVDI(context.Background(), name, size, exclusive, copies, "", l.requires)
}

// CreateVDIWithScheme commits a new erasure-coded VDI (`--ec K+M`; ""
// for copies), refused below FeatureErasureCoding's level as
// Cluster.CreateVDIWith refuses it.
func (l *Local) CreateVDIWithScheme(name string, size uint64, exclusive bool, scheme string) (VDI, error) {
	return l.cmds.CreateVDI(context.Background(), name, size, exclusive, 0, scheme, l.requires)
}

// requires is Cluster.Requires on Local: feature's level, or an error
// naming the members below it.
func (l *Local) requires(feature Feature) error {
	if level := l.Level(); level < feature.Level {
		return upgradeRequired(feature, level, l.membersBelow(feature.Level))
	}
	return nil
}

// SetBuild records what node id's processes report about their binary
// from now on, as gossip carries it (Build): the simulator's nodes that
// run an older herd (a lower supported level) until they are upgraded.
func (l *Local) SetBuild(id string, b Build) {
	l.mu.Lock()
	l.builds[id] = b
	l.mu.Unlock()
}

// membersBelow is Cluster.membersBelow on Local: the members of the log
// (not removed) whose binary does not support level, or that are not
// alive in the log (gossip does not see a node that is down, so its
// version is unknown).
func (l *Local) membersBelow(level int) []string {
	l.mu.Lock()
	builds := maps.Clone(l.builds)
	l.mu.Unlock()
	var below []string
	l.fsm.View(func(s *State) {
		ids := slices.Sorted(maps.Keys(s.Nodes))
		for _, id := range ids {
			if _, removed := s.Removed[id]; removed {
				continue
			}
			b, ok := builds[id]
			if !ok {
				b = Build{Level: SupportedLevel}
			}
			switch {
			case s.Nodes[id].State != NodeAlive:
				below = append(below, fmt.Sprintf("%s (down: its version is unknown; start it on the new herd, or `herd node remove` it)", id))
			case b.SupportedLevel() < level:
				below = append(below, fmt.Sprintf("%s (runs %s, level %d)", id, b, b.SupportedLevel()))
			}
		}
	})
	return below
}

// FinalizeUpgrade raises the cluster's level to target once every member
// supports it, as `herd cluster finalize-upgrade` does
// (Cluster.FinalizeUpgrade, which raises it to SupportedLevel); it
// returns the level the cluster is at. A simulation raises the level its
// features need: what a higher one brings (the peer allow-list of
// LevelSecurity) is not simulated.
func (l *Local) FinalizeUpgrade(target int) (int, error) {
	level := l.Level()
	if target > SupportedLevel {
		return level, fmt.Errorf("%w: this binary supports feature levels up to %d, not %d", ErrInvalid, SupportedLevel, target)
	}
	if level >= target {
		return level, nil
	}
	if below := l.membersBelow(target); len(below) > 0 {
		return level, fmt.Errorf("%w: cannot raise the cluster to feature level %d: upgrade herd on %s first", ErrUpgradeRequired, target, strings.Join(below, ", "))
	}
	level, err := l.cmds.RaiseLevel(context.Background(), target, nil)
	if err != nil {
		return l.Level(), err
	}
	return level, nil
}

// grantLease answers a member's lease request, as Cluster.grantLease
// does: it records the grant (its time, its commit index, the member's
// applied index: leaseGrants.record) and answers the commit index, which
// the member must apply before it holds the lease, and the active index,
// waiting up to activeWait for it to reach want. The leader needs no barrier or
// VerifyLeader here: a member is connected only on the majority's side.
func (l *Local) grantLease(node string, applied, want uint64) (commit, active uint64) {
	commit = l.Len()
	var alive []string
	l.fsm.View(func(s *State) {
		for id, n := range s.Nodes {
			if n.State == NodeAlive {
				alive = append(alive, id)
			}
		}
	})
	deadline := time.Now().Add(activeWait)
	g := &l.grants
	g.mu.Lock()
	defer g.mu.Unlock()
	g.record(node, l.now(), applied, commit)
	close(g.changed)
	g.changed = make(chan struct{})
	for {
		active = g.activeLocked(l.now(), commit, alive)
		if active >= want || !time.Now().Before(deadline) {
			return commit, active
		}
		// Wait for other members' reports (or leases running out).
		changed := g.changed
		g.mu.Unlock()
		timer := time.NewTimer(50 * time.Millisecond)
		select {
		case <-changed:
		case <-timer.C:
		}
		timer.Stop()
		g.mu.Lock()
	}
}

// dropWait is how long the leader must still wait before it commits an
// entry that takes node out (Cluster.dropWait): until any lease it
// granted the node, or a predecessor did before it began to lead, has
// run out.
func (l *Local) dropWait(node string) time.Duration {
	g := &l.grants
	g.mu.Lock()
	defer g.mu.Unlock()
	from := g.since
	if last, ok := g.last[node]; ok && last > from {
		from = last
	}
	return max(time.Duration(from+int64(leaseDuration+leaseMargin)-l.now()), 0)
}

// Close stops every member.
func (l *Local) Close() {
	l.mu.Lock()
	members := make([]*LocalMember, 0, len(l.members))
	for m := range l.members {
		members = append(members, m)
	}
	l.mu.Unlock()
	for _, m := range members {
		m.Stop()
	}
}

// LocalMember is one node process's handle on a Local log: the
// simulation's counterpart of Cluster, satisfying what the gateway and
// the replica side need of it. It starts disconnected and without a
// lease.
type LocalMember struct {
	fsm *FSM
	applied
	cmds        *statemachine.Commands // what this process proposes (Propose)
	log         *Local
	id          string
	incarnation string

	mu           sync.Mutex // guards the fields below
	connected    bool
	lostContact  time.Time
	lag          time.Duration
	catchUp      time.Duration
	catchUpUntil time.Time // applies nothing before: reconnected, its entries not arrived yet
	stopped      bool
	leaseUntil   time.Time     // the lease is valid before it
	active       uint64        // the highest active index the leader answered
	want         uint64        // the active index a write waits for
	renewed      chan struct{} // closed and replaced at every extension
	lastErr      error         // why the last renewal failed (nil: it did not)

	wake   chan struct{}   // nudges the applier after a change of the above
	kick   chan struct{}   // asks for a renewal now
	done   chan struct{}   // closed by Stop
	ctx    context.Context // ends with Stop
	cancel context.CancelFunc
}

// Member starts the member of node id's process incarnation, which has
// already applied the first `from` entries (a restarted node replays the
// log it kept on its disk before it hears from the leader). Stop it, or
// Close the log, when done: it runs goroutines that apply entries and
// renew its lease.
func (l *Local) Member(id, incarnation string, from uint64) *LocalMember {
	fsm := newFSM()
	m := &LocalMember{fsm: fsm, applied: statemachine.NewReads(fsm.FSM), log: l, id: id, incarnation: incarnation, lostContact: time.Now(),
		renewed: make(chan struct{}), wake: make(chan struct{}, 1), kick: make(chan struct{}, 1), done: make(chan struct{})}
	m.ctx, m.cancel = context.WithCancel(context.Background())
	m.cmds = statemachine.NewCommands(m, m.fsm.FSM, id, incarnation)
	m.apply(from)
	l.mu.Lock()
	l.members[m] = true
	l.mu.Unlock()
	go m.run()
	go m.leaseLoop()
	return m
}

// ID is the member's node id.
func (m *LocalMember) ID() string { return m.id }

// Incarnation identifies the member's process.
func (m *LocalMember) Incarnation() string { return m.incarnation }

// Applied is the number of entries this member applied.
func (m *LocalMember) Applied() uint64 { return m.fsm.Applied() }

// SetConnected says whether the member's process reaches the majority
// (the leader): a connected member applies new entries, renews its lease
// and may commit. A member connected again has contact at once (a
// heartbeat, one held in its socket across a pause too) but applies what
// it missed only after its catch-up delay (SetCatchUp).
func (m *LocalMember) SetConnected(connected bool) {
	m.mu.Lock()
	if m.connected && !connected {
		m.lostContact = time.Now()
	}
	if !m.connected && connected {
		m.catchUpUntil = time.Now().Add(m.catchUp)
	}
	m.connected = connected
	m.mu.Unlock()
	m.nudge()
}

// SetLag sets how long the member takes to apply entries after they are
// committed (a follower is always a little behind the leader).
func (m *LocalMember) SetLag(lag time.Duration) {
	m.mu.Lock()
	m.lag = lag
	m.mu.Unlock()
	m.nudge()
}

// SetCatchUp sets how long the member, when it is connected again after
// a pause or a partition, takes before it applies the entries it missed.
// Raft's heartbeats and its entries travel apart: a follower that stopped
// answering gets a heartbeat (or reads one that waited in its socket while
// it was stopped) before the leader, which backs off replication to a
// follower that failed, sends it what it missed. Meanwhile the member has
// contact with the leader, so quorum, and still applies the old epochs.
func (m *LocalMember) SetCatchUp(d time.Duration) {
	m.mu.Lock()
	m.catchUp = d
	m.mu.Unlock()
}

// Stop ends the member: its process died. It applies nothing more, has no
// quorum, no lease, and commits nothing.
func (m *LocalMember) Stop() {
	m.mu.Lock()
	if m.stopped {
		m.mu.Unlock()
		return
	}
	m.stopped = true
	m.mu.Unlock()
	close(m.done)
	m.cancel()
	m.log.mu.Lock()
	delete(m.log.members, m)
	m.log.mu.Unlock()
}

func (m *LocalMember) nudge() {
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// apply applies the committed entries up to index `to` not applied yet.
func (m *LocalMember) apply(to uint64) {
	m.log.mu.Lock()
	to = min(to, uint64(len(m.log.entries)))
	from := m.fsm.Applied()
	var batch []*raft.Log
	for i := from; i < to; i++ {
		batch = append(batch, &raft.Log{Index: i + 1, Type: raft.LogCommand, Data: m.log.entries[i]})
	}
	m.log.mu.Unlock()
	if len(batch) > 0 {
		m.fsm.ApplyBatch(batch)
	}
}

// run applies committed entries while the member is connected, each
// batch after the member's lag (the first after a reconnection after its
// catch-up delay too), until Stop.
func (m *LocalMember) run() {
	for {
		m.log.mu.Lock()
		changed, committed := m.log.changed, uint64(len(m.log.entries))
		m.log.mu.Unlock()
		m.mu.Lock()
		connected, wait, stopped := m.connected, max(m.lag, time.Until(m.catchUpUntil)), m.stopped
		m.mu.Unlock()
		if stopped {
			return
		}
		if connected && committed > m.fsm.Applied() {
			if wait > 0 {
				timer := time.NewTimer(wait)
				select {
				case <-timer.C:
				case <-m.done:
					timer.Stop()
					return
				}
			}
			m.mu.Lock()
			connected = m.connected && !m.stopped && !time.Now().Before(m.catchUpUntil)
			m.mu.Unlock()
			if connected {
				m.apply(^uint64(0))
			}
			continue
		}
		select {
		case <-changed:
		case <-m.wake:
		case <-m.done:
			return
		}
	}
}

// QuorumStatus tells whether this member can currently commit to the log
// (as Cluster.QuorumStatus: a follower keeps saying yes for
// quorumContactTimeout after it last heard from the leader). It is
// contact, not a lease: a member connected again has quorum at once,
// before it applied what it missed.
func (m *LocalMember) QuorumStatus() (ok bool, detail string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case m.stopped:
		return false, "this process has stopped"
	case m.connected:
		return true, "leader reachable"
	}
	since := time.Since(m.lostContact)
	if since > quorumContactTimeout {
		return false, fmt.Sprintf("no contact with the leader for %s", since.Round(100*time.Millisecond))
	}
	return true, "leader reachable a moment ago"
}

// HasQuorum is QuorumStatus's answer without its detail.
func (m *LocalMember) HasQuorum() bool {
	ok, _ := m.QuorumStatus() // formats only when there is no quorum
	return ok
}

// LeaseValid says whether this member may serve data now (as
// Cluster.LeaseValid, on the simulation's clock).
func (m *LocalMember) LeaseValid() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return !m.stopped && time.Now().Before(m.leaseUntil)
}

// LeaseValidMonotonic is LeaseValid: the simulation has one clock, and no
// host is suspended.
func (m *LocalMember) LeaseValidMonotonic() bool { return m.LeaseValid() }

func (m *LocalMember) askRenewal() {
	select {
	case m.kick <- struct{}{}:
	default:
	}
}

// WaitLease returns nil once this member holds a valid lease, or an
// error saying why it has none after leaseWait (as Cluster.WaitLease).
func (m *LocalMember) WaitLease(ctx context.Context) error {
	timer := time.NewTimer(leaseWait)
	defer timer.Stop()
	for {
		m.mu.Lock()
		renewed, lastErr, valid := m.renewed, m.lastErr, !m.stopped && time.Now().Before(m.leaseUntil)
		m.mu.Unlock()
		if valid {
			return nil
		}
		m.askRenewal()
		select {
		case <-renewed:
		case <-timer.C:
			if lastErr == nil {
				lastErr = errors.New("no renewal answered in time")
			}
			return fmt.Errorf("%w: node %s holds no lease from the leader: %v", ErrNoQuorum, m.id, lastErr)
		case <-ctx.Done():
			return ctx.Err()
		case <-m.done:
			return fmt.Errorf("%w: this process has stopped", ErrNoQuorum)
		}
	}
}

// WaitActive returns nil once writes in epoch may be admitted: no member
// serves an epoch before it any more (as Cluster.WaitActive).
func (m *LocalMember) WaitActive(ctx context.Context, epoch uint64) error {
	current, index := m.fsm.EpochStart()
	if current != epoch {
		return nil
	}
	if index == 0 {
		index = m.fsm.Applied()
	}
	m.mu.Lock()
	if m.active >= index {
		m.mu.Unlock()
		return nil
	}
	m.want = max(m.want, index)
	m.mu.Unlock()
	timer := time.NewTimer(leaseWait)
	defer timer.Stop()
	for {
		m.mu.Lock()
		renewed, lastErr, active := m.renewed, m.lastErr, m.active
		m.mu.Unlock()
		if active >= index {
			return nil
		}
		m.askRenewal()
		select {
		case <-renewed:
		case <-timer.C:
			detail := fmt.Sprintf("nodes that may still serve an earlier epoch have not reported epoch %d (entry %d) yet", epoch, index)
			if lastErr != nil {
				detail += "; " + lastErr.Error()
			}
			return fmt.Errorf("%w: %s", ErrNoQuorum, detail)
		case <-ctx.Done():
			return ctx.Err()
		case <-m.done:
			return fmt.Errorf("%w: this process has stopped", ErrNoQuorum)
		}
	}
}

// leaseLoop renews the member's lease every leaseRenewEvery, at once when
// a request found none or waits for a higher active index, and when the
// member applies a new epoch (as Cluster.leaseLoop), until Stop. A paused
// process's timers still fire in the simulation: its renewals fail, as
// they find the leader unreachable.
func (m *LocalMember) leaseLoop() {
	ticker := time.NewTicker(leaseRenewEvery)
	defer ticker.Stop()
	for {
		epochChanged := m.fsm.EpochChanged()
		if err := m.renewLease(); err != nil {
			m.mu.Lock()
			m.lastErr = err
			m.mu.Unlock()
		}
		select {
		case <-m.done:
			return
		case <-ticker.C:
		case <-m.kick:
		case <-epochChanged:
		}
	}
}

// renewLease asks the leader for a lease at t0 (as Cluster.renewLease):
// the request carries the member's applied index and the active index it
// waits for; the member applies the log up to the answered commit index,
// and then holds the lease until t0 + leaseDuration. An answer applied
// later than that extends nothing.
func (m *LocalMember) renewLease() error {
	t0 := time.Now()
	m.mu.Lock()
	connected, stopped, want := m.connected, m.stopped, m.want
	m.mu.Unlock()
	if stopped {
		return nil
	}
	if !connected {
		return fmt.Errorf("the leader is unreachable from node %s", m.id)
	}
	commit, active := m.log.grantLease(m.id, m.fsm.Applied(), want)
	ctx, cancel := context.WithDeadline(m.ctx, t0.Add(leaseDuration))
	defer cancel()
	if err := m.fsm.WaitApplied(ctx, commit); err != nil {
		return fmt.Errorf("node %s did not apply the log up to index %d in time", m.id, commit)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.active = max(m.active, active)
	if until := t0.Add(leaseDuration); until.After(m.leaseUntil) {
		m.leaseUntil = until
	}
	m.lastErr = nil
	close(m.renewed)
	m.renewed = make(chan struct{})
	return nil
}

// Propose implements Proposer: it commits a command through the leader
// and waits until this member has applied it too, as Cluster.Propose
// does.
func (m *LocalMember) Propose(ctx context.Context, data []byte) (json.RawMessage, uint64, error) {
	if ok, detail := m.QuorumStatus(); !ok {
		return nil, 0, fmt.Errorf("%w: %s", ErrNoQuorum, detail)
	}
	m.mu.Lock()
	connected := m.connected
	m.mu.Unlock()
	if !connected {
		return nil, 0, fmt.Errorf("%w: the leader is unreachable from node %s", ErrNoQuorum, m.id)
	}
	value, index, err := m.log.commit(data)
	wait, cancel := context.WithTimeout(ctx, applyTimeout)
	defer cancel()
	m.fsm.WaitApplied(wait, index) // committed either way; this node may just be behind
	return value, index, err
}

// LookupVDI is VDI after catching up with the log on a miss (Cluster's
// read barrier); a miss it cannot confirm (cut off from the log) is
// ErrNoQuorum, as Cluster's.
func (m *LocalMember) LookupVDI(ctx context.Context, name string) (VDI, error) {
	v, err := m.VDI(name)
	if !errors.Is(err, ErrNotFound) {
		return v, err
	}
	m.mu.Lock()
	connected := m.connected
	m.mu.Unlock()
	if !connected {
		return VDI{}, fmt.Errorf("vdi %q is not in this node's copy of the log, and the leader's cannot be asked: %w: cut off from the log", name, ErrNoQuorum)
	}
	wait, cancel := context.WithTimeout(ctx, applyTimeout)
	defer cancel()
	if err := m.fsm.WaitApplied(wait, m.log.Len()); err != nil {
		return VDI{}, fmt.Errorf("vdi %q is not in this node's copy of the log, and it did not catch up: %w", name, err)
	}
	return m.VDI(name)
}

// SnapshotVDI is Cluster.SnapshotVDI.
func (m *LocalMember) SnapshotVDI(ctx context.Context, name, tag, holder string) (SnapshotResult, error) {
	return m.cmds.SnapshotVDI(ctx, name, tag, holder)
}

// AcquireLock is Cluster.AcquireLock.
func (m *LocalMember) AcquireLock(ctx context.Context, key, session string) (Lock, error) {
	wait, cancel := context.WithTimeout(ctx, applyTimeout)
	err := m.WaitRegistered(wait, m.id, m.incarnation)
	cancel()
	if err != nil {
		return Lock{}, err
	}
	return m.cmds.AcquireLock(ctx, key, session)
}

// ReleaseLock is Cluster.ReleaseLock.
// StopWindow opens this node's down-out window as it stops cleanly
// (depart.go step 1b).
func (m *LocalMember) StopWindow(ctx context.Context, at, until time.Time) error {
	return m.cmds.StopWindow(ctx, at, until)
}

func (m *LocalMember) ReleaseLock(ctx context.Context, key, session string) error {
	return m.cmds.ReleaseLock(ctx, key, session)
}

// MarkVDIUnclean is Cluster.MarkVDIUnclean.
func (m *LocalMember) MarkVDIUnclean(ctx context.Context, name string) error {
	return m.cmds.MarkVDIUnclean(ctx, name)
}

// MarkVDIRepaired is Cluster.MarkVDIRepaired.
func (m *LocalMember) MarkVDIRepaired(ctx context.Context, name string) error {
	return m.cmds.MarkVDIRepaired(ctx, name)
}
