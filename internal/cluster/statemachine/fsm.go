package statemachine

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/herd-storage/herd/internal/invariants"
)

// commandType is the first byte of every log entry; Apply dispatches on it
// through the commands table (as Consul does with its message types).
type commandType byte

const (
	commandFormat      commandType = 1
	commandNodeJoin    commandType = 2
	commandNodeLeave   commandType = 3
	commandVDICreate   commandType = 4
	commandVDIDelete   commandType = 5
	commandVDIResize   commandType = 6
	commandLockAcquire commandType = 7
	commandLockRelease commandType = 8
	commandVDISnapshot commandType = 9
	commandVDIClone    commandType = 10
	commandVDIRollback commandType = 11
	commandGarbageDone commandType = 12
	commandVDIRepaired commandType = 13
	commandNodeSpace   commandType = 14
	commandVDIUnclean  commandType = 22 // 15-21: security.go

	// commandIgnorable marks a command type that a binary which does not
	// know it may skip: the command changes nothing that the other
	// commands, or the data path, depend on. A binary that meets an
	// unknown command without this bit stops applying the log (as Consul
	// does with its IgnoreUnknownTypeFlag), because applying the rest
	// without it would make its state differ from the nodes that know it.
	commandIgnorable commandType = 0x80
)

// Command payloads. Time is stamped by the proposer so that Apply stays
// deterministic: the FSM never reads the clock.
type (
	formatCommand struct {
		Copies     int       `json:"copies"`
		ObjectSize uint64    `json:"object_size"`
		Time       time.Time `json:"time"`
	}
	nodeJoinCommand struct {
		Node Node      `json:"node"`
		Time time.Time `json:"time"`
	}
	nodeLeaveCommand struct {
		ID     string    `json:"id"`
		Reason string    `json:"reason"`
		Time   time.Time `json:"time"`
	}
	vdiCreateCommand struct {
		Name      string    `json:"name"`
		Size      uint64    `json:"size"`
		Exclusive bool      `json:"exclusive,omitempty"`
		Time      time.Time `json:"time"`
		// Copies is the VDI's own number of copies (0: the cluster's).
		// Gated by FeatureVDICopies: below its level the field is
		// ignored, as older binaries (which drop it) do.
		Copies int `json:"copies,omitempty"`
		// EC is the VDI's erasure-coding scheme, "K+M" ("": copies).
		// Gated by FeatureErasureCoding: below its level the field is
		// ignored, as older binaries (which drop it) do.
		EC string `json:"ec,omitempty"`
	}
	vdiDeleteCommand struct {
		Name string `json:"name"`
	}
	vdiRepairedCommand struct {
		Name string `json:"name"`
	}
	nodeSpaceCommand struct {
		ID   string    `json:"id"`
		Full bool      `json:"full"`
		Time time.Time `json:"time"`
	}
	vdiResizeCommand struct {
		Name string `json:"name"`
		Size uint64 `json:"size"`
	}
	vdiSnapshotCommand struct {
		Name string `json:"name"`
		Tag  string `json:"tag"`
		// Holder is the node the proposer saw holding the VDI's write
		// lock ("" for none). The snapshot is refused if that changed:
		// a writer that opened meanwhile has not paused its writes, so
		// the cut would not be exact.
		Holder string    `json:"holder"`
		Time   time.Time `json:"time"`
	}
	vdiCloneCommand struct {
		Snapshot string    `json:"snapshot"` // NAME@TAG
		Name     string    `json:"name"`
		Time     time.Time `json:"time"`
	}
	vdiRollbackCommand struct {
		Name string    `json:"name"`
		Tag  string    `json:"tag"`
		Time time.Time `json:"time"`
	}
	garbageDoneCommand struct {
		ID uint32 `json:"id"`
	}
	lockCommand struct {
		Key         string    `json:"key"`
		Node        string    `json:"node"`
		Incarnation string    `json:"incarnation"`
		Session     string    `json:"session"`
		Time        time.Time `json:"time"`
	}
)

// binaryCommand is implemented by hot commands that skip JSON: lock
// acquire/release are the most frequent entries, and decoding JSON on
// every node for every entry cost 12-16% of each node's CPU
// (docs/BENCHMARKS.md).
type binaryCommand interface {
	appendBinary(dst []byte) []byte
}

// checker is implemented by command payloads that carry strings: check
// refuses one longer than the log keeps (state.go, MaxLockKeyLength and
// the others). Apply runs it after decoding; encodeProposal before a
// command is proposed.
type checker interface {
	check() error
}

func (c nodeJoinCommand) check() error { return CheckNodeLengths(c.Node) }

func (c nodeLeaveCommand) check() error {
	return checkLengths(lengthCheck{"node id", c.ID, MaxOwnerLength}, lengthCheck{"reason", c.Reason, MaxReasonLength})
}

func (c vdiCreateCommand) check() error { return checkLength("vdi name", c.Name, MaxNameLength) }

func (c vdiDeleteCommand) check() error { return checkLength("vdi name", c.Name, maxFullNameLength) }

func (c vdiRepairedCommand) check() error { return checkLength("vdi name", c.Name, MaxNameLength) }

func (c nodeSpaceCommand) check() error { return checkLength("node id", c.ID, MaxOwnerLength) }

func (c vdiResizeCommand) check() error { return checkLength("vdi name", c.Name, MaxNameLength) }

func (c vdiSnapshotCommand) check() error {
	return checkLengths(lengthCheck{"vdi name", c.Name, MaxNameLength}, lengthCheck{"snapshot tag", c.Tag, MaxNameLength},
		lengthCheck{"lock holder", c.Holder, MaxOwnerLength})
}

func (c vdiCloneCommand) check() error {
	return checkLengths(lengthCheck{"snapshot name", c.Snapshot, maxFullNameLength}, lengthCheck{"vdi name", c.Name, MaxNameLength})
}

func (c vdiRollbackCommand) check() error {
	return checkLengths(lengthCheck{"vdi name", c.Name, MaxNameLength}, lengthCheck{"snapshot tag", c.Tag, MaxNameLength})
}

func (c lockCommand) check() error {
	return checkLengths(lengthCheck{"lock key", c.Key, MaxLockKeyLength}, lengthCheck{"lock owner node", c.Node, MaxOwnerLength},
		lengthCheck{"lock owner incarnation", c.Incarnation, MaxOwnerLength}, lengthCheck{"lock session", c.Session, MaxOwnerLength})
}

// encodeProposal is encodeCommand for a command about to be proposed: it
// first refuses a command whose apply would refuse it for its lengths,
// so that nothing oversized enters the log and the caller learns why.
func encodeProposal(t commandType, payload any) ([]byte, error) {
	if c, ok := payload.(checker); ok {
		if err := c.check(); err != nil {
			return nil, err
		}
	}
	return encodeCommand(t, payload)
}

func encodeCommand(t commandType, payload any) ([]byte, error) {
	if bc, ok := payload.(binaryCommand); ok {
		return bc.appendBinary([]byte{byte(t)}), nil
	}
	var b bytes.Buffer
	b.WriteByte(byte(t))
	if err := json.NewEncoder(&b).Encode(payload); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// Result is what FSM.ApplyEntries returns for every entry with data.
type Result struct {
	Value any
	Err   error
}

type applyFunc func(s *State, data []byte) (any, error)

var commands = map[commandType]applyFunc{
	commandFormat:      applyFormat,
	commandNodeJoin:    applyNodeJoin,
	commandNodeLeave:   applyNodeLeave,
	commandVDICreate:   applyVDICreate,
	commandVDIDelete:   applyVDIDelete,
	commandVDIResize:   applyVDIResize,
	commandLockAcquire: applyLockAcquire,
	commandLockRelease: applyLockRelease,
	commandVDISnapshot: applyVDISnapshot,
	commandVDIClone:    applyVDIClone,
	commandVDIRollback: applyVDIRollback,
	commandGarbageDone: applyGarbageDone,
	commandVDIRepaired: applyVDIRepaired,
	commandNodeSpace:   applyNodeSpace,
	commandVDIUnclean:  applyVDIUnclean,
}

// FSM is the replicated state machine. Apply must be deterministic and
// produce the same result on all nodes (hashicorp/raft's FSM contract): it
// depends only on the State and the entry, never on the clock or the node.
// Readers use View; ApplyEntries, Snapshot and Restore are called by the
// log only (internal/cluster's raft.FSM adapter, or the simulation's
// log), from one goroutine.
type FSM struct {
	mu    sync.RWMutex // guards state and epochIndex
	state *State
	// epochIndex is the log index of the entry that began the newest
	// epoch (0: it came with a snapshot). Writes in an epoch wait until
	// every node serving data has applied it (lease.go).
	epochIndex uint64
	// OnNodeChange, if set, is called (without mu) after node table
	// changes. Set it before the first entry is applied.
	OnNodeChange func()
	// OnHalt, if set, is called once (without mu) when the FSM meets a
	// command it cannot apply without diverging from other nodes
	// (halted). Set it before the first entry is applied.
	OnHalt func(error)
	// halted (guarded by mu), once set, is why this FSM applies no more
	// entries and takes no snapshot.
	halted error
	// unchecked (guarded by mu) counts the entries applied since the
	// state was last checked (build tag invariants; checkBudget).
	unchecked int

	waitMu  sync.Mutex // guards applied and waiters
	applied uint64
	waiters map[uint64][]chan struct{} // closed once applied >= key

	epochMu      sync.Mutex    // guards the fields below
	epochChanged chan struct{} // closed and replaced whenever the epoch changes
	changed      chan struct{} // closed and replaced after every applied batch
	// epochCtx ends when an epoch other than epochNumber is signalled
	// (epochContext), so that a round of requests can end with its epoch
	// without a goroutine waiting for it (layout.Scoped).
	epochCtx    context.Context
	epochCancel context.CancelFunc
	epochNumber uint64
}

// New returns the state machine of an empty log.
func New() *FSM {
	f := &FSM{state: newState(), waiters: map[uint64][]chan struct{}{}, epochChanged: make(chan struct{}), changed: make(chan struct{})}
	f.epochCtx, f.epochCancel = context.WithCancel(context.Background())
	return f
}

// lastEpoch is the number of the newest epoch in the state (0: none).
func (f *FSM) LastEpoch() uint64 {
	f.mu.RLock()
	defer f.mu.RUnlock()
	if n := len(f.state.Epochs); n > 0 {
		return f.state.Epochs[n-1].Number
	}
	return 0
}

// epochContext returns the epoch signalled last and a context that ends
// when another is. The state may already hold a newer epoch that is not
// signalled yet; its signal follows and ends the context.
func (f *FSM) EpochContext() (context.Context, uint64) {
	f.epochMu.Lock()
	defer f.epochMu.Unlock()
	return f.epochCtx, f.epochNumber
}

// EpochChanged returns a channel closed when the epoch next changes (or
// the node table does: signalEpoch).
func (f *FSM) EpochChanged() <-chan struct{} {
	f.epochMu.Lock()
	defer f.epochMu.Unlock()
	return f.epochChanged
}

// Changes returns a channel closed after the next applied batch.
func (f *FSM) Changes() <-chan struct{} {
	f.epochMu.Lock()
	defer f.epochMu.Unlock()
	return f.changed
}

func (f *FSM) signalChange() {
	f.epochMu.Lock()
	close(f.changed)
	f.changed = make(chan struct{})
	f.epochMu.Unlock()
}

func (f *FSM) signalEpoch() {
	f.epochMu.Lock() // lock order: epochMu > mu (lastEpoch)
	close(f.epochChanged)
	f.epochChanged = make(chan struct{})
	if n := f.LastEpoch(); n != f.epochNumber {
		f.epochCancel()
		f.epochCtx, f.epochCancel = context.WithCancel(context.Background())
		f.epochNumber = n
	}
	f.epochMu.Unlock()
}

// epochStart returns the newest epoch and the index of the entry that
// began it (0: unknown, it came with a snapshot).
func (f *FSM) EpochStart() (epoch, index uint64) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	if n := len(f.state.Epochs); n > 0 {
		epoch = f.state.Epochs[n-1].Number
	}
	return epoch, f.epochIndex
}

// View calls fn with the current state under the read lock; fn must not
// keep references to it.
func (f *FSM) View(fn func(s *State)) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	fn(f.state)
}

// Entry is one committed log entry: its index, its data (a command type
// byte and its payload; nil for an entry that is no command, such as
// raft's configuration changes, which only advances the applied index)
// and the time the leader appended it.
type Entry struct {
	Index uint64
	Data  []byte
	Time  time.Time
}

// ApplyEntries applies a batch of committed entries, in order, and
// returns each one's *Result (nil for an entry without data): one lock
// and one wake-up per batch instead of per entry.
func (f *FSM) ApplyEntries(entries []Entry) []any {
	results := make([]any, len(entries))
	nodesChanged := false
	var halt error
	f.mu.Lock()
	for i, entry := range entries {
		if len(entry.Data) == 0 {
			continue
		}
		t := commandType(entry.Data[0])
		fn, ok := commands[t]
		result := &Result{}
		switch {
		case f.halted != nil:
			result.Err = f.halted
		case !ok && t&commandIgnorable != 0:
			// A newer binary's command that older ones may skip.
			result.Err = fmt.Errorf("%w: log command %d is unknown to this binary and marked ignorable: skipped", ErrInvalid, t)
		case !ok:
			// A newer binary committed a command this one does not know.
			// Going on without it would leave this node's state different
			// from those that applied it: stop here instead.
			f.halted = fmt.Errorf("%w: log entry %d is command %d, which this herd binary does not know (a newer herd committed it); this node stops applying the log rather than diverge from the nodes that know it: upgrade herd on this node", ErrIncompatible, entry.Index, t)
			result.Err, halt = f.halted, f.halted
		default:
			before := len(f.state.Epochs)
			result.Value, result.Err = fn(f.state, entry.Data[1:])
			if result.Err == nil {
				describe(f.state, t, entry.Data[1:], result.Value)
				f.state.commitEvents(entry.Index, entry.Time)
			} else {
				f.state.pending = f.state.pending[:0]
			}
			if len(f.state.Epochs) != before {
				f.epochIndex = entry.Index
			}
			nodesChanged = nodesChanged || len(f.state.Epochs) != before || t == commandNodeJoin
			if invariants.Enabled {
				f.unchecked++
				if n := f.unchecked; n*checkBudget >= f.state.size() {
					f.unchecked = 0
					if err := f.state.Check(); err != nil {
						invariants.Fail("cluster state after log entry %d (command %d, error %v; the %d entries before it unchecked): %v", entry.Index, t, result.Err, n-1, err)
					}
				}
			}
		}
		results[i] = result
	}
	f.mu.Unlock()
	if halt != nil && f.OnHalt != nil {
		f.OnHalt(halt)
	}
	if len(entries) > 0 {
		f.setApplied(entries[len(entries)-1].Index)
		f.signalChange()
	}
	if nodesChanged {
		f.signalEpoch()
		if f.OnNodeChange != nil {
			f.OnNodeChange()
		}
	}
	return results
}

func (f *FSM) setApplied(index uint64) {
	f.waitMu.Lock()
	defer f.waitMu.Unlock()
	if index <= f.applied {
		return
	}
	f.applied = index
	for want, chans := range f.waiters {
		if want <= index {
			for _, ch := range chans {
				close(ch)
			}
			delete(f.waiters, want)
		}
	}
}

// Applied is the index of the last entry applied.
func (f *FSM) Applied() uint64 {
	f.waitMu.Lock()
	defer f.waitMu.Unlock()
	return f.applied
}

// WaitApplied blocks until the FSM has applied index or ctx ends.
func (f *FSM) WaitApplied(ctx context.Context, index uint64) error {
	f.waitMu.Lock()
	if f.applied >= index {
		f.waitMu.Unlock()
		return nil
	}
	ch := make(chan struct{})
	f.waiters[index] = append(f.waiters[index], ch)
	f.waitMu.Unlock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Snapshot returns the state as a snapshot's bytes (JSON); Restore reads
// them back.
func (f *FSM) Snapshot() ([]byte, error) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	if f.halted != nil {
		return nil, f.halted // a state that skipped an entry is never persisted
	}
	data, err := json.Marshal(f.state)
	if err != nil {
		return nil, err
	}
	return data, nil
}

// Restore replaces the state with a snapshot's (Snapshot's bytes).
func (f *FSM) Restore(reader io.Reader) error {
	s := newState()
	if err := json.NewDecoder(reader).Decode(s); err != nil {
		return fmt.Errorf("cluster: restore snapshot: %w", err)
	}
	if s.Nodes == nil {
		s.Nodes = map[string]*Node{}
	}
	if s.VDIs == nil {
		s.VDIs = map[string]*VDI{}
	}
	if s.Locks == nil {
		s.Locks = map[string]*Lock{}
	}
	if s.Snapshots == nil {
		s.Snapshots = map[uint32]*VDI{}
	}
	if s.Tokens == nil {
		s.Tokens = map[string]*Token{}
	}
	if s.Clients == nil {
		s.Clients = map[string]*Client{}
	}
	if s.Removed == nil {
		s.Removed = map[string]time.Time{}
	}
	if invariants.Enabled {
		if err := s.Check(); err != nil {
			invariants.Fail("cluster state restored from a snapshot: %v", err)
		}
	}
	f.mu.Lock()
	f.state, f.epochIndex = s, 0
	f.mu.Unlock()
	f.signalEpoch()
	if f.OnNodeChange != nil {
		f.OnNodeChange()
	}
	return nil
}

// decode decodes a JSON command and checks its lengths (checker).
func decode(data []byte, v any) error {
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("%w: malformed log entry: %v", ErrInvalid, err)
	}
	if c, ok := v.(checker); ok { // *T has T's check
		return c.check()
	}
	return nil
}

func applyFormat(s *State, data []byte) (any, error) {
	var c formatCommand
	if err := decode(data, &c); err != nil {
		return nil, err
	}
	if s.Format != nil {
		return nil, fmt.Errorf("%w (copies %d, object size %d bytes, on %s); formatting again would lose every vdi",
			ErrAlreadyFormatted, s.Format.Copies, s.Format.ObjectSize, s.Format.Created.UTC().Format(time.RFC3339))
	}
	if err := validateFormat(c.Copies, c.ObjectSize); err != nil {
		return nil, err
	}
	if err := checkCopiesPlaceable(s, c.Copies); err != nil {
		return nil, err
	}
	s.Format = &Format{Copies: c.Copies, ObjectSize: c.ObjectSize, Created: c.Time}
	return *s.Format, nil
}

func validateCopies(copies int) error {
	if copies < 1 || copies > MaxCopies {
		return fmt.Errorf("%w: copies must be between 1 and %d, not %d", ErrInvalid, MaxCopies, copies)
	}
	return nil
}

func validateFormat(copies int, objectSize uint64) error {
	if err := validateCopies(copies); err != nil {
		return err
	}
	if objectSize < MinObjectSize || objectSize > MaxObjectSize || objectSize&(objectSize-1) != 0 {
		return fmt.Errorf("%w: object size must be a power of two between 64 KiB and 256 MiB, not %d bytes", ErrInvalid, objectSize)
	}
	return nil
}

// checkCopiesPlaceable refuses a number of copies the alive nodes (or
// zones, when zones are used) cannot hold on distinct failure domains.
func checkCopiesPlaceable(s *State, copies int) error {
	alive := s.AliveNodes()
	zones := map[string]bool{}
	zoned := false
	for _, id := range alive {
		zones[s.Nodes[id].Zone] = true
		if s.Nodes[id].Zone != "" {
			zoned = true
		}
	}
	if zoned && copies > len(zones) {
		return fmt.Errorf("%w: %d copies need %d zones, the cluster has %d alive zones", ErrTooFewNodes, copies, copies, len(zones))
	}
	if copies > len(alive) {
		return fmt.Errorf("%w: %d copies need %d nodes, the cluster has %d alive nodes (start more nodes, or format with fewer copies)", ErrTooFewNodes, copies, copies, len(alive))
	}
	return nil
}

func applyNodeJoin(s *State, data []byte) (any, error) {
	var c nodeJoinCommand
	if err := decode(data, &c); err != nil {
		return nil, err
	}
	n := c.Node
	if n.ID == "" {
		return nil, fmt.Errorf("%w: node join without id", ErrInvalid)
	}
	if _, removed := s.Removed[n.ID]; removed {
		return nil, fmt.Errorf("%w: node %s was removed from the cluster for good", ErrUnauthorized, n.ID)
	}
	if _, admitted := s.Admitted[n.ID]; !admitted && s.Level() >= LevelSecurity {
		return nil, fmt.Errorf("%w: node %s was never admitted (admission.go)", ErrUnauthorized, n.ID)
	}
	old, existed := s.Nodes[n.ID]
	if existed && old.Incarnation != n.Incarnation {
		// The node restarted: whatever its previous process held is gone.
		if old.State == NodeAlive {
			s.note("node", "node %s (%s) restarted: a new process", n.ID, n.Address)
		}
		releaseLocks(s, "its node "+n.ID+" restarted", func(l *Lock) bool { return l.Node == n.ID && l.Incarnation != n.Incarnation })
	}
	wasAlive := existed && old.State == NodeAlive
	if existed {
		n.Full = old.Full // the node clears it itself, with a new epoch
		n.MaintenanceUntil, n.Stopped = old.MaintenanceUntil, old.Stopped
		n.Draining = old.Draining
		if old.SetCapacity {
			n.Capacity, n.SetCapacity = old.Capacity, true
		}
		if old.SetZone {
			n.Zone, n.SetZone = old.Zone, true
		}
	}
	n.State = NodeAlive
	n.Since = c.Time
	if wasAlive {
		n.Since = old.Since
	}
	s.Nodes[n.ID] = &n
	if existed && old.Incarnation != n.Incarnation {
		endStopWindow(s, &n, c.Time)
	}
	switch {
	case !wasAlive:
		newEpoch(s, c.Time, "node "+n.ID+" joined")
	case MemberOf(*old) != MemberOf(n):
		// Back before it was missed (a quick restart) with another
		// capacity or zone: the placement changes, so the epoch does.
		newEpoch(s, c.Time, fmt.Sprintf("node %s rejoined with capacity %d, zone %q (was %d, %q)", n.ID, n.Capacity, n.Zone, old.Capacity, old.Zone))
	}
	return s.Epoch(), nil
}

func applyNodeLeave(s *State, data []byte) (any, error) {
	var c nodeLeaveCommand
	if err := decode(data, &c); err != nil {
		return nil, err
	}
	n, ok := s.Nodes[c.ID]
	if !ok {
		return nil, fmt.Errorf("node %s: %w", c.ID, ErrNotFound)
	}
	if n.State != NodeAlive {
		return s.Epoch(), nil
	}
	n.State = NodeDead
	n.Since = c.Time
	releaseLocks(s, "its node "+c.ID+" left", func(l *Lock) bool { return l.Node == c.ID })
	reason := "node " + c.ID + " left"
	if c.Reason != "" {
		reason += " (" + c.Reason + ")"
	}
	newEpoch(s, c.Time, reason)
	return s.Epoch(), nil
}

// newEpoch begins the next epoch with the alive nodes as they are now:
// the epoch records what placement needs of each, so that it fixes its
// placement by itself.
func newEpoch(s *State, at time.Time, reason string) {
	alive := s.AliveNodes() // sorted
	var full []string
	members := make([]Member, 0, len(alive))
	for _, id := range alive {
		n := s.Nodes[id]
		if n.Full || n.Draining {
			full = append(full, id)
		}
		members = append(members, MemberOf(*n))
	}
	s.Epochs = append(s.Epochs, Epoch{Number: s.Epoch() + 1, Nodes: alive, Full: full, Members: members, Time: at, Reason: reason})
	s.note("epoch", "epoch %d: %s; %d nodes alive", s.Epoch(), reason, len(alive))
}

// applyNodeSpace marks a node full or not; a change is a new epoch, since
// it changes the placement.
func applyNodeSpace(s *State, data []byte) (any, error) {
	var c nodeSpaceCommand
	if err := decode(data, &c); err != nil {
		return nil, err
	}
	n, ok := s.Nodes[c.ID]
	if !ok {
		return nil, fmt.Errorf("node %s: %w", c.ID, ErrNotFound)
	}
	if n.Full == c.Full {
		return s.Epoch(), nil
	}
	n.Full = c.Full
	if n.State == NodeAlive {
		reason := "node " + c.ID + " is full: it takes no objects"
		if !c.Full {
			reason = "node " + c.ID + " has space again"
		}
		newEpoch(s, c.Time, reason)
	}
	return s.Epoch(), nil
}

// releaseLocks drops the locks of a node that left or restarted. A VDI
// whose writer lock goes this way is marked unclean: its writer may have
// died in the middle of writes, leaving replicas that differ, and the
// next writer repairs it before serving.
func releaseLocks(s *State, why string, match func(*Lock) bool) {
	var keys []string
	for key, l := range s.Locks {
		if match(l) {
			keys = append(keys, key)
		}
	}
	sort.Strings(keys) // the events come in one order on every node
	for _, key := range keys {
		delete(s.Locks, key)
		if name, ok := strings.CutPrefix(key, vdiLockKey("")); ok {
			if v, ok := s.VDIs[name]; ok {
				v.Unclean = true
				s.note("lock", "the writer lock on vdi %q was taken away (%s): the vdi is unclean until its next writer makes its replicas identical", name, why)
			}
		}
	}
}

func applyVDIRepaired(s *State, data []byte) (any, error) {
	var c vdiRepairedCommand
	if err := decode(data, &c); err != nil {
		return nil, err
	}
	v, ok := s.VDIs[c.Name]
	if !ok {
		return nil, fmt.Errorf("vdi %q: %w", c.Name, ErrNotFound)
	}
	v.Unclean = false
	return *v, nil
}

// applyVDIUnclean marks a VDI unclean: its writer gave it up while some
// of its objects may have replicas that differ (a change failed after
// reaching some of them, and repairing them failed too).
func applyVDIUnclean(s *State, data []byte) (any, error) {
	var c vdiRepairedCommand
	if err := decode(data, &c); err != nil {
		return nil, err
	}
	v, ok := s.VDIs[c.Name]
	if !ok {
		return nil, fmt.Errorf("vdi %q: %w", c.Name, ErrNotFound)
	}
	v.Unclean = true
	return *v, nil
}

func applyVDICreate(s *State, data []byte) (any, error) {
	var c vdiCreateCommand
	if err := decode(data, &c); err != nil {
		return nil, err
	}
	if s.Format == nil {
		return nil, ErrNotFormatted
	}
	if err := ValidateName(c.Name); err != nil {
		return nil, err
	}
	if err := ValidateSize(c.Size, s.Format.ObjectSize); err != nil {
		return nil, err
	}
	// The name is the lock: the first committed create of a name wins
	// (DESIGN.md, "Distributed locks (VDI create ...) are log entries").
	if _, ok := s.VDIs[c.Name]; ok {
		return nil, fmt.Errorf("vdi %q %w", c.Name, ErrAlreadyExists)
	}
	id, err := newVDIID(s)
	if err != nil {
		return nil, err
	}
	copies, scheme := s.Format.Copies, ""
	if c.EC != "" && s.Level() >= FeatureErasureCoding.Level {
		if c.Copies != 0 {
			return nil, errCopiesWithScheme(c.EC, c.Copies)
		}
		sc, err := parseScheme(c.EC)
		if err != nil {
			return nil, err
		}
		if err := checkSchemeCreate(s, sc); err != nil {
			return nil, err
		}
		copies, scheme = sc.M+1, sc.String()
	} else if c.Copies != 0 && s.Level() >= FeatureVDICopies.Level {
		if err := validateCopies(c.Copies); err != nil {
			return nil, err
		}
		if err := checkCopiesPlaceable(s, c.Copies); err != nil {
			return nil, err
		}
		copies = c.Copies
	}
	v := &VDI{ID: id, Name: c.Name, Size: c.Size, Copies: copies, EC: scheme, ObjectSize: s.Format.ObjectSize, Created: c.Time, Since: s.Epoch(), Exclusive: c.Exclusive}
	s.VDIs[c.Name] = v
	return *v, nil
}

// vdiLockKey is the lock a writer holds while a VDI is open for writing.
func vdiLockKey(name string) string { return "vdi/" + name }

func applyVDIDelete(s *State, data []byte) (any, error) {
	var c vdiDeleteCommand
	if err := decode(data, &c); err != nil {
		return nil, err
	}
	v, err := s.lookup(c.Name)
	if err != nil {
		return nil, err
	}
	if !v.Snapshot {
		if l, held := s.Locks[vdiLockKey(v.Name)]; held {
			return nil, fmt.Errorf("vdi %q is open for writing through node %s (session %s): %w", c.Name, l.Node, l.Session, ErrBusy)
		}
		delete(s.VDIs, v.Name)
	}
	removeVDI(s, v)
	return *v, nil
}

// removeVDI takes v out of the tree (it is already out of s.VDIs if it
// was writable). A VDI with descendants stays, hidden, because they read
// its objects; one without goes to the garbage list, and so does every
// hidden ancestor it was the last descendant of.
func removeVDI(s *State, v *VDI) {
	for v != nil {
		if s.hasChildren(v.ID) {
			v.Deleted = true
			s.Snapshots[v.ID] = v
			return
		}
		delete(s.Snapshots, v.ID)
		s.Garbage = append(s.Garbage, Garbage{ID: v.ID, Size: v.Size, ObjectSize: v.ObjectSize, Copies: v.Copies, EC: v.EC})
		parent, ok := s.Snapshots[v.Parent]
		if !ok || !parent.Deleted {
			return
		}
		v = parent
	}
}

// newVDIID hands out the next VDI id.
func newVDIID(s *State) (uint32, error) {
	if s.NextVDIID > MaxVDIID {
		return 0, fmt.Errorf("%w: all %d vdi ids have been used", ErrExhausted, MaxVDIID)
	}
	id := s.NextVDIID
	s.NextVDIID++
	return id, nil
}

// SnapshotResult is what a snapshot commits: the frozen snapshot and the
// writable VDI that continues under the name.
type SnapshotResult struct {
	Snapshot VDI `json:"snapshot"`
	VDI      VDI `json:"vdi"`
}

func applyVDISnapshot(s *State, data []byte) (any, error) {
	var c vdiSnapshotCommand
	if err := decode(data, &c); err != nil {
		return nil, err
	}
	v, ok := s.VDIs[c.Name]
	if !ok {
		return nil, fmt.Errorf("vdi %q %w", c.Name, ErrNotFound)
	}
	holder := ""
	if l, held := s.Locks[vdiLockKey(c.Name)]; held {
		holder = l.Node
	}
	if holder != c.Holder {
		return nil, fmt.Errorf("%w: vdi %q changed hands while the snapshot was prepared (held by %q); try again", ErrBusy, c.Name, holder)
	}
	tag := c.Tag
	if tag == "" {
		tag = fmt.Sprint(v.ID)
	}
	if err := ValidateTag(tag); err != nil {
		return nil, err
	}
	if s.findSnapshot(c.Name, tag) != nil {
		return nil, fmt.Errorf("snapshot %s@%s %w", c.Name, tag, ErrAlreadyExists)
	}
	id, err := newVDIID(s)
	if err != nil {
		return nil, err
	}
	snapshot := *v
	snapshot.Snapshot, snapshot.Tag, snapshot.SnapshotTime = true, tag, c.Time
	s.Snapshots[snapshot.ID] = &snapshot
	child := &VDI{ID: id, Name: v.Name, Size: v.Size, Copies: v.Copies, EC: v.EC, ObjectSize: v.ObjectSize, Created: v.Created, Since: s.Epoch(), Parent: snapshot.ID}
	keepSettings(child, v)
	s.VDIs[c.Name] = child
	return SnapshotResult{Snapshot: snapshot, VDI: *child}, nil
}

func applyVDIClone(s *State, data []byte) (any, error) {
	var c vdiCloneCommand
	if err := decode(data, &c); err != nil {
		return nil, err
	}
	name, tag := SplitName(c.Snapshot)
	parent := s.findSnapshot(name, tag)
	if tag == "" || parent == nil {
		return nil, fmt.Errorf("snapshot %q %w (clone from NAME@TAG)", c.Snapshot, ErrNotFound)
	}
	if err := ValidateName(c.Name); err != nil {
		return nil, err
	}
	if _, ok := s.VDIs[c.Name]; ok {
		return nil, fmt.Errorf("vdi %q %w", c.Name, ErrAlreadyExists)
	}
	id, err := newVDIID(s)
	if err != nil {
		return nil, err
	}
	v := &VDI{ID: id, Name: c.Name, Size: parent.Size, Copies: parent.Copies, EC: parent.EC, ObjectSize: parent.ObjectSize, Created: c.Time, Since: s.Epoch(), Parent: parent.ID}
	s.VDIs[c.Name] = v
	return *v, nil
}

func applyVDIRollback(s *State, data []byte) (any, error) {
	var c vdiRollbackCommand
	if err := decode(data, &c); err != nil {
		return nil, err
	}
	v, ok := s.VDIs[c.Name]
	if !ok {
		return nil, fmt.Errorf("vdi %q %w", c.Name, ErrNotFound)
	}
	target := s.findSnapshot(c.Name, c.Tag)
	if target == nil {
		return nil, fmt.Errorf("snapshot %s@%s %w", c.Name, c.Tag, ErrNotFound)
	}
	if l, held := s.Locks[vdiLockKey(c.Name)]; held {
		return nil, fmt.Errorf("vdi %q is open for writing through node %s (session %s); close it first: %w", c.Name, l.Node, l.Session, ErrBusy)
	}
	if v.Ack == AckZone && target.EC != "" {
		// The name keeps its settings (keepSettings), the VDI takes the
		// snapshot's scheme: a VDI of that name deleted and created again
		// without it may have --ack zone, which erasure coding has not.
		return nil, fmt.Errorf("%w: vdi %q acknowledges writes in the writer's zone (--ack zone) and snapshot %s is erasure-coded (%s), which --ack zone is not for: set --ack all first", ErrInvalid, c.Name, target.FullName(), target.EC)
	}
	id, err := newVDIID(s)
	if err != nil {
		return nil, err
	}
	delete(s.VDIs, c.Name)
	removeVDI(s, v)
	w := &VDI{ID: id, Name: c.Name, Size: target.Size, Copies: target.Copies, EC: target.EC, ObjectSize: target.ObjectSize, Created: v.Created, Since: s.Epoch(), Parent: target.ID}
	keepSettings(w, v)
	s.VDIs[c.Name] = w
	return *w, nil
}

// keepSettings carries what belongs to the VDI's name, not to one id of
// it, to the VDI a snapshot or rollback puts under that name: whether it
// is exclusive, its QoS limits, its handover count, and the broken lock
// generation (the lock is the name's: its fenced holder stays fenced).
func keepSettings(to, from *VDI) {
	to.Exclusive, to.Limits, to.Handovers, to.BrokenGeneration = from.Exclusive, from.Limits, from.Handovers, from.BrokenGeneration
}

func applyGarbageDone(s *State, data []byte) (any, error) {
	var c garbageDoneCommand
	if err := decode(data, &c); err != nil {
		return nil, err
	}
	for i, g := range s.Garbage {
		if g.ID == c.ID {
			s.Garbage = append(s.Garbage[:i], s.Garbage[i+1:]...)
			return nil, nil
		}
	}
	return nil, nil
}

func applyVDIResize(s *State, data []byte) (any, error) {
	var c vdiResizeCommand
	if err := decode(data, &c); err != nil {
		return nil, err
	}
	v, ok := s.VDIs[c.Name]
	if !ok {
		return nil, fmt.Errorf("vdi %q %w", c.Name, ErrNotFound)
	}
	if err := ValidateSize(c.Size, v.ObjectSize); err != nil {
		return nil, err
	}
	if c.Size < v.Size {
		return nil, fmt.Errorf("%w: vdi %q is %d bytes, asked for %d (shrinking would discard data)", ErrShrink, c.Name, v.Size, c.Size)
	}
	v.Size = c.Size
	return *v, nil
}

// lockCommandVersion starts the binary encoding of a lock command:
// version, then key, node, incarnation and session as uvarint length and
// bytes, then the time as varint Unix nanoseconds.
const lockCommandVersion = 1

func (c lockCommand) appendBinary(dst []byte) []byte {
	dst = append(dst, lockCommandVersion)
	for _, s := range []string{c.Key, c.Node, c.Incarnation, c.Session} {
		dst = binary.AppendUvarint(dst, uint64(len(s)))
		dst = append(dst, s...)
	}
	var nanos int64
	if !c.Time.IsZero() {
		nanos = c.Time.UnixNano()
	}
	return binary.AppendVarint(dst, nanos)
}

func decodeLockCommand(data []byte) (lockCommand, error) {
	var c lockCommand
	if len(data) == 0 || data[0] != lockCommandVersion {
		return c, fmt.Errorf("%w: malformed lock entry", ErrInvalid)
	}
	data = data[1:]
	fields := []struct {
		value *string
		what  string
		limit int
	}{
		{&c.Key, "lock key", MaxLockKeyLength},
		{&c.Node, "lock owner node", MaxOwnerLength},
		{&c.Incarnation, "lock owner incarnation", MaxOwnerLength},
		{&c.Session, "lock session", MaxOwnerLength},
	}
	for _, f := range fields {
		n, used := binary.Uvarint(data)
		if used <= 0 || n > uint64(len(data)-used) {
			return c, fmt.Errorf("%w: malformed lock entry", ErrInvalid)
		}
		if n > uint64(f.limit) {
			// Checked before the string is made (lockCommand.check).
			return c, fmt.Errorf("%w: %s of %d bytes: at most %d", ErrInvalid, f.what, n, f.limit)
		}
		*f.value = string(data[used : used+int(n)])
		if !utf8.ValidString(*f.value) {
			// The JSON snapshot would change it (checkLength).
			return c, fmt.Errorf("%w: %s is not valid UTF-8", ErrInvalid, f.what)
		}
		data = data[used+int(n):]
	}
	nanos, used := binary.Varint(data)
	if used <= 0 || used != len(data) {
		return c, fmt.Errorf("%w: malformed lock entry", ErrInvalid)
	}
	if nanos != 0 {
		c.Time = time.Unix(0, nanos).UTC()
	}
	return c, nil
}

func applyLockAcquire(s *State, data []byte) (any, error) {
	c, err := decodeLockCommand(data)
	if err != nil {
		return nil, err
	}
	if c.Key == "" || c.Node == "" {
		return nil, fmt.Errorf("%w: lock needs a key and an owner", ErrInvalid)
	}
	if n, ok := s.Nodes[c.Node]; !ok || n.State != NodeAlive || n.Incarnation != c.Incarnation {
		// A claim from a node (process) that has since left must not win.
		return nil, fmt.Errorf("%w: lock %q claimed by node %s which is not a live member", ErrInvalid, c.Key, c.Node)
	}
	if l, ok := s.Locks[c.Key]; ok {
		if l.Node == c.Node && l.Session == c.Session {
			return *l, nil
		}
		return nil, &LockHeldError{Lock: *l}
	}
	return *grantLock(s, c.Key, LockOwner{Node: c.Node, Incarnation: c.Incarnation, Session: c.Session}, c.Time), nil
}

func applyLockRelease(s *State, data []byte) (any, error) {
	c, err := decodeLockCommand(data)
	if err != nil {
		return nil, err
	}
	l, ok := s.Locks[c.Key]
	if !ok {
		return nil, fmt.Errorf("lock %q %w", c.Key, ErrNotFound)
	}
	if l.Node != c.Node || l.Session != c.Session {
		return nil, fmt.Errorf("%w: lock %q is held by node %s session %s", ErrNotLockOwner, c.Key, l.Node, l.Session)
	}
	delete(s.Locks, c.Key)
	return nil, nil
}

// LockHeldError says who holds a lock someone else asked for.
type LockHeldError struct{ Lock Lock }

func (e *LockHeldError) Error() string {
	return fmt.Sprintf("lock %q is held by node %s (session %s) since %s", e.Lock.Key, e.Lock.Node, e.Lock.Session, e.Lock.Acquired.UTC().Format(time.RFC3339))
}

func (e *LockHeldError) Is(target error) bool { return target == ErrLockHeld }

// sortedVDIs returns copies of the VDIs ordered by name.
func sortedVDIs(s *State) []VDI {
	out := make([]VDI, 0, len(s.VDIs))
	for _, v := range s.VDIs {
		out = append(out, *v)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}
