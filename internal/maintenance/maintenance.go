// Package maintenance is the repair path that is not recovery: checking
// and repairing a VDI's replicas (`herd vdi check [--repair]`, and the
// repair of a VDI whose writer's node died before its next writer serves
// it), space accounting per VDI, freeing the objects of deleted VDIs
// (the leader's garbage collector), and marking this node full when its
// disks fill.
//
// Invariants:
//   - A repair never serves or spreads a copy that is not provably
//     current: each object is proven (recovery.Proof) before its
//     reference copy is chosen, and an unavailable object is reported,
//     never "repaired" from an older copy.
//   - A VDI open for writing is never repaired behind its writer's back
//     (refused, naming the holder), except by that writer itself.
//   - Garbage is freed only for VDIs the log says nothing reads any more,
//     and recorded done only after every object is gone; repeating it is
//     harmless.
//   - A full node keeps its copies until the placement (which gives it
//     none) has re-created them elsewhere: recovery deletes surplus copies
//     only once replaced.
package maintenance

import (
	"context"
	"log/slog"

	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/layout"
	"github.com/herd-storage/herd/internal/object"
	"github.com/herd-storage/herd/internal/recovery"
)

// Cluster is what maintenance needs of the cluster log.
type Cluster interface {
	LookupVDI(ctx context.Context, name string) (cluster.VDI, error)
	MarkVDIRepaired(ctx context.Context, name string) error
	Tree() []cluster.VDI
	Chain(id uint32) []uint32
}

// GarbageLog is the leader's view of the garbage list.
type GarbageLog interface {
	IsLeader() bool
	Garbage() []cluster.Garbage
	GarbageDone(ctx context.Context, id uint32) error
}

// Replicas reaches every node's replica (replica.Client).
type Replicas interface {
	recovery.Replicas
	Remove(ctx context.Context, node cluster.Node, epoch object.Epoch, oid object.OID) error
	Recover(ctx context.Context, node cluster.Node, epoch object.Epoch, oid object.OID) error
	Write(ctx context.Context, node cluster.Node, epoch object.Epoch, oid object.OID, p []byte, offset uint32, flags object.Flags) error
	FetchAt(ctx context.Context, node cluster.Node, epoch object.Epoch, oid object.OID, p []byte, offset uint32) (object.Epoch, error)
}

// Data is the data path maintenance reads object maps and objects
// through, and removes objects through: the node's gateway
// (gateway.Gateway). It is an argument of each operation rather than a
// part of Maintenance, because the gateway itself takes the repair of
// unclean VDIs (RepairUnclean) when it is made, and hands itself to it.
type Data interface {
	// Map returns the VDI's object map entries (internal/objmap).
	Map(ctx context.Context, vdi cluster.VDI) ([]uint32, error)
	ReadObject(ctx context.Context, oid object.OID, copies int, p []byte, offset uint32) error
	RemoveObject(ctx context.Context, oid object.OID, copies int) error
}

// ChunkChecker is what Data may also do: check (and repair) the chunks
// of a data object of an erasure-coded VDI against its head
// (gateway.Gateway.CheckChunks).
type ChunkChecker interface {
	CheckChunks(ctx context.Context, vdi cluster.VDI, oid object.OID, repair bool) (checked, bad, repaired int, problems []string, err error)
}

// Maintenance is one node's maintenance.
type Maintenance struct {
	cluster  Cluster
	layouts  *layout.History
	replicas Replicas
	proof    *recovery.Proof
	logger   *slog.Logger
}

// New returns a node's maintenance. proof is the node's recovery's
// (recovery.Recovery.Proof).
func New(c Cluster, layouts *layout.History, replicas Replicas, proof *recovery.Proof, logger *slog.Logger) *Maintenance {
	return &Maintenance{cluster: c, layouts: layouts, replicas: replicas, proof: proof, logger: logger}
}
