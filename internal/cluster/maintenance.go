package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"time"
)

// Maintenance windows (issue 12): `herd node maintenance NODE --for 30m`
// records in the log that the node may be down until then. Its leaving is
// still an epoch (the placement skips it, clients are served by the other
// replicas and the nodes that take its place), but no node copies its
// objects elsewhere in the background while its window is open: only the
// objects clients touch are made current on their new replicas, on
// demand. When it returns, the next epoch's recovery restamps its
// unchanged copies and fetches only what changed; when the window closes
// first, the background pass copies the rest as after any failure.

const commandNodeMaintenance commandType = 23

// MaxMaintenance is the longest window one command opens.
const MaxMaintenance = 7 * 24 * time.Hour

type nodeMaintenanceCommand struct {
	ID    string    `json:"id"`
	Until time.Time `json:"until"` // zero: end the window now
	Time  time.Time `json:"time"`
}

func (c nodeMaintenanceCommand) check() error { return checkLength("node id", c.ID, MaxOwnerLength) }

func init() { commands[commandNodeMaintenance] = applyNodeMaintenance }

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
	n.MaintenanceUntil = c.Until
	if c.Until.IsZero() || !c.Until.After(c.Time) {
		n.MaintenanceUntil = time.Time{}
		s.note("node", "node %s (%s): maintenance ended", n.ID, n.Address)
	} else {
		s.note("node", "node %s (%s) in maintenance until %s: while it is down its objects are not re-replicated in the background",
			n.ID, n.Address, c.Until.UTC().Format(time.RFC3339))
	}
	return *n, nil
}

// SetMaintenance opens a maintenance window of length d for node id (0
// ends it).
func (c *Cluster) SetMaintenance(ctx context.Context, id string, d time.Duration) (Node, error) {
	if d < 0 || d > MaxMaintenance {
		return Node{}, fmt.Errorf("%w: maintenance --for must be between 0 (end it) and %s, not %s", ErrInvalid, MaxMaintenance, d)
	}
	now := time.Now().UTC()
	until := time.Time{}
	if d > 0 {
		until = now.Add(d)
	}
	var n Node
	out, err := c.propose(ctx, commandNodeMaintenance, nodeMaintenanceCommand{ID: id, Until: until, Time: now})
	if err != nil {
		return n, err
	}
	return n, json.Unmarshal(out, &n)
}

// MaintenanceHold reports the nodes that are down inside their
// maintenance window at now, and the earliest end of those windows:
// while there is one, background recovery copies nothing.
func (c *applied) MaintenanceHold(now time.Time) (until time.Time, nodes []string) {
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
