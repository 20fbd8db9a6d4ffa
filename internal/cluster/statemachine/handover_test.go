package statemachine

import (
	"errors"
	"testing"
)

func TestLockHandover(t *testing.T) {
	h := newHarness(t)
	h.join("a", "", "1")
	h.join("b", "", "1")
	h.apply(commandFormat, formatCommand{Copies: 1, ObjectSize: 4 << 20})
	if _, err := h.apply(commandVDICreate, vdiCreateCommand{Name: "vm", Size: 1 << 30}); err != nil {
		t.Fatal(err)
	}
	key := vdiLockKey("vm")
	want := func(node, session string) (LockWant, error) {
		w, err := h.apply(commandLockWant, lockCommand{Key: key, Node: node, Incarnation: "1", Session: session, Time: t0})
		if err != nil {
			return LockWant{}, err
		}
		return w.(LockWant), nil
	}
	// A free lock is granted at once, with a generation.
	w, err := want("a", "g")
	if err != nil || !w.Granted || w.Lock.Node != "a" || w.Lock.Generation == 0 {
		t.Fatalf("want of a free lock: %+v %v", w, err)
	}
	first := w.Lock.Generation
	// A held one is not granted: the wish is recorded for the holder.
	if w, err = want("b", "g"); err != nil || w.Granted || w.Lock.Node != "a" || w.Lock.Wanted == nil || w.Lock.Wanted.Node != "b" {
		t.Fatalf("want of a held lock: %+v %v", w, err)
	}
	// Only the holder hands over.
	if _, err := h.apply(commandLockHandover, lockHandoverCommand{Key: key, FromNode: "b", FromSession: "g", To: LockOwner{Node: "b", Incarnation: "1", Session: "g"}}); !errors.Is(err, ErrNotLockOwner) {
		t.Fatalf("handover by a non-holder: %v", err)
	}
	out, err := h.apply(commandLockHandover, lockHandoverCommand{Key: key, FromNode: "a", FromSession: "g", To: *w.Lock.Wanted, Time: t0})
	if err != nil {
		t.Fatal(err)
	}
	l := h.state().Locks[key]
	if got := out.(LockWant); !got.Granted || l.Node != "b" || l.Wanted != nil || l.Generation <= first {
		t.Fatalf("after the handover: %+v, lock %+v (first generation %d)", got, l, first)
	}
	if v := h.state().VDIs["vm"]; v.Handovers != 1 || v.Unclean {
		t.Fatalf("vdi after a handover: %+v", v)
	}
	// A handover to a node that has gone releases the lock instead.
	if _, err := want("a", "g"); err != nil {
		t.Fatal(err)
	}
	h.apply(commandNodeLeave, nodeLeaveCommand{ID: "a", Time: t0})
	if _, err := h.apply(commandLockHandover, lockHandoverCommand{Key: key, FromNode: "b", FromSession: "g", To: LockOwner{Node: "a", Incarnation: "1", Session: "g"}}); err != nil {
		t.Fatal(err)
	}
	if _, held := h.state().Locks[key]; held {
		t.Fatal("a lock handed to a node that left is still held")
	}
}

func TestExclusiveVDIRefusesAWant(t *testing.T) {
	h := newHarness(t)
	h.join("a", "", "1")
	h.join("b", "", "1")
	h.apply(commandFormat, formatCommand{Copies: 1, ObjectSize: 4 << 20})
	if v, err := h.apply(commandVDICreate, vdiCreateCommand{Name: "db", Size: 1 << 30, Exclusive: true}); err != nil || !v.(VDI).Exclusive {
		t.Fatalf("create --exclusive: %+v %v", v, err)
	}
	key := vdiLockKey("db")
	if _, err := h.apply(commandLockWant, lockCommand{Key: key, Node: "a", Incarnation: "1", Session: "g"}); err != nil {
		t.Fatal(err)
	}
	var held *LockHeldError
	if _, err := h.apply(commandLockWant, lockCommand{Key: key, Node: "b", Incarnation: "1", Session: "g"}); !errors.As(err, &held) || held.Lock.Node != "a" {
		t.Fatalf("want of an exclusive vdi's held lock: %v", err)
	}
	if h.state().Locks[key].Wanted != nil {
		t.Fatal("a want was recorded on an exclusive vdi")
	}
	// Not exclusive any more: the want is recorded.
	if _, err := h.apply(commandVDISet, vdiSetCommand{Name: "db", Settings: VDISettings{Exclusive: ptr(false)}}); err != nil {
		t.Fatal(err)
	}
	if w, err := h.apply(commandLockWant, lockCommand{Key: key, Node: "b", Incarnation: "1", Session: "g"}); err != nil || w.(LockWant).Lock.Wanted == nil {
		t.Fatalf("want after --exclusive=false: %+v %v", w, err)
	}
	if _, err := h.apply(commandVDISet, vdiSetCommand{Name: "nope", Settings: VDISettings{Exclusive: ptr(true)}}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("set of an unknown vdi: %v", err)
	}
	// A snapshot or a rollback puts a new id under the name: the setting
	// stays with the name.
	if _, err := h.apply(commandVDISet, vdiSetCommand{Name: "db", Settings: VDISettings{Exclusive: ptr(true)}}); err != nil {
		t.Fatal(err)
	}
	h.apply(commandLockRelease, lockCommand{Key: key, Node: "a", Incarnation: "1", Session: "g"})
	if r, err := h.apply(commandVDISnapshot, vdiSnapshotCommand{Name: "db", Tag: "s1"}); err != nil || !r.(SnapshotResult).VDI.Exclusive {
		t.Fatalf("the vdi after a snapshot of an exclusive one: %+v %v", r, err)
	}
	if v, err := h.apply(commandVDIRollback, vdiRollbackCommand{Name: "db", Tag: "s1"}); err != nil || !v.(VDI).Exclusive {
		t.Fatalf("the vdi after a rollback of an exclusive one: %+v %v", v, err)
	}
}

// A broken lock is gone, its VDI unclean, and a new epoch fences the
// holder's writes of the epoch before.
func TestLockBreakFences(t *testing.T) {
	h := newHarness(t)
	h.join("a", "", "1")
	h.apply(commandFormat, formatCommand{Copies: 1, ObjectSize: 4 << 20})
	h.apply(commandVDICreate, vdiCreateCommand{Name: "vm", Size: 1 << 30})
	key := vdiLockKey("vm")
	if _, err := h.apply(commandLockAcquire, lockCommand{Key: key, Node: "a", Incarnation: "1", Session: "g"}); err != nil {
		t.Fatal(err)
	}
	epoch := h.state().Epoch()
	out, err := h.apply(commandLockBreak, lockBreakCommand{Key: key, By: "admin token ops", Time: t0})
	if err != nil || out.(Lock).Node != "a" {
		t.Fatalf("break: %+v %v", out, err)
	}
	s := h.state()
	if _, held := s.Locks[key]; held || !s.VDIs["vm"].Unclean || s.Epoch() != epoch+1 {
		t.Fatalf("after a break: locks %+v, vdi %+v, epoch %d (was %d)", s.Locks, s.VDIs["vm"], s.Epoch(), epoch)
	}
	if _, err := h.apply(commandLockBreak, lockBreakCommand{Key: key}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("break of a free lock: %v", err)
	}
}
