package cluster

import (
	"context"
)

// Merges, flattens, deletes and the garbage list on the simulation's log
// (Local, LocalMember): the same commands as Cluster's, applied by the
// production FSM, so the simulator runs the gateway's merge runner and
// the garbage collector on them.

// DeleteVDI commits a delete, as `herd vdi delete NAME[@TAG]` does.
func (l *Local) DeleteVDI(name string) error {
	return l.cmds.DeleteVDI(context.Background(), name)
}

// FlattenVDI commits a flatten request, as `herd vdi flatten NAME`
// does; the node holding the VDI's writer lock (or the leader) copies.
func (l *Local) FlattenVDI(name string) (VDI, error) {
	return l.cmds.FlattenVDI(context.Background(), name)
}

// LayerMerged is Cluster.LayerMerged.
func (m *LocalMember) LayerMerged(ctx context.Context, layer, child, parent uint32) error {
	return m.cmds.LayerMerged(ctx, layer, child, parent)
}

// LayerFlattened is Cluster.LayerFlattened.
func (m *LocalMember) LayerFlattened(ctx context.Context, child, parent uint32) error {
	return m.cmds.LayerFlattened(ctx, child, parent)
}

// FlattenVDI is Cluster.FlattenVDI.
func (m *LocalMember) FlattenVDI(ctx context.Context, name string) (VDI, error) {
	return m.cmds.FlattenVDI(ctx, name)
}

// GarbageDone is Cluster.GarbageDone.
func (m *LocalMember) GarbageDone(ctx context.Context, id uint32) error {
	return m.cmds.GarbageDone(ctx, id)
}
