package cluster

// The real runtime in the simulator (internal/sim, -sim.raft): a Cluster
// whose raft, gossip and forwarding travel over the simulator's network
// instead of the peer port and memberlist's sockets, with in-memory raft
// stores, inside a testing/synctest bubble. Everything else is the node's
// own code: hashicorp/raft with herd's configuration (raftConfig), the
// FSM, memberlist with herd's configuration (startGossipOver), the
// reconcile loop with the voter management (reconcile.go, voters.go),
// leases (lease.go), the rejoin loop, Depart and Close's order.
//
// Left out: the peer port itself (TLS, the forwarding connection; the
// simulator carries each forwarded request instead: forwarder.sim), the
// peers file, gossip key rotation and CA rotation (no credentials), and
// raft-boltdb (raft's in-memory stores, kept across a simulated kill as
// a disk would be).

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/hashicorp/raft"
	"github.com/herd-storage/herd/internal/cluster/statemachine"
	"github.com/herd-storage/herd/internal/logging"
)

// Ports of a simulated node at its address.
const (
	SimRaftPort   = 7000
	SimGossipPort = 7001
)

// SimRaftTransport is what a simulated node's raft needs of the
// simulator's network.
type SimRaftTransport interface {
	raft.Transport
	raft.WithPreVote
	raft.WithClose
}

// SimStores are a simulated node's raft log, stable store and snapshots:
// its disk, which outlives its processes.
type SimStores struct {
	log       *raft.InmemStore
	snapshots *raft.InmemSnapshotStore
}

// NewSimStores returns an empty disk.
func NewSimStores() *SimStores {
	return &SimStores{log: raft.NewInmemStore(), snapshots: raft.NewInmemSnapshotStore()}
}

// SimConfig describes one process of a simulated node.
type SimConfig struct {
	NodeID      string
	Incarnation string
	Zone        string
	// Address is the node's IP: raft at Address:SimRaftPort, gossip at
	// Address:SimGossipPort.
	Address string
	Raft    SimRaftTransport
	Stores  *SimStores
	Gossip  memberlist.Transport
	// Forward carries a forwarded request (a command, a lease or barrier
	// request) to the leader at raft address address and returns its
	// answer: the simulator calls the leader's ProposeForwarded.
	Forward func(ctx context.Context, address string, command []byte) (json.RawMessage, uint64, error)
	// Join are gossip addresses of members; none for the first node of
	// the cluster, which bootstraps raft.
	Join   []string
	Logger *slog.Logger
}

// UseSimClock makes leases read time.Now instead of CLOCK_BOOTTIME and
// the monotonic clock, for the simulator, whose fake clock is time.Now's
// inside its bubbles. It cannot be undone: call it only in the
// simulator's test process.
func UseSimClock() { simClock.Store(true) }

// StartSim starts a simulated node's process: raft over cfg.Raft on its
// stores (bootstrapped alone when cfg.Join is empty and the stores are
// new), gossip over cfg.Gossip, joined through cfg.Join, and the loops of
// a node: reconcile (as leader), leases, rejoin. Stop it with Close (a
// clean stop, SIGTERM) or Kill (kill -9).
func StartSim(cfg SimConfig) (*Cluster, error) {
	if !simClock.Load() {
		return nil, fmt.Errorf("cluster: StartSim without UseSimClock")
	}
	address := net.JoinHostPort(cfg.Address, fmt.Sprint(SimRaftPort))
	fsm := newFSM()
	c := &Cluster{
		cfg: Config{
			NodeID: cfg.NodeID, Incarnation: cfg.Incarnation, BindIP: cfg.Address, PeerAddr: address, GossipPort: SimGossipPort,
			AdminAddr: net.JoinHostPort(cfg.Address, "7080"), NBDAddr: net.JoinHostPort(cfg.Address, "10809"), Zone: cfg.Zone,
			Capacity: 1 << 40, Join: cfg.Join, DataDir: "/nonexistent/herd-sim/" + cfg.NodeID, Logger: cfg.Logger,
		},
		logger:     cfg.Logger,
		fsm:        fsm,
		applied:    statemachine.NewReads(fsm.FSM),
		started:    time.Now(),
		nudge:      make(chan struct{}, 1),
		peersDirty: make(chan struct{}, 1),
		halted:     make(chan error, 1),
		stop:       make(chan struct{}),
		seen:       map[string]gossipState{},
		addresses:  map[string]gossipAddress{},
		refused:    map[string]bool{},
		vetoed:     map[string]time.Time{},
		forward:    &forwarder{sim: cfg.Forward},
		lease:      newNodeLease(),
	}
	c.fsm.OnHalt = func(err error) {
		select {
		case c.halted <- err:
		default:
		}
	}
	c.fsm.OnNodeChange = c.poke
	rc := raftConfig(cfg.NodeID, logging.Hclog(cfg.Logger, "raft"))
	existing, err := raft.HasExistingState(cfg.Stores.log, cfg.Stores.log, cfg.Stores.snapshots)
	if err != nil {
		return nil, err
	}
	c.contact = newContactTransport(cfg.Raft)
	r, err := raft.NewRaft(rc, c.fsm, cfg.Stores.log, cfg.Stores.log, cfg.Stores.snapshots, c.contact)
	if err != nil {
		return nil, fmt.Errorf("cluster: start raft: %w", err)
	}
	c.raft = r
	if !existing && len(cfg.Join) == 0 {
		boot := raft.Configuration{Servers: []raft.Server{{ID: rc.LocalID, Address: raft.ServerAddress(address), Suffrage: raft.Voter}}}
		if err := r.BootstrapCluster(boot).Error(); err != nil {
			r.Shutdown()
			return nil, fmt.Errorf("cluster: bootstrap: %w", err)
		}
	}
	if err := c.startGossipOver(cfg.Gossip); err != nil {
		r.Shutdown()
		return nil, err
	}
	if len(cfg.Join) > 0 {
		c.gossip.Join(cfg.Join) // the rejoin loop tries again while it is alone
	}
	c.wg.Add(3)
	go c.leaseLoop()
	go c.reconcileLoop()
	go c.rejoinLoop()
	return c, nil
}

// Kill ends the process as kill -9 does: no departure, no gossip leave,
// raft stops where it is. The simulator cuts the process off its network
// first. It returns once every goroutine of the node has ended.
func (c *Cluster) Kill() {
	c.closeOnce.Do(func() {
		close(c.stop)
		if c.gossip != nil {
			c.gossip.Shutdown()
		}
		c.wg.Wait()
		if c.raft != nil {
			c.raft.Shutdown().Error()
		}
	})
}

// EpochChanged returns a channel closed when this node next applies a
// new epoch.
func (c *Cluster) EpochChanged() <-chan struct{} {
	return c.fsm.EpochChanged()
}

// CurrentEpoch is the newest epoch this node applied, with its nodes
// (zero before the first).
func (c *Cluster) CurrentEpoch() Epoch {
	var e Epoch
	c.fsm.View(func(s *State) {
		if n := len(s.Epochs); n > 0 {
			e = s.Epochs[n-1]
			e.Nodes = append([]string(nil), e.Nodes...)
			e.Members = nil
		}
	})
	return e
}

// RaftState is this node's raft role ("Leader", "Follower", ...).
func (c *Cluster) RaftState() string { return c.raft.State().String() }

// RaftVoters are the voters of this node's latest raft configuration.
func (c *Cluster) RaftVoters() []string {
	future := c.raft.GetConfiguration()
	if future.Error() != nil {
		return nil
	}
	var out []string
	for _, s := range future.Configuration().Servers {
		if s.Suffrage == raft.Voter {
			out = append(out, string(s.ID))
		}
	}
	return out
}
