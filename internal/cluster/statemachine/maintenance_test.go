package statemachine

import (
	"errors"
	"slices"
	"strings"
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
	c := &Reads{fsm: h.fsm}
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

// Down, not out: the window a node opens as it stops cleanly holds its
// objects' recovery while it is away, never shortens a longer window,
// ends when a new process of the node joins (its end kept, in the past),
// is replaced by an operator's window, and the events say when the node
// is marked out.
func TestStopWindow(t *testing.T) {
	h := newHarness(t)
	for _, id := range []string{"a", "b", "c"} {
		h.join(id, "", "1")
	}
	stop := func(id string, at time.Time, interval time.Duration) Node {
		t.Helper()
		out, err := h.apply(commandNodeMaintenance, nodeMaintenanceCommand{ID: id, Until: at.Add(interval), Time: at, Stop: true})
		if err != nil {
			t.Fatalf("stop window of %s: %v", id, err)
		}
		return out.(Node)
	}
	rejoin := func(id, incarnation string, at time.Time) {
		t.Helper()
		if _, err := h.apply(commandNodeJoin, nodeJoinCommand{Node: Node{ID: id, Address: id, Incarnation: incarnation}, Time: at}); err != nil {
			t.Fatal(err)
		}
	}
	leave := func(id string, at time.Time) {
		t.Helper()
		if _, err := h.apply(commandNodeLeave, nodeLeaveCommand{ID: id, Reason: "stopped", Time: at}); err != nil {
			t.Fatal(err)
		}
	}
	c := &Reads{fsm: h.fsm}

	// c stops at t0 with a 10-minute interval, leaves, and returns after 5.
	if n := stop("c", t0, 10*time.Minute); !n.Stopped || !n.MaintenanceUntil.Equal(t0.Add(10*time.Minute)) {
		t.Fatalf("c after its stop window: %+v", n)
	}
	events := h.state().Events
	if last := events[len(events)-1].Text; !strings.Contains(last, "down, not out, until 2026-11-21T12:10:00Z") {
		t.Errorf("the stop's event: %q", last)
	}
	leave("c", t0)
	if until, nodes := c.MaintenanceHold(t0.Add(time.Minute)); !slices.Equal(nodes, []string{"c"}) || !until.Equal(t0.Add(10*time.Minute)) {
		t.Fatalf("hold while c is stopped: %v %v", until, nodes)
	}
	rejoin("c", "1", t0.Add(time.Minute)) // the same process (a partition healed): still stopped
	if n := h.state().Nodes["c"]; !n.Stopped {
		t.Fatalf("c rejoined with its old incarnation: %+v", n)
	}
	leave("c", t0.Add(time.Minute))
	rejoin("c", "2", t0.Add(5*time.Minute))
	if n := h.state().Nodes["c"]; n.Stopped || !n.MaintenanceUntil.Equal(t0.Add(5*time.Minute)) {
		t.Fatalf("c back inside its window: %+v; want the window ended at its return", n)
	}
	if _, nodes := c.MaintenanceHold(t0.Add(6 * time.Minute)); len(nodes) != 0 {
		t.Fatalf("hold after c returned: %v", nodes)
	}
	events = h.state().Events
	if !slices.ContainsFunc(events, func(e Event) bool { return strings.Contains(e.Text, "node c (c) is back before it was marked out") }) {
		t.Errorf("no event says c came back before it was marked out")
	}

	// b is in an operator's window of an hour: its stop does not shorten it.
	if _, err := h.apply(commandNodeMaintenance, nodeMaintenanceCommand{ID: "b", Until: t0.Add(time.Hour), Time: t0}); err != nil {
		t.Fatal(err)
	}
	if n := stop("b", t0, 10*time.Minute); n.Stopped || !n.MaintenanceUntil.Equal(t0.Add(time.Hour)) {
		t.Fatalf("b's stop inside a longer window: %+v", n)
	}

	// a stops, stays away past its window, then returns: marked out in
	// between; its window's end is kept.
	stop("a", t0, 10*time.Minute)
	leave("a", t0)
	if _, nodes := c.MaintenanceHold(t0.Add(11 * time.Minute)); len(nodes) != 0 {
		t.Fatalf("hold after a's window closed: %v", nodes)
	}
	rejoin("a", "2", t0.Add(20*time.Minute))
	if n := h.state().Nodes["a"]; n.Stopped || !n.MaintenanceUntil.Equal(t0.Add(10*time.Minute)) {
		t.Fatalf("a back after its window: %+v", n)
	}

	// An operator's window replaces a stop window.
	stop("a", t0.Add(30*time.Minute), 10*time.Minute)
	if _, err := h.apply(commandNodeMaintenance, nodeMaintenanceCommand{ID: "a", Until: t0.Add(3 * time.Hour), Time: t0.Add(30 * time.Minute)}); err != nil {
		t.Fatal(err)
	}
	if n := h.state().Nodes["a"]; n.Stopped || !n.MaintenanceUntil.Equal(t0.Add(3*time.Hour)) {
		t.Fatalf("a after an operator's window: %+v", n)
	}
}
