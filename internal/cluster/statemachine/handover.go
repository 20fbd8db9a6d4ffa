package statemachine

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// Writer handover: a VDI's writer lock moves between gateways
// cooperatively, the way a live migration needs it. A gateway that wants
// to write while another holds the lock records its wish in the log
// (LockWant); the holder sees it, stops and drains its writes, flushes,
// forgets what it cached of the VDI, and hands the lock over in one entry
// (LockHandover). Every grant gets a new Generation, so a gateway can tell
// that the lock it holds is still the one it was granted. An operator can
// take a lock away from a holder that is gone (LockBreak): that entry also
// begins a new epoch, so that every replica refuses the old holder's
// writes stamped with the epoch before (the fence), and marks the VDI
// unclean, so its next writer makes its replicas identical first.
//
// An exclusive VDI (VDI.Exclusive) keeps the older rule: a second writer
// is refused while the lock is held, and a want is never recorded.

const (
	commandLockWant     commandType = 26
	commandLockHandover commandType = 27
	commandLockBreak    commandType = 28
	commandVDISet       commandType = 29
)

func init() {
	commands[commandLockWant] = applyLockWant
	commands[commandLockHandover] = applyLockHandover
	commands[commandLockBreak] = applyLockBreak
	commands[commandVDISet] = applyVDISet
}

// LockOwner is who holds or wants a lock.
type LockOwner struct {
	Node        string    `json:"node"`
	Incarnation string    `json:"incarnation"`
	Session     string    `json:"session"`
	Since       time.Time `json:"since,omitzero"`
}

// LockWant is the result of a want: the lock as it is after the entry,
// and whether the wanter holds it now.
type LockWant struct {
	Lock    Lock `json:"lock"`
	Granted bool `json:"granted"`
}

type lockHandoverCommand struct {
	Key         string    `json:"key"`
	FromNode    string    `json:"from_node"`
	FromSession string    `json:"from_session"`
	To          LockOwner `json:"to"`
	Time        time.Time `json:"time"`
}

func (c lockHandoverCommand) check() error {
	return checkLengths(lengthCheck{"lock key", c.Key, MaxLockKeyLength}, lengthCheck{"lock owner node", c.FromNode, MaxOwnerLength},
		lengthCheck{"lock session", c.FromSession, MaxOwnerLength}, lengthCheck{"lock owner node", c.To.Node, MaxOwnerLength},
		lengthCheck{"lock owner incarnation", c.To.Incarnation, MaxOwnerLength}, lengthCheck{"lock session", c.To.Session, MaxOwnerLength})
}

type lockBreakCommand struct {
	Key  string    `json:"key"`
	By   string    `json:"by"` // who asked, for the event
	Time time.Time `json:"time"`
}

func (c lockBreakCommand) check() error {
	return checkLengths(lengthCheck{"lock key", c.Key, MaxLockKeyLength}, lengthCheck{"requester", c.By, MaxOwnerLength})
}

// VDISettings are what `herd vdi set` changes; nil leaves a value as it is.
type VDISettings struct {
	Exclusive *bool `json:"exclusive,omitempty"`
	// Ack changes when writes are acknowledged: AckAll or AckZone.
	Ack *string `json:"ack,omitempty"`
	// LimitSettings change the VDI's QoS limits (qos.go).
	LimitSettings
}

// empty says whether the settings change nothing.
func (s VDISettings) empty() bool {
	return s.Exclusive == nil && s.Ack == nil && s.LimitSettings.empty()
}

// validate checks the settings.
func (s VDISettings) validate() error {
	if s.Ack != nil && *s.Ack != AckAll && *s.Ack != AckZone {
		return fmt.Errorf("%w: --ack %q: want %q (every replica has a write before it is acknowledged) or %q (the writer's zone has it; the other zones catch up before the next FLUSH completes)", ErrInvalid, *s.Ack, AckAll, AckZone)
	}
	return s.LimitSettings.validate()
}

type vdiSetCommand struct {
	Name     string      `json:"name"`
	Settings VDISettings `json:"settings"`
}

func (c vdiSetCommand) check() error {
	if err := checkLength("vdi name", c.Name, MaxNameLength); err != nil {
		return err
	}
	return c.Settings.validate()
}

// grantLock gives key to owner with the next generation.
func grantLock(s *State, key string, owner LockOwner, at time.Time) *Lock {
	s.LockGrants++
	l := &Lock{Key: key, Node: owner.Node, Incarnation: owner.Incarnation, Session: owner.Session, Acquired: at, Generation: s.LockGrants}
	s.Locks[key] = l
	return l
}

// lockedVDI returns the writable VDI a lock key guards, if any.
func lockedVDI(s *State, key string) *VDI {
	if name, ok := strings.CutPrefix(key, vdiLockKey("")); ok {
		return s.VDIs[name]
	}
	return nil
}

func liveOwner(s *State, node, incarnation string) bool {
	n, ok := s.Nodes[node]
	return ok && n.State == NodeAlive && n.Incarnation == incarnation
}

// applyLockWant grants a free lock, or records that its owner wants a
// held one (the holder hands it over). An exclusive VDI's lock is refused
// while held, as an acquire is.
func applyLockWant(s *State, data []byte) (any, error) {
	c, err := decodeLockCommand(data)
	if err != nil {
		return nil, err
	}
	if c.Key == "" || c.Node == "" {
		return nil, fmt.Errorf("%w: lock needs a key and an owner", ErrInvalid)
	}
	if !liveOwner(s, c.Node, c.Incarnation) {
		return nil, fmt.Errorf("%w: lock %q wanted by node %s which is not a live member", ErrInvalid, c.Key, c.Node)
	}
	owner := LockOwner{Node: c.Node, Incarnation: c.Incarnation, Session: c.Session, Since: c.Time}
	l, held := s.Locks[c.Key]
	switch {
	case !held:
		return LockWant{Lock: *grantLock(s, c.Key, owner, c.Time), Granted: true}, nil
	case l.Node == c.Node && l.Incarnation == c.Incarnation && l.Session == c.Session:
		return LockWant{Lock: *l, Granted: true}, nil
	}
	if v := lockedVDI(s, c.Key); v != nil && v.Exclusive {
		return nil, &LockHeldError{Lock: *l}
	}
	l.Wanted = &owner
	return LockWant{Lock: *l}, nil
}

// applyLockHandover moves a lock from its holder to the owner that wants
// it, with a new generation. A target that is no longer a live member
// gets nothing: the lock is released instead.
func applyLockHandover(s *State, data []byte) (any, error) {
	var c lockHandoverCommand
	if err := decode(data, &c); err != nil {
		return nil, err
	}
	l, ok := s.Locks[c.Key]
	if !ok {
		return nil, fmt.Errorf("lock %q %w", c.Key, ErrNotFound)
	}
	if l.Node != c.FromNode || l.Session != c.FromSession {
		return nil, fmt.Errorf("%w: lock %q is held by node %s session %s", ErrNotLockOwner, c.Key, l.Node, l.Session)
	}
	from := l.Node
	if !liveOwner(s, c.To.Node, c.To.Incarnation) {
		delete(s.Locks, c.Key)
		s.note("lock", "lock %q released by node %s: the node that wanted it (%s) is gone", c.Key, from, c.To.Node)
		return LockWant{}, nil
	}
	next := grantLock(s, c.Key, c.To, c.Time)
	if v := lockedVDI(s, c.Key); v != nil {
		v.Handovers++
		s.note("lock", "the writer lock on vdi %q moved from node %s to node %s (handover %d)", v.Name, from, c.To.Node, v.Handovers)
	}
	return LockWant{Lock: *next, Granted: true}, nil
}

// applyLockBreak takes a lock away from its holder, whatever it is doing:
// a new epoch fences the holder's writes in flight (every replica refuses
// the epoch before), and the VDI is unclean until its next writer makes
// its replicas identical.
func applyLockBreak(s *State, data []byte) (any, error) {
	var c lockBreakCommand
	if err := decode(data, &c); err != nil {
		return nil, err
	}
	l, ok := s.Locks[c.Key]
	if !ok {
		return nil, fmt.Errorf("lock %q %w: nothing to unlock", c.Key, ErrNotFound)
	}
	broken := *l
	delete(s.Locks, c.Key)
	what := fmt.Sprintf("lock %q", c.Key)
	if v := lockedVDI(s, c.Key); v != nil {
		v.Unclean = true
		v.BrokenGeneration = broken.Generation
		what = fmt.Sprintf("the writer lock on vdi %q", v.Name)
	}
	newEpoch(s, c.Time, fmt.Sprintf("%s was broken by %s (held by node %s since %s): the holder's writes are fenced", what, c.By, broken.Node, broken.Acquired.UTC().Format(time.RFC3339)))
	return broken, nil
}

func applyVDISet(s *State, data []byte) (any, error) {
	var c vdiSetCommand
	if err := decode(data, &c); err != nil {
		return nil, err
	}
	v, ok := s.VDIs[c.Name]
	if !ok {
		if _, err := s.lookup(c.Name); err == nil {
			return nil, fmt.Errorf("%w: vdi %q is a snapshot: its settings cannot change", ErrInvalid, c.Name)
		}
		return nil, fmt.Errorf("vdi %q: %w", c.Name, ErrNotFound)
	}
	if c.Settings.Ack != nil && *c.Settings.Ack == AckZone && v.EC != "" {
		// Acknowledging in the writer's zone leaves the other zones'
		// replicas behind until the next FLUSH; an erasure-coded VDI's
		// chunks are spread over the zones by design, and its write
		// needs every chunk it changes.
		return nil, fmt.Errorf("%w: vdi %q is erasure-coded (%s): --ack zone needs copies", ErrInvalid, v.Name, v.EC)
	}
	if c.Settings.Exclusive != nil {
		v.Exclusive = *c.Settings.Exclusive
		if v.Exclusive {
			if l, held := s.Locks[vdiLockKey(v.Name)]; held {
				l.Wanted = nil
			}
		}
	}
	if c.Settings.Ack != nil {
		v.Ack = *c.Settings.Ack
		if v.Ack == AckAll {
			v.Ack = ""
		}
	}
	c.Settings.LimitSettings.apply(&v.Limits)
	return *v, nil
}

// WaitLock waits until done, called with key's lock as this node has
// applied it (held false when free), returns true, and returns that lock.
func (c *Reads) WaitLock(ctx context.Context, key string, done func(l Lock, held bool) bool) (Lock, bool, error) {
	for {
		changed := c.fsm.Changes()
		l, held := c.Lock(key)
		if done(l, held) {
			return l, held, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return l, held, ctx.Err()
		}
	}
}
