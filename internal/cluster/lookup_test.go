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

// TestLookupVDIWithoutLeader: a node that knows no leader (an election
// under way after the leader died) finds a VDI in its own copy of the log,
// and answers a name it misses not with ErrNotFound but with ErrNoQuorum:
// the VDI may have been created through another node a moment ago, and
// only the leader can tell. An NBD open turned ErrNotFound into "no such
// export" for a VDI that existed.
func TestLookupVDIWithoutLeader(t *testing.T) {
	h := newHarness(t)
	h.join("a", "", "1")
	h.as("a").Format(context.Background(), 1, 4<<20)
	if _, err := h.as("a").CreateVDI(context.Background(), "w", 1<<30, false, 0, "", nil); err != nil {
		t.Fatal(err)
	}
	// A raft server never bootstrapped nor contacted: it knows no leader.
	_, transport := raft.NewInmemTransport("")
	config := raft.DefaultConfig()
	config.LocalID = "a"
	config.Logger = logging.Hclog(slog.New(slog.DiscardHandler), "raft")
	store := raft.NewInmemStore()
	r, err := raft.NewRaft(config, h.fsm, store, store, raft.NewInmemSnapshotStore(), transport)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Shutdown() })
	c := &Cluster{fsm: h.fsm, applied: statemachine.NewReads(h.fsm.FSM), raft: r}

	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if v, err := c.LookupVDI(ctx, "w"); err != nil || v.Name != "w" {
		t.Fatalf("LookupVDI of a VDI in this node's copy, without a leader: %+v, %v", v, err)
	}
	_, err = c.LookupVDI(ctx, "missing")
	if errors.Is(err, ErrNotFound) || !errors.Is(err, ErrNoQuorum) {
		t.Fatalf("LookupVDI of a name this node misses, without a leader: %v; want ErrNoQuorum, not ErrNotFound", err)
	}
}
