// Package cluster is the ordered history every herd node shares: a
// hashicorp/raft log applied to a deterministic state machine (format,
// nodes, epochs, VDIs, locks), with hashicorp/memberlist gossip for failure
// detection. Gossip only advises; the leader writes membership through the
// log (as Consul does): a node gossip reports alive and the log does not
// know is committed with NodeJoin, one gossip reports dead with NodeLeave,
// and every such change is a new epoch. The leader also keeps the raft
// voter set healthy: 1 voter alone, 3 once 3 nodes are alive, 5 from 5,
// spread over zones, dead voters replaced; every other node is a non-voter
// that applies the same log.
package cluster

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/memberlist"
	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"

	"github.com/herd-storage/herd/internal/peer"
)

// Timing. Failure detection must commit a new epoch within 10 s of a node's
// death (issue 2); these leave ample margin on a loaded machine.
const (
	applyTimeout         = 5 * time.Second
	quorumContactTimeout = 3 * time.Second // a follower without leader contact this long has no quorum
	reconcileInterval    = 300 * time.Millisecond
	rejoinInterval       = 2 * time.Second
	unseenGrace          = 20 * time.Second // after start, how long a node may be unknown to gossip before it counts as dead
)

// Config describes the local node.
type Config struct {
	DataDir     string
	NodeID      string
	Incarnation string // unique per process start
	BindIP      string
	PeerAddr    string
	GossipPort  int
	AdminAddr   string
	NBDAddr     string
	Zone        string
	Capacity    uint64
	Token       string
	Join        []string // gossip addresses of members to join through
	JoinTimeout time.Duration
	Logger      *slog.Logger
	Peer        *peer.Listener
}

// Cluster is the local node's view of and handle on the cluster.
type Cluster struct {
	cfg       Config
	logger    *slog.Logger
	fsm       *FSM
	raft      *raft.Raft
	transport *raft.NetworkTransport
	store     *raftboltdb.BoltStore
	gossip    *memberlist.Memberlist
	forward   *forwarder
	started   time.Time

	nudge       chan struct{} // wakes the reconcile loop
	peersDirty  chan struct{} // node table changed: persist peers file
	stop        chan struct{}
	wg          sync.WaitGroup
	mu          sync.Mutex // guards seen
	seen        map[string]gossipState
	shutdownErr error
	closeOnce   sync.Once
}

type gossipState struct {
	alive bool
	since time.Time
}

// nodeMeta travels in gossip (memberlist's 512-byte node metadata).
type nodeMeta struct {
	Address     string `json:"a"`
	Peer        string `json:"p"`
	Admin       string `json:"h"`
	NBD         string `json:"n"`
	Zone        string `json:"z,omitempty"`
	Capacity    uint64 `json:"c"`
	Incarnation string `json:"i"`
}

// Start opens the local raft state, joins gossip and returns once the node
// is part of the cluster's gossip (or is its first node).
func Start(ctx context.Context, cfg Config) (*Cluster, error) {
	c := &Cluster{
		cfg:        cfg,
		logger:     cfg.Logger,
		fsm:        newFSM(),
		started:    time.Now(),
		nudge:      make(chan struct{}, 1),
		peersDirty: make(chan struct{}, 1),
		stop:       make(chan struct{}),
		seen:       map[string]gossipState{},
		forward:    &forwarder{key: peer.Key(cfg.Token)},
	}
	c.fsm.onNodeChange = func() {
		select {
		case c.peersDirty <- struct{}{}:
		default:
		}
		c.poke()
	}
	fresh, err := c.startRaft()
	if err != nil {
		c.Close()
		return nil, err
	}
	if err := c.startGossip(); err != nil {
		c.Close()
		return nil, err
	}
	seeds := append([]string{}, cfg.Join...)
	if fresh && len(seeds) > 0 {
		if err := c.firstJoin(ctx, seeds); err != nil {
			c.Close()
			return nil, err
		}
	}
	c.wg.Add(4)
	go c.serveForward(cfg.Peer.Protocol(peer.ProtocolForward))
	go c.reconcileLoop()
	go c.rejoinLoop()
	go c.peersLoop()
	return c, nil
}

func (c *Cluster) startRaft() (fresh bool, err error) {
	dir := filepath.Join(c.cfg.DataDir, "raft")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return false, err
	}
	hlog := hclog.New(&hclog.LoggerOptions{Name: "raft", Level: hclog.Warn, Output: os.Stderr})
	store, err := raftboltdb.New(raftboltdb.Options{Path: filepath.Join(dir, "raft.db")})
	if err != nil {
		return false, fmt.Errorf("cluster: open raft log %s: %w", dir, err)
	}
	c.store = store
	snapshots, err := raft.NewFileSnapshotStoreWithLogger(dir, 3, hlog)
	if err != nil {
		return false, fmt.Errorf("cluster: open raft snapshots: %w", err)
	}
	logs, err := raft.NewLogCache(1024, store)
	if err != nil {
		return false, err
	}
	stream := &streamLayer{sub: c.cfg.Peer.Protocol(peer.ProtocolRaft), key: peer.Key(c.cfg.Token), advertise: c.cfg.PeerAddr}
	c.transport = raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
		Stream: stream, MaxPool: 4, Timeout: 10 * time.Second, Logger: hlog,
	})
	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(c.cfg.NodeID)
	rc.Logger = hlog
	// Slightly above raft's defaults: on a saturated host (a VM host under
	// load, a shared CI machine) contact times of 500-700 ms were seen, and
	// a 500 ms lease made the leader step down under load.
	rc.HeartbeatTimeout = 1500 * time.Millisecond
	rc.ElectionTimeout = 1500 * time.Millisecond
	rc.LeaderLeaseTimeout = 1000 * time.Millisecond
	rc.CommitTimeout = 5 * time.Millisecond
	rc.BatchApplyCh = true
	rc.MaxAppendEntries = 512
	rc.SnapshotThreshold = 4096
	rc.TrailingLogs = 4096
	existing, err := raft.HasExistingState(logs, store, snapshots)
	if err != nil {
		return false, err
	}
	r, err := raft.NewRaft(rc, c.fsm, logs, store, snapshots, c.transport)
	if err != nil {
		return false, fmt.Errorf("cluster: start raft: %w", err)
	}
	c.raft = r
	if !existing && len(c.cfg.Join) == 0 {
		// The first node of a new cluster: a configuration of itself alone.
		boot := raft.Configuration{Servers: []raft.Server{{ID: rc.LocalID, Address: raft.ServerAddress(c.cfg.PeerAddr), Suffrage: raft.Voter}}}
		if err := r.BootstrapCluster(boot).Error(); err != nil {
			return false, fmt.Errorf("cluster: bootstrap: %w", err)
		}
		c.logger.Info("created a new cluster", "node", c.cfg.NodeID)
	}
	return !existing, nil
}

func (c *Cluster) startGossip() error {
	mc := memberlist.DefaultLANConfig()
	mc.Name = c.cfg.NodeID
	mc.BindAddr = c.cfg.BindIP
	mc.BindPort = c.cfg.GossipPort
	mc.AdvertiseAddr = c.cfg.BindIP
	mc.AdvertisePort = c.cfg.GossipPort
	key := sha256.Sum256([]byte("herd gossip key v1\x00" + c.cfg.Token))
	mc.SecretKey = key[:]
	mc.GossipVerifyIncoming = true
	mc.GossipVerifyOutgoing = true
	// Dead in about 3-5 s (probe, then suspicion of 3-6 s shortened by
	// other members' confirmations); issue 2 allows 10 s to a new epoch.
	mc.ProbeInterval = 750 * time.Millisecond
	mc.ProbeTimeout = 500 * time.Millisecond
	mc.SuspicionMult = 4
	mc.SuspicionMaxTimeoutMult = 2
	mc.GossipInterval = 100 * time.Millisecond
	mc.PushPullInterval = 10 * time.Second
	mc.TCPTimeout = 2 * time.Second
	mc.DeadNodeReclaimTime = time.Second
	mc.Delegate = &gossipDelegate{c: c}
	mc.Events = &gossipEvents{c: c}
	mc.Logger = newGossipLogger(c.logger)
	ml, err := memberlist.Create(mc)
	if err != nil {
		return fmt.Errorf("cluster: start gossip on %s:%d: %w", c.cfg.BindIP, c.cfg.GossipPort, err)
	}
	c.gossip = ml
	return nil
}

// firstJoin joins gossip through the given members, retrying until
// JoinTimeout. A node that has never been part of the cluster cannot do
// anything useful alone, so failure here is fatal and must say why.
func (c *Cluster) firstJoin(ctx context.Context, seeds []string) error {
	deadline := time.Now().Add(c.cfg.JoinTimeout)
	var last error
	for {
		n, err := c.gossip.Join(seeds)
		if n > 0 {
			c.logger.Info("joined the cluster", "through", seeds)
			return nil
		}
		last = explainJoinFailure(seeds, err)
		if time.Now().After(deadline) {
			return last
		}
		c.logger.Warn("cluster: join failed, retrying", "err", last)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

func explainJoinFailure(seeds []string, err error) error {
	for _, s := range seeds {
		conn, dialErr := net.DialTimeout("tcp", s, 2*time.Second)
		if dialErr != nil {
			return fmt.Errorf("cluster: cannot join through %s: nothing answers there (%v); is a herd node running at that address and gossip port?", s, dialErr)
		}
		conn.Close()
	}
	return fmt.Errorf("cluster: cannot join through %v: no herd node answered with this cluster's token; check the address (IP[:gossip port, default 7001]) and that --token/HERD_TOKEN is the one in the first node's DATA/cluster.token (%v)", seeds, err)
}

// Close leaves gossip and stops raft. The rest of the cluster sees this
// node as gone and commits a new epoch.
func (c *Cluster) Close() error {
	c.closeOnce.Do(func() {
		close(c.stop)
		if c.raft != nil && c.raft.State() == raft.Leader && c.raft.LeadershipTransfer().Error() == nil {
			c.logger.Info("handed raft leadership over before stopping")
		}
		if c.gossip != nil {
			c.gossip.Leave(time.Second)
			c.gossip.Shutdown()
		}
		c.forward.close()
		c.cfg.Peer.Protocol(peer.ProtocolForward).Close()
		c.wg.Wait()
		if c.raft != nil {
			c.shutdownErr = c.raft.Shutdown().Error()
		}
		if c.transport != nil {
			c.transport.Close()
		}
		if c.store != nil {
			c.store.Close()
		}
	})
	return c.shutdownErr
}

func (c *Cluster) poke() {
	select {
	case c.nudge <- struct{}{}:
	default:
	}
}

// streamLayer carries raft over the authenticated peer port.
type streamLayer struct {
	sub       *peer.SubListener
	key       []byte
	advertise string
}

func (s *streamLayer) Accept() (net.Conn, error) { return s.sub.Accept() }
func (s *streamLayer) Close() error              { return s.sub.Close() }
func (s *streamLayer) Addr() net.Addr            { return advertisedAddr(s.advertise) }
func (s *streamLayer) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return peer.Dial(ctx, string(address), s.key, peer.ProtocolRaft)
}

type advertisedAddr string

func (a advertisedAddr) Network() string { return "tcp" }
func (a advertisedAddr) String() string  { return string(a) }

// ---- gossip delegates ----

type gossipDelegate struct{ c *Cluster }

func (d *gossipDelegate) NodeMeta(limit int) []byte {
	cfg := d.c.cfg
	meta, _ := json.Marshal(nodeMeta{Address: cfg.BindIP, Peer: cfg.PeerAddr, Admin: cfg.AdminAddr, NBD: cfg.NBDAddr, Zone: cfg.Zone, Capacity: cfg.Capacity, Incarnation: cfg.Incarnation})
	if len(meta) > limit {
		panic("cluster: node metadata exceeds gossip limit") // zone length is validated at start
	}
	return meta
}
func (d *gossipDelegate) NotifyMsg([]byte)                           {}
func (d *gossipDelegate) GetBroadcasts(overhead, limit int) [][]byte { return nil }
func (d *gossipDelegate) LocalState(join bool) []byte                { return nil }
func (d *gossipDelegate) MergeRemoteState(buf []byte, join bool)     {}

type gossipEvents struct{ c *Cluster }

func (e *gossipEvents) NotifyJoin(n *memberlist.Node)   { e.c.observe(n.Name, true) }
func (e *gossipEvents) NotifyLeave(n *memberlist.Node)  { e.c.observe(n.Name, false) }
func (e *gossipEvents) NotifyUpdate(n *memberlist.Node) { e.c.observe(n.Name, true) }

func (c *Cluster) observe(id string, alive bool) {
	c.mu.Lock()
	c.seen[id] = gossipState{alive: alive, since: time.Now()}
	c.mu.Unlock()
	c.poke()
}

// ---- leader reconciliation: gossip -> log, log -> raft configuration ----

func (c *Cluster) reconcileLoop() {
	defer c.wg.Done()
	ticker := time.NewTicker(reconcileInterval)
	defer ticker.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-ticker.C:
		case <-c.nudge:
		}
		if c.raft.State() != raft.Leader {
			continue
		}
		if err := c.reconcile(); err != nil && !errors.Is(err, ErrNoQuorum) {
			c.logger.Warn("cluster: reconcile", "err", err)
		}
	}
}

// gossipMembers returns the nodes gossip currently considers alive, with
// their metadata.
func (c *Cluster) gossipMembers() map[string]Node {
	out := map[string]Node{}
	for _, m := range c.gossip.Members() {
		var meta nodeMeta
		if err := json.Unmarshal(m.Meta, &meta); err != nil {
			continue
		}
		out[m.Name] = Node{
			ID: m.Name, Address: meta.Address, PeerAddr: meta.Peer,
			GossipAddr: net.JoinHostPort(m.Addr.String(), strconv.Itoa(int(m.Port))),
			AdminAddr:  meta.Admin, NBDAddr: meta.NBD, Zone: meta.Zone, Capacity: meta.Capacity, Incarnation: meta.Incarnation,
		}
	}
	return out
}

// confirmedDead says whether the log may record id as gone: gossip
// declared it dead, or it has never shown up since this process started
// and the grace period (for whole-cluster restarts) has passed.
func (c *Cluster) confirmedDead(id string) bool {
	c.mu.Lock()
	s, ok := c.seen[id]
	c.mu.Unlock()
	if ok {
		return !s.alive
	}
	return time.Since(c.started) > unseenGrace
}

func (c *Cluster) reconcile() error {
	ctx, cancel := context.WithTimeout(context.Background(), applyTimeout)
	defer cancel()
	members := c.gossipMembers()
	var logged map[string]Node
	c.fsm.View(func(s *State) {
		logged = make(map[string]Node, len(s.Nodes))
		for id, n := range s.Nodes {
			logged[id] = *n
		}
	})
	// Gossip -> log. Sorted so that epochs are committed in a stable order.
	ids := make([]string, 0, len(members))
	for id := range members {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		m := members[id]
		l, ok := logged[id]
		if ok && l.State == NodeAlive && sameNode(l, m) {
			continue
		}
		if _, err := c.propose(ctx, commandNodeJoin, nodeJoinCommand{Node: m, Time: time.Now().UTC()}); err != nil {
			return fmt.Errorf("commit join of %s: %w", id, err)
		}
		c.logger.Info("node joined", "node", id, "address", m.Address, "epoch", c.Epoch())
	}
	for id, l := range logged {
		if _, alive := members[id]; alive || l.State != NodeAlive || id == c.cfg.NodeID || !c.confirmedDead(id) {
			continue
		}
		if _, err := c.propose(ctx, commandNodeLeave, nodeLeaveCommand{ID: id, Reason: "failure detected by gossip", Time: time.Now().UTC()}); err != nil {
			return fmt.Errorf("commit leave of %s: %w", id, err)
		}
		c.logger.Info("node left", "node", id, "address", l.Address, "epoch", c.Epoch())
	}
	return c.reconcileVoters(members)
}

func sameNode(a, b Node) bool {
	return a.Address == b.Address && a.PeerAddr == b.PeerAddr && a.GossipAddr == b.GossipAddr && a.AdminAddr == b.AdminAddr &&
		a.NBDAddr == b.NBDAddr && a.Zone == b.Zone && a.Capacity == b.Capacity && a.Incarnation == b.Incarnation
}

// targetVoters is the voter count for n healthy nodes: odd, at most 5.
func targetVoters(n int) int {
	switch {
	case n >= 5:
		return 5
	case n >= 3:
		return 3
	default:
		return 1
	}
}

// reconcileVoters makes at most one raft configuration change per call:
// raft applies configuration changes one at a time anyway, and the next
// tick continues.
func (c *Cluster) reconcileVoters(members map[string]Node) error {
	future := c.raft.GetConfiguration()
	if err := future.Error(); err != nil {
		return err
	}
	servers := future.Configuration().Servers
	var nodes map[string]Node
	c.fsm.View(func(s *State) {
		nodes = make(map[string]Node, len(s.Nodes))
		for id, n := range s.Nodes {
			nodes[id] = *n
		}
	})
	healthy := func(id string) bool {
		n, ok := nodes[id]
		_, inGossip := members[id]
		return ok && n.State == NodeAlive && inGossip
	}
	inConfig := map[string]raft.Server{}
	for _, s := range servers {
		inConfig[string(s.ID)] = s
	}
	// Dead servers out first, so quorum math only counts the living.
	for _, s := range servers {
		id := string(s.ID)
		if n, ok := nodes[id]; ok && n.State == NodeDead && id != c.cfg.NodeID {
			c.logger.Info("removing dead node from raft", "node", id, "suffrage", s.Suffrage.String())
			return c.raft.RemoveServer(s.ID, 0, applyTimeout).Error()
		}
	}
	// Healthy nodes not in the configuration join as non-voters, and
	// servers whose address changed are re-added.
	healthyIDs := []string{}
	for id := range nodes {
		if healthy(id) {
			healthyIDs = append(healthyIDs, id)
		}
	}
	sort.Strings(healthyIDs)
	for _, id := range healthyIDs {
		s, ok := inConfig[id]
		address := raft.ServerAddress(nodes[id].PeerAddr)
		switch {
		case !ok:
			return c.raft.AddNonvoter(raft.ServerID(id), address, 0, applyTimeout).Error()
		case s.Address != address && s.Suffrage == raft.Voter:
			return c.raft.AddVoter(raft.ServerID(id), address, 0, applyTimeout).Error()
		case s.Address != address:
			return c.raft.AddNonvoter(raft.ServerID(id), address, 0, applyTimeout).Error()
		}
	}
	voters, candidates := []string{}, []string{}
	for _, id := range healthyIDs {
		if inConfig[id].Suffrage == raft.Voter {
			voters = append(voters, id)
		} else {
			candidates = append(candidates, id)
		}
	}
	target := targetVoters(len(healthyIDs))
	zoneOf := func(id string) string { return nodes[id].Zone }
	switch {
	case len(voters) < target && len(candidates) > 0:
		id := pickByZone(candidates, voters, zoneOf, false)
		c.logger.Info("promoting node to voter", "node", id, "voters", len(voters)+1, "healthy", len(healthyIDs))
		return c.raft.AddVoter(raft.ServerID(id), inConfig[id].Address, 0, applyTimeout).Error()
	case len(voters) > target:
		var others []string
		for _, v := range voters {
			if v != c.cfg.NodeID {
				others = append(others, v)
			}
		}
		id := pickByZone(others, voters, zoneOf, true)
		c.logger.Info("demoting voter", "node", id, "voters", len(voters)-1, "healthy", len(healthyIDs))
		return c.raft.DemoteVoter(raft.ServerID(id), 0, applyTimeout).Error()
	}
	return nil
}

// pickByZone chooses from candidates the node whose zone has the fewest
// (or, with most, the most) members among voters; ties go to the smallest
// id so every leader decides alike.
func pickByZone(candidates, voters []string, zoneOf func(string) string, most bool) string {
	count := map[string]int{}
	for _, v := range voters {
		count[zoneOf(v)]++
	}
	best := ""
	for _, id := range candidates {
		if best == "" {
			best = id
			continue
		}
		a, b := count[zoneOf(id)], count[zoneOf(best)]
		if (!most && a < b) || (most && a > b) || (a == b && id < best) {
			best = id
		}
	}
	return best
}

// rejoinLoop keeps gossip connected to every node the log knows: after a
// partition heals or nodes restart, memberlist alone does not look for
// members it already declared dead.
func (c *Cluster) rejoinLoop() {
	defer c.wg.Done()
	ticker := time.NewTicker(rejoinInterval)
	defer ticker.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-ticker.C:
		}
		members := c.gossipMembers()
		var targets []string
		c.fsm.View(func(s *State) {
			for id, n := range s.Nodes {
				if _, ok := members[id]; !ok && n.GossipAddr != "" {
					targets = append(targets, n.GossipAddr)
				}
			}
		})
		if len(members) <= 1 {
			targets = append(targets, c.cfg.Join...)
			targets = append(targets, c.loadPeers()...)
		}
		for _, t := range dedupe(targets) {
			go func(address string) {
				if _, err := c.gossip.Join([]string{address}); err == nil {
					c.logger.Debug("gossip: reconnected", "to", address)
				}
			}(t)
		}
	}
}

func dedupe(in []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, s := range in {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}

// peersLoop persists the gossip addresses of every known node, so a node
// restarted after the whole cluster stopped can find the others before its
// log has been replayed.
func (c *Cluster) peersLoop() {
	defer c.wg.Done()
	for {
		select {
		case <-c.stop:
			return
		case <-c.peersDirty:
		}
		var addrs []string
		c.fsm.View(func(s *State) {
			for id, n := range s.Nodes {
				if id != c.cfg.NodeID && n.GossipAddr != "" {
					addrs = append(addrs, n.GossipAddr)
				}
			}
		})
		sort.Strings(addrs)
		data, _ := json.Marshal(addrs)
		path := filepath.Join(c.cfg.DataDir, "peers.json")
		if err := os.WriteFile(path+".tmp", data, 0o600); err == nil {
			os.Rename(path+".tmp", path)
		}
	}
}

func (c *Cluster) loadPeers() []string {
	data, err := os.ReadFile(filepath.Join(c.cfg.DataDir, "peers.json"))
	if err != nil {
		return nil
	}
	var addrs []string
	json.Unmarshal(data, &addrs)
	return addrs
}
