package statemachine

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

func limitsHarness(t *testing.T) *harness {
	h := newHarness(t)
	h.join("a", "", "1")
	h.apply(commandFormat, formatCommand{Copies: 1, ObjectSize: 4 << 20})
	if _, err := h.apply(commandVDICreate, vdiCreateCommand{Name: "vm", Size: 1 << 30}); err != nil {
		t.Fatal(err)
	}
	return h
}

// vdi set changes only the limits it names; 0 removes one.
func TestVDISetLimits(t *testing.T) {
	h := limitsHarness(t)
	set := func(s LimitSettings) (VDI, error) {
		out, err := h.apply(commandVDISet, vdiSetCommand{Name: "vm", Settings: VDISettings{LimitSettings: s}})
		if err != nil {
			return VDI{}, err
		}
		return out.(VDI), nil
	}
	v, err := set(LimitSettings{WriteIOPS: ptr[uint64](500), BPS: ptr[uint64](200 << 20)})
	if err != nil || v.Limits != (Limits{WriteIOPS: 500, BPS: 200 << 20}) {
		t.Fatalf("set: %+v %v", v.Limits, err)
	}
	if got := h.state().VDIs["vm"].Limits; got != v.Limits {
		t.Fatalf("state holds %+v, the result said %+v", got, v.Limits)
	}
	if got := v.Limits.String(); got != "write iops 500/s, bandwidth 200 MiB/s" {
		t.Fatalf("String: %q", got)
	}
	v, err = set(LimitSettings{ReadIOPS: ptr[uint64](100), BPS: ptr[uint64](0)})
	if err != nil || v.Limits != (Limits{WriteIOPS: 500, ReadIOPS: 100}) {
		t.Fatalf("second set: %+v %v", v.Limits, err)
	}
	if v.Exclusive {
		t.Fatal("a limits-only set changed --exclusive")
	}
	// Out of bounds: refused where applied too, changing nothing.
	for _, bad := range []LimitSettings{
		{IOPS: ptr[uint64](MaxIOPSLimit + 1)},
		{WriteBPS: ptr[uint64](MaxBPSLimit + 1)},
		{ReadBPS: ptr[uint64](1000)},
	} {
		if _, err := set(bad); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "-limit") {
			t.Errorf("set %+v: %v, want invalid naming the flag", bad, err)
		}
	}
	if got := h.state().VDIs["vm"].Limits; got != (Limits{WriteIOPS: 500, ReadIOPS: 100}) {
		t.Fatalf("refused sets changed the limits: %+v", got)
	}
	// A snapshot's settings do not change.
	h.apply(commandVDISnapshot, vdiSnapshotCommand{Name: "vm", Tag: "s1"})
	if _, err := h.apply(commandVDISet, vdiSetCommand{Name: "vm@s1", Settings: VDISettings{LimitSettings: LimitSettings{IOPS: ptr[uint64](5)}}}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("set of a snapshot: %v", err)
	}
}

// Limits belong to the name: kept by the VDI a snapshot or a rollback
// puts under it, and by a snapshot of the state machine (raft's).
func TestLimitsKeptAcrossSnapshotAndRollback(t *testing.T) {
	h := limitsHarness(t)
	want := Limits{IOPS: 1000, WriteBPS: 50 << 20}
	if _, err := h.apply(commandVDISet, vdiSetCommand{Name: "vm", Settings: VDISettings{LimitSettings: LimitSettings{IOPS: ptr[uint64](1000), WriteBPS: ptr[uint64](50 << 20)}}}); err != nil {
		t.Fatal(err)
	}
	r, err := h.apply(commandVDISnapshot, vdiSnapshotCommand{Name: "vm", Tag: "s1"})
	if err != nil || r.(SnapshotResult).VDI.Limits != want {
		t.Fatalf("the vdi after a snapshot: %+v %v", r, err)
	}
	v, err := h.apply(commandVDIRollback, vdiRollbackCommand{Name: "vm", Tag: "s1"})
	if err != nil || v.(VDI).Limits != want {
		t.Fatalf("the vdi after a rollback: %+v %v", v, err)
	}
	snap, err := h.fsm.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	sink := bytes.NewBuffer(snap)
	restored := New()
	if err := restored.Restore(bytes.NewReader(sink.Bytes())); err != nil {
		t.Fatal(err)
	}
	var got Limits
	restored.View(func(s *State) { got = s.VDIs["vm"].Limits })
	if got != want {
		t.Fatalf("limits after a snapshot and restore of the state machine: %+v, want %+v", got, want)
	}
}

// SetVDI refuses, before proposing, a set that changes nothing (naming
// the flags) and a limit out of bounds.
func TestSetVDIRefusesBeforeProposing(t *testing.T) {
	c := NewCommands(nil, nil, "", "") // never reaches its proposer
	if _, err := c.SetVDI(context.Background(), "vm", VDISettings{}); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "--write-iops-limit") {
		t.Fatalf("empty set: %v", err)
	}
	if _, err := c.SetVDI(context.Background(), "vm", VDISettings{LimitSettings: LimitSettings{WriteBPS: ptr[uint64](1)}}); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "--write-bps-limit") {
		t.Fatalf("1 B/s: %v", err)
	}
}

// WaitVDI sees a change of the limits the moment it is applied.
func TestWaitVDISeesLimits(t *testing.T) {
	h := limitsHarness(t)
	a := &Reads{fsm: h.fsm}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	got := make(chan Limits, 1)
	go func() {
		v, _ := a.WaitVDI(ctx, "vm", func(v VDI, err error) bool { return err == nil && !v.Limits.Unlimited() })
		got <- v.Limits
	}()
	if _, err := h.apply(commandVDISet, vdiSetCommand{Name: "vm", Settings: VDISettings{LimitSettings: LimitSettings{ReadIOPS: ptr[uint64](7)}}}); err != nil {
		t.Fatal(err)
	}
	if l := <-got; l != (Limits{ReadIOPS: 7}) {
		t.Fatalf("WaitVDI returned %+v", l)
	}
}
