package cluster

import (
	"context"
	"encoding/json"
	"time"
)

// Merges, flattens, deletes and the garbage list on the simulation's log
// (Local, LocalMember): the same commands as Cluster's, applied by the
// production FSM, so the simulator runs the gateway's merge runner and
// the garbage collector on them.

// DeleteVDI commits a delete, as `herd vdi delete NAME[@TAG]` does.
func (l *Local) DeleteVDI(name string) error {
	return l.commitCommand(commandVDIDelete, vdiDeleteCommand{Name: name}, nil)
}

// FlattenVDI commits a flatten request, as `herd vdi flatten NAME`
// does; the node holding the VDI's writer lock (or the leader) copies.
func (l *Local) FlattenVDI(name string) (VDI, error) {
	var v VDI
	err := l.commitCommand(commandVDILayer, vdiLayerCommand{Op: layerFlatten, Name: name, Time: time.Now().UTC()}, &v)
	return v, err
}

// LayerMerged is Cluster.LayerMerged.
func (m *LocalMember) LayerMerged(ctx context.Context, layer, child, parent uint32) error {
	_, err := m.propose(ctx, commandVDILayer, vdiLayerCommand{Op: layerMerged, ID: layer, Child: child, Parent: &parent, Time: time.Now().UTC()})
	return err
}

// LayerFlattened is Cluster.LayerFlattened.
func (m *LocalMember) LayerFlattened(ctx context.Context, child, parent uint32) error {
	_, err := m.propose(ctx, commandVDILayer, vdiLayerCommand{Op: layerFlattened, ID: parent, Child: child, Time: time.Now().UTC()})
	return err
}

// FlattenVDI is Cluster.FlattenVDI.
func (m *LocalMember) FlattenVDI(ctx context.Context, name string) (VDI, error) {
	var v VDI
	out, err := m.propose(ctx, commandVDILayer, vdiLayerCommand{Op: layerFlatten, Name: name, Time: time.Now().UTC()})
	if err != nil {
		return v, err
	}
	return v, json.Unmarshal(out, &v)
}

// GarbageDone is Cluster.GarbageDone.
func (m *LocalMember) GarbageDone(ctx context.Context, id uint32) error {
	_, err := m.propose(ctx, commandGarbageDone, garbageDoneCommand{ID: id})
	return err
}
