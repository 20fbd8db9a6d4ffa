package statemachine

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"
)

// The FSM decodes every log entry it applies from bytes (JSON, or the
// binary lock encoding), and a log entry is whatever a leader proposed: a
// newer or buggy binary, or a forwarded command from a follower. Applying
// any bytes must never panic, must leave the state valid (checkState), must
// refuse malformed payloads with ErrInvalid, must change nothing when it
// refuses, and must be deterministic.

// fuzzBase applies, through the FSM, a state with something of everything:
// four nodes in three zones (one dead, one full), a format, writable VDIs,
// a snapshot, a clone, a held writer lock and garbage.
func fuzzBase(t *testing.T) *harness {
	t.Helper()
	h := newHarness(t)
	for _, node := range []struct{ id, zone string }{{"a", "z1"}, {"b", "z2"}, {"c", "z3"}, {"d", "z1"}} {
		h.join(node.id, node.zone, "1")
	}
	steps := []struct {
		command commandType
		payload any
	}{
		{commandFormat, formatCommand{Copies: 2, ObjectSize: 4 << 20, Time: t0}},
		{commandVDICreate, vdiCreateCommand{Name: "vm", Size: 1 << 30, Time: t0}},
		{commandVDICreate, vdiCreateCommand{Name: "db", Size: 64 << 20, Time: t0}},
		{commandVDICreate, vdiCreateCommand{Name: "tmp", Size: 8 << 20, Time: t0}},
		{commandVDISnapshot, vdiSnapshotCommand{Name: "vm", Tag: "s1", Time: t0}},
		{commandVDIClone, vdiCloneCommand{Snapshot: "vm@s1", Name: "clone", Time: t0}},
		{commandVDIDelete, vdiDeleteCommand{Name: "tmp"}},
		{commandLockAcquire, lockCommand{Key: vdiLockKey("db"), Node: "a", Incarnation: "1", Session: "s", Time: t0}},
		{commandNodeLeave, nodeLeaveCommand{ID: "d", Reason: "killed", Time: t0}},
		{commandNodeSpace, nodeSpaceCommand{ID: "c", Full: true, Time: t0}},
	}
	for _, step := range steps {
		if _, err := h.apply(step.command, step.payload); err != nil {
			t.Fatalf("building the base state: command %d %+v: %v", step.command, step.payload, err)
		}
	}
	if err := checkState(h.state()); err != nil {
		t.Fatalf("the base state is invalid: %v", err)
	}
	return h
}

// fuzzPayloads are valid payloads of every command type against fuzzBase,
// some accepted and some refused by the state (not by the decoder).
var fuzzPayloads = map[commandType][]any{
	commandFormat:          {formatCommand{Copies: 1, ObjectSize: 4 << 20, Time: t0}},
	commandNodeJoin:        {nodeJoinCommand{Node: Node{ID: "e", Zone: "z2", Incarnation: "1", Capacity: 1 << 40}, Time: t0}, nodeJoinCommand{Node: Node{ID: "a", Incarnation: "2"}, Time: t0}, nodeJoinCommand{Node: Node{ID: "d", Incarnation: "2", Full: true}, Time: t0}},
	commandNodeLeave:       {nodeLeaveCommand{ID: "a", Reason: "killed", Time: t0}, nodeLeaveCommand{ID: "zz"}},
	commandVDICreate:       {vdiCreateCommand{Name: "new", Size: 1 << 20, Time: t0}, vdiCreateCommand{Name: "vm", Size: 1 << 20}, vdiCreateCommand{Name: "two", Size: 1 << 20, Copies: 2, Time: t0}, vdiCreateCommand{Name: "many", Size: 1 << 20, Copies: 9}},
	commandFeatureLevel:    {featureLevelCommand{Level: LevelVDICopies, Time: t0}, featureLevelCommand{Level: 1}},
	commandJoinTokenCreate: {JoinToken{ID: "j1", Hash: "h", Created: t0, Expires: t0.Add(time.Hour), Uses: 1}, JoinToken{ID: "j2", Hash: "h", Created: t0, Expires: t0}},
	commandJoinTokenRevoke: {joinTokenRevokeCommand{ID: "j1"}, joinTokenRevokeCommand{ID: "none"}},
	commandGossipKey:       {gossipKeyCommand{Op: gossipKeyStart, Key: "00112233445566ff", Node: "a", Time: t0}, gossipKeyCommand{Op: gossipKeyInstalled, Key: "00112233445566ff", Node: "b"}, gossipKeyCommand{Op: GossipKeyOpSwitch, Key: "00112233445566ff"}, gossipKeyCommand{Op: "bad", Key: "zz"}},
	commandCA:              {caCommand{Op: caStart, Fingerprint: strings.Repeat("ab", 32), Cert: []byte("not a certificate"), Node: "a", Time: t0}, caCommand{Op: caCertificate, Fingerprint: strings.Repeat("ab", 32), Node: "b", Serial: "0b"}, caCommand{Op: caFinish, Fingerprint: strings.Repeat("ab", 32), Force: true}, caCommand{Op: caCancel, Fingerprint: strings.Repeat("ab", 32)}, caCommand{Op: "bad", Fingerprint: "x"}},
	commandNodeAdmit:       {nodeAdmitCommand{ID: "h", Serial: "0c", Time: t0, JoinToken: "j1"}, nodeAdmitCommand{ID: "f", Serial: "0a1b", Time: t0}, nodeAdmitCommand{ID: "a", Serial: "ff"}, nodeAdmitCommand{ID: "g", Serial: "xyz"}},
	commandVDIDelete:       {vdiDeleteCommand{Name: "vm@s1"}, vdiDeleteCommand{Name: "clone"}, vdiDeleteCommand{Name: "db"}},
	commandVDIResize:       {vdiResizeCommand{Name: "db", Size: 128 << 20}, vdiResizeCommand{Name: "db", Size: 1 << 20}},
	commandLockAcquire:     {lockCommand{Key: vdiLockKey("vm"), Node: "b", Incarnation: "1", Session: "t", Time: t0}, lockCommand{Key: vdiLockKey("db"), Node: "b", Incarnation: "1", Session: "t"}},
	commandLockRelease:     {lockCommand{Key: vdiLockKey("db"), Node: "a", Session: "s"}, lockCommand{Key: vdiLockKey("db"), Node: "b", Session: "s"}},
	commandVDISnapshot:     {vdiSnapshotCommand{Name: "db", Tag: "s2", Holder: "a", Time: t0}, vdiSnapshotCommand{Name: "vm", Time: t0}},
	commandVDIClone:        {vdiCloneCommand{Snapshot: "vm@s1", Name: "clone2", Time: t0}, vdiCloneCommand{Snapshot: "vm@1", Name: "byid", Time: t0}},
	commandVDIRollback:     {vdiRollbackCommand{Name: "vm", Tag: "s1", Time: t0}, vdiRollbackCommand{Name: "db", Tag: "s1"}},
	commandGarbageDone:     {garbageDoneCommand{ID: 3}, garbageDoneCommand{ID: 999}}, // 3: tmp
	commandVDIRepaired:     {vdiRepairedCommand{Name: "db"}, vdiRepairedCommand{Name: "none"}},
	commandNodeSpace:       {nodeSpaceCommand{ID: "c", Full: false, Time: t0}, nodeSpaceCommand{ID: "d", Full: true}},
	commandVDIUnclean:      {vdiRepairedCommand{Name: "vm"}, vdiRepairedCommand{Name: "none"}},
	commandVDILayer:        {vdiLayerCommand{Op: layerFlatten, Name: "clone", Time: t0}, vdiLayerCommand{Op: layerMerged, ID: 3, Child: 4, Time: t0}, vdiLayerCommand{Op: layerFlattened, ID: 3, Child: 5}, vdiLayerCommand{Op: "x"}},
	commandSecurityInit:    {securityInitCommand{JoinHash: "j1", Admin: Token{ID: "t1", Name: "admin", Hash: "h1", Created: t0}}, securityInitCommand{JoinHash: "j2", Admin: Token{ID: "t2", Name: "admin", Hash: "h2"}}},
	commandTokenCreate:     {Token{ID: "t3", Name: "ops", Hash: "h3", ReadOnly: true, Created: t0}, Token{ID: "t1", Name: "dup", Hash: "h"}},
	commandTokenRevoke:     {tokenRevokeCommand{ID: "t1"}, tokenRevokeCommand{ID: "ops"}, tokenRevokeCommand{ID: "none"}},
	commandClientAdd:       {Client{Name: "vmhost", Pattern: "vm*", Serial: "ab", Created: t0}, Client{Name: "ro", Pattern: "*", ReadOnly: true, Serial: "cd"}, Client{Name: "bad", Pattern: "[", Serial: "x"}},
	commandClientRevoke:    {clientRevokeCommand{Name: "vmhost"}, clientRevokeCommand{Name: "none"}},
	commandNodeRemove:      {nodeRemoveCommand{ID: "d", Time: t0}, nodeRemoveCommand{ID: "a", Time: t0}},
	commandJoinSecretSet:   {joinSecretCommand{Hash: "j3"}},
	commandNodeSet:         {nodeSetCommand{ID: "c", Settings: NodeSettings{Capacity: ptr(uint64(1 << 30))}, Time: t0}, nodeSetCommand{ID: "c", Settings: NodeSettings{Zone: ptr("z9")}, Time: t0}, nodeSetCommand{ID: "c", Settings: NodeSettings{Reset: true}}, nodeSetCommand{ID: "c", Settings: NodeSettings{Capacity: ptr(uint64(0))}}},
	commandNodeDrain:       {nodeDrainCommand{ID: "c", Drain: true, Time: t0}, nodeDrainCommand{ID: "c", Time: t0}, nodeDrainCommand{ID: "zz", Drain: true}},
	commandLockWant:        {lockCommand{Key: vdiLockKey("db"), Node: "b", Incarnation: "1", Session: "t", Time: t0}, lockCommand{Key: vdiLockKey("vm"), Node: "b", Incarnation: "1", Session: "t"}, lockCommand{Key: vdiLockKey("db"), Node: "zz", Incarnation: "1", Session: "t"}},
	commandLockHandover:    {lockHandoverCommand{Key: vdiLockKey("db"), FromNode: "a", FromSession: "s", To: LockOwner{Node: "b", Incarnation: "1", Session: "t"}, Time: t0}, lockHandoverCommand{Key: vdiLockKey("db"), FromNode: "a", FromSession: "s", To: LockOwner{Node: "zz"}}, lockHandoverCommand{Key: vdiLockKey("vm"), FromNode: "b"}},
	commandLockBreak:       {lockBreakCommand{Key: vdiLockKey("db"), By: "admin", Time: t0}, lockBreakCommand{Key: "none"}},
	commandVDISet:          {vdiSetCommand{Name: "db", Settings: VDISettings{Exclusive: ptr(true)}}, vdiSetCommand{Name: "db", Settings: VDISettings{LimitSettings: LimitSettings{WriteIOPS: ptr[uint64](500), BPS: ptr[uint64](1 << 30)}}}, vdiSetCommand{Name: "vm@s1", Settings: VDISettings{Exclusive: ptr(true)}}, vdiSetCommand{Name: "none"}},
	commandNodeMaintenance: {nodeMaintenanceCommand{ID: "c", Until: t0.Add(time.Hour), Time: t0}, nodeMaintenanceCommand{ID: "c", Time: t0},
		nodeMaintenanceCommand{ID: "zz", Until: t0.Add(time.Hour), Time: t0}, nodeMaintenanceCommand{ID: "a", Until: t0.Add(30 * 24 * time.Hour), Time: t0}},
}

// laterPayload is a command added to the log after fuzzPayloads' golden
// encoding was fixed (TestLogEncodingUnchanged): applied, in this order,
// after fuzzPayloads, so that the lines before stay as they were.
type laterPayload struct {
	command commandType
	payload any
}

// laterPayloads: erasure-coded VDIs (LevelErasureCoding), their
// inheritance, the --ack zone refusal and the garbage record's scheme.
var laterPayloads = []laterPayload{
	{commandVDICreate, vdiCreateCommand{Name: "early-ec", Size: 1 << 20, EC: "2+1", Time: t0}}, // below the level: copies
	{commandFeatureLevel, featureLevelCommand{Level: LevelErasureCoding, Time: t0}},
	{commandVDICreate, vdiCreateCommand{Name: "ec", Size: 1 << 20, EC: "2+1", Time: t0}},
	{commandVDICreate, vdiCreateCommand{Name: "wide", Size: 1 << 20, EC: "8+3", Time: t0}},
	{commandVDICreate, vdiCreateCommand{Name: "both", Size: 1 << 20, EC: "2+1", Copies: 2, Time: t0}},
	{commandVDICreate, vdiCreateCommand{Name: "bad", Size: 1 << 20, EC: "2+0", Time: t0}},
	{commandVDISet, vdiSetCommand{Name: "ec", Settings: VDISettings{Ack: ptr(AckZone)}}},
	{commandVDISnapshot, vdiSnapshotCommand{Name: "ec", Tag: "s1", Time: t0}},
	{commandVDIClone, vdiCloneCommand{Snapshot: "ec@s1", Name: "ec-clone", Time: t0}},
	{commandVDIDelete, vdiDeleteCommand{Name: "ec-clone"}},
}

// appendEntry appends one log entry to a fuzz input: its length as a
// uvarint, then the entry.
func appendEntry(dst, entry []byte) []byte {
	return append(binary.AppendUvarint(dst, uint64(len(entry))), entry...)
}

// splitEntries cuts a fuzz input into at most 16 log entries (see
// appendEntry); a length that does not parse makes the rest one entry.
func splitEntries(data []byte) [][]byte {
	var entries [][]byte
	for len(data) > 0 && len(entries) < 16 {
		length, used := binary.Uvarint(data)
		if used <= 0 {
			return append(entries, data)
		}
		data = data[used:]
		length = min(length, uint64(len(data)))
		entries = append(entries, data[:length])
		data = data[length:]
	}
	return entries
}

func TestFSMFuzzSeedsCoverEveryCommand(t *testing.T) {
	for command := range commands {
		if len(fuzzPayloads[command]) == 0 {
			t.Errorf("command %d has no seed payload in fuzzPayloads: FuzzFSMApply would start without a valid encoding of it", command)
		}
	}
	for command := range fuzzPayloads {
		if _, ok := commands[command]; !ok {
			t.Errorf("fuzzPayloads has command %d, which Apply does not know", command)
		}
	}
}

func FuzzFSMApply(f *testing.F) {
	var sequence []byte
	// In command order, so that the seeds are the same on every run.
	for _, command := range slices.Sorted(maps.Keys(fuzzPayloads)) {
		for _, payload := range fuzzPayloads[command] {
			entry, err := encodeCommand(command, payload)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(appendEntry(nil, entry))
			sequence = appendEntry(sequence, entry)
			// Damaged copies of the valid encoding: cut short, and with
			// its last byte changed.
			f.Add(appendEntry(nil, entry[:len(entry)/2]))
			f.Add(appendEntry(nil, append(bytes.Clone(entry[:len(entry)-1]), entry[len(entry)-1]^0xff)))
		}
		for _, garbage := range []string{"", "{", "null", "[]", `{"name":5,"id":"x","copies":"2"}`, "\x01\xff\xff\xff\xff\x0f"} {
			f.Add(appendEntry(nil, append([]byte{byte(command)}, garbage...)))
		}
	}
	for _, later := range laterPayloads {
		entry, err := encodeCommand(later.command, later.payload)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(appendEntry(nil, entry))
		sequence = appendEntry(sequence, entry)
	}
	f.Add(sequence)
	f.Add(appendEntry(nil, []byte{77, '{', '}'}))                          // a command from a newer binary: halts
	f.Add(appendEntry(nil, []byte{byte(commandIgnorable | 77), '{', '}'})) // one marked ignorable: skipped
	f.Add(appendEntry(appendEntry(nil, []byte{77}), fuzzFirstEntry(f)))    // nothing applies after a halt
	f.Add(appendEntry(appendEntry(nil, nil), []byte{0}))
	f.Fuzz(func(t *testing.T, data []byte) {
		entries := splitEntries(data)
		one, batch := fuzzBase(t), fuzzBase(t)
		logs := make([]Entry, len(entries))
		results := make([]any, len(entries))
		halted := false
		for i, entry := range entries {
			before := stateJSON(t, one.fsm)
			one.index++
			logs[i] = Entry{Index: one.index, Data: entry}
			results[i] = one.fsm.ApplyEntries(logs[i : i+1])[0]
			after := stateJSON(t, one.fsm)
			if err := checkState(one.state()); err != nil {
				t.Fatalf("entry %d %q left an invalid state: %v\n%s", i, entry, err, after)
			}
			result, ok := results[i].(*Result)
			if len(entry) == 0 {
				if results[i] != nil {
					t.Fatalf("entry %d is empty but gave %+v", i, results[i])
				}
				continue
			}
			if !ok {
				t.Fatalf("entry %d %q gave %T, want *Result", i, entry, results[i])
			}
			if result.Err != nil && !bytes.Equal(before, after) {
				t.Fatalf("entry %d %q was refused (%v) but changed the state:\n%s\n%s", i, entry, result.Err, before, after)
			}
			_, known := commands[commandType(entry[0])]
			switch {
			case halted || (!known && commandType(entry[0])&commandIgnorable == 0):
				// An unknown command that is not ignorable halts the FSM:
				// it and everything after it are refused.
				if !errors.Is(result.Err, ErrIncompatible) {
					t.Fatalf("entry %d %q (halted before: %v) gave %+v, %v; want ErrIncompatible", i, entry, halted, result.Value, result.Err)
				}
				halted = true
			case malformed(entry) && !errors.Is(result.Err, ErrInvalid):
				t.Fatalf("entry %d %q is malformed but gave %+v, %v; want ErrInvalid", i, entry, result.Value, result.Err)
			}
		}
		// The same entries as one batch on another FSM: the same results
		// and the same state (map order must not matter).
		batchResults := batch.fsm.ApplyEntries(logs)
		for i := range entries {
			if got, want := resultText(t, batchResults[i]), resultText(t, results[i]); got != want {
				t.Fatalf("entry %d %q: %s applied alone, %s in a batch", i, entries[i], want, got)
			}
		}
		final := stateJSON(t, one.fsm)
		if other := stateJSON(t, batch.fsm); !bytes.Equal(final, other) {
			t.Fatalf("the same entries gave two states:\n%s\n%s", final, other)
		}
		// A snapshot of the final state restores it exactly; a halted FSM
		// takes none (its state skipped an entry).
		snapshot, err := one.fsm.Snapshot()
		if halted {
			if !errors.Is(err, ErrIncompatible) {
				t.Fatalf("snapshot of a halted FSM: %v", err)
			}
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		sink := bytes.NewBuffer(snapshot)
		restored := New()
		if err := restored.Restore(bytes.NewReader(sink.Bytes())); err != nil {
			t.Fatalf("restoring %s: %v", sink.Bytes(), err)
		}
		if again := stateJSON(t, restored); !bytes.Equal(final, again) {
			t.Fatalf("the snapshot round trip changed the state:\n%s\n%s", final, again)
		}
	})
}

// fuzzFirstEntry is a valid entry (the first seed payload's).
func fuzzFirstEntry(f *testing.F) []byte {
	command := slices.Sorted(maps.Keys(fuzzPayloads))[0]
	entry, err := encodeCommand(command, fuzzPayloads[command][0])
	if err != nil {
		f.Fatal(err)
	}
	return entry
}

// malformed reports whether an entry's payload cannot be decoded at all:
// an unknown command, invalid JSON, or a lock command that does not parse.
func malformed(entry []byte) bool {
	command, payload := commandType(entry[0]), entry[1:]
	if _, known := commands[command]; !known {
		return true
	}
	if command == commandLockAcquire || command == commandLockRelease || command == commandLockWant {
		_, err := decodeLockCommand(payload)
		return err != nil
	}
	return !json.Valid(payload)
}

func stateJSON(t *testing.T, f *FSM) []byte {
	t.Helper()
	var data []byte
	var err error
	f.View(func(s *State) { data, err = json.Marshal(s) })
	if err != nil {
		t.Fatalf("marshalling the state: %v", err)
	}
	return data
}

// resultText is what an Apply result says, for comparing two of them.
func resultText(t *testing.T, result any) string {
	t.Helper()
	r, ok := result.(*Result)
	if !ok {
		return fmt.Sprintf("%T %v", result, result)
	}
	value, err := json.Marshal(r.Value)
	if err != nil {
		t.Fatalf("marshalling a result value %+v: %v", r.Value, err)
	}
	return fmt.Sprintf("value %s, error %v", value, r.Err)
}

// checkState is State.Check (check.go), under the name the tests knew.
func checkState(s *State) error { return s.Check() }

// TestCheckStateFindsDamage checks that checkState is not vacuous: each
// damage to a valid state is reported.
func TestCheckStateFindsDamage(t *testing.T) {
	damages := map[string]struct {
		damage func(s *State)
		want   string
	}{
		"epoch missing a node": {func(s *State) {
			s.Epochs[len(s.Epochs)-1].Nodes, s.Epochs[len(s.Epochs)-1].Full = []string{"a", "b"}, nil
		}, "but the alive nodes are"},
		"zone changed, same epoch": {func(s *State) { s.Nodes["a"].Zone = "z9" }, "the node table has"},
		"drained, same epoch":      {func(s *State) { s.Nodes["a"].Draining = true }, "full or draining"},
		"lock of a dead node":      {func(s *State) { s.Locks["x"] = &Lock{Key: "x", Node: "d", Incarnation: "1"} }, "not a live member"},
		"lock of an old process":   {func(s *State) { s.Locks["x"] = &Lock{Key: "x", Node: "a", Incarnation: "0"} }, "not a live member"},
		"orphan clone":             {func(s *State) { delete(s.Snapshots, s.VDIs["clone"].Parent) }, "not an older snapshot"},
		"duplicate id":             {func(s *State) { s.VDIs["db"].ID = s.VDIs["vm"].ID }, "is both"},
		"id not handed out":        {func(s *State) { s.NextVDIID = 2 }, "the next id is 2"},
		"garbage still live":       {func(s *State) { s.Garbage = append(s.Garbage, Garbage{ID: s.VDIs["vm"].ID}) }, "live true"},
		"renamed writable vdi":     {func(s *State) { s.VDIs["other"] = s.VDIs["vm"] }, `writable vdi "other"`},
		"bad format":               {func(s *State) { s.Format.Copies = 0 }, "format"},
		"deleted without child": {func(s *State) {
			v := *s.VDIs["db"]
			v.Snapshot, v.Deleted, v.Tag = true, true, "t"
			s.Snapshots[v.ID] = &v
			delete(s.VDIs, "db")
		}, "kept without children"},
	}
	for name, test := range damages {
		t.Run(name, func(t *testing.T) {
			h := fuzzBase(t)
			test.damage(h.state())
			if err := checkState(h.state()); err == nil || !strings.Contains(err.Error(), test.want) {
				t.Fatalf("checkState = %v, want an error saying %q", err, test.want)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }
