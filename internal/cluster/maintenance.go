package cluster

import (
	"context"
	"fmt"
	"time"
)

// SetNode changes node id's capacity or zone at run time.
func (c *Cluster) SetNode(ctx context.Context, id string, settings NodeSettings) (Node, error) {
	return c.cmds().SetNode(ctx, id, settings)
}

// Drain starts (drain true) or cancels the drain of node id.
func (c *Cluster) Drain(ctx context.Context, id string, drain bool) (Node, error) {
	return c.cmds().Drain(ctx, id, drain)
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
	return c.cmds().SetMaintenance(ctx, id, now, until)
}
