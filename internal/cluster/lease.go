package cluster

// Leases: a node serves data (its replica answers reads and writes) only
// while it holds a lease that proves its applied state is current.
//
// Raft alone does not prove it. A follower learns that a leader exists
// from heartbeats, and a heartbeat carries no log position: one sent
// before a node was paused (SIGSTOP, a frozen VM host) and delivered
// after, or a fresh one arriving before the node has applied what it
// missed, makes "leader known, contact recent" true while the node still
// applies an epoch the cluster left seconds ago. A replica admitting
// requests in that epoch would serve a copy that missed every write made
// meanwhile. So:
//
//   - Renewal. A node sends a lease request at time t0 (CLOCK_BOOTTIME,
//     which keeps counting while the host is suspended and the process is
//     stopped). The leader, once it has applied a Barrier in its term,
//     reads its commit index C, confirms it still leads with a round of
//     heartbeats a majority answers (VerifyLeader), records the grant's
//     time and answers C. The node applies up to C and then holds the
//     lease until t0 + leaseDuration. An answer that comes later than
//     that extends nothing. Every node renews every leaseRenewEvery; a
//     request that finds no valid lease asks for a renewal at once and
//     waits up to leaseWait.
//   - Serving. A replica admits a request only with a valid lease, and
//     answers a read only if, after the store read, the lease is still
//     valid and the node still applies the request's epoch
//     (replica.Replica.Read).
//   - Dropping. The leader commits an entry that takes a node out of the
//     cluster (NodeLeave, NodeRemove) only leaseDuration + leaseMargin
//     after its last grant to that node, and a new leader commits none
//     until leaseDuration + leaseMargin after it began to lead (it does
//     not know its predecessor's grants).
//   - Activation. A node that stays in the cluster may still apply a new
//     epoch later than the others (a join moves objects away from it; it
//     may lag a few milliseconds, or seconds on a starved host). Every
//     lease request carries the node's applied index, a floor below which
//     it serves nothing from then on (a read in an older epoch fails its
//     check after the store read). The leader answers with the active
//     index: the lowest floor of the nodes whose leases may still run
//     (and 0 for a node alive in the log it has not heard from in its
//     first leaseDuration + leaseMargin). A replica admits a write in an
//     epoch only once the active index reaches the entry that began the
//     epoch: no node serves the epoch before it any more. Nodes renew at
//     once when they apply a new epoch, so this costs a round trip at an
//     epoch change, or the remaining lease of a node that stopped
//     answering.
//
// Why it holds: a node's lease from t0 means it applied every entry
// committed before t0. An epoch that drops the node is committed after
// the node's lease ran out (the leader's wait), so the node, if it is
// still running, learns of it before it serves again: its next lease
// needs a renewal that carries the drop's index. A read answered under a
// valid lease in the old epoch is answered before the drop is committed,
// so before any write of the new epoch is acknowledged. A node left in
// the new epoch answers reads in the old one only until it reports the
// new epoch's index, and no write of the new epoch is admitted before
// that report or its lease's end. Timing
// assumptions: the clocks of the node and the leader advance at rates
// that differ by less than leaseMargin/leaseDuration (25%); no
// synchronised clocks are needed, since each side measures only its own
// intervals. See docs/ARCHITECTURE.md, "Leases".

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	"github.com/herd-storage/herd/internal/cluster/statemachine"
	"golang.org/x/sys/unix"
)

const (
	leaseDuration   = 2 * time.Second
	leaseMargin     = 500 * time.Millisecond
	leaseRenewEvery = 500 * time.Millisecond
	leaseWait       = 2 * time.Second // a request without a valid lease waits this long for a renewal
	// leaseRequest is the forwarded request that asks the leader for a
	// lease: leaseRequest, the node's applied index and the active index
	// it waits for (8 bytes each, big-endian), then the node id. It is
	// never a log command (TestLeaseAndBarrierRequestsAreNoCommands).
	leaseRequest = 0x7f
	// activeWait is how long the leader holds a lease request that waits
	// for an active index before it answers with the one it has.
	activeWait = 500 * time.Millisecond
)

// leaseAnswer is the body of the leader's answer (its index field is the
// commit index).
type leaseAnswer struct {
	Active uint64 `json:"active"`
}

// processStart is the origin of monoNow.
var processStart = time.Now()

// monoNow is Go's monotonic clock in nanoseconds since processStart.
func monoNow() int64 {
	if simClock.Load() {
		return time.Now().UnixNano()
	}
	return int64(time.Since(processStart))
}

// simClock makes bootNow and monoNow read time.Now, the fake clock of a
// testing/synctest bubble: set by the simulator (UseSimClock, sim.go),
// never in a herd process.
var simClock atomic.Bool

// raise sets a to v unless it holds more already.
func raise(a *atomic.Int64, v int64) {
	for {
		old := a.Load()
		if v <= old || a.CompareAndSwap(old, v) {
			return
		}
	}
}

// bootNow is CLOCK_BOOTTIME in nanoseconds: monotonic, and counting while
// the host is suspended.
func bootNow() int64 {
	if simClock.Load() {
		return time.Now().UnixNano()
	}
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		panic(fmt.Sprintf("cluster: CLOCK_BOOTTIME: %v", err)) // Linux has had it since 2.6.39
	}
	return ts.Nano()
}

// nodeLease is this node's lease.
type nodeLease struct {
	until atomic.Int64 // bootNow() below it: valid
	// untilMono is the same end on the monotonic clock (monoNow), which
	// is read without a system call but stands still while the host is
	// suspended: it admits requests, and the exact check (valid) decides
	// before a read is answered.
	untilMono atomic.Int64
	active    atomic.Uint64 // the highest active index the leader answered
	want      atomic.Uint64 // the active index a write waits for
	kick      chan struct{}

	mu      sync.Mutex
	renewed chan struct{} // closed and replaced at every extension
	lastErr error         // why the last renewal failed (nil: it did not)
}

func newNodeLease() *nodeLease {
	return &nodeLease{kick: make(chan struct{}, 1), renewed: make(chan struct{})}
}

func (l *nodeLease) valid() bool { return bootNow() < l.until.Load() }

func (l *nodeLease) validMonotonic() bool { return monoNow() < l.untilMono.Load() }

// extend makes the lease run until until (bootNow) and untilMono
// (monoNow), unless it already runs longer.
func (l *nodeLease) extend(until, untilMono int64) {
	raise(&l.until, until)
	raise(&l.untilMono, untilMono)
	l.mu.Lock()
	l.lastErr = nil
	close(l.renewed)
	l.renewed = make(chan struct{})
	l.mu.Unlock()
}

func (l *nodeLease) failed(err error) {
	l.mu.Lock()
	l.lastErr = err
	l.mu.Unlock()
}

func (l *nodeLease) askRenewal() {
	select {
	case l.kick <- struct{}{}:
	default:
	}
}

// LeaseValid says whether this node may serve data now: exact, on
// CLOCK_BOOTTIME (a system call, about 0.5 µs).
func (c *Cluster) LeaseValid() bool {
	if bugServeByContact {
		return c.HasQuorum()
	}
	return c.lease.valid()
}

// LeaseValidMonotonic is LeaseValid on the monotonic clock, read without
// a system call: it cannot tell that the host was suspended, so it only
// admits requests, and LeaseValid decides before a read is answered.
func (c *Cluster) LeaseValidMonotonic() bool {
	if bugServeByContact {
		return c.HasQuorum()
	}
	return c.lease.validMonotonic()
}

// WaitLease returns nil once this node holds a valid lease, or an error
// saying why it has none after leaseWait (or when ctx ends).
func (c *Cluster) WaitLease(ctx context.Context) error {
	timer := time.NewTimer(leaseWait)
	defer timer.Stop()
	for {
		c.lease.mu.Lock()
		renewed, lastErr := c.lease.renewed, c.lease.lastErr
		c.lease.mu.Unlock()
		if c.lease.valid() {
			return nil
		}
		c.lease.askRenewal()
		select {
		case <-renewed:
		case <-timer.C:
			if lastErr == nil {
				lastErr = errors.New("no renewal answered in time")
			}
			return fmt.Errorf("%w: this node holds no lease from the leader: %v", ErrNoQuorum, lastErr)
		case <-ctx.Done():
			return ctx.Err()
		case <-c.stop:
			return fmt.Errorf("%w: this node is stopping", ErrNoQuorum)
		}
	}
}

// WaitActive returns nil once writes in epoch may be admitted: no node
// serves an epoch before it any more. Another epoch than the newest this
// node applied is the caller's to refuse; it passes here.
func (c *Cluster) WaitActive(ctx context.Context, epoch uint64) error {
	current, index := c.fsm.EpochStart()
	if current != epoch {
		return nil
	}
	if index == 0 {
		// The epoch came with a snapshot: its entry is at most the
		// index this node has applied.
		index = c.fsm.Applied()
	}
	if c.lease.active.Load() >= index {
		return nil
	}
	for {
		old := c.lease.want.Load()
		if old >= index || c.lease.want.CompareAndSwap(old, index) {
			break
		}
	}
	timer := time.NewTimer(leaseWait)
	defer timer.Stop()
	for {
		c.lease.mu.Lock()
		renewed, lastErr := c.lease.renewed, c.lease.lastErr
		c.lease.mu.Unlock()
		if c.lease.active.Load() >= index {
			return nil
		}
		c.lease.askRenewal()
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
		case <-c.stop:
			return fmt.Errorf("%w: this node is stopping", ErrNoQuorum)
		}
	}
}

// leaseLoop renews this node's lease every leaseRenewEvery, at once when
// a request found none or waits for a higher active index, and when this
// node applies a new epoch (so that writes in it wait a round trip only).
func (c *Cluster) leaseLoop() {
	defer c.wg.Done()
	ticker := time.NewTicker(leaseRenewEvery)
	defer ticker.Stop()
	for {
		epochChanged := c.fsm.EpochChanged()
		if err := c.renewLease(); err != nil {
			c.lease.failed(err)
		}
		select {
		case <-c.stop:
			return
		case <-ticker.C:
		case <-c.lease.kick:
		case <-epochChanged:
		}
	}
}

func (c *Cluster) renewLease() error {
	t0, t0Mono := bootNow(), monoNow()
	ctx, cancel := context.WithTimeout(context.Background(), leaseDuration)
	defer cancel()
	applied, want := c.fsm.Applied(), c.lease.want.Load()
	var commit, active uint64
	if c.raft.State() == raft.Leader {
		var err error
		if commit, active, err = c.grantLease(c.cfg.NodeID, applied, want); err != nil {
			return err
		}
	} else {
		leaderAddr, _ := c.raft.LeaderWithID()
		if leaderAddr == "" {
			return errors.New("no leader is known to this node")
		}
		request := make([]byte, 17, 17+len(c.cfg.NodeID))
		request[0] = leaseRequest
		binary.BigEndian.PutUint64(request[1:], applied)
		binary.BigEndian.PutUint64(request[9:], want)
		request = append(request, c.cfg.NodeID...)
		value, index, err := c.forward.send(ctx, string(leaderAddr), request)
		if err != nil {
			return fmt.Errorf("leader at %s: %w", leaderAddr, err)
		}
		var answer leaseAnswer
		if err := json.Unmarshal(value, &answer); err != nil {
			return fmt.Errorf("leader at %s: a lease answer that is not JSON: %v", leaderAddr, err)
		}
		commit, active = index, answer.Active
	}
	if err := c.fsm.WaitApplied(ctx, commit); err != nil {
		return fmt.Errorf("this node did not apply the log up to index %d in time", commit)
	}
	for {
		old := c.lease.active.Load()
		if active <= old || c.lease.active.CompareAndSwap(old, active) {
			break
		}
	}
	c.lease.extend(t0+int64(leaseDuration), t0Mono+int64(leaseDuration))
	return nil
}

// leaseGrants is the leader's record of the leases it granted in its
// current term.
type leaseGrants struct {
	mu    sync.Mutex
	term  uint64
	since int64            // bootNow when this node began to act as the term's leader
	ready bool             // the term's Barrier was applied: CommitIndex covers every earlier term's entries
	last  map[string]int64 // node id -> bootNow of its last grant
	// dropping are the nodes an entry that takes them out is being
	// committed for (awaitDrop): granted no lease meanwhile.
	dropping map[string]int
	floor    map[string]uint64 // node id -> the highest applied index it reported
	// granted are each node's grants whose leases may still run, oldest
	// first: a node uses a lease only once it applied the grant's commit
	// index, so the oldest one's is a floor too.
	granted map[string][]grant
	changed chan struct{} // closed and replaced at every grant
}

// begin resets the record when term is a new term.
func (g *leaseGrants) begin(term uint64) {
	if g.term != term || g.last == nil {
		g.term, g.since, g.ready = term, bootNow(), false
		g.last, g.floor, g.granted, g.dropping = map[string]int64{}, map[string]uint64{}, map[string][]grant{}, map[string]int{}
	}
	if g.changed == nil {
		g.changed = make(chan struct{})
	}
}

// grant is one lease granted: when, and the commit index it carried.
type grant struct {
	at     int64
	commit uint64
}

// record notes a grant to node at now with commit, the node having
// reported applied.
func (g *leaseGrants) record(node string, now int64, applied, commit uint64) {
	if g.last == nil {
		g.last = map[string]int64{}
	}
	if g.floor == nil {
		g.floor = map[string]uint64{}
	}
	if g.granted == nil {
		g.granted = map[string][]grant{}
	}
	g.last[node] = now
	g.floor[node] = max(g.floor[node], applied)
	g.granted[node] = append(g.granted[node], grant{at: now, commit: commit})
}

// floorLocked is the index below which node serves nothing at now: what
// it reported applying, or, once no predecessor's lease can run any
// more, the commit index of its oldest grant that may still run (a node
// catching up, whose report is low, serves nothing until it applied its
// grant's index).
func (g *leaseGrants) floorLocked(node string, now int64) uint64 {
	floor := g.floor[node]
	hold := int64(leaseDuration + leaseMargin)
	list := g.granted[node]
	for len(list) > 0 && now >= list[0].at+hold {
		list = list[1:]
	}
	if g.granted != nil {
		g.granted[node] = list
	}
	if len(list) > 0 && now >= g.since+hold {
		floor = max(floor, list[0].commit)
	}
	return floor
}

// activeLocked is the active index at now (g.mu held): the lowest floor
// of the nodes whose leases may still run, commit when there is none.
// alive are the nodes alive in the log: in the term's first lease
// period, one not heard from yet may hold a predecessor's lease with any
// floor.
func (g *leaseGrants) activeLocked(now int64, commit uint64, alive []string) uint64 {
	active := commit
	hold := int64(leaseDuration + leaseMargin)
	for node, last := range g.last {
		if now < last+hold {
			active = min(active, g.floorLocked(node, now))
		}
	}
	if now < g.since+hold {
		for _, node := range alive {
			if _, heard := g.last[node]; !heard {
				return 0
			}
		}
	}
	return active
}

// grantLease answers a lease request from node, which has applied the
// log up to applied and waits for the active index want: the commit
// index it must apply before it holds the lease, and the active index.
func (c *Cluster) grantLease(node string, applied, want uint64) (commit, active uint64, err error) {
	term := c.raft.CurrentTerm()
	if c.raft.State() != raft.Leader {
		return 0, 0, fmt.Errorf("%w: this node is no longer the leader", ErrNoQuorum)
	}
	c.grants.mu.Lock()
	c.grants.begin(term)
	ready := c.grants.ready
	c.grants.mu.Unlock()
	if !ready {
		// A new leader's commit index may not yet cover entries of the
		// terms before it: commit one of its own first.
		if err := c.raft.Barrier(applyTimeout).Error(); err != nil {
			return 0, 0, fmt.Errorf("%w: %v", ErrNoQuorum, err)
		}
		c.grants.mu.Lock()
		if c.grants.term == term {
			c.grants.ready = true
		}
		c.grants.mu.Unlock()
	}
	commit = c.raft.CommitIndex()
	if err := c.raft.VerifyLeader().Error(); err != nil {
		return 0, 0, fmt.Errorf("%w: %v", ErrNoQuorum, err)
	}
	alive := c.aliveNodes()
	deadline := time.Now().Add(activeWait)
	c.grants.mu.Lock()
	defer c.grants.mu.Unlock()
	if c.grants.term != term {
		return 0, 0, fmt.Errorf("%w: this node is no longer the leader", ErrNoQuorum)
	}
	if c.grants.dropping[node] > 0 {
		return 0, 0, fmt.Errorf("%w: node %s is being taken out of the cluster", ErrNoQuorum, node)
	}
	// A drop of node applied since commit was read: the grant must carry
	// it (the leader's commit index covers what it applied).
	commit = max(commit, c.raft.CommitIndex())
	c.grants.record(node, bootNow(), applied, commit)
	close(c.grants.changed)
	c.grants.changed = make(chan struct{})
	for {
		active = c.grants.activeLocked(bootNow(), commit, alive)
		if active >= want || !time.Now().Before(deadline) || c.grants.term != term {
			return commit, active, nil
		}
		// Wait for other nodes' reports (or leases running out).
		changed := c.grants.changed
		c.grants.mu.Unlock()
		select {
		case <-changed:
		case <-time.After(50 * time.Millisecond):
		case <-c.stop:
		}
		c.grants.mu.Lock()
	}
}

// aliveNodes are the nodes alive in this node's log.
func (c *Cluster) aliveNodes() []string {
	var out []string
	c.fsm.View(func(s *State) {
		for id, n := range s.Nodes {
			if n.State == NodeAlive {
				out = append(out, id)
			}
		}
	})
	return out
}

// dropWait is how long this leader must still wait before it may commit
// an entry that takes node out of the cluster: until any lease it or its
// predecessor granted the node has run out (0: now).
func (c *Cluster) dropWait(node string) time.Duration {
	c.grants.mu.Lock()
	defer c.grants.mu.Unlock()
	c.grants.begin(c.raft.CurrentTerm())
	from := c.grants.since
	if last, ok := c.grants.last[node]; ok && last > from {
		from = last
	}
	wait := time.Duration(from + int64(leaseDuration+leaseMargin) - bootNow())
	return max(wait, 0)
}

// awaitDrop waits, on the leader, until the entry data may be committed:
// an entry that takes a node out waits for its lease to run out. Call
// release once the entry is applied (or failed): until then the node is
// granted no lease.
func (c *Cluster) awaitDrop(ctx context.Context, data []byte) (release func(), err error) {
	release = func() {}
	node, remove, ok := statemachine.Drop(data)
	switch {
	case !ok:
		return release, nil // no node taken out, or refused by the state machine with its own error
	case remove:
		alive := false
		c.fsm.View(func(s *State) {
			n, ok := s.Nodes[node]
			alive = ok && n.State == NodeAlive
		})
		if alive {
			// Refused by the state machine (only a node out of the
			// epoch may be removed): no wait. An alive node renews its
			// lease all the time, and the wait below would last until
			// the caller gave up. Its leave, should it come first,
			// waits for its leases itself.
			return release, nil
		}
	}
	// A lease granted while the leader waits (the node's next process,
	// restarted meanwhile, renews) must run out too: wait again until
	// none is left, then grant the node none until the entry is
	// applied (grantLease), when grants carry its index.
	for {
		wait := c.holdDrop(node)
		if wait == 0 {
			return func() { c.releaseDrop(node) }, nil
		}
		timer := time.NewTimer(wait)
		select {
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
			return nil, fmt.Errorf("%w: node %s may still hold a lease for %s", ErrNoQuorum, node, wait.Round(time.Millisecond))
		}
	}
}

// holdDrop is dropWait, and when it is 0 it holds node's grants back
// (releaseDrop ends the hold) in the same step: no grant comes between.
func (c *Cluster) holdDrop(node string) time.Duration {
	c.grants.mu.Lock()
	defer c.grants.mu.Unlock()
	c.grants.begin(c.raft.CurrentTerm())
	from := c.grants.since
	if last, ok := c.grants.last[node]; ok && last > from {
		from = last
	}
	if wait := time.Duration(from + int64(leaseDuration+leaseMargin) - bootNow()); wait > 0 {
		return wait
	}
	c.grants.dropping[node]++
	return 0
}

func (c *Cluster) releaseDrop(node string) {
	c.grants.mu.Lock()
	defer c.grants.mu.Unlock()
	if c.grants.dropping[node] > 0 {
		c.grants.dropping[node]--
	}
}

// answerLease serves a forwarded lease request.
func (c *Cluster) answerLease(request []byte) (json.RawMessage, uint64, error) {
	if len(request) < 18 || len(request) > 17+MaxOwnerLength {
		return nil, 0, fmt.Errorf("%w: a lease request of %d bytes", ErrInvalid, len(request))
	}
	applied, want := binary.BigEndian.Uint64(request[1:]), binary.BigEndian.Uint64(request[9:])
	commit, active, err := c.grantLease(string(request[17:]), applied, want)
	if err != nil {
		return nil, 0, err
	}
	value, err := json.Marshal(leaseAnswer{Active: active})
	return value, commit, err
}
