package statemachine

import (
	"fmt"
	"regexp"
	"sort"
	"time"
)

// Maintenance windows: `herd node maintenance NODE --for 30m`
// records in the log that the node may be down until then. Its leaving is
// still an epoch (the placement skips it, clients are served by the other
// replicas and the nodes that take its place), but no node copies its
// objects elsewhere in the background while its window is open: only the
// objects clients touch are made current on their new replicas, on
// demand. When it returns, the next epoch's recovery restamps its
// unchanged copies and fetches only what changed; when the window closes
// first, the background pass copies the rest as after any failure.
//
// Down, not out (as Ceph's mon_osd_down_out_interval): a node stopped
// cleanly opens such a window for itself on its way out (depart.go,
// openStopWindow), until --down-out-interval from then, so a restart
// (an upgrade, a reboot) costs a catch-up, not a copy of its share. The
// window is marked Stopped: the node's return ends it, and `node list`,
// the health and the events say the node is stopped and when it is
// marked out.

const (
	commandNodeMaintenance commandType = 23
	commandNodeDrain       commandType = 24
	commandNodeSet         commandType = 25
)

// MaxMaintenance is the longest window one command opens.
const MaxMaintenance = 7 * 24 * time.Hour

type nodeMaintenanceCommand struct {
	ID    string    `json:"id"`
	Until time.Time `json:"until"` // zero: end the window now
	Time  time.Time `json:"time"`
	// Stop: the node opens the window itself as it stops cleanly
	// (openStopWindow). It never shortens a window already open.
	Stop bool `json:"stop,omitempty"`
}

func (c nodeMaintenanceCommand) check() error { return checkLength("node id", c.ID, MaxOwnerLength) }

func init() {
	commands[commandNodeMaintenance] = applyNodeMaintenance
	commands[commandNodeDrain] = applyNodeDrain
	commands[commandNodeSet] = applyNodeSet
}

// NodeSettings are what `herd node set` changes; nil leaves a value as
// it is. Reset drops earlier settings: the node's own flags count again
// from its next start.
type NodeSettings struct {
	Capacity *uint64 `json:"capacity,omitempty"`
	Zone     *string `json:"zone,omitempty"`
	Reset    bool    `json:"reset,omitempty"`
}

type nodeSetCommand struct {
	ID       string       `json:"id"`
	Settings NodeSettings `json:"settings"`
	Time     time.Time    `json:"time"`
}

func (c nodeSetCommand) check() error {
	zone := ""
	if c.Settings.Zone != nil {
		zone = *c.Settings.Zone
	}
	return checkLengths(lengthCheck{"node id", c.ID, MaxOwnerLength}, lengthCheck{"node zone", zone, MaxZoneLength})
}

// applyNodeSet changes a node's capacity (its placement weight) or zone;
// a change is a new epoch, since the placement changes. A zone change
// is refused when it would leave too few zones for the copies.
func applyNodeSet(s *State, data []byte) (any, error) {
	var c nodeSetCommand
	if err := decode(data, &c); err != nil {
		return nil, err
	}
	n, ok := s.Nodes[c.ID]
	if !ok {
		return nil, fmt.Errorf("node %s: %w", c.ID, ErrNotFound)
	}
	before := MemberOf(*n)
	next := *n
	if c.Settings.Reset {
		next.SetCapacity, next.SetZone = false, false
	}
	if c.Settings.Capacity != nil {
		if *c.Settings.Capacity == 0 {
			return nil, fmt.Errorf("%w: capacity must be more than 0 (drain the node to give it no objects)", ErrInvalid)
		}
		next.Capacity, next.SetCapacity = *c.Settings.Capacity, true
	}
	if c.Settings.Zone != nil {
		next.Zone, next.SetZone = *c.Settings.Zone, true
	}
	if s.Format != nil && next.Zone != n.Zone {
		saved := *n
		*n = next
		err := checkCopiesPlaceable(s, s.largestCopies())
		if err == nil {
			// Erasure-coded VDIs: K+M nodes, at most M in a zone.
			nodes, _ := chunkNodes(s, "")
			if why := s.schemesShortfall(nodes, "the change would leave"); why != "" {
				err = fmt.Errorf("%w: %s", ErrTooFewNodes, why)
			}
		}
		*n = saved
		if err != nil {
			return nil, fmt.Errorf("zone %q for node %s: %w", next.Zone, c.ID, err)
		}
	}
	*n = next
	if after := MemberOf(*n); after != before && n.State == NodeAlive {
		newEpoch(s, c.Time, fmt.Sprintf("node %s set to capacity %d, zone %q (was %d, %q)", n.ID, n.Capacity, n.Zone, before.Weight, before.Zone))
	} else if c.Settings.Reset {
		s.note("node", "node %s: its capacity and zone come from its flags again from its next start", n.ID)
	}
	return *n, nil
}

var zoneRegexp = regexp.MustCompile(`^[A-Za-z0-9._-]{0,64}$`)

type nodeDrainCommand struct {
	ID    string    `json:"id"`
	Drain bool      `json:"drain"` // false: cancel the drain
	Time  time.Time `json:"time"`
}

func (c nodeDrainCommand) check() error { return checkLength("node id", c.ID, MaxOwnerLength) }

// applyNodeDrain starts or cancels a drain: a new epoch in which the
// node takes no objects (or takes them again). A drain is refused when
// the nodes left to hold objects are too few for the cluster's copies.
func applyNodeDrain(s *State, data []byte) (any, error) {
	var c nodeDrainCommand
	if err := decode(data, &c); err != nil {
		return nil, err
	}
	n, ok := s.Nodes[c.ID]
	if !ok {
		return nil, fmt.Errorf("node %s: %w", c.ID, ErrNotFound)
	}
	if n.Draining == c.Drain {
		return *n, nil
	}
	if c.Drain && s.Format != nil {
		zones := map[string]bool{}
		placeable, zoned := 0, false
		for _, id := range s.AliveNodes() {
			m := s.Nodes[id]
			if id == c.ID || m.Full || m.Draining {
				continue
			}
			placeable++
			zones[m.Zone] = true
			zoned = zoned || m.Zone != ""
		}
		// The VDI of the most copies decides (largestCopies).
		if copies := s.largestCopies(); placeable < copies || (zoned && len(zones) < copies) {
			return nil, fmt.Errorf("%w: draining node %s would leave %d nodes (%d zones) to hold %d copies of every object; add a node first",
				ErrTooFewNodes, c.ID, placeable, len(zones), copies)
		}
		// Erasure-coded VDIs need K+M such nodes, at most M in a zone.
		var left []*Node
		for _, id := range s.AliveNodes() {
			if m := s.Nodes[id]; id != c.ID && !m.Full && !m.Draining {
				left = append(left, m)
			}
		}
		if why := s.schemesShortfall(left, "the drain would leave"); why != "" {
			return nil, fmt.Errorf("%w: draining node %s: %s; add a node first", ErrTooFewNodes, c.ID, why)
		}
	}
	n.Draining = c.Drain
	reason := "node " + n.ID + " draining: its objects move to the other nodes"
	if !c.Drain {
		reason = "node " + n.ID + ": drain cancelled, it takes objects again"
	}
	if n.State == NodeAlive {
		newEpoch(s, c.Time, reason)
	} else {
		s.note("node", "%s", reason)
	}
	return *n, nil
}

func applyNodeMaintenance(s *State, data []byte) (any, error) {
	var c nodeMaintenanceCommand
	if err := decode(data, &c); err != nil {
		return nil, err
	}
	n, ok := s.Nodes[c.ID]
	if !ok {
		return nil, fmt.Errorf("node %s: %w", c.ID, ErrNotFound)
	}
	if !c.Until.IsZero() && c.Until.Sub(c.Time) > MaxMaintenance {
		return nil, fmt.Errorf("%w: a maintenance window is at most %s", ErrInvalid, MaxMaintenance)
	}
	if c.Stop {
		// The stopping node checked this before proposing; an operator's
		// window committed in between wins the same way.
		if !n.MaintenanceUntil.Before(c.Until) || !c.Until.After(c.Time) {
			return *n, nil
		}
		n.MaintenanceUntil, n.Stopped = c.Until, true
		s.note("node", "node %s (%s) is stopping cleanly: down, not out, until %s (its --down-out-interval, %s): unless it returns first, its objects are re-replicated only from then",
			n.ID, n.Address, c.Until.UTC().Format(time.RFC3339), c.Until.Sub(c.Time).Round(time.Second))
		return *n, nil
	}
	n.MaintenanceUntil, n.Stopped = c.Until, false
	if c.Until.IsZero() || !c.Until.After(c.Time) {
		n.MaintenanceUntil = time.Time{}
		s.note("node", "node %s (%s): maintenance ended", n.ID, n.Address)
	} else {
		s.note("node", "node %s (%s) in maintenance until %s: while it is down its objects are not re-replicated in the background",
			n.ID, n.Address, c.Until.UTC().Format(time.RFC3339))
	}
	return *n, nil
}

// endStopWindow ends the window node n opened as it stopped (Stopped),
// now that a new process of it joined at: it is back, so a crash from
// now on is recovered as any other. The window's end stays recorded
// (never zero again), so recovery still treats the node as one back from
// maintenance (recovery.returningFromMaintenance).
func endStopWindow(s *State, n *Node, at time.Time) {
	if !n.Stopped {
		return
	}
	n.Stopped = false
	if n.InMaintenance(at) {
		n.MaintenanceUntil = at
		s.note("node", "node %s (%s) is back before it was marked out: recovery restamps its unchanged copies and fetches only what changed", n.ID, n.Address)
	}
}

// MaintenanceHold reports the nodes that are down inside their
// maintenance window at now, and the earliest end of those windows:
// while there is one, background recovery copies nothing.
func (c *Reads) MaintenanceHold(now time.Time) (until time.Time, nodes []string) {
	c.fsm.View(func(s *State) {
		for id, n := range s.Nodes {
			if n.State != NodeAlive && n.InMaintenance(now) {
				nodes = append(nodes, id)
				if until.IsZero() || n.MaintenanceUntil.Before(until) {
					until = n.MaintenanceUntil
				}
			}
		}
	})
	sort.Strings(nodes)
	return until, nodes
}
