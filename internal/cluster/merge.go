package cluster

import (
	"context"
)

// LayerMerged records that child holds every object it read through the
// deleted layer, whose parent was parent when the job began: the layer
// leaves the chain and its objects are freed.
func (c *Cluster) LayerMerged(ctx context.Context, layer, child, parent uint32) error {
	if err := c.Requires(FeatureLayerMerge); err != nil {
		return err
	}
	return c.cmds().LayerMerged(ctx, layer, child, parent)
}

// FlattenVDI asks for the writable VDI name to be flattened; the node
// holding its writer lock (or the leader) copies, then LayerFlattened.
func (c *Cluster) FlattenVDI(ctx context.Context, name string) (VDI, error) {
	if err := c.Requires(FeatureLayerMerge); err != nil {
		return VDI{}, err
	}
	return c.cmds().FlattenVDI(ctx, name)
}

// LayerFlattened records that child holds every object it read through
// its ancestors, parent the nearest: it no longer has a parent.
func (c *Cluster) LayerFlattened(ctx context.Context, child, parent uint32) error {
	if err := c.Requires(FeatureLayerMerge); err != nil {
		return err
	}
	return c.cmds().LayerFlattened(ctx, child, parent)
}
