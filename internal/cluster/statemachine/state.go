package statemachine

import (
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"
	"unicode/utf8"
)

// NodeState is a node's membership state as committed in the log.
type NodeState string

const (
	NodeAlive NodeState = "alive"
	NodeDead  NodeState = "dead"
)

// Node is one member of the cluster as the log records it.
type Node struct {
	ID          string    `json:"id"`
	Address     string    `json:"address"` // the IP the node binds
	PeerAddr    string    `json:"peer_addr"`
	GossipAddr  string    `json:"gossip_addr"`
	AdminAddr   string    `json:"admin_addr"`
	NBDAddr     string    `json:"nbd_addr"`
	Zone        string    `json:"zone,omitempty"`
	Capacity    uint64    `json:"capacity"`
	State       NodeState `json:"state"`
	Incarnation string    `json:"incarnation"` // changes on every process start
	// Full: the node's disks are nearly full. It stays a member but the
	// placement gives it no objects, so its copies move to other nodes.
	// Set and cleared by the node itself.
	Full  bool      `json:"full,omitempty"`
	Since time.Time `json:"since"` // when State last changed
	// Build is what gossip reports about the node's binary (features.go);
	// never in the log, nor in a snapshot.
	Build Build `json:"-"`
	// MaintenanceUntil: an operator put the node in maintenance until
	// then (`herd node maintenance`). While it is down inside that window
	// its objects are not copied elsewhere in the background (only those
	// clients use are, on demand), so a reboot does not move its data out
	// and back (maintenance.go).
	MaintenanceUntil time.Time `json:"maintenance_until,omitzero"`
	// Stopped: the node stopped cleanly (SIGTERM) and, on its way out,
	// opened its own window until MaintenanceUntil (its
	// --down-out-interval): it is down, not out, until then, and marked
	// out (its objects re-replicated in the background) if the window
	// closes before it returns. Its return ends the window; an
	// operator's `node maintenance` replaces it (maintenance.go).
	Stopped bool `json:"stopped,omitempty"`
	// Draining: an operator asked for the node's data to move to the
	// others (`herd node drain`). The placement treats it as full: it
	// takes no objects and its copies are deleted once replaced, so full
	// redundancy is kept throughout (maintenance.go).
	Draining bool `json:"draining,omitempty"`
	// SetCapacity and SetZone: an operator set the node's capacity or zone
	// at run time (`herd node set`); they win over what the node announces
	// from its flags when it rejoins, until reset.
	SetCapacity bool `json:"set_capacity,omitempty"`
	SetZone     bool `json:"set_zone,omitempty"`
}

// InMaintenance reports whether the node's maintenance window is open at now.
func (n Node) InMaintenance(now time.Time) bool { return now.Before(n.MaintenanceUntil) }

// Epoch is one entry of the epoch history: the set of alive nodes from
// Number on, until the next epoch, and everything placement needs of
// each of them. An epoch fixes its placement by itself (DESIGN.md:
// placement is a function of the epoch): a node's weight, zone and
// fullness are copied into the epoch when it begins, and any change to
// them begins a new epoch, so a past epoch's placement, which the proof
// of currency asks for, is what it was then, whatever the node table
// says now.
type Epoch struct {
	Number uint64    `json:"epoch"`
	Nodes  []string  `json:"nodes"` // sorted node ids
	Time   time.Time `json:"time"`
	Reason string    `json:"reason"`
	// Full lists the epoch's nodes that take no objects (disks full).
	Full []string `json:"full,omitempty"`
	// Members are the epoch's nodes as placement sees them, sorted by id.
	// Empty only in epochs committed by a binary that did not record
	// them; their placement then comes from the node table (see
	// State.Members).
	Members []Member `json:"members,omitempty"`
}

// Member is what placement needs of a node in an epoch.
type Member struct {
	ID     string `json:"id"`
	Zone   string `json:"zone,omitempty"`
	Weight uint64 `json:"weight"`         // the node's capacity in bytes, at least 1
	Full   bool   `json:"full,omitempty"` // takes no objects
}

// MemberOf is placement's view of n.
func MemberOf(n Node) Member {
	return Member{ID: n.ID, Zone: n.Zone, Weight: max(n.Capacity, 1), Full: n.Full || n.Draining}
}

// Placed returns the epoch's nodes that hold objects: all but the full
// ones, unless every node is full.
func (e Epoch) Placed() []string {
	if len(e.Full) == 0 || len(e.Full) >= len(e.Nodes) {
		return e.Nodes
	}
	var out []string
	for _, id := range e.Nodes {
		if !slices.Contains(e.Full, id) {
			out = append(out, id)
		}
	}
	return out
}

// PlacedMembers returns the members that hold objects in e (Placed), as
// the epoch recorded them; lookup supplies them for an epoch that did
// not record its members (an older binary's), from the node table.
func (e Epoch) PlacedMembers(lookup func(id string) (Member, bool)) []Member {
	placed := e.Placed()
	out := make([]Member, 0, len(placed))
	for _, id := range placed {
		if i, found := slices.BinarySearchFunc(e.Members, id, func(m Member, id string) int { return strings.Compare(m.ID, id) }); found {
			out = append(out, e.Members[i])
		} else if m, ok := lookup(id); ok {
			out = append(out, m)
		}
	}
	return out
}

// Format is the cluster-wide configuration fixed by `herd cluster format`.
type Format struct {
	Copies     int       `json:"copies"`
	ObjectSize uint64    `json:"object_size"`
	Created    time.Time `json:"created"`
}

// VDI is one virtual disk image: a writable VDI, a read-only snapshot,
// or a deleted one kept because its descendants still read its objects.
// VDIs form a tree through Parent (DESIGN.md "Objects and VDIs"): a
// snapshot freezes a VDI, the name continues as a new writable child; a
// clone is a new writable child of a snapshot. A child's object map
// starts empty and inherits every object from its ancestors until it
// writes its own copy (copy-on-write).
type VDI struct {
	ID     uint32 `json:"id"`
	Name   string `json:"name"`
	Size   uint64 `json:"size"`
	Copies int    `json:"copies"`
	// EC is the VDI's erasure-coding scheme, "K+M" (ec.Parse), or ""
	// for a VDI of copies. An erasure-coded VDI's data is folded into
	// chunks, one copy each on K+M nodes; its map objects and its data
	// objects (which hold the recent writes not folded yet) are
	// replicated with Copies = M+1 copies (docs/ARCHITECTURE.md, "Erasure-coded VDIs").
	// Snapshots, clones and rollbacks inherit it, as they do Copies.
	// Set only from LevelErasureCoding on (FeatureErasureCoding).
	EC         string    `json:"ec,omitempty"`
	ObjectSize uint64    `json:"object_size"`
	Created    time.Time `json:"created"`
	// Since is the epoch in which the VDI's id was handed out: no object
	// of this VDI can have been written in an earlier epoch, so the proof
	// that a copy is current never looks further back (0: unknown, for
	// VDIs created by a binary that did not record it).
	Since        uint64    `json:"since_epoch,omitempty"`
	Parent       uint32    `json:"parent,omitempty"`
	Snapshot     bool      `json:"snapshot,omitempty"`
	Tag          string    `json:"tag,omitempty"`
	SnapshotTime time.Time `json:"snapshot_time,omitzero"`
	Deleted      bool      `json:"deleted,omitempty"`
	// Unclean: the node holding the VDI's writer lock died; replicas of
	// objects it was writing may differ until the next writer (or `herd
	// vdi check --repair`) makes them identical.
	Unclean bool `json:"unclean,omitempty"`
	// Ack is when a write without FUA is acknowledged: "" (AckAll) once
	// every replica has it, AckZone once every replica in the writer's
	// zone has it, the other zones catching up before the next FLUSH
	// completes (internal/gateway/lag.go).
	Ack string `json:"ack,omitempty"`
	// Exclusive: a second writer is refused while the VDI is open for
	// writing, instead of taking the lock over (handover.go).
	Exclusive bool `json:"exclusive,omitempty"`
	// Handovers counts the times its writer lock moved between nodes.
	Handovers uint64 `json:"handovers,omitempty"`
	// BrokenGeneration is the generation of the last writer lock an
	// operator broke (`herd vdi unlock --force`): its holder is fenced
	// for good, where a holder that lost its lock otherwise takes it
	// again.
	BrokenGeneration uint64 `json:"broken_generation,omitempty"`
	// Limits are the VDI's QoS limits, paced by each gateway (qos.go).
	Limits Limits `json:"limits,omitzero"`
	// Flatten: `herd vdi flatten` asked for the VDI to copy everything it
	// reads from its ancestors, then lose its parent (merge.go).
	Flatten bool `json:"flatten,omitempty"`
}

// Write acknowledgement modes (VDI.Ack, `herd vdi set --ack`).
const (
	AckAll  = "all"
	AckZone = "zone"
)

// FullName is NAME for a writable VDI and NAME@TAG for a snapshot.
func (v VDI) FullName() string {
	if v.Snapshot {
		return v.Name + "@" + v.Tag
	}
	return v.Name
}

// Garbage is a VDI whose objects must be freed: nothing reads them any
// more. The leader frees them and then commits GarbageDone.
type Garbage struct {
	ID         uint32 `json:"id"`
	Size       uint64 `json:"size"`
	ObjectSize uint64 `json:"object_size"`
	Copies     int    `json:"copies"`
	// EC is the deleted VDI's erasure-coding scheme (VDI.EC), "" for one
	// of copies.
	EC string `json:"ec,omitempty"`
}

// Lock is a cluster-wide lock: the first committed claim wins.
type Lock struct {
	Key         string    `json:"key"`
	Node        string    `json:"node"`
	Incarnation string    `json:"incarnation"`
	Session     string    `json:"session"`
	Acquired    time.Time `json:"acquired"`
	// Generation is this grant's number: every grant of any lock gets the
	// next one, so a holder can tell that the lock is still the grant it
	// was given (handover.go).
	Generation uint64 `json:"generation,omitempty"`
	// Wanted is the owner waiting for the holder to hand the lock over.
	Wanted *LockOwner `json:"wanted,omitempty"`
}

// State is the replicated state machine's data. Every node holds the same
// State after applying the same log prefix.
type State struct {
	Format    *Format          `json:"format,omitempty"`
	Nodes     map[string]*Node `json:"nodes"`
	Epochs    []Epoch          `json:"epochs"`
	VDIs      map[string]*VDI  `json:"vdis"`      // writable VDIs by name
	Snapshots map[uint32]*VDI  `json:"snapshots"` // snapshots and kept deleted VDIs by id
	Garbage   []Garbage        `json:"garbage,omitempty"`
	NextVDIID uint32           `json:"next_vdi_id"`
	Locks     map[string]*Lock `json:"locks"`
	// LockGrants counts lock grants: the last Lock.Generation given.
	LockGrants uint64 `json:"lock_grants,omitempty"`

	// Credentials (security.go).
	JoinHash string               `json:"join_hash,omitempty"`
	Tokens   map[string]*Token    `json:"tokens"`
	Clients  map[string]*Client   `json:"clients"`
	Removed  map[string]time.Time `json:"removed"` // nodes removed for good

	// FeatureLevel is the cluster's feature level (features.go; 0 in logs
	// that never raised it: LevelBase). It never falls.
	FeatureLevel int `json:"feature_level,omitempty"`
	// Admitted names, from LevelSecurity on, every node allowed on the
	// peer port by id and node certificate serial (admission.go).
	Admitted map[string]string `json:"admitted,omitempty"`
	// JoinTokens are join secrets with a lifetime (jointokens.go).
	JoinTokens map[string]*JoinToken `json:"join_tokens,omitempty"`
	// GossipKeys is the gossip key's id and any rotation of it under way
	// (gossipkeys.go).
	GossipKeys GossipKeyring `json:"gossip_keys,omitzero"`
	// CA is the cluster CA's record and any rotation of it under way
	// (carotation.go).
	CA CAState `json:"ca,omitzero"`

	// Events is the cluster's history in words, the newest MaxEvents
	// (events.go); pending holds those of the entry being applied.
	Events  []Event `json:"events,omitempty"`
	pending []Event
}

func newState() *State {
	return &State{
		Nodes:     map[string]*Node{},
		VDIs:      map[string]*VDI{},
		Snapshots: map[uint32]*VDI{},
		Locks:     map[string]*Lock{},
		NextVDIID: 1,
		Tokens:    map[string]*Token{},
		Clients:   map[string]*Client{},
		Removed:   map[string]time.Time{},
	}
}

// Epoch returns the current epoch number (0 before the first node joined).
func (s *State) Epoch() uint64 {
	if len(s.Epochs) == 0 {
		return 0
	}
	return s.Epochs[len(s.Epochs)-1].Number
}

// AliveNodes returns the ids of alive nodes, sorted.
func (s *State) AliveNodes() []string {
	var ids []string
	for id, n := range s.Nodes {
		if n.State == NodeAlive {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	return ids
}

// MaxVDIID is the largest VDI id: object ids reserve 24 bits for it
// (Sheepdog's layout, DESIGN.md "Objects and VDIs").
const MaxVDIID = 1<<24 - 1

// Name limits. '@' is reserved for snapshots (NAME@TAG), '/' for paths.
const MaxNameLength = 128

// Length limits of the other strings the log keeps. Every node applies
// and keeps every entry, and these strings come from outside: the admin
// API (lock keys and sessions, VDI names and tags), gossip metadata
// (addresses, zones). Each command is checked where it is proposed
// (encodeProposal), so that the caller learns why and nothing oversized
// enters the log, and again where it is applied (each apply function),
// so that an entry from a buggy proposer is refused by every node alike.
// The limits are far above what herd itself proposes: an entry an older
// binary committed is never refused for them.
const (
	// MaxLockKeyLength bounds a lock key: "vdi/" and a VDI name fit.
	MaxLockKeyLength = 256
	// MaxOwnerLength bounds node ids, process incarnations and lock
	// sessions.
	MaxOwnerLength = 128
	// MaxAddressLength bounds a node's addresses: host:port, where a DNS
	// name is at most 253 bytes.
	MaxAddressLength = 300
	// MaxZoneLength bounds a zone (herd server allows 64).
	MaxZoneLength = 128
	// MaxReasonLength bounds the reason recorded with an epoch change.
	MaxReasonLength = 1024
	// maxFullNameLength bounds NAME@TAG.
	maxFullNameLength = 2*MaxNameLength + 1
)

// checkLength refuses value when it is longer than limit bytes, naming
// what it is: "lock key of 5000 bytes: at most 256".
func checkLength(what, value string, limit int) error {
	if len(value) > limit {
		return fmt.Errorf("%w: %s of %d bytes: at most %d", ErrInvalid, what, len(value), limit)
	}
	// The state is snapshotted as JSON, which turns invalid UTF-8 into
	// U+FFFD: a node restored from a snapshot would hold another string
	// than one that applied the entry (binary lock entries carry raw
	// bytes; FuzzFSMApply found it).
	if !utf8.ValidString(value) {
		return fmt.Errorf("%w: %s is not valid UTF-8", ErrInvalid, what)
	}
	return nil
}

// checkLengths is checkLength over (what, value, limit) triples, in order.
func checkLengths(fields ...lengthCheck) error {
	for _, f := range fields {
		if err := checkLength(f.what, f.value, f.limit); err != nil {
			return err
		}
	}
	return nil
}

type lengthCheck struct {
	what  string
	value string
	limit int
}

// checkNodeLengths checks the strings a node join records.
func CheckNodeLengths(n Node) error {
	return checkLengths(
		lengthCheck{"node id", n.ID, MaxOwnerLength},
		lengthCheck{"node address", n.Address, MaxAddressLength},
		lengthCheck{"node peer address", n.PeerAddr, MaxAddressLength},
		lengthCheck{"node gossip address", n.GossipAddr, MaxAddressLength},
		lengthCheck{"node admin address", n.AdminAddr, MaxAddressLength},
		lengthCheck{"node NBD address", n.NBDAddr, MaxAddressLength},
		lengthCheck{"node zone", n.Zone, MaxZoneLength},
		lengthCheck{"node incarnation", n.Incarnation, MaxOwnerLength},
	)
}

var nameRegexp = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9._-]*$`)

// Member returns placement's view of node id as the node table has it
// now: for epochs that did not record their members.
func (s *State) Member(id string) (Member, bool) {
	n, ok := s.Nodes[id]
	if !ok {
		return Member{}, false
	}
	return MemberOf(*n), true
}

// ValidateName checks a VDI name.
func ValidateName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("%w: vdi name is empty", ErrInvalid)
	case len(name) > MaxNameLength:
		return fmt.Errorf("%w: vdi name is %d characters long, the limit is %d", ErrInvalid, len(name), MaxNameLength)
	case !nameRegexp.MatchString(name):
		return fmt.Errorf("%w: vdi name %q: use letters, digits, '.', '_' and '-', not starting with '.' or '-'", ErrInvalid, name)
	}
	return nil
}

// MinVDISize and the sector granularity of VDI sizes.
const SectorSize = 512

// ValidateSize checks a VDI size against the object size: a whole number
// of sectors, and no more objects than a 32-bit object index can address.
func ValidateSize(bytes, objectSize uint64) error {
	switch {
	case bytes == 0:
		return fmt.Errorf("%w: size must be greater than zero", ErrInvalid)
	case bytes%SectorSize != 0:
		return fmt.Errorf("%w: size %d is not a multiple of %d bytes", ErrInvalid, bytes, SectorSize)
	case objectSize > 0 && bytes/objectSize >= 1<<32:
		return fmt.Errorf("%w: size %d is too large (at most %d bytes with %d-byte objects)", ErrInvalid, bytes, (uint64(1)<<32-1)*objectSize, objectSize)
	}
	return nil
}

// Object size limits for `cluster format --object-size`.
const (
	MinObjectSize     = 64 << 10
	MaxObjectSize     = 256 << 20
	DefaultObjectSize = 4 << 20
	MaxCopies         = 16
)

// ValidateTag checks a snapshot tag: like a name.
func ValidateTag(tag string) error {
	if err := ValidateName(tag); err != nil {
		return fmt.Errorf("%w: snapshot tag %q: use up to %d letters, digits, '.', '_' and '-'", ErrInvalid, tag, MaxNameLength)
	}
	return nil
}

// SplitName splits "NAME@TAG" into name and tag ("" when absent).
func SplitName(full string) (name, tag string) {
	name, tag, _ = strings.Cut(full, "@")
	return name, tag
}

// findSnapshot returns name's snapshot whose tag (or id) is tag.
func (s *State) findSnapshot(name, tag string) *VDI {
	var byID *VDI
	for _, v := range s.Snapshots {
		if !v.Snapshot || v.Deleted || v.Name != name {
			continue
		}
		if v.Tag == tag {
			return v
		}
		if fmt.Sprint(v.ID) == tag {
			byID = v
		}
	}
	return byID
}

// lookup resolves "NAME" or "NAME@TAG".
func (s *State) lookup(full string) (*VDI, error) {
	name, tag := SplitName(full)
	if tag == "" {
		if v, ok := s.VDIs[name]; ok {
			return v, nil
		}
		return nil, fmt.Errorf("vdi %q %w", full, ErrNotFound)
	}
	if v := s.findSnapshot(name, tag); v != nil {
		return v, nil
	}
	return nil, fmt.Errorf("snapshot %q %w", full, ErrNotFound)
}

// byID returns any VDI of the tree by id.
func (s *State) byID(id uint32) *VDI {
	if v, ok := s.Snapshots[id]; ok {
		return v
	}
	for _, v := range s.VDIs {
		if v.ID == id {
			return v
		}
	}
	return nil
}

func (s *State) hasChildren(id uint32) bool {
	for _, v := range s.VDIs {
		if v.Parent == id {
			return true
		}
	}
	for _, v := range s.Snapshots {
		if v.Parent == id {
			return true
		}
	}
	return false
}

// Chain returns id and its ancestors, nearest first.
func (s *State) Chain(id uint32) []uint32 {
	var chain []uint32
	for v := s.byID(id); v != nil && len(chain) <= 1<<16; v = s.byID(v.Parent) {
		chain = append(chain, v.ID)
		if v.Parent == 0 {
			break
		}
	}
	return chain
}
