package cluster

// The leader's own view of which servers it reaches: the time of the last
// answered AppendEntries (heartbeat or replication) to each server. It is
// the measure raft itself uses for the leader's lease, which hashicorp/raft
// does not export, so the transport records it on the way through.

import (
	"sync"
	"time"

	"github.com/hashicorp/raft"
)

// raftTransport is what raft needs of a transport herd gives it: the
// network transport in a node, the in-memory one in tests.
type raftTransport interface {
	raft.Transport
	raft.WithPreVote
	raft.WithClose
}

// contactTransport passes every call to the transport it wraps and
// records, per server, when an AppendEntries to it was last answered.
type contactTransport struct {
	raftTransport
	mu   sync.Mutex
	last map[raft.ServerID]time.Time
	now  func() time.Time
}

func newContactTransport(t raftTransport) *contactTransport {
	return &contactTransport{raftTransport: t, last: map[raft.ServerID]time.Time{}, now: time.Now}
}

// AppendEntries is raft's heartbeat (every HeartbeatTimeout/10 to every
// server in the configuration, voter or not) and its replication: an
// answer, whatever it says, is contact.
func (t *contactTransport) AppendEntries(id raft.ServerID, target raft.ServerAddress, args *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse) error {
	err := t.raftTransport.AppendEntries(id, target, args, resp)
	if err == nil {
		t.mu.Lock()
		t.last[id] = t.now()
		t.mu.Unlock()
	}
	return err
}

// reached says whether an AppendEntries to id was answered within the
// last `within`. Only a leader sends AppendEntries, so on any other node,
// and for a server the leader has not sent to yet, it is false.
func (t *contactTransport) reached(id string, within time.Duration) bool {
	t.mu.Lock()
	last, ok := t.last[raft.ServerID(id)]
	t.mu.Unlock()
	return ok && t.now().Sub(last) <= within
}

// reachable says whether this node, as leader, reaches id the way its
// lease counts a voter: itself always, another server if it answered
// within the lease timeout.
func (c *Cluster) reachable(id string) bool {
	return id == c.cfg.NodeID || (c.contact != nil && c.contact.reached(id, leaderLeaseTimeout))
}
