package statemachine

import (
	"errors"
	"runtime"
	"strings"
	"testing"
)

// Every string a command carries has a limit, and a command that breaks
// one is refused where it is applied (by every node alike: nothing
// changes) and where it is proposed (nothing enters the log), with an
// error that says which string and how long.
func TestCommandLengthLimits(t *testing.T) {
	long := func(n int) string { return strings.Repeat("x", n) }
	cases := []struct {
		name    string
		command commandType
		payload any
		message string // in the error
	}{
		{"lock key", commandLockAcquire, lockCommand{Key: long(5000), Node: "a", Incarnation: "1", Session: "s", Time: t0}, "lock key of 5000 bytes: at most 256"},
		{"lock session", commandLockAcquire, lockCommand{Key: "k", Node: "a", Incarnation: "1", Session: long(129), Time: t0}, "lock session of 129 bytes: at most 128"},
		{"lock owner", commandLockAcquire, lockCommand{Key: "k", Node: long(200), Incarnation: "1", Session: "s", Time: t0}, "lock owner node of 200 bytes: at most 128"},
		{"lock release key", commandLockRelease, lockCommand{Key: long(257), Node: "a", Session: "s"}, "lock key of 257 bytes: at most 256"},
		{"node id", commandNodeJoin, nodeJoinCommand{Node: Node{ID: long(129), Incarnation: "1"}, Time: t0}, "node id of 129 bytes: at most 128"},
		{"node zone", commandNodeJoin, nodeJoinCommand{Node: Node{ID: "e", Zone: long(1000), Incarnation: "1"}, Time: t0}, "node zone of 1000 bytes: at most 128"},
		{"node address", commandNodeJoin, nodeJoinCommand{Node: Node{ID: "e", AdminAddr: long(301), Incarnation: "1"}, Time: t0}, "node admin address of 301 bytes: at most 300"},
		{"leave reason", commandNodeLeave, nodeLeaveCommand{ID: "b", Reason: long(1025), Time: t0}, "reason of 1025 bytes: at most 1024"},
		{"create name", commandVDICreate, vdiCreateCommand{Name: long(129), Size: 1 << 20, Time: t0}, "vdi name of 129 bytes: at most 128"},
		{"delete name", commandVDIDelete, vdiDeleteCommand{Name: long(300)}, "vdi name of 300 bytes: at most 257"},
		{"resize name", commandVDIResize, vdiResizeCommand{Name: long(129), Size: 1 << 30}, "vdi name of 129 bytes: at most 128"},
		{"snapshot tag", commandVDISnapshot, vdiSnapshotCommand{Name: "vm", Tag: long(129), Time: t0}, "snapshot tag of 129 bytes: at most 128"},
		{"snapshot holder", commandVDISnapshot, vdiSnapshotCommand{Name: "vm", Holder: long(129), Time: t0}, "lock holder of 129 bytes: at most 128"},
		{"clone source", commandVDIClone, vdiCloneCommand{Snapshot: "vm@" + long(300), Name: "c2", Time: t0}, "snapshot name of 303 bytes: at most 257"},
		{"rollback tag", commandVDIRollback, vdiRollbackCommand{Name: "vm", Tag: long(129), Time: t0}, "snapshot tag of 129 bytes: at most 128"},
		{"repaired name", commandVDIRepaired, vdiRepairedCommand{Name: long(129)}, "vdi name of 129 bytes: at most 128"},
		{"space node", commandNodeSpace, nodeSpaceCommand{ID: long(129), Full: true, Time: t0}, "node id of 129 bytes: at most 128"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := fuzzBase(t)
			before := stateJSON(t, h.fsm)
			_, err := h.apply(c.command, c.payload)
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.message) {
				t.Fatalf("apply: %v, want invalid: %q", err, c.message)
			}
			if after := stateJSON(t, h.fsm); string(after) != string(before) {
				t.Fatal("a refused command changed the state")
			}
			if _, err := encodeProposal(c.command, c.payload); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.message) {
				t.Fatalf("proposal: %v, want invalid: %q", err, c.message)
			}
		})
	}
	// At the limits, a lock is taken.
	h := fuzzBase(t)
	h.join(long(MaxOwnerLength), "z1", long(MaxOwnerLength))
	if _, err := h.apply(commandLockAcquire, lockCommand{Key: long(MaxLockKeyLength), Node: long(MaxOwnerLength), Incarnation: long(MaxOwnerLength), Session: long(MaxOwnerLength), Time: t0}); err != nil {
		t.Fatalf("a lock at every limit: %v", err)
	}
	if err := checkState(h.state()); err != nil {
		t.Fatal(err)
	}
}

// The binary lock decoder refuses a long field before it makes the
// string: refusing ten 1 MiB keys allocates far less than 1 MiB.
func TestLockDecoderRefusesLongFields(t *testing.T) {
	data := lockCommand{Key: strings.Repeat("k", 1<<20), Node: "a"}.appendBinary(nil)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range 10 {
		if _, err := decodeLockCommand(data); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "lock key of 1048576 bytes") {
			t.Fatalf("decode: %v", err)
		}
	}
	runtime.ReadMemStats(&after)
	if allocated := after.TotalAlloc - before.TotalAlloc; allocated > 1<<20 {
		t.Fatalf("refusing 10 long keys allocated %d bytes", allocated)
	}
}
