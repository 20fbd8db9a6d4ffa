package statemachine

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"
	"time"
)

// harness applies commands to an FSM as raft would, one index at a time.
type harness struct {
	t     *testing.T
	fsm   *FSM
	index uint64
}

func newHarness(t *testing.T) *harness { return &harness{t: t, fsm: New()} }

func (h *harness) apply(ct commandType, payload any) (any, error) {
	h.t.Helper()
	data, err := encodeCommand(ct, payload)
	if err != nil {
		h.t.Fatal(err)
	}
	h.index++
	res := h.fsm.ApplyEntries([]Entry{{Index: h.index, Data: data}})[0].(*Result)
	return res.Value, res.Err
}

var t0 = time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)

func (h *harness) join(id, zone, incarnation string) {
	h.t.Helper()
	if _, err := h.apply(commandNodeJoin, nodeJoinCommand{Node: Node{ID: id, Address: id, Zone: zone, Incarnation: incarnation}, Time: t0}); err != nil {
		h.t.Fatalf("join %s: %v", id, err)
	}
}

func (h *harness) state() *State {
	var s *State
	h.fsm.View(func(st *State) { s = st })
	return s
}

func TestEpochsFollowMembership(t *testing.T) {
	h := newHarness(t)
	h.join("a", "", "1")
	h.join("b", "", "1")
	h.join("b", "", "1") // the same announcement again: no new epoch
	h.join("c", "", "1")
	if _, err := h.apply(commandNodeLeave, nodeLeaveCommand{ID: "b", Time: t0}); err != nil {
		t.Fatal(err)
	}
	h.join("b", "", "2")
	want := [][]string{{"a"}, {"a", "b"}, {"a", "b", "c"}, {"a", "c"}, {"a", "b", "c"}}
	epochs := h.state().Epochs
	if len(epochs) != len(want) {
		t.Fatalf("epochs = %+v, want %d of them", epochs, len(want))
	}
	for i, e := range epochs {
		if e.Number != uint64(i+1) || !equal(e.Nodes, want[i]) {
			t.Errorf("epoch %d = %d %v, want %d %v", i, e.Number, e.Nodes, i+1, want[i])
		}
	}
	if _, err := h.apply(commandNodeLeave, nodeLeaveCommand{ID: "zzz", Time: t0}); !errors.Is(err, ErrNotFound) {
		t.Errorf("leave of unknown node: %v", err)
	}
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestFormatOnceAndCopiesPlaceable(t *testing.T) {
	h := newHarness(t)
	h.join("a", "", "1")
	h.join("b", "", "1")
	if _, err := h.apply(commandVDICreate, vdiCreateCommand{Name: "x", Size: 1 << 30}); !errors.Is(err, ErrNotFormatted) {
		t.Fatalf("create before format: %v", err)
	}
	if _, err := h.apply(commandFormat, formatCommand{Copies: 3, ObjectSize: 4 << 20}); !errors.Is(err, ErrTooFewNodes) {
		t.Fatalf("3 copies on 2 nodes: %v, want ErrTooFewNodes", err)
	}
	if _, err := h.apply(commandFormat, formatCommand{Copies: 2, ObjectSize: 3 << 20}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("object size not a power of two: %v", err)
	}
	if _, err := h.apply(commandFormat, formatCommand{Copies: 2, ObjectSize: 4 << 20, Time: t0}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.apply(commandFormat, formatCommand{Copies: 1, ObjectSize: 4 << 20}); !errors.Is(err, ErrAlreadyFormatted) {
		t.Fatalf("second format: %v", err)
	}
	if f := h.state().Format; f.Copies != 2 {
		t.Fatalf("format changed by refused command: %+v", f)
	}
}

func TestCopiesNeedZones(t *testing.T) {
	h := newHarness(t)
	h.join("a", "z1", "1")
	h.join("b", "z1", "1")
	h.join("c", "z2", "1")
	if _, err := h.apply(commandFormat, formatCommand{Copies: 3, ObjectSize: 4 << 20}); !errors.Is(err, ErrTooFewNodes) {
		t.Fatalf("3 copies over 2 zones: %v", err)
	}
	if _, err := h.apply(commandFormat, formatCommand{Copies: 2, ObjectSize: 4 << 20}); err != nil {
		t.Fatal(err)
	}
}

func TestVDINamespace(t *testing.T) {
	h := newHarness(t)
	h.join("a", "", "1")
	h.apply(commandFormat, formatCommand{Copies: 1, ObjectSize: 4 << 20})
	ids := map[uint32]bool{}
	for _, name := range []string{"one", "two", "three"} {
		v, err := h.apply(commandVDICreate, vdiCreateCommand{Name: name, Size: 1 << 30})
		if err != nil {
			t.Fatal(err)
		}
		ids[v.(VDI).ID] = true
	}
	if len(ids) != 3 {
		t.Fatalf("ids not distinct: %v", ids)
	}
	if _, err := h.apply(commandVDICreate, vdiCreateCommand{Name: "two", Size: 1 << 30}); !errors.Is(err, ErrAlreadyExists) {
		t.Fatalf("duplicate create: %v", err)
	}
	if _, err := h.apply(commandVDIDelete, vdiDeleteCommand{Name: "two"}); err != nil {
		t.Fatal(err)
	}
	v, err := h.apply(commandVDICreate, vdiCreateCommand{Name: "two", Size: 1 << 30})
	if err != nil || ids[v.(VDI).ID] {
		t.Fatalf("re-created vdi reuses an id or fails: %+v %v", v, err)
	}
	if _, err := h.apply(commandVDIResize, vdiResizeCommand{Name: "one", Size: 1 << 29}); !errors.Is(err, ErrShrink) {
		t.Fatalf("shrink: %v", err)
	}
	if v, err := h.apply(commandVDIResize, vdiResizeCommand{Name: "one", Size: 2 << 30}); err != nil || v.(VDI).Size != 2<<30 {
		t.Fatalf("grow: %+v %v", v, err)
	}
	if _, err := h.apply(commandVDIResize, vdiResizeCommand{Name: "one", Size: 2<<30 + 1}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("unaligned size: %v", err)
	}
	if _, err := h.apply(commandVDIDelete, vdiDeleteCommand{Name: "nope"}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("delete unknown: %v", err)
	}
	// A VDI open for writing cannot be deleted.
	if _, err := h.apply(commandLockAcquire, lockCommand{Key: vdiLockKey("one"), Node: "a", Incarnation: "1", Session: "s"}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.apply(commandVDIDelete, vdiDeleteCommand{Name: "one"}); !errors.Is(err, ErrBusy) {
		t.Fatalf("delete of open vdi: %v", err)
	}
}

func TestLocks(t *testing.T) {
	h := newHarness(t)
	h.join("a", "", "1")
	h.join("b", "", "1")
	lock := func(node, inc, session string) error {
		_, err := h.apply(commandLockAcquire, lockCommand{Key: "k", Node: node, Incarnation: inc, Session: session, Time: t0})
		return err
	}
	if err := lock("a", "1", "s1"); err != nil {
		t.Fatal(err)
	}
	if err := lock("a", "1", "s1"); err != nil {
		t.Fatalf("re-acquire by owner: %v", err)
	}
	var held *LockHeldError
	if err := lock("b", "1", "s1"); !errors.As(err, &held) || !errors.Is(err, ErrLockHeld) || held.Lock.Node != "a" {
		t.Fatalf("second owner: %v", err)
	}
	if _, err := h.apply(commandLockRelease, lockCommand{Key: "k", Node: "b", Session: "s1"}); !errors.Is(err, ErrNotLockOwner) {
		t.Fatalf("release by non-owner: %v", err)
	}
	if err := lock("b", "0", "s1"); !errors.Is(err, ErrInvalid) {
		t.Fatalf("claim from a stale incarnation: %v", err)
	}
	// The owner's node leaves: its locks go.
	h.apply(commandNodeLeave, nodeLeaveCommand{ID: "a", Time: t0})
	if err := lock("b", "1", "s2"); err != nil {
		t.Fatalf("lock after owner left: %v", err)
	}
	// The owner's process restarts (new incarnation): its old locks go.
	h.join("b", "", "2")
	if len(h.state().Locks) != 0 {
		t.Fatalf("locks of a restarted node survived: %+v", h.state().Locks)
	}
	if err := lock("b", "2", "s3"); err != nil {
		t.Fatal(err)
	}
	if _, err := h.apply(commandLockRelease, lockCommand{Key: "k", Node: "b", Session: "s3"}); err != nil {
		t.Fatal(err)
	}
	if err := lock("a", "1", "s1"); !errors.Is(err, ErrInvalid) {
		t.Fatalf("claim from a dead node: %v", err)
	}
}

func TestDeterministicAndSnapshotRoundTrip(t *testing.T) {
	run := func() *harness {
		h := newHarness(t)
		h.join("a", "z", "1")
		h.join("b", "y", "1")
		h.apply(commandFormat, formatCommand{Copies: 2, ObjectSize: 4 << 20, Time: t0})
		for _, n := range []string{"p", "q", "p", "r"} {
			h.apply(commandVDICreate, vdiCreateCommand{Name: n, Size: 1 << 20, Time: t0})
		}
		h.apply(commandLockAcquire, lockCommand{Key: "k", Node: "a", Incarnation: "1", Session: "s", Time: t0})
		h.apply(commandNodeLeave, nodeLeaveCommand{ID: "b", Time: t0})
		return h
	}
	a, b := run(), run()
	ja, _ := json.Marshal(a.state())
	jb, _ := json.Marshal(b.state())
	if !bytes.Equal(ja, jb) {
		t.Fatalf("same log, different states:\n%s\n%s", ja, jb)
	}
	snap, err := a.fsm.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	sink := bytes.NewBuffer(snap)
	restored := New()
	if err := restored.Restore(bytes.NewReader(sink.Bytes())); err != nil {
		t.Fatal(err)
	}
	var jr []byte
	restored.View(func(s *State) { jr, _ = json.Marshal(s) })
	if !bytes.Equal(ja, jr) {
		t.Fatalf("snapshot round trip changed the state:\n%s\n%s", ja, jr)
	}
	if err := restored.Restore(bytes.NewReader([]byte("{garbage"))); err == nil {
		t.Fatal("restore of a damaged snapshot succeeded")
	}
}

func TestUnknownAndMalformedCommands(t *testing.T) {
	h := newHarness(t)
	h.join("a", "", "1")
	var halted []error
	h.fsm.OnHalt = func(err error) { halted = append(halted, err) }
	// An unknown command marked ignorable is skipped, and the log goes on.
	h.index++
	res := h.fsm.ApplyEntries([]Entry{{Index: h.index, Data: []byte{byte(commandIgnorable | 99), '{', '}'}}})[0].(*Result)
	if !errors.Is(res.Err, ErrInvalid) || len(halted) != 0 {
		t.Fatalf("ignorable unknown command: %v, halted %v", res.Err, halted)
	}
	h.index++
	res = h.fsm.ApplyEntries([]Entry{{Index: h.index, Data: []byte{byte(commandVDICreate), 'x'}}})[0].(*Result)
	if !errors.Is(res.Err, ErrInvalid) {
		t.Fatalf("malformed command: %v", res.Err)
	}
	h.join("b", "", "1") // still applying
	if got := len(h.state().Epochs); got != 2 {
		t.Fatalf("%d epochs after two joins", got)
	}
	// An unknown command without the bit: this binary cannot know what
	// it changes, so it applies nothing more (its state would differ from
	// the nodes that know the command), takes no snapshot, and says so once.
	h.index++
	res = h.fsm.ApplyEntries([]Entry{{Index: h.index, Data: []byte{77, '{', '}'}}})[0].(*Result)
	if !errors.Is(res.Err, ErrIncompatible) || len(halted) != 1 {
		t.Fatalf("unknown command: %v, halted %v", res.Err, halted)
	}
	if _, err := h.apply(commandNodeJoin, nodeJoinCommand{Node: Node{ID: "c", Address: "c", Incarnation: "1"}, Time: t0}); !errors.Is(err, ErrIncompatible) {
		t.Fatalf("a join after the unknown command: %v", err)
	}
	if got := len(h.state().Epochs); got != 2 {
		t.Fatalf("an entry after the unknown command was applied: %d epochs", got)
	}
	if _, err := h.fsm.Snapshot(); !errors.Is(err, ErrIncompatible) {
		t.Fatalf("snapshot of a halted FSM: %v", err)
	}
	if len(halted) != 1 {
		t.Fatalf("halt reported %d times", len(halted))
	}
}

// An epoch fixes its placement: a node that comes back before it was missed (a quick
// restart: same id, new incarnation, no leave in between) with another
// capacity or zone changes the placement, so it begins a new epoch; the
// earlier epochs keep what placement needed then. Before, only the node
// table changed, and one epoch had two placements.
func TestRejoinWithNewPlacementIsANewEpoch(t *testing.T) {
	h := newHarness(t)
	join := func(id, zone string, capacity uint64, incarnation string) {
		t.Helper()
		if _, err := h.apply(commandNodeJoin, nodeJoinCommand{Node: Node{ID: id, Address: id, Zone: zone, Capacity: capacity, Incarnation: incarnation}, Time: t0}); err != nil {
			t.Fatal(err)
		}
	}
	join("a", "z1", 100, "1")
	join("b", "z1", 100, "1")
	join("b", "z1", 100, "2") // restarted, same placement: no new epoch
	if got := len(h.state().Epochs); got != 2 {
		t.Fatalf("a restart with the same capacity and zone made %d epochs, want 2", got)
	}
	join("b", "z1", 5000, "3") // restarted with another capacity
	join("b", "z2", 5000, "4") // and with another zone
	epochs := h.state().Epochs
	if len(epochs) != 4 {
		t.Fatalf("%d epochs, want 4: %+v", len(epochs), epochs)
	}
	want := []Member{{ID: "a", Zone: "z1", Weight: 100}, {ID: "b", Zone: "z1", Weight: 100}}
	if got := epochs[1].Members; !slicesEqual(got, want) {
		t.Fatalf("epoch 2 members %+v, want %+v", got, want)
	}
	if got := epochs[2].Members[1]; got != (Member{ID: "b", Zone: "z1", Weight: 5000}) {
		t.Fatalf("epoch 3 records b as %+v", got)
	}
	if got := epochs[3].Members[1]; got != (Member{ID: "b", Zone: "z2", Weight: 5000}) {
		t.Fatalf("epoch 4 records b as %+v", got)
	}
	// Full is placement too: it is recorded, and PlacedMembers leaves
	// the full node out.
	if _, err := h.apply(commandNodeSpace, nodeSpaceCommand{ID: "a", Full: true, Time: t0}); err != nil {
		t.Fatal(err)
	}
	last := h.state().Epochs[len(h.state().Epochs)-1]
	if !last.Members[0].Full {
		t.Fatalf("full node not recorded: %+v", last.Members)
	}
	if got := last.PlacedMembers(func(string) (Member, bool) { return Member{}, false }); len(got) != 1 || got[0].ID != "b" {
		t.Fatalf("placed members %+v, want b only", got)
	}
}

func slicesEqual(a, b []Member) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestRemoteErrorsKeepIdentity(t *testing.T) {
	for _, sentinel := range []error{ErrNoQuorum, ErrAlreadyExists, ErrNotFound, ErrLockHeld, ErrShrink} {
		remote := ErrorFromCode(ErrorCode(sentinel), "message")
		if !errors.Is(remote, sentinel) {
			t.Errorf("remote %s does not match its sentinel", ErrorCode(sentinel))
		}
		if errors.Is(remote, ErrInvalid) {
			t.Errorf("remote %s matches ErrInvalid", ErrorCode(sentinel))
		}
	}
	if ErrorCode(&LockHeldError{}) != "lock_held" {
		t.Error("LockHeldError has no lock_held code")
	}
}

func TestValidateName(t *testing.T) {
	for _, good := range []string{"vm1", "a", "debian-12.qcow", "A_b.c-d", string(bytes.Repeat([]byte("x"), MaxNameLength))} {
		if err := ValidateName(good); err != nil {
			t.Errorf("ValidateName(%q): %v", good, err)
		}
	}
	for _, bad := range []string{"", "-x", ".x", "a b", "a@b", "a/b", "é", string(bytes.Repeat([]byte("x"), MaxNameLength+1))} {
		if err := ValidateName(bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("ValidateName(%q) = %v, want ErrInvalid", bad, err)
		}
	}
}

func TestLockCommandEncoding(t *testing.T) {
	c := lockCommand{Key: "vdi/disk", Node: "0123456789abcdef", Incarnation: "inc", Session: "s", Time: t0}
	data, err := encodeCommand(commandLockAcquire, c)
	if err != nil || commandType(data[0]) != commandLockAcquire {
		t.Fatalf("encode: %v", err)
	}
	got, err := decodeLockCommand(data[1:])
	if err != nil || got != c {
		t.Fatalf("round trip: %+v %v, want %+v", got, err, c)
	}
	for cut := 0; cut < len(data)-1; cut++ {
		if _, err := decodeLockCommand(data[1 : 1+cut]); !errors.Is(err, ErrInvalid) {
			t.Fatalf("truncated to %d bytes: %v", cut, err)
		}
	}
	if _, err := decodeLockCommand(append(data[1:len(data):len(data)], 0)); !errors.Is(err, ErrInvalid) {
		t.Fatalf("trailing bytes accepted: %v", err)
	}
}

func FuzzLockCommand(f *testing.F) {
	seed, _ := encodeCommand(commandLockAcquire, lockCommand{Key: "k", Node: "n", Incarnation: "i", Session: "s", Time: t0})
	f.Add(seed[1:])
	f.Add([]byte{1, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := decodeLockCommand(data)
		if err != nil {
			return
		}
		again, err := decodeLockCommand(c.appendBinary(nil))
		if err != nil || again != c {
			t.Fatalf("re-encoding changed %+v into %+v (%v)", c, again, err)
		}
	})
}

func TestSnapshotCloneRollbackDeleteTree(t *testing.T) {
	h := newHarness(t)
	h.join("a", "", "1")
	h.apply(commandFormat, formatCommand{Copies: 1, ObjectSize: 4 << 20})
	v, err := h.apply(commandVDICreate, vdiCreateCommand{Name: "vm", Size: 1 << 30, Time: t0})
	if err != nil {
		t.Fatal(err)
	}
	original := v.(VDI).ID
	r, err := h.apply(commandVDISnapshot, vdiSnapshotCommand{Name: "vm", Tag: "s1", Time: t0})
	if err != nil {
		t.Fatal(err)
	}
	snap := r.(SnapshotResult)
	if snap.Snapshot.ID != original || !snap.Snapshot.Snapshot || snap.VDI.Parent != original || snap.VDI.ID == original {
		t.Fatalf("snapshot result: %+v", snap)
	}
	if _, err := h.apply(commandVDISnapshot, vdiSnapshotCommand{Name: "vm", Tag: "s1"}); !errors.Is(err, ErrAlreadyExists) {
		t.Fatalf("duplicate tag: %v", err)
	}
	if _, err := h.apply(commandVDISnapshot, vdiSnapshotCommand{Name: "vm", Tag: "bad@tag"}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("bad tag: %v", err)
	}
	// A snapshot expecting no writer is refused once one holds the VDI.
	h.apply(commandLockAcquire, lockCommand{Key: vdiLockKey("vm"), Node: "a", Incarnation: "1", Session: "g"})
	if _, err := h.apply(commandVDISnapshot, vdiSnapshotCommand{Name: "vm", Tag: "s2"}); !errors.Is(err, ErrBusy) {
		t.Fatalf("snapshot with a stale holder: %v", err)
	}
	if _, err := h.apply(commandVDISnapshot, vdiSnapshotCommand{Name: "vm", Tag: "s2", Holder: "a"}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.apply(commandVDIRollback, vdiRollbackCommand{Name: "vm", Tag: "s1"}); !errors.Is(err, ErrBusy) {
		t.Fatalf("rollback while open: %v", err)
	}
	h.apply(commandLockRelease, lockCommand{Key: vdiLockKey("vm"), Node: "a", Session: "g"})
	c, err := h.apply(commandVDIClone, vdiCloneCommand{Snapshot: "vm@s1", Name: "clone", Time: t0})
	if err != nil || c.(VDI).Parent != original {
		t.Fatalf("clone: %+v %v", c, err)
	}
	if _, err := h.apply(commandVDIClone, vdiCloneCommand{Snapshot: "vm", Name: "x"}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("clone of a writable vdi: %v", err)
	}
	before := h.state().VDIs["vm"].ID
	rb, err := h.apply(commandVDIRollback, vdiRollbackCommand{Name: "vm", Tag: "s1", Time: t0})
	if err != nil || rb.(VDI).Parent != original {
		t.Fatalf("rollback: %+v %v", rb, err)
	}
	if garbage := h.state().Garbage; len(garbage) != 1 || garbage[0].ID != before {
		t.Fatalf("the rolled-back vdi's objects are not garbage: %+v", garbage)
	}
	// Deleting s1 while the clone and vm depend on it keeps it, hidden.
	if _, err := h.apply(commandVDIDelete, vdiDeleteCommand{Name: "vm@s1"}); err != nil {
		t.Fatal(err)
	}
	if s := h.state().Snapshots[original]; s == nil || !s.Deleted {
		t.Fatalf("snapshot with clones was not kept: %+v", s)
	}
	if _, err := h.apply(commandVDIClone, vdiCloneCommand{Snapshot: "vm@s1", Name: "y"}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("clone of a deleted snapshot: %v", err)
	}
	// Delete everything: every id ends as garbage, the tree is empty.
	for _, name := range []string{"clone", "vm", "vm@s2"} {
		if _, err := h.apply(commandVDIDelete, vdiDeleteCommand{Name: name}); err != nil {
			t.Fatalf("delete %s: %v", name, err)
		}
	}
	st := h.state()
	if len(st.VDIs) != 0 || len(st.Snapshots) != 0 {
		t.Fatalf("tree not empty: %+v %+v", st.VDIs, st.Snapshots)
	}
	ids := map[uint32]bool{}
	for _, g := range st.Garbage {
		ids[g.ID] = true
	}
	if len(ids) != 5 { // original(s1), s2's vdi, the rolled-back one, the rollback child, clone
		t.Fatalf("garbage %+v: want 5 distinct vdis", st.Garbage)
	}
	for id := range ids {
		h.apply(commandGarbageDone, garbageDoneCommand{ID: id})
	}
	if len(h.state().Garbage) != 0 {
		t.Fatalf("garbage left: %+v", h.state().Garbage)
	}
}
