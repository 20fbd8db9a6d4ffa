package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/raft"
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
// again. Like a raft follower without leader contact, a disconnected
// member reports no quorum once quorumContactTimeout has passed.
//
// Local itself stands for the leader: its state is the committed one
// (the reads of applied), and its Format, NodeJoin, NodeLeave and
// CreateVDI commit what the leader's reconcile loop and the admin API
// commit in a real cluster. Safe for concurrent use; time is read from
// the time package, so a simulation's fake clock governs it.
type Local struct {
	applied // the leader's FSM: applies every entry as it is committed

	mu      sync.Mutex // guards entries, changed, members
	entries [][]byte
	changed chan struct{} // closed and replaced on every commit
	members map[*LocalMember]bool
}

// NewLocal returns an empty log.
func NewLocal() *Local {
	return &Local{applied: applied{fsm: newFSM()}, changed: make(chan struct{}), members: map[*LocalMember]bool{}}
}

// commit appends an encoded command and returns the result the leader's
// FSM computed for it (as raft's ApplyFuture does) and its index. An entry
// whose apply fails is still committed: every FSM refuses it alike.
func (l *Local) commit(data []byte) (json.RawMessage, uint64, error) {
	if len(data) == 0 || commands[commandType(data[0])] == nil {
		return nil, 0, fmt.Errorf("%w: unknown command", ErrInvalid)
	}
	l.mu.Lock()
	l.entries = append(l.entries, data)
	index := uint64(len(l.entries))
	results := l.fsm.ApplyBatch([]*raft.Log{{Index: index, Type: raft.LogCommand, Data: data}})
	close(l.changed)
	l.changed = make(chan struct{})
	l.mu.Unlock()
	res, _ := results[0].(*applyResult)
	if res == nil {
		return nil, index, fmt.Errorf("cluster: log entry produced no result")
	}
	if res.Err != nil {
		return nil, index, res.Err
	}
	value, err := json.Marshal(res.Value)
	return value, index, err
}

func (l *Local) commitCommand(t commandType, payload any, out any) error {
	data, err := encodeProposal(t, payload)
	if err != nil {
		return err
	}
	value, _, err := l.commit(data)
	if err != nil || out == nil {
		return err
	}
	return json.Unmarshal(value, out)
}

// Len is the number of committed entries.
func (l *Local) Len() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return uint64(len(l.entries))
}

// Format commits the cluster's format, as `herd cluster format` does.
func (l *Local) Format(copies int, objectSize uint64) (Format, error) {
	var f Format
	if err := validateFormat(copies, objectSize); err != nil {
		return f, err
	}
	err := l.commitCommand(commandFormat, formatCommand{Copies: copies, ObjectSize: objectSize, Time: time.Now().UTC()}, &f)
	return f, err
}

// NodeJoin commits a node (or its new process: another incarnation) as
// alive, as the leader does when gossip sees it; it returns the epoch.
func (l *Local) NodeJoin(n Node) (uint64, error) {
	var epoch uint64
	err := l.commitCommand(commandNodeJoin, nodeJoinCommand{Node: n, Time: time.Now().UTC()}, &epoch)
	return epoch, err
}

// NodeLeave commits a node as gone, as the leader does when gossip
// declares it dead; it returns the epoch.
func (l *Local) NodeLeave(id, reason string) (uint64, error) {
	var epoch uint64
	err := l.commitCommand(commandNodeLeave, nodeLeaveCommand{ID: id, Reason: reason, Time: time.Now().UTC()}, &epoch)
	return epoch, err
}

// SetMaintenance commits a maintenance window of length d for node id,
// as `herd node maintenance` does.
func (l *Local) SetMaintenance(id string, d time.Duration) (Node, error) {
	var n Node
	now := time.Now().UTC()
	err := l.commitCommand(commandNodeMaintenance, nodeMaintenanceCommand{ID: id, Until: now.Add(d), Time: now}, &n)
	return n, err
}

// CreateVDI commits a new VDI, as `herd vdi create` does.
func (l *Local) CreateVDI(name string, size uint64) (VDI, error) {
	return l.CreateVDIWith(name, size, false)
}

// CreateVDIWith commits a new VDI, exclusive or not (`--exclusive`).
func (l *Local) CreateVDIWith(name string, size uint64, exclusive bool) (VDI, error) {
	var v VDI
	if err := ValidateName(name); err != nil {
		return v, err
	}
	if err := ValidateSize(size, 0); err != nil {
		return v, err
	}
	err := l.commitCommand(commandVDICreate, vdiCreateCommand{Name: name, Size: size, Exclusive: exclusive, Time: time.Now().UTC()}, &v)
	return v, err
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
// the replica side need of it. It starts disconnected.
type LocalMember struct {
	applied
	log         *Local
	id          string
	incarnation string

	mu          sync.Mutex // guards connected, lostContact, lag, stopped
	connected   bool
	lostContact time.Time
	lag         time.Duration
	stopped     bool

	wake chan struct{} // nudges the applier after a change of the above
	done chan struct{} // closed by Stop
}

// Member starts the member of node id's process incarnation, which has
// already applied the first `from` entries (a restarted node replays the
// log it kept on its disk before it hears from the leader). Stop it, or
// Close the log, when done: it runs a goroutine that applies entries.
func (l *Local) Member(id, incarnation string, from uint64) *LocalMember {
	m := &LocalMember{applied: applied{fsm: newFSM()}, log: l, id: id, incarnation: incarnation, lostContact: time.Now(), wake: make(chan struct{}, 1), done: make(chan struct{})}
	m.apply(from)
	l.mu.Lock()
	l.members[m] = true
	l.mu.Unlock()
	go m.run()
	return m
}

// ID is the member's node id.
func (m *LocalMember) ID() string { return m.id }

// Incarnation identifies the member's process.
func (m *LocalMember) Incarnation() string { return m.incarnation }

// Applied is the number of entries this member applied.
func (m *LocalMember) Applied() uint64 { return m.fsm.Applied() }

// SetConnected says whether the member's process reaches the majority
// (the leader): a connected member applies new entries and may commit.
func (m *LocalMember) SetConnected(connected bool) {
	m.mu.Lock()
	if m.connected && !connected {
		m.lostContact = time.Now()
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

// Stop ends the member: its process died. It applies nothing more, has no
// quorum and commits nothing.
func (m *LocalMember) Stop() {
	m.mu.Lock()
	if m.stopped {
		m.mu.Unlock()
		return
	}
	m.stopped = true
	m.mu.Unlock()
	close(m.done)
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
// batch after the member's lag, until Stop.
func (m *LocalMember) run() {
	for {
		m.log.mu.Lock()
		changed, committed := m.log.changed, uint64(len(m.log.entries))
		m.log.mu.Unlock()
		m.mu.Lock()
		connected, lag, stopped := m.connected, m.lag, m.stopped
		m.mu.Unlock()
		if stopped {
			return
		}
		if connected && committed > m.fsm.Applied() {
			if lag > 0 {
				timer := time.NewTimer(lag)
				select {
				case <-timer.C:
				case <-m.done:
					timer.Stop()
					return
				}
			}
			m.mu.Lock()
			connected = m.connected && !m.stopped
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
// quorumContactTimeout after it last heard from the leader).
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

// LeaseValid is HasQuorum: the simulator models a node's lease by its
// contact with the leader.
func (m *LocalMember) LeaseValid() bool { return m.HasQuorum() }

// LeaseValidMonotonic is LeaseValid.
func (m *LocalMember) LeaseValidMonotonic() bool { return m.HasQuorum() }

// WaitLease is LeaseValid's answer as an error.
func (m *LocalMember) WaitLease(ctx context.Context) error {
	if ok, detail := m.QuorumStatus(); !ok {
		return fmt.Errorf("%w: %s", ErrNoQuorum, detail)
	}
	return nil
}

// WaitActive admits every write: the simulator models neither leases nor
// activation (a member's lease is its contact with the leader); the real
// runtime's are tested on real processes (test/e2e
// TestPausedNodeServesNoStaleRead).
func (m *LocalMember) WaitActive(ctx context.Context, epoch uint64) error { return nil }

// propose commits a command through the leader and waits until this
// member has applied it too, as Cluster.propose does.
func (m *LocalMember) propose(ctx context.Context, t commandType, payload any) (json.RawMessage, error) {
	data, err := encodeProposal(t, payload)
	if err != nil {
		return nil, err
	}
	if ok, detail := m.QuorumStatus(); !ok {
		return nil, fmt.Errorf("%w: %s", ErrNoQuorum, detail)
	}
	m.mu.Lock()
	connected := m.connected
	m.mu.Unlock()
	if !connected {
		return nil, fmt.Errorf("%w: the leader is unreachable from node %s", ErrNoQuorum, m.id)
	}
	value, index, err := m.log.commit(data)
	wait, cancel := context.WithTimeout(ctx, applyTimeout)
	defer cancel()
	m.fsm.WaitApplied(wait, index) // committed either way; this node may just be behind
	return value, err
}

// LookupVDI is VDI after catching up with the log on a miss (Cluster's
// read barrier).
func (m *LocalMember) LookupVDI(ctx context.Context, name string) (VDI, error) {
	v, err := m.VDI(name)
	if err == nil {
		return v, nil
	}
	m.mu.Lock()
	connected := m.connected
	m.mu.Unlock()
	if connected {
		wait, cancel := context.WithTimeout(ctx, applyTimeout)
		defer cancel()
		if m.fsm.WaitApplied(wait, m.log.Len()) == nil {
			v, err = m.VDI(name)
		}
	}
	return v, err
}

// SnapshotVDI is Cluster.SnapshotVDI.
func (m *LocalMember) SnapshotVDI(ctx context.Context, name, tag, holder string) (SnapshotResult, error) {
	var r SnapshotResult
	if tag != "" {
		if err := ValidateTag(tag); err != nil {
			return r, err
		}
	}
	out, err := m.propose(ctx, commandVDISnapshot, vdiSnapshotCommand{Name: name, Tag: tag, Holder: holder, Time: time.Now().UTC()})
	if err != nil {
		return r, err
	}
	return r, json.Unmarshal(out, &r)
}

// AcquireLock is Cluster.AcquireLock.
func (m *LocalMember) AcquireLock(ctx context.Context, key, session string) (Lock, error) {
	var l Lock
	wait, cancel := context.WithTimeout(ctx, applyTimeout)
	err := m.registered(wait, m.id, m.incarnation)
	cancel()
	if err != nil {
		return l, err
	}
	out, err := m.propose(ctx, commandLockAcquire, lockCommand{Key: key, Node: m.id, Incarnation: m.incarnation, Session: session, Time: time.Now().UTC()})
	if err != nil {
		return l, err
	}
	return l, json.Unmarshal(out, &l)
}

// ReleaseLock is Cluster.ReleaseLock.
func (m *LocalMember) ReleaseLock(ctx context.Context, key, session string) error {
	_, err := m.propose(ctx, commandLockRelease, lockCommand{Key: key, Node: m.id, Incarnation: m.incarnation, Session: session})
	return err
}

// MarkVDIUnclean is Cluster.MarkVDIUnclean.
func (m *LocalMember) MarkVDIUnclean(ctx context.Context, name string) error {
	_, err := m.propose(ctx, commandVDIUnclean, vdiRepairedCommand{Name: name})
	return err
}

// MarkVDIRepaired is Cluster.MarkVDIRepaired.
func (m *LocalMember) MarkVDIRepaired(ctx context.Context, name string) error {
	_, err := m.propose(ctx, commandVDIRepaired, vdiRepairedCommand{Name: name})
	return err
}
