package statemachine

import "github.com/herd-storage/herd/internal/ec"

// A VDI's number of copies.
//
// Every VDI records how many copies its objects have (VDI.Copies): the
// format's, or its own once the cluster's level allows `vdi create
// --copies` (FeatureVDICopies); snapshots, clones and rollbacks inherit
// it, and a deleted VDI's garbage record keeps it until its objects are
// freed. Whatever computes an object's replica set (the gateway,
// recovery, the proof of currency, scrub, checks) must use the copies of
// the object's VDI (object.VDI(oid)), never the format's: recovery using
// the format's would add a copy to a VDI of fewer, and delete as surplus
// the copies of a VDI of more.
//
// An erasure-coded VDI (VDI.EC, erasure.go) has Copies = M+1: its map
// objects and data objects are replicated like any other VDI's; only its
// chunks are not, and SchemeOf gives their scheme the same way.

// CopiesOf returns the number of copies of VDI id's objects: the VDI's
// own (writable, snapshot, or deleted but kept for its descendants) or,
// for a deleted VDI whose objects wait to be freed, its garbage record's.
// ok is false for an id this state does not know: a VDI created after
// the entries applied here (a node that lags), or one freed for good.
func (s *State) CopiesOf(id uint32) (copies int, ok bool) {
	if v := s.byID(id); v != nil && v.Copies > 0 {
		return v.Copies, true
	}
	for _, g := range s.Garbage {
		if g.ID == id && g.Copies > 0 {
			return g.Copies, true
		}
	}
	return 0, false
}

// SchemeOf returns the erasure-coding scheme of VDI id's objects, found
// as CopiesOf finds their copies: the VDI's own, or a deleted VDI's
// garbage record's. ok is false for a VDI of copies and for an id this
// state does not know.
func (s *State) SchemeOf(id uint32) (scheme ec.Scheme, ok bool) {
	if v := s.byID(id); v != nil {
		return v.Scheme()
	}
	for _, g := range s.Garbage {
		if g.ID == id {
			return schemeOf(g.EC)
		}
	}
	return ec.Scheme{}, false
}

// Scheme returns the VDI's erasure-coding scheme; ok is false for a VDI
// of copies.
func (v VDI) Scheme() (scheme ec.Scheme, ok bool) { return schemeOf(v.EC) }

// SpaceFactor is the raw space a byte of the VDI's data takes: its
// copies, or (K+M)/K for an erasure-coded VDI (its map objects and the
// recent writes not folded into chunks yet, replicated with M+1 copies,
// are left out).
func (v VDI) SpaceFactor() float64 {
	if scheme, ok := v.Scheme(); ok {
		return float64(scheme.Chunks()) / float64(scheme.K)
	}
	return float64(v.Copies)
}

// schemeOf parses a recorded scheme ("" for copies). State.Check makes
// sure every recorded one parses.
func schemeOf(text string) (ec.Scheme, bool) {
	if text == "" {
		return ec.Scheme{}, false
	}
	scheme, err := ec.Parse(text)
	return scheme, err == nil
}

// largestCopies is the most copies any object of the cluster may need:
// the format's (every VDI created without --copies gets it) or more, for
// a VDI (or garbage record) of its own copies. Drains and zone changes
// keep this many nodes (and zones) placeable, and the chunks of every
// erasure-coded VDI too (State.schemesShortfall). Below LevelVDICopies every
// VDI has the format's copies, so this is the format's, as binaries
// before per-VDI copies computed it: every node applies the entries
// alike.
func (s *State) largestCopies() int {
	if s.Format == nil {
		return 0
	}
	largest := s.Format.Copies
	for _, v := range s.VDIs {
		largest = max(largest, v.Copies)
	}
	for _, v := range s.Snapshots {
		largest = max(largest, v.Copies)
	}
	for _, g := range s.Garbage {
		largest = max(largest, g.Copies)
	}
	return largest
}

// VDICopies is State.CopiesOf on the state this node applied.
func (c *Reads) VDICopies(id uint32) (copies int, ok bool) {
	c.fsm.View(func(s *State) { copies, ok = s.CopiesOf(id) })
	return copies, ok
}

// VDIScheme is State.SchemeOf on the state this node applied.
func (c *Reads) VDIScheme(id uint32) (scheme ec.Scheme, ok bool) {
	c.fsm.View(func(s *State) { scheme, ok = s.SchemeOf(id) })
	return scheme, ok
}
