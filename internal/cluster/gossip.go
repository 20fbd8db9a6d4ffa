package cluster

// Gossip (hashicorp/memberlist): failure detection and the members' metadata.
// Gossip only advises; the leader writes membership through the log
// (reconcile.go).

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/hashicorp/memberlist"
)

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
	// Stopping: the node is stopping cleanly (Depart). The leader moves
	// its voter role to the others before it leaves (voters.go).
	Stopping bool `json:"s,omitempty"`
	// Build: the node's version, commit, supported feature level and
	// formats (features.go); absent in nodes older than feature levels.
	Build Build `json:"b,omitzero"`
}

func (c *Cluster) startGossip() error { return c.startGossipOver(nil) }

// startGossipOver starts memberlist over transport: its own UDP and TCP
// sockets when nil, the simulator's network otherwise (sim.go).
func (c *Cluster) startGossipOver(transport memberlist.Transport) error {
	mc := memberlist.DefaultLANConfig()
	mc.Transport = transport
	mc.Name = c.cfg.NodeID
	mc.BindAddr = c.cfg.BindIP
	mc.BindPort = c.cfg.GossipPort
	mc.AdvertiseAddr = c.cfg.BindIP
	mc.AdvertisePort = c.cfg.GossipPort
	if c.cfg.GossipKeys != nil {
		mc.Keyring = c.cfg.GossipKeys.Keyring
	} else {
		mc.SecretKey = c.cfg.GossipKey
	}
	mc.GossipVerifyIncoming = true
	mc.GossipVerifyOutgoing = true
	// Dead in about 3-5 s (probe, then suspicion of 3-6 s shortened by
	// other members' confirmations); a new epoch is promised within 10 s.
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
	return fmt.Errorf("cluster: cannot join gossip through %v: no herd node answered with this cluster's gossip key (%v)", seeds, err)
}

type gossipDelegate struct{ c *Cluster }

func (d *gossipDelegate) NodeMeta(limit int) []byte {
	cfg := d.c.cfg
	build := cfg.Build
	if build.Level == 0 {
		build.Level = SupportedLevel
	}
	meta, _ := json.Marshal(nodeMeta{Address: cfg.BindIP, Peer: cfg.PeerAddr, Admin: cfg.AdminAddr, NBD: cfg.NBDAddr, Zone: cfg.Zone, Capacity: cfg.Capacity, Incarnation: cfg.Incarnation,
		Stopping: d.c.stopping.Load(), Build: build.Bounded()})
	if len(meta) > limit {
		panic("cluster: node metadata exceeds gossip limit") // zone length is validated at start
	}
	return meta
}

func (d *gossipDelegate) NotifyMsg([]byte) {}

func (d *gossipDelegate) GetBroadcasts(overhead, limit int) [][]byte { return nil }

func (d *gossipDelegate) LocalState(join bool) []byte { return nil }

func (d *gossipDelegate) MergeRemoteState(buf []byte, join bool) {}

type gossipEvents struct{ c *Cluster }

// memberlist calls these with its node lock held: the only moment a
// node's fields may be read, since it updates them in place (Members
// returns pointers to them).
func (e *gossipEvents) NotifyJoin(n *memberlist.Node) { e.c.observe(n, true) }

func (e *gossipEvents) NotifyLeave(n *memberlist.Node) { e.c.observe(n, false) }

func (e *gossipEvents) NotifyUpdate(n *memberlist.Node) { e.c.observe(n, true) }

// gossipAddress is a member's gossip address and metadata, copied when
// memberlist reports it.
type gossipAddress struct {
	address  string // host:port
	meta     []byte
	stopping bool // its metadata says it is stopping; kept once it left
}

func (c *Cluster) observe(n *memberlist.Node, alive bool) {
	address := gossipAddress{address: net.JoinHostPort(n.Addr.String(), strconv.Itoa(int(n.Port))), meta: bytes.Clone(n.Meta)}
	var meta nodeMeta
	if json.Unmarshal(n.Meta, &meta) == nil {
		address.stopping = meta.Stopping
	}
	c.mu.Lock()
	c.seen[n.Name] = gossipState{alive: alive, since: time.Now()}
	c.addresses[n.Name] = address
	c.mu.Unlock()
	c.poke()
}

// gossipMembers returns the nodes gossip currently considers alive, with
// their metadata (as last reported by memberlist's events: the nodes
// Members returns must not be read outside memberlist's lock).
func (c *Cluster) gossipMembers() map[string]Node {
	out := map[string]Node{}
	members := c.gossip.Members()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, m := range members {
		id := m.Name // set when memberlist creates the node, never changed
		a, ok := c.addresses[id]
		if !ok {
			continue // its join event has not been handled yet
		}
		var meta nodeMeta
		if err := json.Unmarshal(a.meta, &meta); err != nil {
			continue
		}
		out[id] = Node{
			ID: id, Address: meta.Address, PeerAddr: meta.Peer, GossipAddr: a.address,
			AdminAddr: meta.Admin, NBDAddr: meta.NBD, Zone: meta.Zone, Capacity: meta.Capacity, Incarnation: meta.Incarnation,
			Build: meta.Build,
		}
	}
	return out
}

// gossipStopping returns the members (and the members gone) whose last
// metadata said they are stopping.
func (c *Cluster) gossipStopping() map[string]bool {
	out := map[string]bool{}
	c.mu.Lock()
	defer c.mu.Unlock()
	for id, a := range c.addresses {
		if a.stopping {
			out[id] = true
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
