package statemachine

import (
	"errors"
	"fmt"
	"slices"

	"github.com/herd-storage/herd/internal/ec"
)

// checkBudget bounds what State.Check costs the FSM per applied entry
// (build tag invariants): a state of n items (size) is checked after
// every max(1, n/checkBudget)th entry, so every entry while the state
// is small (the simulator's, the tests' harnesses) and about checkBudget
// items per entry on a large one (a test creating thousands of VDIs
// would otherwise check O(n^2) items).
const checkBudget = 64

// size is the number of items State.Check walks.
func (s *State) size() int {
	return len(s.Nodes) + len(s.Epochs) + len(s.Locks) + len(s.VDIs) + len(s.Snapshots) + len(s.Garbage) + len(s.Admitted)
}

// Check returns an error naming the first invariant s breaks. These hold
// after any sequence of entries, accepted or refused; the FSM checks them
// after every entry it applies in a build with the tag invariants
// (internal/invariants), and the fuzz test after every input.
//
// It walks the whole state: nodes, epochs, locks, VDIs, snapshots and
// garbage (with a map of VDI ids, so O(state)); a deleted snapshot's
// children are found once for all snapshots, not per snapshot.
func (s *State) Check() error {
	if s.Nodes == nil || s.VDIs == nil || s.Snapshots == nil || s.Locks == nil {
		return errors.New("a nil map")
	}
	for id, n := range s.Nodes {
		if id == "" || n == nil || n.ID != id {
			return fmt.Errorf("node %q is recorded as %+v", id, n)
		}
		if n.State != NodeAlive && n.State != NodeDead {
			return fmt.Errorf("node %q is in state %q", id, n.State)
		}
		if err := CheckNodeLengths(*n); err != nil {
			return fmt.Errorf("node %.20q...: %v", id, err)
		}
	}
	for i, e := range s.Epochs {
		if e.Number != uint64(i+1) {
			return fmt.Errorf("epoch %d of the history is numbered %d", i+1, e.Number)
		}
		if !strictlySorted(e.Nodes) {
			return fmt.Errorf("epoch %d lists nodes %v", e.Number, e.Nodes)
		}
		for _, id := range e.Full {
			if !slices.Contains(e.Nodes, id) {
				return fmt.Errorf("epoch %d has full node %s outside its nodes %v", e.Number, id, e.Nodes)
			}
		}
	}
	alive := s.AliveNodes()
	var full []string
	for _, id := range alive {
		if n := s.Nodes[id]; n.Full || n.Draining {
			full = append(full, id)
		}
	}
	// The current epoch is the alive nodes as they are: any change to
	// what placement sees of them (alive, full or draining, zone,
	// weight) began a new epoch, so that one epoch has one placement.
	if len(s.Epochs) == 0 {
		if len(alive) > 0 {
			return fmt.Errorf("nodes %v are alive before any epoch", alive)
		}
	} else if current := s.Epochs[len(s.Epochs)-1]; !slices.Equal(current.Nodes, alive) || !slices.Equal(current.Full, full) {
		return fmt.Errorf("epoch %d has nodes %v (full or draining %v), but the alive nodes are %v (full or draining %v)", current.Number, current.Nodes, current.Full, alive, full)
	} else if current.Members != nil {
		if len(current.Members) != len(alive) {
			return fmt.Errorf("epoch %d records %d members, %d nodes are alive", current.Number, len(current.Members), len(alive))
		}
		for i, id := range alive {
			if m := MemberOf(*s.Nodes[id]); current.Members[i] != m {
				return fmt.Errorf("epoch %d records member %+v, the node table has %+v", current.Number, current.Members[i], m)
			}
		}
	}
	if s.FeatureLevel < 0 || s.FeatureLevel > SupportedLevel {
		return fmt.Errorf("feature level %d, this binary supports up to %d", s.FeatureLevel, SupportedLevel)
	}
	if s.Level() >= LevelSecurity {
		for id := range s.Nodes {
			_, admitted := s.Admitted[id]
			if _, removed := s.Removed[id]; !admitted && !removed {
				return fmt.Errorf("node %s is a member at feature level %d but was never admitted", id, s.Level())
			}
		}
	}
	for id := range s.Admitted {
		if _, removed := s.Removed[id]; removed {
			return fmt.Errorf("node %s is both admitted and removed", id)
		}
	}
	if k := s.GossipKeys; k.Primary != "" && !validGossipKeyID(k.Primary) {
		return fmt.Errorf("gossip key id %q", k.Primary)
	} else if r := k.Rotation; r != nil {
		if !validGossipKeyID(r.Key) || r.Key == k.Primary || r.Old != k.Primary || (r.Phase != GossipKeyInstall && r.Phase != GossipKeyUse) {
			return fmt.Errorf("gossip key rotation %+v, the cluster's key %q", *r, k.Primary)
		}
		for _, list := range [][]string{r.Installed, r.Using} {
			if !strictlySorted(list) {
				return fmt.Errorf("gossip key rotation %+v lists nodes twice or unsorted", *r)
			}
		}
	}
	for key, l := range s.Locks {
		if l == nil || key == "" || l.Key != key || l.Node == "" {
			return fmt.Errorf("lock %q is recorded as %+v", key, l)
		}
		if err := (lockCommand{Key: l.Key, Node: l.Node, Incarnation: l.Incarnation, Session: l.Session}).check(); err != nil {
			return fmt.Errorf("lock %.20q...: %v", key, err)
		}
		if n, ok := s.Nodes[l.Node]; !ok || n.State != NodeAlive || n.Incarnation != l.Incarnation {
			return fmt.Errorf("lock %q is held by node %s incarnation %q, which is not a live member (%+v)", key, l.Node, l.Incarnation, n)
		}
	}
	if s.Format != nil {
		if err := validateFormat(s.Format.Copies, s.Format.ObjectSize); err != nil {
			return fmt.Errorf("format %+v: %v", *s.Format, err)
		}
	} else if len(s.VDIs)+len(s.Snapshots)+len(s.Garbage) > 0 {
		return errors.New("vdis exist in an unformatted cluster")
	}
	if s.NextVDIID < 1 || s.NextVDIID > MaxVDIID+1 {
		return fmt.Errorf("the next vdi id is %d", s.NextVDIID)
	}
	ids := map[uint32]string{}
	checkVDI := func(v *VDI) error {
		if owner, taken := ids[v.ID]; taken {
			return fmt.Errorf("vdi id %d is both %s and %s", v.ID, owner, v.FullName())
		}
		ids[v.ID] = v.FullName()
		if v.ID < 1 || v.ID >= s.NextVDIID {
			return fmt.Errorf("vdi %s has id %d, the next id is %d", v.FullName(), v.ID, s.NextVDIID)
		}
		// A VDI's own copies need LevelVDICopies; below it, the format's.
		if (v.Copies != s.Format.Copies && s.Level() < LevelVDICopies) || v.Copies < 1 || v.Copies > MaxCopies || v.ObjectSize != s.Format.ObjectSize {
			return fmt.Errorf("vdi %s has copies %d and object size %d, the format %+v", v.FullName(), v.Copies, v.ObjectSize, *s.Format)
		}
		if err := checkScheme(s, v.EC, v.Copies); err != nil {
			return fmt.Errorf("vdi %s: %v", v.FullName(), err)
		}
		if v.EC != "" && v.Ack == AckZone {
			return fmt.Errorf("vdi %s is erasure-coded (%s) and acknowledges in the writer's zone", v.FullName(), v.EC)
		}
		if err := ValidateSize(v.Size, v.ObjectSize); err != nil {
			return fmt.Errorf("vdi %s: %v", v.FullName(), err)
		}
		if err := ValidateName(v.Name); err != nil {
			return fmt.Errorf("vdi %s: %v", v.FullName(), err)
		}
		// Every child is newer than its parent, so the tree has no cycle,
		// and a parent is kept (as a snapshot) while children read it.
		if v.Parent != 0 && (v.Parent >= v.ID || s.Snapshots[v.Parent] == nil) {
			return fmt.Errorf("vdi %s (id %d) has parent %d, which is not an older snapshot", v.FullName(), v.ID, v.Parent)
		}
		// Snapshots, clones and rollbacks inherit the scheme: a tree
		// has one.
		if v.Parent != 0 && s.Snapshots[v.Parent].EC != v.EC {
			return fmt.Errorf("vdi %s has erasure coding %q, its parent %s %q", v.FullName(), v.EC, s.Snapshots[v.Parent].FullName(), s.Snapshots[v.Parent].EC)
		}
		return nil
	}
	for name, v := range s.VDIs {
		if v == nil || v.Name != name || v.Snapshot || v.Deleted {
			return fmt.Errorf("writable vdi %q is recorded as %+v", name, v)
		}
		if err := checkVDI(v); err != nil {
			return err
		}
	}
	parents := map[uint32]bool{}
	for _, v := range s.VDIs {
		parents[v.Parent] = true
	}
	for _, v := range s.Snapshots {
		if v != nil {
			parents[v.Parent] = true
		}
	}
	tags := map[string]bool{}
	for id, v := range s.Snapshots {
		if v == nil || v.ID != id || !v.Snapshot {
			return fmt.Errorf("snapshot %d is recorded as %+v", id, v)
		}
		if err := checkVDI(v); err != nil {
			return err
		}
		if v.Deleted {
			if !parents[v.ID] {
				return fmt.Errorf("deleted snapshot %s is kept without children", v.FullName())
			}
			continue
		}
		if err := ValidateTag(v.Tag); err != nil {
			return fmt.Errorf("snapshot %s: %v", v.FullName(), err)
		}
		if tags[v.FullName()] {
			return fmt.Errorf("two snapshots are named %s", v.FullName())
		}
		tags[v.FullName()] = true
	}
	garbage := map[uint32]bool{}
	for _, g := range s.Garbage {
		if _, live := ids[g.ID]; live || garbage[g.ID] || g.ID < 1 || g.ID >= s.NextVDIID {
			return fmt.Errorf("garbage %+v: live %v, listed twice %v", g, live, garbage[g.ID])
		}
		if err := checkScheme(s, g.EC, g.Copies); err != nil {
			return fmt.Errorf("garbage %+v: %v", g, err)
		}
		garbage[g.ID] = true
	}
	return nil
}

// checkScheme checks a recorded erasure-coding scheme: none, or one in
// its canonical text, recorded from LevelErasureCoding on, with M+1
// copies.
func checkScheme(s *State, text string, copies int) error {
	if text == "" {
		return nil
	}
	if s.Level() < LevelErasureCoding {
		return fmt.Errorf("erasure coding %q at feature level %d", text, s.Level())
	}
	scheme, err := ec.Parse(text)
	if err != nil {
		return err
	}
	if scheme.String() != text || copies != scheme.M+1 {
		return fmt.Errorf("erasure coding %q (%s) with %d copies, want %d", text, scheme, copies, scheme.M+1)
	}
	return nil
}

// strictlySorted reports whether list is sorted without repeats.
func strictlySorted(list []string) bool {
	for i := 1; i < len(list); i++ {
		if list[i-1] >= list[i] {
			return false
		}
	}
	return true
}
