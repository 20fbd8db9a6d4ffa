package cluster

import (
	"errors"
	"slices"
	"testing"
	"time"
)

// A drain is a new epoch in which the node takes no objects; it survives
// the node's restart; it is refused when the other nodes could not hold
// every copy; cancelling it is another epoch.
func TestDrainIsAnEpochWithoutTheNode(t *testing.T) {
	h := newHarness(t)
	for _, id := range []string{"a", "b", "c", "d"} {
		h.join(id, "", "1")
	}
	if _, err := h.apply(commandFormat, formatCommand{Copies: 3, ObjectSize: 4 << 20, Time: t0}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.apply(commandNodeDrain, nodeDrainCommand{ID: "d", Drain: true, Time: t0}); err != nil {
		t.Fatal(err)
	}
	last := h.state().Epochs[len(h.state().Epochs)-1]
	if last.Number != 5 || !slices.Equal(last.Placed(), []string{"a", "b", "c"}) {
		t.Fatalf("epoch after the drain: %+v, placed %v", last, last.Placed())
	}
	h.join("d", "", "2") // restarts: still draining, no new epoch
	if n := h.state().Nodes["d"]; !n.Draining || h.state().Epoch() != 5 {
		t.Fatalf("after d restarted: %+v, epoch %d", n, h.state().Epoch())
	}
	if _, err := h.apply(commandNodeDrain, nodeDrainCommand{ID: "c", Drain: true, Time: t0}); !errors.Is(err, ErrTooFewNodes) {
		t.Fatalf("draining a second node of four with 3 copies: %v, want ErrTooFewNodes", err)
	}
	if _, err := h.apply(commandNodeDrain, nodeDrainCommand{ID: "d", Drain: false, Time: t0}); err != nil {
		t.Fatal(err)
	}
	if last := h.state().Epochs[len(h.state().Epochs)-1]; last.Number != 6 || len(last.Placed()) != 4 {
		t.Fatalf("epoch after the drain was cancelled: %+v", last)
	}
}

// A maintenance window is recorded on the node, survives its rejoin, is
// bounded, and MaintenanceHold names the nodes down inside one.
func TestMaintenanceWindowIsRecorded(t *testing.T) {
	h := newHarness(t)
	h.join("a", "", "1")
	h.join("b", "", "1")
	if _, err := h.apply(commandNodeMaintenance, nodeMaintenanceCommand{ID: "b", Until: t0.Add(30 * 24 * time.Hour), Time: t0}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("a 30-day window: %v, want ErrInvalid", err)
	}
	if _, err := h.apply(commandNodeMaintenance, nodeMaintenanceCommand{ID: "b", Until: t0.Add(time.Hour), Time: t0}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.apply(commandNodeLeave, nodeLeaveCommand{ID: "b", Time: t0}); err != nil {
		t.Fatal(err)
	}
	c := &applied{fsm: h.fsm}
	if until, nodes := c.MaintenanceHold(t0.Add(time.Minute)); !slices.Equal(nodes, []string{"b"}) || !until.Equal(t0.Add(time.Hour)) {
		t.Fatalf("hold inside the window: %v %v", until, nodes)
	}
	if _, nodes := c.MaintenanceHold(t0.Add(2 * time.Hour)); len(nodes) != 0 {
		t.Fatalf("hold after the window: %v", nodes)
	}
	h.join("b", "", "2")
	if _, nodes := c.MaintenanceHold(t0.Add(time.Minute)); len(nodes) != 0 || !h.state().Nodes["b"].MaintenanceUntil.Equal(t0.Add(time.Hour)) {
		t.Fatalf("after b returned: hold %v, node %+v", nodes, h.state().Nodes["b"])
	}
}

// A node's capacity or zone set at run time is a new epoch, wins over
// what the node announces when it rejoins, and yields to it after a reset.
func TestNodeSetIsAnEpochAndOutlivesRestarts(t *testing.T) {
	h := newHarness(t)
	for _, id := range []string{"a", "b", "c"} {
		h.join(id, "", "1")
	}
	capacity := uint64(1 << 30)
	if _, err := h.apply(commandNodeSet, nodeSetCommand{ID: "c", Settings: NodeSettings{Capacity: &capacity}, Time: t0}); err != nil {
		t.Fatal(err)
	}
	if e := h.state().Epochs[len(h.state().Epochs)-1]; e.Number != 4 || e.Members[2].Weight != capacity {
		t.Fatalf("epoch after node set: %+v", e)
	}
	h.join("c", "", "2") // restarts announcing capacity 0 (its flags)
	if n := h.state().Nodes["c"]; n.Capacity != capacity || h.state().Epoch() != 4 {
		t.Fatalf("after c restarted: %+v, epoch %d", n, h.state().Epoch())
	}
	zero := uint64(0)
	if _, err := h.apply(commandNodeSet, nodeSetCommand{ID: "c", Settings: NodeSettings{Capacity: &zero}, Time: t0}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("capacity 0: %v", err)
	}
	if _, err := h.apply(commandNodeSet, nodeSetCommand{ID: "c", Settings: NodeSettings{Reset: true}, Time: t0}); err != nil {
		t.Fatal(err)
	}
	h.join("c", "", "3")
	if n := h.state().Nodes["c"]; n.Capacity != 0 || n.SetCapacity || h.state().Epoch() != 5 {
		t.Fatalf("after a reset and a restart: %+v, epoch %d", n, h.state().Epoch())
	}
}
