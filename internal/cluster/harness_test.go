package cluster

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/hashicorp/raft"
	"github.com/herd-storage/herd/internal/cluster/statemachine"
)

// harness is a log without raft for the runtime's tests: commands built
// by statemachine.Commands (Propose), applied to an FSM one index at a
// time through raft's FSM interface, as raft would. The state machine's
// own tests have theirs (internal/cluster/statemachine).
type harness struct {
	t     *testing.T
	fsm   *FSM
	index uint64
}

func newHarness(t *testing.T) *harness { return &harness{t: t, fsm: newFSM()} }

// Propose implements statemachine.Proposer: data is the next entry.
func (h *harness) Propose(_ context.Context, data []byte) (json.RawMessage, uint64, error) {
	h.index++
	res := h.fsm.Apply(&raft.Log{Index: h.index, Type: raft.LogCommand, Data: data}).(*statemachine.Result)
	if res.Err != nil {
		return nil, h.index, res.Err
	}
	value, err := json.Marshal(res.Value)
	return value, h.index, err
}

// as returns the commands node proposes.
func (h *harness) as(node string) *statemachine.Commands {
	return statemachine.NewCommands(h, h.fsm.FSM, node, "1")
}

func (h *harness) join(id, zone, incarnation string) {
	h.t.Helper()
	if _, err := h.as(id).NodeJoin(context.Background(), Node{ID: id, Address: id, Zone: zone, Incarnation: incarnation}); err != nil {
		h.t.Fatalf("join %s: %v", id, err)
	}
}

func (h *harness) state() *State {
	var s *State
	h.fsm.View(func(st *State) { s = st })
	return s
}

// securityHarness is a cluster at LevelSecurity with nodes a, b, c alive.
func securityHarness(t *testing.T) *harness {
	t.Helper()
	h := newHarness(t)
	ctx := context.Background()
	if err := h.as("a").InitSecurity(ctx, "j", Token{ID: "t", Name: "admin", Hash: "h"}, LevelSecurity, "a", "0a"); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"b", "c"} {
		if err := h.as("a").Admit(ctx, id, "0"+id, ""); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range []string{"a", "b", "c"} {
		h.join(id, "", "1")
	}
	return h
}

// encoded returns the entry the command fn proposes (as node's process
// incarnation), as it would enter the log, without proposing it.
func encoded(node, incarnation string, fn func(*statemachine.Commands) error) ([]byte, error) {
	var p capture
	err := fn(statemachine.NewCommands(&p, nil, node, incarnation))
	if p.data == nil {
		return nil, err
	}
	return p.data, nil
}

// capture is a Proposer that keeps the entry it is given and commits
// nothing.
type capture struct{ data []byte }

func (p *capture) Propose(_ context.Context, data []byte) (json.RawMessage, uint64, error) {
	p.data = data
	return json.RawMessage("null"), 0, nil
}
