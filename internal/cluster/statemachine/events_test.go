package statemachine

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// The cluster's events say in words what the log did: epochs with their
// reasons, a restart, a writer lock taken away with the node that left,
// VDI changes; refused entries and lock traffic add none; each carries
// its entry's index and the time the leader appended it.
func TestEventsTellTheHistory(t *testing.T) {
	h := newHarness(t)
	h.join("a", "", "1")
	h.join("b", "", "1")
	if _, err := h.apply(commandFormat, formatCommand{Copies: 2, ObjectSize: 4 << 20, Time: t0}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.apply(commandVDICreate, vdiCreateCommand{Name: "vm1", Size: 1 << 30, Time: t0}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.apply(commandVDICreate, vdiCreateCommand{Name: "vm1", Size: 1 << 30, Time: t0}); err == nil {
		t.Fatal("a second create of vm1 applied")
	}
	if _, err := h.apply(commandLockAcquire, lockCommand{Key: VDILockKey("vm1"), Node: "b", Incarnation: "1", Session: "s", Time: t0}); err != nil {
		t.Fatal(err)
	}
	h.join("a", "", "2") // a restarts before it was missed
	if _, err := h.apply(commandNodeLeave, nodeLeaveCommand{ID: "b", Reason: "gossip: dead", Time: t0}); err != nil {
		t.Fatal(err)
	}
	want := []struct {
		index uint64
		kind  string
		text  string
	}{
		{1, "epoch", "epoch 1: node a joined; 1 nodes alive"},
		{2, "epoch", "epoch 2: node b joined; 2 nodes alive"},
		{3, "cluster", "cluster formatted: 2 copies, 4096 KiB objects"},
		{4, "vdi", `vdi "vm1" created (1073741824 bytes)`},
		{7, "node", "node a (a) restarted: a new process"},
		{8, "lock", `the writer lock on vdi "vm1" was taken away (its node b left)`},
		{8, "epoch", "epoch 3: node b left (gossip: dead); 1 nodes alive"},
	}
	events := h.state().Events
	var got []string
	for _, e := range events {
		got = append(got, fmt.Sprintf("%d %s %s", e.Index, e.Kind, e.Text))
	}
	if len(events) != len(want) {
		t.Fatalf("%d events, want %d:\n%s", len(events), len(want), strings.Join(got, "\n"))
	}
	for i, w := range want {
		e := events[i]
		if e.Index != w.index || e.Kind != w.kind || !strings.HasPrefix(e.Text, w.text) {
			t.Errorf("event %d: %s; want %d %s %s...", i, got[i], w.index, w.kind, w.text)
		}
	}
	if v := h.state().VDIs["vm1"]; !v.Unclean {
		t.Error("vm1 is not unclean after its writer's node left")
	}
}

// The entry's append time stamps its events, and the state keeps only the
// newest MaxEvents.
func TestEventsAreStampedAndBounded(t *testing.T) {
	f := New()
	at := time.Date(2026, 11, 24, 10, 0, 0, 0, time.UTC)
	apply := func(index uint64, ct commandType, payload any) {
		data, err := encodeCommand(ct, payload)
		if err != nil {
			t.Fatal(err)
		}
		if res := f.ApplyEntries([]Entry{{Index: index, Data: data, Time: at}})[0].(*Result); res.Err != nil {
			t.Fatal(res.Err)
		}
	}
	apply(1, commandNodeJoin, nodeJoinCommand{Node: Node{ID: "a", Incarnation: "1"}, Time: t0})
	apply(2, commandFormat, formatCommand{Copies: 1, ObjectSize: 4 << 20, Time: t0})
	total := MaxEvents + MaxEvents/2
	for i := 0; i < total; i++ {
		apply(uint64(3+i), commandVDICreate, vdiCreateCommand{Name: fmt.Sprintf("v%d", i), Size: 1 << 20, Time: t0})
	}
	var events []Event
	f.View(func(s *State) { events = s.Events })
	if len(events) < MaxEvents || len(events) > MaxEvents+MaxEvents/4 {
		t.Fatalf("%d events kept, want %d to %d", len(events), MaxEvents, MaxEvents+MaxEvents/4)
	}
	last := events[len(events)-1]
	if !last.Time.Equal(at) || last.Index != uint64(2+total) || last.Text != fmt.Sprintf("vdi %q created (1048576 bytes)", fmt.Sprintf("v%d", total-1)) {
		t.Fatalf("newest event %+v", last)
	}
	for i := 1; i < len(events); i++ {
		if events[i].Index != events[i-1].Index+1 {
			t.Fatalf("events %d and %d are not consecutive: %d, %d", i-1, i, events[i-1].Index, events[i].Index)
		}
	}
}
