package layout

import (
	"fmt"

	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/object"
)

// ChunkHomes (temporary stand-in) places k+m chunks on distinct nodes.
func (e *Epoch) ChunkHomes(oid object.OID, k, m int) ([]cluster.Node, error) {
	if e.ring.MaxCopies() < k+m {
		return nil, fmt.Errorf("epoch %d cannot place %d chunks", e.Number, k+m)
	}
	return e.ReplicasOf(oid, k+m), nil
}
