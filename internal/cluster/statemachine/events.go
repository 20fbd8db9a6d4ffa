package statemachine

import (
	"encoding/json"
	"fmt"
	"time"
)

// Event is one thing that happened to the cluster, in words: an epoch
// (a node joined, left, filled up), a writer lock taken away, a VDI made,
// changed or repaired, a credential issued or revoked. Events are part of
// the replicated state: the FSM derives them from the entries it applies,
// so every node holds the same history (`herd events`).
type Event struct {
	Index uint64    `json:"index"` // the log entry that made it
	Time  time.Time `json:"time"`  // when the leader appended that entry
	Kind  string    `json:"kind"`  // epoch, node, lock, vdi, cluster, credentials
	Text  string    `json:"text"`
}

// MaxEvents is how many events the state keeps (the newest); older ones
// are dropped as new ones come (a few hundred bytes each).
const MaxEvents = 2000

// note records an event of the entry being applied; ApplyBatch stamps it
// with the entry's index and time once the entry applied without error.
func (s *State) note(kind, format string, args ...any) {
	s.pending = append(s.pending, Event{Kind: kind, Text: fmt.Sprintf(format, args...)})
}

// commitEvents stamps the pending events of entry index (appended at) and
// keeps them, dropping the oldest beyond MaxEvents (in steps of a quarter,
// so that trimming costs one copy per MaxEvents/4 events).
func (s *State) commitEvents(index uint64, at time.Time) {
	for _, e := range s.pending {
		e.Index, e.Time = index, at
		s.Events = append(s.Events, e)
	}
	s.pending = s.pending[:0]
	if len(s.Events) > MaxEvents+MaxEvents/4 {
		s.Events = append([]Event(nil), s.Events[len(s.Events)-MaxEvents:]...)
	}
}

// describe notes the event of a command that applied (value is what its
// apply returned). Commands whose events depend on what they changed
// (epochs, locks taken away, restarts) note them where they change it;
// lock acquire and release, the most frequent entries, note nothing.
func describe(s *State, t commandType, data []byte, value any) {
	switch t {
	case commandFormat:
		if f, ok := value.(Format); ok {
			s.note("cluster", "cluster formatted: %d copies, %d KiB objects", f.Copies, f.ObjectSize>>10)
		}
	case commandVDICreate:
		var c vdiCreateCommand
		if v, ok := value.(VDI); ok && v.EC != "" {
			s.note("vdi", "vdi %q created (%d bytes, erasure coding %s)", v.Name, v.Size, v.EC)
		} else if json.Unmarshal(data, &c) == nil {
			s.note("vdi", "vdi %q created (%d bytes)", c.Name, c.Size)
		}
	case commandVDIDelete:
		var c vdiDeleteCommand
		if json.Unmarshal(data, &c) == nil {
			s.note("vdi", "vdi %q deleted", c.Name)
		}
	case commandVDIResize:
		var c vdiResizeCommand
		if json.Unmarshal(data, &c) == nil {
			s.note("vdi", "vdi %q resized to %d bytes", c.Name, c.Size)
		}
	case commandVDISnapshot:
		var c vdiSnapshotCommand
		if json.Unmarshal(data, &c) == nil {
			s.note("vdi", "vdi %q snapshotted as %s@%s", c.Name, c.Name, c.Tag)
		}
	case commandVDIClone:
		var c vdiCloneCommand
		if json.Unmarshal(data, &c) == nil {
			s.note("vdi", "vdi %q cloned from %s", c.Name, c.Snapshot)
		}
	case commandVDIRollback:
		var c vdiRollbackCommand
		if json.Unmarshal(data, &c) == nil {
			s.note("vdi", "vdi %q rolled back to %s@%s", c.Name, c.Name, c.Tag)
		}
	case commandVDIRepaired:
		var c vdiRepairedCommand
		if json.Unmarshal(data, &c) == nil {
			s.note("vdi", "vdi %q repaired: its replicas are identical again", c.Name)
		}
	case commandVDIUnclean:
		var c vdiRepairedCommand
		if json.Unmarshal(data, &c) == nil {
			s.note("vdi", "vdi %q marked unclean: a change reached only some replicas; its next writer makes them identical first", c.Name)
		}
	case commandTokenCreate:
		if tok, ok := value.(Token); ok {
			s.note("credentials", "admin token %q created (%s)", tok.Name, access(tok.ReadOnly))
		}
	case commandTokenRevoke:
		if tok, ok := value.(Token); ok {
			s.note("credentials", "admin token %q revoked", tok.Name)
		}
	case commandClientAdd:
		if c, ok := value.(Client); ok {
			s.note("credentials", "NBD client %q added for vdis %q (%s)", c.Name, c.Pattern, access(c.ReadOnly))
		}
	case commandClientRevoke:
		if c, ok := value.(Client); ok {
			s.note("credentials", "NBD client %q revoked", c.Name)
		}
	case commandNodeRemove:
		var c nodeRemoveCommand
		if json.Unmarshal(data, &c) == nil {
			s.note("node", "node %s removed for good: its certificate is refused from now on", c.ID)
		}
	case commandJoinSecretSet:
		s.note("credentials", "join token rotated: the old one no longer admits nodes")
	}
}

func access(readOnly bool) string {
	if readOnly {
		return "read-only"
	}
	return "read-write"
}
