package statemachine

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

// largestCopies is the most copies any object of the cluster may need:
// the format's (every VDI created without --copies gets it) or more, for
// a VDI (or garbage record) of its own copies. Drains and zone changes
// keep this many nodes (and zones) placeable. Below LevelVDICopies every
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
