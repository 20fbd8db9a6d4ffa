package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"sort"
	"strings"
	"time"

	"github.com/hashicorp/raft"
	"github.com/herd-storage/herd/internal/cluster/statemachine"
	"github.com/herd-storage/herd/internal/logging"
)

// HasQuorum is QuorumStatus's answer without its detail: it is asked on
// every replica request, and formats nothing.
func (c *Cluster) HasQuorum() bool {
	if c.raft.State() == raft.Leader {
		return true
	}
	if _, leader := c.raft.LeaderWithID(); leader == "" {
		return false
	}
	return time.Since(c.raft.LastContact()) <= quorumContactTimeout
}

// QuorumStatus tells whether this node can currently commit to the log.
func (c *Cluster) QuorumStatus() (ok bool, detail string) {
	if c.raft.State() == raft.Leader {
		return true, "this node is the leader"
	}
	_, leader := c.raft.LeaderWithID()
	if leader == "" {
		return false, "no leader is reachable from this node"
	}
	since := time.Since(c.raft.LastContact())
	if since > quorumContactTimeout {
		return false, fmt.Sprintf("no contact with leader %s for %s", leader, since.Round(100*time.Millisecond))
	}
	return true, fmt.Sprintf("leader %s reachable", leader)
}

// Propose commits a command through the leader: locally when this node
// leads, otherwise forwarded to the leader's admin API. It returns the
// command's result as JSON, once this node has applied it too, so a client
// reads its own writes through the node it asked.
//
// Propose implements Proposer: data is an encoded command (Commands
// builds them); it also returns the entry's index.
func (c *Cluster) Propose(ctx context.Context, data []byte) (json.RawMessage, uint64, error) {
	started := time.Now()
	result, index, err := c.proposeIndex(ctx, data)
	if err == nil && c.cfg.ObserveApply != nil {
		c.cfg.ObserveApply(time.Since(started))
	}
	return result, index, err
}

// ProposeForwarded applies a command forwarded from another node and also
// returns its log index, so the forwarder can wait until it applied it.
func (c *Cluster) ProposeForwarded(ctx context.Context, data []byte) (json.RawMessage, uint64, error) {
	if c.raft.State() != raft.Leader {
		return nil, 0, fmt.Errorf("%w: this node is no longer the leader", ErrNoQuorum)
	}
	if len(data) == 1 && data[0] == barrierRequest {
		// A deposed leader that has not noticed yet must not answer: its
		// applied index may miss what its successor committed.
		applied := c.raft.AppliedIndex()
		if err := c.raft.VerifyLeader().Error(); err != nil {
			return nil, 0, fmt.Errorf("%w: %v", ErrNoQuorum, err)
		}
		return json.RawMessage("null"), applied, nil
	}
	if len(data) > 0 && data[0] == leaseRequest {
		return c.answerLease(data)
	}
	return c.proposeIndex(ctx, data)
}

// barrierRequest asks the leader for its applied index (forwarded, never
// a log entry).
const barrierRequest = 0

// Sync waits until this node has applied everything the leader had
// applied when asked: after it, a read here sees every change committed
// before Sync was called (a VDI created through another node a moment
// ago, say). Reads that miss call it before answering "not found".
func (c *Cluster) Sync(ctx context.Context) error {
	if c.raft.State() == raft.Leader {
		return nil
	}
	leaderAddr, _ := c.raft.LeaderWithID()
	if leaderAddr == "" {
		return fmt.Errorf("%w: no leader is known to this node", ErrNoQuorum)
	}
	ctx, cancel := context.WithTimeout(ctx, applyTimeout)
	defer cancel()
	_, index, err := c.forward.send(ctx, string(leaderAddr), []byte{barrierRequest})
	if err != nil {
		return fmt.Errorf("%w: leader at %s unreachable: %v", ErrNoQuorum, leaderAddr, err)
	}
	return c.fsm.WaitApplied(ctx, index)
}

// CatchUp is Sync, retried while this node knows no leader (it just
// started, or an election is under way), until ctx ends.
func (c *Cluster) CatchUp(ctx context.Context) error {
	for {
		err := c.Sync(ctx)
		if err == nil || !errors.Is(err, ErrNoQuorum) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// freshReadTimeout bounds the wait of SyncForRead: a node without a
// reachable leader still answers reads from its own copy, soon.
const freshReadTimeout = 2 * time.Second

// SyncForRead is Sync for an admin read: it waits at most freshReadTimeout
// and reports no error, so that a read after it sees a change made through
// another node a moment before (vdi set there, vdi info here) when the
// leader answers, and this node's own copy when it does not. Without
// quorum it does not wait at all: a dashboard polling a node cut off from
// the leader gets that node's copy at once.
func (c *Cluster) SyncForRead(ctx context.Context) {
	if !c.HasQuorum() {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, freshReadTimeout)
	defer cancel()
	c.Sync(ctx)
}

// LookupVDI is VDI after making sure a miss is not just this node lagging
// behind the leader. A miss the leader cannot confirm (none is known, it
// does not answer, ctx ends first) is not ErrNotFound but the reason,
// ErrNoQuorum mostly: the VDI may have been created through another node
// a moment ago, and only the log can tell.
func (c *Cluster) LookupVDI(ctx context.Context, name string) (VDI, error) {
	v, err := c.VDI(name)
	if !errors.Is(err, ErrNotFound) {
		return v, err
	}
	if err := c.Sync(ctx); err != nil {
		return VDI{}, fmt.Errorf("vdi %q is not in this node's copy of the log, and the leader's cannot be asked: %w", name, err)
	}
	return c.VDI(name)
}

func (c *Cluster) proposeIndex(ctx context.Context, data []byte) (json.RawMessage, uint64, error) {
	if !statemachine.Known(data) {
		return nil, 0, fmt.Errorf("%w: unknown command", ErrInvalid)
	}
	if ok, detail := c.QuorumStatus(); !ok {
		return nil, 0, fmt.Errorf("%w: %s", ErrNoQuorum, detail)
	}
	if c.raft.State() != raft.Leader {
		leaderAddr, _ := c.raft.LeaderWithID()
		if leaderAddr == "" {
			return nil, 0, fmt.Errorf("%w: no leader is known to this node", ErrNoQuorum)
		}
		ctx, cancel := context.WithTimeout(ctx, applyTimeout)
		defer cancel()
		result, index, err := c.forward.send(ctx, string(leaderAddr), data)
		if err != nil {
			var remote *RemoteError
			if errors.As(err, &remote) {
				return nil, 0, err
			}
			return nil, 0, fmt.Errorf("%w: leader at %s unreachable: %v", ErrNoQuorum, leaderAddr, err)
		}
		if err := c.fsm.WaitApplied(ctx, index); err != nil {
			// Committed on the leader; this node is just behind.
			c.logger.Warn("cluster: committed entry not yet applied locally", "index", index)
		}
		return result, index, nil
	}
	release, err := c.awaitDrop(ctx, data)
	if err != nil {
		return nil, 0, err
	}
	defer release()
	timeout := applyTimeout
	if deadline, ok := ctx.Deadline(); ok {
		timeout = time.Until(deadline)
	}
	future := c.raft.Apply(data, timeout)
	if err := future.Error(); err != nil {
		switch {
		case errors.Is(err, raft.ErrNotLeader), errors.Is(err, raft.ErrLeadershipLost), errors.Is(err, raft.ErrEnqueueTimeout), errors.Is(err, raft.ErrRaftShutdown):
			return nil, 0, fmt.Errorf("%w: %v (the change may or may not have been committed)", ErrNoQuorum, err)
		}
		return nil, 0, err
	}
	res, _ := future.Response().(*statemachine.Result)
	if res == nil {
		return nil, 0, fmt.Errorf("cluster: log entry produced no result")
	}
	if res.Err != nil {
		return nil, 0, res.Err
	}
	value, err := json.Marshal(res.Value)
	return value, future.Index(), err
}

// ---- operations for the admin API ----

// Format fixes the cluster's copies and object size, once.
func (c *Cluster) Format(ctx context.Context, copies int, objectSize uint64) (Format, error) {
	return c.cmds().Format(ctx, copies, objectSize)
}

// CreateVDI creates a VDI; the first committed create of a name wins.
func (c *Cluster) CreateVDI(ctx context.Context, name string, size uint64) (VDI, error) {
	return c.CreateVDIWith(ctx, name, size, VDISettings{}, 0, "")
}

// CreateVDIWith creates a VDI with settings: open to writer handover
// unless settings.Exclusive is true (handover.go), with copies copies (0:
// the cluster's number; another number needs FeatureVDICopies), or
// erasure-coded with scheme ("K+M"; "" for copies; needs
// FeatureErasureCoding, refused with copies).
func (c *Cluster) CreateVDIWith(ctx context.Context, name string, size uint64, settings VDISettings, copies int, scheme string) (VDI, error) {
	return c.cmds().CreateVDI(ctx, name, size, settings.Exclusive != nil && *settings.Exclusive, copies, scheme, c.Requires)
}

// SnapshotVDI freezes a VDI's content as NAME@TAG; the name continues as
// a new writable child. The gateway holding the VDI open for writing
// calls this with its writes paused (gateway.Snapshot), so the snapshot
// holds exactly the writes completed before it.
//
// holder is the node the caller saw holding the VDI's write lock ("" for
// none); the snapshot is refused if that is no longer true.
func (c *Cluster) SnapshotVDI(ctx context.Context, name, tag, holder string) (SnapshotResult, error) {
	return c.cmds().SnapshotVDI(ctx, name, tag, holder)
}

// CloneVDI creates a writable VDI sharing a snapshot's objects.
func (c *Cluster) CloneVDI(ctx context.Context, snapshot, name string) (VDI, error) {
	return c.cmds().CloneVDI(ctx, snapshot, name)
}

// RollbackVDI makes a VDI's content a snapshot's again.
func (c *Cluster) RollbackVDI(ctx context.Context, name, tag string) (VDI, error) {
	return c.cmds().RollbackVDI(ctx, name, tag)
}

// GarbageDone records that a VDI's objects were freed.
func (c *Cluster) GarbageDone(ctx context.Context, id uint32) error {
	return c.cmds().GarbageDone(ctx, id)
}

// IsLeader says whether this node leads the log now.
func (c *Cluster) IsLeader() bool { return c.raft.State() == raft.Leader }

// DeleteVDI removes a VDI (NAME) that nobody has open for writing, or a
// snapshot (NAME@TAG).
func (c *Cluster) DeleteVDI(ctx context.Context, name string) error {
	if _, err := c.LookupVDI(ctx, name); err != nil {
		return err
	}
	return c.cmds().DeleteVDI(ctx, name)
}

// SetFull marks this node full (it takes no objects) or not.
func (c *Cluster) SetFull(ctx context.Context, full bool) error {
	return c.cmds().SetFull(ctx, full)
}

// MarkVDIRepaired clears a VDI's unclean mark once its replicas were made
// identical.
func (c *Cluster) MarkVDIRepaired(ctx context.Context, name string) error {
	return c.cmds().MarkVDIRepaired(ctx, name)
}

// MarkVDIUnclean marks a VDI whose replicas may differ: its next writer
// makes them identical before serving it.
func (c *Cluster) MarkVDIUnclean(ctx context.Context, name string) error {
	return c.cmds().MarkVDIUnclean(ctx, name)
}

// ResizeVDI grows a VDI.
func (c *Cluster) ResizeVDI(ctx context.Context, name string, size uint64) (VDI, error) {
	if _, err := c.LookupVDI(ctx, name); err != nil {
		return VDI{}, err
	}
	return c.cmds().ResizeVDI(ctx, name, size)
}

// AcquireLock claims key for session on this node.
func (c *Cluster) AcquireLock(ctx context.Context, key, session string) (Lock, error) {
	var l Lock
	wait, cancel := context.WithTimeout(ctx, applyTimeout)
	err := c.WaitRegistered(wait, c.cfg.NodeID, c.cfg.Incarnation)
	cancel()
	if err != nil {
		return l, err
	}
	// A lock this node already sees held by another owner is refused
	// here: a refused open (an NBD client knocking on a VDI that a VM
	// holds, again and again) must not grow the log. Only the log
	// grants a lock.
	heldElsewhere := func() (Lock, bool) {
		held, ok := c.Lock(key)
		return held, ok && (held.Node != c.cfg.NodeID || held.Incarnation != c.cfg.Incarnation || held.Session != session)
	}
	if _, ok := heldElsewhere(); ok {
		// This node may lag behind a release the leader applied (a
		// writer that just closed): catch up first, with a read
		// barrier that adds nothing to the log.
		if err := c.Sync(ctx); err != nil {
			return l, err
		}
		if held, ok := heldElsewhere(); ok {
			return l, &LockHeldError{Lock: held}
		}
	}
	return c.cmds().AcquireLock(ctx, key, session)
}

// ReleaseLock releases key held by session on this node.
func (c *Cluster) ReleaseLock(ctx context.Context, key, session string) error {
	return c.cmds().ReleaseLock(ctx, key, session)
}

// NodeInfo is a node as `herd node list` shows it.
type NodeInfo struct {
	Node
	Role string `json:"role"` // leader, voter, nonvoter, none
	// Build: what the node reports about its binary, if gossip sees it.
	Build *BuildInfo `json:"build,omitempty"`
}

// Info is what `herd cluster info` shows.
type Info struct {
	NodeID       string   `json:"node_id"`
	Formatted    bool     `json:"formatted"`
	Format       *Format  `json:"format,omitempty"`
	Epoch        uint64   `json:"epoch"`
	Leader       string   `json:"leader"`
	LeaderAddr   string   `json:"leader_address"`
	Voters       []string `json:"voters"`
	Quorum       bool     `json:"quorum"`
	QuorumDetail string   `json:"quorum_detail"`
	NodesAlive   int      `json:"nodes_alive"`
	NodesTotal   int      `json:"nodes_total"`
	VDIs         int      `json:"vdis"`
	AppliedIndex uint64   `json:"applied_index"`
	// InsecureNBD: this node serves plaintext NBD on its TCP port.
	InsecureNBD bool `json:"insecure_nbd,omitempty"`
	// Level is the cluster's feature level; SupportedLevel this node's
	// binary's (features.go).
	Level          int `json:"feature_level"`
	SupportedLevel int `json:"supported_feature_level"`
	// GossipKey is the gossip key's id and any rotation of it under way
	// (gossipkeys.go), from LevelSecurity on.
	GossipKey *GossipKeyring `json:"gossip_key,omitempty"`
	// CA is the cluster CA: fingerprint, age, any rotation under way
	// (carotation.go).
	CA *CAInfo `json:"ca,omitempty"`
}

// Running says whether node id runs as a member, as this node sees it:
// a member of raft, or alive in gossip. An id the log only admitted (a
// join that never started a node) is neither.
func (c *Cluster) Running(id string) bool {
	if id == c.cfg.NodeID {
		return true
	}
	c.mu.Lock()
	s, seen := c.seen[id]
	c.mu.Unlock()
	if seen && s.alive {
		return true
	}
	if c.raft == nil {
		return false
	}
	future := c.raft.GetConfiguration()
	if future.Error() != nil {
		return false
	}
	for _, server := range future.Configuration().Servers {
		if string(server.ID) == id {
			return true
		}
	}
	return false
}

func (c *Cluster) roles() map[string]string {
	roles := map[string]string{}
	future := c.raft.GetConfiguration()
	if future.Error() == nil {
		for _, s := range future.Configuration().Servers {
			if s.Suffrage == raft.Voter {
				roles[string(s.ID)] = "voter"
			} else {
				roles[string(s.ID)] = "nonvoter"
			}
		}
	}
	if _, id := c.raft.LeaderWithID(); id != "" {
		roles[string(id)] = "leader"
	}
	return roles
}

// Nodes lists every node the log knows.
func (c *Cluster) Nodes() []NodeInfo {
	roles := c.roles()
	var out []NodeInfo
	builds := c.Builds()
	c.fsm.View(func(s *State) {
		for _, n := range s.Nodes {
			role := roles[n.ID]
			if role == "" {
				role = "none"
			}
			info := NodeInfo{Node: *n, Role: role}
			if b, ok := builds[n.ID]; ok {
				bi := b.Info()
				info.Build = &bi
			}
			out = append(out, info)
		}
	})
	sort.Slice(out, func(i, j int) bool {
		return out[i].Address < out[j].Address || (out[i].Address == out[j].Address && out[i].ID < out[j].ID)
	})
	return out
}

// Info summarises the cluster as this node sees it.
func (c *Cluster) Info() Info {
	info := Info{NodeID: c.cfg.NodeID}
	info.Quorum, info.QuorumDetail = c.QuorumStatus()
	_, leader := c.raft.LeaderWithID()
	info.Leader = string(leader)
	for id, role := range c.roles() {
		if role == "voter" || role == "leader" {
			info.Voters = append(info.Voters, id)
		}
	}
	sort.Strings(info.Voters)
	c.fsm.View(func(s *State) {
		if s.Format != nil {
			f := *s.Format
			info.Format, info.Formatted = &f, true
		}
		info.Epoch = s.Epoch()
		info.NodesTotal = len(s.Nodes)
		info.NodesAlive = len(s.AliveNodes())
		info.VDIs = len(s.VDIs)
		info.Level = s.Level()
		if n, ok := s.Nodes[info.Leader]; ok {
			info.LeaderAddr = n.Address
		}
	})
	if info.Level >= FeatureGossipKeyRotation.Level {
		k := c.GossipKeyState()
		if k.Primary == "" && k.Rotation == nil && c.cfg.GossipKeys != nil {
			k.Primary = c.cfg.GossipKeys.PrimaryID() // never rotated: the first key, as this node holds it
		}
		info.GossipKey = &k
	}
	if c.cfg.CurrentCA != nil {
		info.CA = c.caInfo(c.cfg.CurrentCA())
	}
	info.AppliedIndex = c.fsm.Applied()
	info.InsecureNBD = c.cfg.InsecureNBD
	info.SupportedLevel = SupportedLevel
	return info
}

// ID is this node's id.
func (c *Cluster) ID() string { return c.cfg.NodeID }

// ---- memberlist's logger, translated to slog ----

// gossipLogWriter turns memberlist's "[LEVEL] memberlist: ..." lines into
// structured logs, and says plainly when a message was refused because
// the sender lacks the cluster token. A line about a message or stream
// from an address (memberlist ends those with "from=ADDRESS": anyone who
// reaches the gossip port can make it write one per packet) is a bounded
// refusal line (internal/logging): its message is memberlist's up to the
// first detail, the whole line is its detail, cut.
type gossipLogWriter struct{ logger *slog.Logger }

func newGossipLogger(logger *slog.Logger) *log.Logger {
	return log.New(&gossipLogWriter{logger: logging.WithBounds(logger)}, "", 0)
}

func (w *gossipLogWriter) Write(p []byte) (int, error) {
	line := string(bytes.TrimSpace(p))
	level, message := logging.ParseStdLine(line)
	from, hasFrom := gossipSource(message)
	switch {
	case strings.Contains(strings.ToLower(line), "decrypt") || strings.Contains(line, "No installed keys"):
		w.logger.Warn("gossip: refused a message from a process without this cluster's token", logging.From("gossip", from), "detail", line)
	case hasFrom:
		w.logger.Log(context.Background(), level, gossipReason(message), logging.From("gossip", from), "component", "memberlist", "detail", message)
	default:
		w.logger.Log(context.Background(), level, message, "component", "memberlist")
	}
	return len(p), nil
}

// gossipSource returns the address of memberlist's "from=ADDRESS" in
// message, if there is one.
func gossipSource(message string) (string, bool) {
	i := strings.LastIndex(message, "from=")
	if i < 0 {
		return "unknown", false
	}
	from, _, _ := strings.Cut(message[i+len("from="):], " ")
	return from, true
}

// gossipReason is message up to its first detail (an error, a quoted
// label, a number in parentheses, the address): the same for every
// packet of one kind.
func gossipReason(message string) string {
	rest, prefixed := strings.CutPrefix(message, "memberlist: ")
	end := len(rest)
	for _, stop := range []string{": ", "\"", "'", "(", "from="} {
		if i := strings.Index(rest, stop); i >= 0 {
			end = min(end, i)
		}
	}
	reason := strings.TrimSpace(rest[:end])
	if reason == "" {
		reason = "refused a message"
	}
	if prefixed {
		reason = "memberlist: " + reason
	}
	return reason
}

// Incarnation identifies this process (lock owners carry it).
func (c *Cluster) Incarnation() string { return c.cfg.Incarnation }
