package gateway

import (
	"github.com/herd-storage/herd/internal/cluster"

	"github.com/herd-storage/herd/internal/object"
)

// ReplicasOf returns the nodes that hold oid in the latest epoch this node
// applied, and that epoch's number: what every node computes alike from
// the log. For tools and tests that compare stores with the placement
// (the simulator's final check).
func (g *Gateway) ReplicasOf(oid object.OID, copies int) (epoch object.Epoch, nodes []cluster.Node, err error) {
	rv, err := g.layouts.Current()
	if err != nil {
		return 0, nil, err
	}
	return rv.Number, rv.ReplicasOf(oid, copies), nil
}

// ObjectSize is the size of oid's VDI's objects.
func (g *Gateway) ObjectSize(oid object.OID) (uint64, error) { return objectSizeIn(g.cluster, oid) }
