package cluster

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/herd-storage/herd/internal/logging"
)

// The node ids of the robustness run that lost its raft quorum (seed
// 1795530086916370419): node 0 led, node 2 was cut off, node 4 killed.
const (
	id0 = "521948f910d8fbc9"
	id1 = "f5df78920bcab450"
	id2 = "c61f89a89eecf7d0"
	id3 = "4d77d46875c9d5e6"
	id4 = "f048a477ee793fda"
)

// raftNode is one server of an in-memory raft cluster: the real FSM, the
// contact-recording transport over raft's in-memory transport.
type raftNode struct {
	id    string
	addr  raft.ServerAddress
	inmem *raft.InmemTransport
	trans *contactTransport
	fsm   *FSM
	raft  *raft.Raft
}

func startRaftNodes(t *testing.T, ids ...string) []*raftNode {
	t.Helper()
	var nodes []*raftNode
	for _, id := range ids {
		addr, inmem := raft.NewInmemTransport(raft.ServerAddress(id + ":7000"))
		nodes = append(nodes, &raftNode{id: id, addr: addr, inmem: inmem, trans: newContactTransport(inmem), fsm: newFSM()})
	}
	for _, a := range nodes {
		for _, b := range nodes {
			if a != b {
				a.inmem.Connect(b.addr, b.inmem)
			}
		}
	}
	for i, n := range nodes {
		rc := raft.DefaultConfig()
		rc.LocalID = raft.ServerID(n.id)
		rc.Logger = logging.Hclog(slog.New(slog.DiscardHandler), "raft")
		rc.HeartbeatTimeout = 200 * time.Millisecond
		rc.ElectionTimeout = 200 * time.Millisecond
		rc.LeaderLeaseTimeout = 200 * time.Millisecond
		rc.CommitTimeout = 5 * time.Millisecond
		store := raft.NewInmemStore()
		r, err := raft.NewRaft(rc, n.fsm, store, store, raft.NewInmemSnapshotStore(), n.trans)
		if err != nil {
			t.Fatal(err)
		}
		n.raft = r
		t.Cleanup(func() { r.Shutdown() })
		if i == 0 {
			boot := raft.Configuration{Servers: []raft.Server{{ID: rc.LocalID, Address: n.addr, Suffrage: raft.Voter}}}
			if err := r.BootstrapCluster(boot).Error(); err != nil {
				t.Fatal(err)
			}
		}
	}
	return nodes
}

// cut stops every message between n and the others (kill -9 or a
// partition, as far as raft can tell).
func cut(n *raftNode, all []*raftNode) {
	n.inmem.DisconnectAll()
	for _, o := range all {
		o.inmem.Disconnect(n.addr)
	}
}

func waitUntil(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func commit(c *Cluster, ct commandType, payload any) error {
	data, err := encodeCommand(ct, payload)
	if err != nil {
		return err
	}
	f := c.raft.Apply(data, 2*time.Second)
	if err := f.Error(); err != nil {
		return err
	}
	if res, ok := f.Response().(*applyResult); ok && res.Err != nil {
		return res.Err
	}
	return nil
}

func configVoters(t *testing.T, r *raft.Raft) []string {
	t.Helper()
	future := r.GetConfiguration()
	if err := future.Error(); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, s := range future.Configuration().Servers {
		if s.Suffrage == raft.Voter {
			out = append(out, string(s.ID))
		}
	}
	slices.Sort(out)
	return out
}

// The robustness run that never recovered (seed 1795530086916370419),
// with real raft: five voters; node 2 is cut off and node 4 killed; gossip
// declares node 2 dead while it still reports node 4 alive; then node 2's
// stale "dead" message about node 1, which never failed, commits node 1's
// leave. The old voter management demoted node 3 (its id sorts first)
// instead of the unreachable node 4, then removed node 1: voters {0, 4}
// with node 4 dead, a configuration raft can never commit in, and the
// leader stepped down for good. Now the leader must still commit.
func TestVotersKeepAMajorityThroughAFalseDeath(t *testing.T) {
	ids := []string{id0, id1, id2, id3, id4}
	nodes := startRaftNodes(t, ids...)
	leader := nodes[0]
	waitUntil(t, 5*time.Second, "node 0 to lead", func() bool { return leader.raft.State() == raft.Leader })
	c := &Cluster{
		cfg: Config{NodeID: id0}, logger: slog.New(slog.DiscardHandler), applied: applied{fsm: leader.fsm},
		raft: leader.raft, contact: leader.trans, vetoed: map[string]time.Time{},
	}
	members := map[string]Node{}
	for _, n := range nodes {
		node := Node{ID: n.id, Address: n.id, PeerAddr: string(n.addr), Incarnation: "1"}
		if err := commit(c, commandNodeJoin, nodeJoinCommand{Node: node, Time: t0}); err != nil {
			t.Fatal(err)
		}
		members[n.id] = node
	}
	// reconcile runs the leader's voter management until it has nothing
	// left to do (each call makes one change and waits for its commit).
	reconcile := func(what string) {
		t.Helper()
		last := ""
		for range 50 {
			if err := c.reconcileVoters(members); err != nil {
				t.Logf("%s: reconcileVoters: %v", what, err)
			}
			future := leader.raft.GetConfiguration()
			if err := future.Error(); err != nil {
				t.Fatal(err)
			}
			config := fmt.Sprint(future.Configuration().Servers)
			if config == last {
				return
			}
			last = config
		}
		t.Fatalf("%s: the voter management never settled", what)
	}
	waitUntil(t, 10*time.Second, "five voters", func() bool {
		reconcile("start")
		return len(configVoters(t, leader.raft)) == 5
	})

	// Node 2 cut off, node 4 killed: the leader stops reaching both.
	cut(nodes[2], nodes)
	cut(nodes[4], nodes)
	waitUntil(t, 5*time.Second, "the leader to lose contact with nodes 2 and 4", func() bool {
		return !c.reachable(id2) && !c.reachable(id4)
	})
	if err := commit(c, commandNodeLeave, nodeLeaveCommand{ID: id2, Reason: "failure detected by gossip", Time: t0}); err != nil {
		t.Fatal(err)
	}
	delete(members, id2) // node 4 is still in gossip: it has not noticed yet
	reconcile("node 2 left")
	t.Logf("voters after node 2 left: %v", configVoters(t, leader.raft))

	// Node 1's false death (its raft never stopped answering).
	if err := commit(c, commandNodeLeave, nodeLeaveCommand{ID: id1, Reason: "failure detected by gossip", Time: t0}); err != nil {
		t.Fatal(err)
	}
	delete(members, id1)
	reconcile("node 1 left")
	voters := configVoters(t, leader.raft)
	t.Logf("voters after node 1 left: %v", voters)

	// Node 1 refutes and is back in gossip: the leader commits its join.
	members[id1] = Node{ID: id1, Address: id1, PeerAddr: string(nodes[1].addr), Incarnation: "1"}
	err := commit(c, commandNodeJoin, nodeJoinCommand{Node: members[id1], Time: t0})
	if errors.Is(err, raft.ErrLeadershipLost) || errors.Is(err, raft.ErrNotLeader) {
		t.Fatalf("the leader cannot commit any more (%v): voters %v, and it reaches only %v", err, voters, reachedOf(c, ids))
	}
	if err != nil {
		t.Fatal(err)
	}
	reconcile("node 1 back")
	if got := configVoters(t, leader.raft); !slices.Contains(got, id1) || slices.Contains(got, id4) {
		t.Errorf("voters %v once node 1 is back: want node 1 in and node 4 (killed) out", got)
	}
}

func reachedOf(c *Cluster, ids []string) []string {
	var out []string
	for _, id := range ids {
		if c.reachable(id) {
			out = append(out, id)
		}
	}
	return out
}
