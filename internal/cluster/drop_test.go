package cluster

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/herd-storage/herd/internal/cluster/statemachine"
)

// A lease granted to a node while the leader waits to commit its leave
// (the node's next process, restarted meanwhile, renews) must run out
// before the leave is committed too, and no lease is granted to the node
// between the end of that wait and the leave's apply; after it, a grant
// carries the leave. Found by the simulator's raft mode: the wait was
// computed once, so the restarted process served in the epoch the leave
// then ended (TestSimulateRaft, about 2 seeds in 100).
func TestDropWaitsForLeasesGrantedMeanwhile(t *testing.T) {
	nodes := startRaftNodes(t, id0)
	leader := nodes[0]
	waitUntil(t, 5*time.Second, "node 0 to lead", func() bool { return leader.raft.State() == raft.Leader })
	c := &Cluster{
		cfg: Config{NodeID: id0}, logger: slog.New(slog.DiscardHandler), fsm: leader.fsm, applied: statemachine.NewReads(leader.fsm.FSM),
		raft: leader.raft, contact: leader.trans, vetoed: map[string]time.Time{}, stop: make(chan struct{}),
	}
	for _, id := range []string{id0, id1} {
		if err := commitErr(commit(c).NodeJoin(context.Background(), Node{ID: id, Address: id, Incarnation: "1"})); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := c.grantLease(id1, 0, 0); err != nil {
		t.Fatal(err)
	}
	first := time.Now()
	leave, err := encoded("", "", func(c *statemachine.Commands) error {
		_, err := c.NodeLeave(context.Background(), id1, "failure detected by gossip")
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	type outcome struct {
		release func()
		err     error
		at      time.Time
	}
	done := make(chan outcome, 1)
	go func() {
		release, err := c.awaitDrop(context.Background(), leave)
		done <- outcome{release, err, time.Now()}
	}()
	time.Sleep(time.Second)
	if _, _, err := c.grantLease(id1, 0, 0); err != nil { // node 1's next process renews
		t.Fatal(err)
	}
	second := time.Now()
	o := <-done
	if o.err != nil {
		t.Fatal(o.err)
	}
	if hold := leaseDuration + leaseMargin; o.at.Sub(second) < hold {
		t.Fatalf("the leave may be committed %v after the first grant and %v after the second: want %v after the last", o.at.Sub(first).Round(time.Millisecond), o.at.Sub(second).Round(time.Millisecond), hold)
	}
	if _, _, err := c.grantLease(id1, 0, 0); err == nil {
		t.Fatal("a lease was granted to the node while its leave is being committed")
	}
	if err := commitErr(commit(c).NodeLeave(context.Background(), id1, "failure detected by gossip")); err != nil {
		t.Fatal(err)
	}
	o.release()
	applied := leader.fsm.Applied()
	commitIndex, _, err := c.grantLease(id1, 0, 0)
	if err != nil {
		t.Fatalf("no lease once the leave is applied: %v", err)
	}
	if commitIndex < applied {
		t.Fatalf("a grant after the leave carries commit index %d, below the leave's %d", commitIndex, applied)
	}
}
