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
//
// The state machine itself (state, commands, apply, snapshots) is
// internal/cluster/statemachine, which imports no raft, gossip or network
// package; this package is its runtime, and proposes every command through
// statemachine.Commands (Cluster.Propose). names.go aliases the state
// machine's names (cluster.VDI, cluster.ErrNotFound, ...).
package cluster

import (
	"context"
	"crypto/x509"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	"github.com/herd-storage/herd/internal/cluster/statemachine"
	"github.com/herd-storage/herd/internal/peer"
)

// Timing. Failure detection must commit a new epoch within 10 s of a node's
// death; these leave ample margin on a loaded machine.
const (
	applyTimeout         = 5 * time.Second
	leaderLeaseTimeout   = time.Second     // raft's: a leader that reached no majority of voters this long steps down
	quorumContactTimeout = 3 * time.Second // a follower without leader contact this long has no quorum
	reconcileInterval    = 300 * time.Millisecond
	rejoinInterval       = 2 * time.Second
	unseenGrace          = 20 * time.Second // after start, how long a node may be unknown to gossip before it counts as dead
	gossipDeathVeto      = 2 * time.Second  // how long the leader's raft contact with a node outweighs gossip's "dead" (reconcile.go)
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
	GossipKey   []byte // 32 bytes: memberlist's AES key (gossip.go), unless GossipKeys is set; the peer port uses PeerCredentials
	// GossipKeys is the node's gossip keyring, which rotations change
	// (gossipkeys.go); nil: GossipKey alone, never rotated.
	GossipKeys  *GossipKeys
	Join        []string // gossip addresses of members to join through
	JoinTimeout time.Duration
	InsecureNBD bool // reported by Info (--insecure-nbd)
	Logger      *slog.Logger
	Peer        *peer.Listener
	// PeerCredentials are the node's certificate and the cluster CA: the
	// raft transport and forwarding dial the other nodes with them.
	PeerCredentials *peer.Credentials
	// ObserveApply, if set, is told how long each entry this node
	// proposed took to be applied here (metrics).
	ObserveApply func(time.Duration)
	// DownOutInterval is how long this node, stopped cleanly, stays down
	// but not out: the maintenance window it opens for itself as it
	// departs (depart.go). 0: none, its objects are recovered elsewhere
	// at once.
	DownOutInterval time.Duration
	// Build is what this node reports about its binary in gossip
	// (features.go); Build.Level 0 means SupportedLevel.
	Build Build
	// CurrentCA, if set, returns the CA this node trusts as the
	// cluster's (cluster info; carotation.go).
	CurrentCA func() *x509.Certificate
}

// Cluster is the local node's view of and handle on the cluster.
type Cluster struct {
	cfg       Config
	logger    *slog.Logger
	fsm       *FSM // the state machine, as raft applies the log to it
	applied        // the state this node applied: reads (statemachine.Reads)
	raft      *raft.Raft
	transport *raft.NetworkTransport
	contact   *contactTransport // transport wraps it: when the leader last reached each server
	store     *raftboltdb.BoltStore
	gossip    *memberlist.Memberlist
	forward   *forwarder
	started   time.Time
	lease     *nodeLease  // this node's lease to serve data (lease.go)
	grants    leaseGrants // as leader: the leases granted in this term

	nudge       chan struct{} // wakes the reconcile loop
	peersDirty  chan struct{} // node table changed: persist peers file
	halted      chan error    // the FSM stopped applying the log (Halted)
	stop        chan struct{}
	wg          sync.WaitGroup
	mu          sync.Mutex // guards seen, addresses, refused, vetoed and held
	seen        map[string]gossipState
	addresses   map[string]gossipAddress // gossip's view of each member (gossip.go)
	refused     map[string]bool          // gossip members not committed: their metadata is too long (reconcile)
	vetoed      map[string]time.Time     // gossip reports them dead (since), but the leader's raft still reaches them (reconcile)
	held        string                   // the voter changes last held back, logged when it changes (voters.go)
	shutdownErr error
	closeOnce   sync.Once
	stopping    atomic.Bool // Depart announced this node's stop (gossip metadata)
	departOnce  sync.Once
}

// cmds builds the commands this node proposes (through Propose).
func (c *Cluster) cmds() *statemachine.Commands {
	return statemachine.NewCommands(c, c.fsm.FSM, c.cfg.NodeID, c.cfg.Incarnation)
}

// Halted reports, once, that this node stopped applying the log because
// it holds a command this binary does not know: the node must stop (and
// be upgraded) rather than serve a state that differs from the others'.
func (c *Cluster) Halted() <-chan error { return c.halted }

// Start opens the local raft state, joins gossip and returns once the node
// is part of the cluster's gossip (or is its first node).
func Start(ctx context.Context, cfg Config) (*Cluster, error) {
	fsm := newFSM()
	c := &Cluster{
		cfg:        cfg,
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
		forward:    &forwarder{creds: cfg.PeerCredentials},
		lease:      newNodeLease(),
	}
	c.fsm.OnHalt = func(err error) {
		c.logger.Error("cluster: stopping: the log holds a command this binary cannot apply", "err", err)
		select {
		case c.halted <- err:
		default:
		}
	}
	c.fsm.OnNodeChange = func() {
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
	if cfg.GossipKeys != nil {
		// A node that was down while the gossip key was rotated needs
		// the new key before gossip lets it in: ask a member over mTLS.
		refresh, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := c.RefreshGossipKeys(refresh)
		cancel()
		if errors.Is(err, ErrTrustLost) {
			c.Close()
			return nil, c.trustLost(err)
		}
		if err != nil {
			c.logger.Info("gossip: no member gave its gossip keys at start; using this node's", "err", err)
		}
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
	c.wg.Add(6)
	go c.gossipKeyLoop()
	go c.serveForward(cfg.Peer.Protocol(peer.ProtocolForward))
	go c.leaseLoop()
	go c.reconcileLoop()
	go c.rejoinLoop()
	go c.peersLoop()
	return c, nil
}

// Close departs (Depart: the node announces its stop, hands leadership
// and its voter role over), then leaves gossip and stops raft. The rest
// of the cluster sees this node as gone and commits a new epoch. The
// order matters: gossip's leave before raft's hand-over let the leader
// count this node out while its raft still answered (voters.go).
func (c *Cluster) Close() error {
	c.closeOnce.Do(func() {
		c.Depart()
		close(c.stop)
		if c.gossip != nil {
			c.gossip.Leave(time.Second)
			c.gossip.Shutdown()
		}
		if c.forward != nil {
			c.forward.close()
		}
		if c.cfg.Peer != nil { // nil in tests over raft's in-memory transport
			c.cfg.Peer.Protocol(peer.ProtocolForward).Close()
		}
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
