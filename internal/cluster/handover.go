package cluster

import (
	"context"
)

// WantLock claims key for session on this node, or, when another holds
// it, records that this node wants it: the holder hands it over. Granted
// says whether the lock is this node's now.
func (c *Cluster) WantLock(ctx context.Context, key, session string) (LockWant, error) {
	wait, cancel := context.WithTimeout(ctx, applyTimeout)
	err := c.WaitRegistered(wait, c.cfg.NodeID, c.cfg.Incarnation)
	cancel()
	if err != nil {
		return LockWant{}, err
	}
	return c.cmds().WantLock(ctx, key, session)
}

// HandOverLock moves key, held by session on this node, to owner.
func (c *Cluster) HandOverLock(ctx context.Context, key, session string, to LockOwner) error {
	return c.cmds().HandOverLock(ctx, key, session, to)
}

// BreakLock takes key away from its holder (see applyLockBreak).
func (c *Cluster) BreakLock(ctx context.Context, key, by string) (Lock, error) {
	return c.cmds().BreakLock(ctx, key, by)
}

// SetVDI changes a VDI's settings.
func (c *Cluster) SetVDI(ctx context.Context, name string, settings VDISettings) (VDI, error) {
	return c.cmds().SetVDI(ctx, name, settings)
}

// WantLock is Cluster.WantLock.
func (m *LocalMember) WantLock(ctx context.Context, key, session string) (LockWant, error) {
	return m.cmds.WantLock(ctx, key, session)
}

// HandOverLock is Cluster.HandOverLock.
func (m *LocalMember) HandOverLock(ctx context.Context, key, session string, to LockOwner) error {
	return m.cmds.HandOverLock(ctx, key, session, to)
}
