package cluster

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/herd-storage/herd/internal/cluster/statemachine"
)

// A new leader commits no entry that takes a node out until
// leaseDuration + leaseMargin after it began to lead, even for a node it
// never granted a lease: it does not know its predecessor's grants, and
// the node may hold one of them. A proposal whose context ends first
// fails with no quorum, saying the node may still hold a lease, and
// commits nothing.
func TestNewLeaderCommitsNoDropUntilPredecessorsLeasesRanOut(t *testing.T) {
	nodes := startRaftNodes(t, id0)
	leader := nodes[0]
	waitUntil(t, 5*time.Second, "node 0 to lead", func() bool { return leader.raft.State() == raft.Leader })
	elected := time.Now() // at or after the election
	c := &Cluster{
		cfg: Config{NodeID: id0}, logger: slog.New(slog.DiscardHandler), fsm: leader.fsm, applied: statemachine.NewReads(leader.fsm.FSM),
		raft: leader.raft, contact: leader.trans, vetoed: map[string]time.Time{}, stop: make(chan struct{}),
	}
	for _, id := range []string{id0, id1} {
		if err := commitErr(commit(c).NodeJoin(context.Background(), Node{ID: id, Address: id, Incarnation: "1"})); err != nil {
			t.Fatal(err)
		}
	}
	leave, err := encoded(id0, "1", func(c *statemachine.Commands) error {
		_, err := c.NodeLeave(context.Background(), id1, "failure detected by gossip")
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	hold := leaseDuration + leaseMargin
	alive := func() bool {
		var ok bool
		leader.fsm.View(func(s *State) { ok = s.Nodes[id1].State == NodeAlive })
		return ok
	}

	// The context ends first: refused, nothing committed.
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	_, _, err = c.ProposeForwarded(ctx, leave)
	cancel()
	if err == nil || !errors.Is(err, ErrNoQuorum) || !strings.Contains(err.Error(), "may still hold a lease") {
		t.Fatalf("a leave proposed %v after the election with a 1 s context: %v; want no quorum, the node may still hold a lease", time.Since(elected).Round(time.Millisecond), err)
	}
	if !alive() {
		t.Fatal("the refused leave was committed")
	}
	t.Logf("refused %v after the election: %v", time.Since(elected).Round(time.Millisecond), err)

	// Given time, it is committed, no earlier than hold after the term
	// began (grants.since) and so after the election.
	c.grants.mu.Lock()
	since := c.grants.since
	c.grants.mu.Unlock()
	if since == 0 {
		t.Fatal("the leader recorded no start of its term")
	}
	before := leader.fsm.Applied()
	var appliedBoot atomic.Int64
	var appliedAt atomic.Pointer[time.Time]
	watching := make(chan struct{})
	go func() {
		defer close(watching)
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			if leader.fsm.Applied() > before {
				now := time.Now()
				appliedBoot.Store(bootNow())
				appliedAt.Store(&now)
				return
			}
			time.Sleep(time.Millisecond)
		}
	}()
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, _, err := c.ProposeForwarded(ctx, leave); err != nil {
		t.Fatalf("the leave %v after the election: %v", time.Since(elected).Round(time.Millisecond), err)
	}
	<-watching
	if alive() || appliedAt.Load() == nil {
		t.Fatal("the leave was not applied")
	}
	afterElection := appliedAt.Load().Sub(elected)
	afterSince := time.Duration(appliedBoot.Load() - since)
	if afterElection < hold || afterSince < hold {
		t.Fatalf("the leave was committed %v after the election and %v after the term's start: want %v", afterElection.Round(time.Millisecond), afterSince.Round(time.Millisecond), hold)
	}
	t.Logf("the leave was committed %v after the election", afterElection.Round(time.Millisecond))
}
