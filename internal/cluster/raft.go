package cluster

// Raft: the log (hashicorp/raft over the peer port's raft protocol,
// raft-boltdb for the log and stable store, file snapshots).

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"

	"github.com/herd-storage/herd/internal/logging"
	"github.com/herd-storage/herd/internal/peer"
)

func (c *Cluster) startRaft() (fresh bool, err error) {
	dir := filepath.Join(c.cfg.DataDir, "raft")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return false, err
	}
	// Raft logs into the node's slog stream (its Info as Debug).
	hlog := logging.Hclog(c.logger, "raft")
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
	stream := &streamLayer{sub: c.cfg.Peer.Protocol(peer.ProtocolRaft), creds: c.cfg.PeerCredentials, advertise: c.cfg.PeerAddr}
	c.transport = raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
		Stream: stream, MaxPool: 4, Timeout: 10 * time.Second, Logger: hlog,
	})
	rc := raftConfig(c.cfg.NodeID, hlog)
	existing, err := raft.HasExistingState(logs, store, snapshots)
	if err != nil {
		return false, err
	}
	// The leader's voter management needs to know which servers it
	// reaches (contact.go).
	c.contact = newContactTransport(c.transport)
	r, err := raft.NewRaft(rc, c.fsm, logs, store, snapshots, c.contact)
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

// raftConfig is herd's raft configuration for node id (the simulator's
// nodes use it too, sim.go).
func raftConfig(id string, hlog hclog.Logger) *raft.Config {
	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(id)
	rc.Logger = hlog
	// Slightly above raft's defaults: on a saturated host (a VM host under
	// load, a shared CI machine) contact times of 500-700 ms were seen, and
	// a 500 ms lease made the leader step down under load.
	rc.HeartbeatTimeout = 1500 * time.Millisecond
	rc.ElectionTimeout = 1500 * time.Millisecond
	rc.LeaderLeaseTimeout = leaderLeaseTimeout
	rc.CommitTimeout = 5 * time.Millisecond
	rc.BatchApplyCh = true
	rc.MaxAppendEntries = 512
	rc.SnapshotThreshold = 4096
	rc.TrailingLogs = 4096
	return rc
}

// streamLayer carries raft over the authenticated peer port.
type streamLayer struct {
	sub       *peer.SubListener
	creds     *peer.Credentials
	advertise string
}

func (s *streamLayer) Accept() (net.Conn, error) { return s.sub.Accept() }

func (s *streamLayer) Close() error { return s.sub.Close() }

func (s *streamLayer) Addr() net.Addr { return advertisedAddr(s.advertise) }

func (s *streamLayer) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return peer.Dial(ctx, string(address), s.creds, peer.ProtocolRaft)
}

type advertisedAddr string

func (a advertisedAddr) Network() string { return "tcp" }

func (a advertisedAddr) String() string { return string(a) }
