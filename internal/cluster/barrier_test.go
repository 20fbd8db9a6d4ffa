package cluster

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/herd-storage/herd/internal/cluster/statemachine"

	"github.com/herd-storage/herd/internal/logging"
)

// A deposed leader that has not noticed yet answers no barrier request.
// Sync (ops.go) makes a node apply up to the index the leader's barrier
// answer names. A leader cut off from the others (or paused and resumed)
// while they elect a successor and commit still believes it leads until
// its next leader lease check (LeaderLeaseTimeout, 1 s in herd), and its
// applied index misses what its successor committed: answered, a read
// after Sync could miss a change committed before it. ProposeForwarded
// confirms the leadership with VerifyLeader before it answers.
//
// Here node 0 holds on to its leadership for leaseHold without a
// majority, and nodes 1 and 2 elect a new leader a few seconds after the
// cut: the old leader is asked while it still reports itself leader.
func TestDeposedLeaderAnswersNoBarrier(t *testing.T) {
	const leaseHold = 10 * time.Second
	nodes := startBarrierRaftNodes(t, leaseHold, id0, id1, id2)
	old := nodes[0]

	// The fast nodes win the first election; leadership then goes to
	// node 0.
	var first *raftNode
	waitUntil(t, 15*time.Second, "a first leader", func() bool {
		for _, n := range nodes {
			if n.raft.State() == raft.Leader {
				first = n
				return true
			}
		}
		return false
	})
	if first != old {
		if err := first.raft.LeadershipTransferToServer(raft.ServerID(old.id), old.addr).Error(); err != nil {
			t.Fatalf("leadership transfer to node 0: %v", err)
		}
	}
	waitUntil(t, 10*time.Second, "node 0 to lead", func() bool { return old.raft.State() == raft.Leader })
	c := &Cluster{cfg: Config{NodeID: old.id}, logger: slog.New(slog.DiscardHandler), fsm: old.fsm, applied: statemachine.NewReads(old.fsm.FSM), raft: old.raft, contact: old.trans}
	if err := commitErr(commit(c).NodeJoin(context.Background(), Node{ID: id0, Address: id0, Incarnation: "1"})); err != nil {
		t.Fatal(err)
	}
	if _, index, err := c.ProposeForwarded(t.Context(), []byte{barrierRequest}); err != nil || index == 0 {
		t.Fatalf("the leader's barrier answer while it leads: index %d, %v", index, err)
	}

	// Node 0 is cut off; the others elect a leader and commit an entry.
	// Once they no longer follow its slow heartbeats, they may time out
	// sooner: an election round takes 1 to 2 s.
	cut(old, nodes)
	cutAt := time.Now()
	for _, n := range nodes[1:] {
		rc := n.raft.ReloadableConfig()
		rc.HeartbeatTimeout, rc.ElectionTimeout = time.Second, time.Second
		if err := n.raft.ReloadConfig(rc); err != nil {
			t.Fatal(err)
		}
	}
	var successor *raftNode
	waitUntil(t, leaseHold*3/4, "nodes 1 and 2 to elect a leader", func() bool {
		for _, n := range nodes[1:] {
			if n.raft.State() == raft.Leader {
				successor = n
				return true
			}
		}
		return false
	})
	s := &Cluster{raft: successor.raft, fsm: successor.fsm}
	if err := commitErr(commit(s).NodeJoin(context.Background(), Node{ID: id1, Address: id1, Incarnation: "1"})); err != nil {
		t.Fatalf("the new leader's commit: %v", err)
	}
	committed := successor.raft.CommitIndex()
	if old.raft.State() != raft.Leader {
		t.Fatalf("node 0 stepped down %v after the cut, before it was asked: the test needs a leader that has not noticed yet", time.Since(cutAt).Round(time.Millisecond))
	}
	t.Logf("node 1 or 2 leads and committed index %d %v after the cut; node 0 still reports itself leader, applied %d", committed, time.Since(cutAt).Round(time.Millisecond), old.raft.AppliedIndex())

	type answer struct {
		index uint64
		err   error
	}
	done := make(chan answer, 1)
	go func() {
		_, index, err := c.ProposeForwarded(t.Context(), []byte{barrierRequest})
		done <- answer{index, err}
	}()
	select {
	case a := <-done:
		if a.err == nil {
			t.Fatalf("the deposed leader answered a barrier request with applied index %d; its successor had committed index %d", a.index, committed)
		}
		if !errors.Is(a.err, ErrNoQuorum) {
			t.Errorf("the deposed leader's barrier answer: %v; want no quorum", a.err)
		}
		t.Logf("the deposed leader refused the barrier %v after the cut: %v", time.Since(cutAt).Round(time.Millisecond), a.err)
	case <-time.After(3 * leaseHold):
		t.Fatalf("the deposed leader's barrier request did not return %v after the cut", time.Since(cutAt).Round(time.Millisecond))
	}
}

// startBarrierRaftNodes is startRaftNodes with every node a voter from
// the start, the first node slow to notice it lost its majority (its
// LeaderLeaseTimeout is leaseHold) and the others slow enough to follow
// its heartbeats (sent every tenth of its HeartbeatTimeout, which cannot
// be below the lease timeout) but quick to elect once it is gone.
func startBarrierRaftNodes(t *testing.T, leaseHold time.Duration, ids ...string) []*raftNode {
	t.Helper()
	var nodes []*raftNode
	var servers []raft.Server
	for _, id := range ids {
		addr, inmem := raft.NewInmemTransport(raft.ServerAddress(id + ":7000"))
		nodes = append(nodes, &raftNode{id: id, addr: addr, inmem: inmem, trans: newContactTransport(inmem), fsm: newFSM()})
		servers = append(servers, raft.Server{ID: raft.ServerID(id), Address: addr, Suffrage: raft.Voter})
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
		rc.HeartbeatTimeout = 2 * time.Second
		rc.ElectionTimeout = 2 * time.Second
		rc.LeaderLeaseTimeout = time.Second
		if i == 0 {
			rc.HeartbeatTimeout, rc.ElectionTimeout, rc.LeaderLeaseTimeout = leaseHold, leaseHold, leaseHold
		}
		rc.CommitTimeout = 5 * time.Millisecond
		store := raft.NewInmemStore()
		n.store = store
		r, err := raft.NewRaft(rc, n.fsm, store, store, raft.NewInmemSnapshotStore(), n.trans)
		if err != nil {
			t.Fatal(err)
		}
		n.raft = r
		t.Cleanup(func() { r.Shutdown() })
		if err := r.BootstrapCluster(raft.Configuration{Servers: servers}).Error(); err != nil {
			t.Fatal(err)
		}
	}
	return nodes
}
