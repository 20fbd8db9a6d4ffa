package statemachine

import (
	"context"
	"fmt"
	"sort"
)

// Reads is the read side of one node's cluster state: what its FSM has
// applied. Cluster (the raft log) and LocalMember (the log without raft,
// for simulations) embed it, so both answer every read (epochs, nodes,
// VDIs, locks, WaitEpoch) with the same code.
type Reads struct{ fsm *FSM }

// NewReads returns the reads of fsm's state.
func NewReads(fsm *FSM) Reads { return Reads{fsm: fsm} }

// Tree returns every VDI of the tree: writable, snapshots and deleted
// ones kept for their descendants, by id.
func (c *Reads) Tree() []VDI {
	var out []VDI
	c.fsm.View(func(s *State) {
		for _, v := range s.VDIs {
			out = append(out, *v)
		}
		for _, v := range s.Snapshots {
			out = append(out, *v)
		}
	})
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Chain returns a VDI's id and its ancestors' ids, nearest first.
func (c *Reads) Chain(id uint32) []uint32 {
	var chain []uint32
	c.fsm.View(func(s *State) { chain = s.Chain(id) })
	return chain
}

// Garbage returns the VDIs whose objects are waiting to be freed.
func (c *Reads) Garbage() []Garbage {
	var out []Garbage
	c.fsm.View(func(s *State) { out = append(out, s.Garbage...) })
	return out
}

// WaitRegistered waits until the log knows this process (its incarnation)
// as an alive node: right after a restart the leader has not yet
// committed the new incarnation, and a lock claimed by the old one would
// be refused.
func (c *Reads) WaitRegistered(ctx context.Context, id, incarnation string) error {
	for {
		changed := c.fsm.EpochChanged()
		n, ok := c.Node(id)
		if ok && n.State == NodeAlive && n.Incarnation == incarnation {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return fmt.Errorf("%w: this node has not been admitted to the cluster yet", ErrNoQuorum)
		}
	}
}

// ---- local reads (this node's applied state) ----

// Epoch is the latest epoch this node has applied.
func (c *Reads) Epoch() uint64 {
	var e uint64
	c.fsm.View(func(s *State) { e = s.Epoch() })
	return e
}

// Epochs returns the whole epoch history.
func (c *Reads) Epochs() []Epoch {
	var out []Epoch
	c.fsm.View(func(s *State) { out = append(out, s.Epochs...) })
	return out
}

// Events returns the cluster's events made by log entries after index
// after (0: all that are kept), oldest first.
func (c *Reads) Events(after uint64) []Event {
	var out []Event
	c.fsm.View(func(s *State) {
		for _, e := range s.Events {
			if e.Index > after {
				out = append(out, e)
			}
		}
	})
	return out
}

// VDIs lists VDIs by name.
func (c *Reads) VDIs() []VDI {
	var out []VDI
	c.fsm.View(func(s *State) { out = sortedVDIs(s) })
	return out
}

// VDI returns one VDI: NAME (writable) or NAME@TAG (a snapshot).
func (c *Reads) VDI(name string) (VDI, error) {
	var v VDI
	var err error
	c.fsm.View(func(s *State) {
		var p *VDI
		if p, err = s.lookup(name); err == nil {
			v = *p
		}
	})
	return v, err
}

// VDIByID returns a VDI of the tree by id: writable, snapshot or deleted
// but kept for its descendants.
func (c *Reads) VDIByID(id uint32) (VDI, bool) {
	var v VDI
	var ok bool
	c.fsm.View(func(s *State) {
		if p := s.byID(id); p != nil {
			v, ok = *p, true
		}
	})
	return v, ok
}

// Locks lists held locks.
func (c *Reads) Locks() []Lock {
	var out []Lock
	c.fsm.View(func(s *State) {
		for _, l := range s.Locks {
			out = append(out, *l)
		}
	})
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out
}

// EpochView is the current epoch with the nodes in it, as the data path
// needs it: placement is a function of exactly this.
type EpochView struct {
	Number uint64
	Nodes  []Node   // the epoch's nodes, sorted by id
	Placed []string // those that hold objects (Epoch.Placed)
	// Members are the placed nodes as the epoch recorded them: all that
	// placement needs (Epoch.PlacedMembers).
	Members []Member
	Format  *Format
}

// View returns the latest epoch this node has applied.
func (c *Reads) View() EpochView {
	var v EpochView
	c.fsm.View(func(s *State) {
		if s.Format != nil {
			f := *s.Format
			v.Format = &f
		}
		if len(s.Epochs) == 0 {
			return
		}
		last := s.Epochs[len(s.Epochs)-1]
		v.Number = last.Number
		v.Placed = last.Placed()
		v.Members = last.PlacedMembers(s.Member)
		for _, id := range last.Nodes {
			if n, ok := s.Nodes[id]; ok {
				v.Nodes = append(v.Nodes, *n)
			}
		}
	})
	return v
}

// WaitEpoch blocks until this node has applied an epoch after `after`,
// or ctx ends.
func (c *Reads) WaitEpoch(ctx context.Context, after uint64) (EpochView, error) {
	for {
		changed := c.fsm.EpochChanged()
		if v := c.View(); v.Number > after {
			return v, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return c.View(), ctx.Err()
		}
	}
}

// EpochContext returns the newest epoch this node has applied and
// signalled, and a context that ends once it applies another.
func (c *Reads) EpochContext() (context.Context, uint64) { return c.fsm.EpochContext() }

// Node returns a node by id from the log.
func (c *Reads) Node(id string) (Node, bool) {
	var n Node
	var ok bool
	c.fsm.View(func(s *State) {
		var p *Node
		if p, ok = s.Nodes[id]; ok {
			n = *p
		}
	})
	return n, ok
}

// Lock returns the holder of key, if any.
func (c *Reads) Lock(key string) (Lock, bool) {
	var l Lock
	var ok bool
	c.fsm.View(func(s *State) {
		var p *Lock
		if p, ok = s.Locks[key]; ok {
			l = *p
		}
	})
	return l, ok
}

// VDILockKey is the lock held while a VDI is open for writing.
func VDILockKey(name string) string { return vdiLockKey(name) }
