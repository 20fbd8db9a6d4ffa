package gateway

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/layout"
	"github.com/herd-storage/herd/internal/object"
)

// Suspect objects.
//
// A change (write, zero, remove) goes to every replica in parallel. When
// it fails, it may have reached some replicas and not others: their
// copies then differ under the same epoch stamp, which recovery takes for
// identical, so nothing would ever make them equal again, and reads would
// return old or new data depending on the replica they reach. The client
// was told the change failed, so either content is right, but only one
// of them, on every replica.
//
// So a failed change marks its object suspect, and before this gateway
// reads or changes a suspect object again it makes its replicas identical
// (repairSuspect): under the object's exclusive lock, so that no change
// of this gateway (the VDI's only writer) runs meanwhile, it reads the
// whole object from one replica and writes it to every replica of the
// current epoch. A write acknowledged in this zone whose far part failed
// was not reported failed: the copy read may lack it (lag.go, rule 6),
// so the repair writes it over that copy first. A gateway that gives up
// a VDI with suspect objects left
// (they could not be repaired either) marks it unclean in the cluster
// log before releasing its lock, and the next writer repairs the whole
// VDI (maintenance.RepairUnclean), as it does when a writer's node dies.

// suspect marks oid: a change to it failed, perhaps after reaching some
// of its replicas.
func (g *Gateway) suspect(oid uint64, err error) {
	g.suspectMu.Lock()
	defer g.suspectMu.Unlock()
	if g.suspects == nil {
		g.suspects = map[uint64]bool{}
	}
	if !g.suspects[oid] {
		g.suspects[oid] = true
		g.suspectCount.Add(1)
		g.logger.Warn("gateway: a change failed and may have reached some replicas only; the object is repaired before its next use",
			"object", fmt.Sprintf("%016x", oid), "err", err)
	}
}

func (g *Gateway) isSuspect(oid uint64) bool {
	if g.suspectCount.Load() == 0 {
		return false
	}
	g.suspectMu.Lock()
	defer g.suspectMu.Unlock()
	return g.suspects[oid]
}

func (g *Gateway) clearSuspect(oid uint64) {
	g.suspectMu.Lock()
	defer g.suspectMu.Unlock()
	if g.suspects[oid] {
		delete(g.suspects, oid)
		g.suspectCount.Add(-1)
	}
}

// suspectsOf returns the suspect objects of the VDIs in ids.
func (g *Gateway) suspectsOf(ids []uint32) []uint64 {
	if g.suspectCount.Load() == 0 {
		return nil
	}
	g.suspectMu.Lock()
	defer g.suspectMu.Unlock()
	var out []uint64
	for oid := range g.suspects {
		if slices.Contains(ids, object.VDI(oid)) {
			out = append(out, oid)
		}
	}
	return out
}

// objectSize is the size of oid's VDI's objects (map objects have the
// same size as data objects).
func (g *Gateway) objectSize(oid uint64) (uint64, error) {
	id := object.VDI(oid)
	for _, v := range g.cluster.Tree() {
		if v.ID == id {
			return v.ObjectSize, nil
		}
	}
	return 0, fmt.Errorf("object %016x: no vdi %d in the cluster log", oid, id)
}

// needsRepair says whether oid is suspect or has far parts kept for its
// repair (lag.go, rule 6; a kept part leaves its object suspect, so this
// is the same, checked twice); otherwise it costs two atomic loads.
func (g *Gateway) needsRepair(oid uint64) bool {
	return g.isSuspect(oid) || g.lag.hasFailed(oid)
}

// repairSuspect makes the replicas of oid identical if a failed change
// left it suspect (see above), with every write acknowledged in this
// zone that the copy it reads may lack; otherwise it costs atomic loads.
func (g *Gateway) repairSuspect(ctx context.Context, oid uint64, copies int) error {
	if !g.needsRepair(oid) {
		return nil
	}
	// The repair rewrites every replica: the writes still on their way
	// to other zones land first (lag.go, rule 3).
	if err := g.waitLag(ctx, oid); err != nil {
		return err
	}
	lock := g.objectLock(oid)
	lock.Lock()
	defer lock.Unlock()
	if !g.needsRepair(oid) {
		return nil // repaired by a request that held the lock before us
	}
	started := time.Now()
	size, err := g.objectSize(oid)
	if err != nil {
		return err
	}
	data := make([]byte, size)
	err = g.readReplicas(ctx, oid, copies, data, 0)
	// The writes acknowledged in this zone that the copy read may lack:
	// its far parts that failed, and those still pending (lag.go, rule 6).
	apply, settle := g.lagRepair(ctx, oid)
	clearSuspect := func() { g.clearSuspect(oid) }
	if errors.Is(err, object.ErrNoObject) {
		if len(apply) == 0 {
			// No node holds it: the change never created it anywhere,
			// or a failed remove reached every replica. Nothing can
			// differ.
			g.lag.settle(oid, settle, clearSuspect)
			return nil
		}
		// No copy left, but writes acknowledged in this zone: they are
		// all of the object if the first starts it afresh, or if it is
		// a map object (absent, it reads as zeros). Otherwise the rest
		// of a data object is lost, and zeros must not stand for it.
		if !apply[0].flags.Fresh && object.Type(oid) != object.TypeMap {
			return fmt.Errorf("object %016x: writes acknowledged in this zone did not reach the other zones, and no copy of the object is left to write them on: %w", oid, err)
		}
		clear(data)
		err = nil
	}
	if err != nil {
		return fmt.Errorf("object %016x: a failed change may have reached some of its replicas only, and reading it to make them identical failed: %w", oid, err)
	}
	applyLag(data, apply)
	flags := object.Flags{Create: true, Sync: true}
	err = g.replicate(ctx, oid, copies, func(ctx context.Context, node cluster.Node, rv *layout.Epoch) error {
		err := g.replicas.Write(ctx, node, rv.Number, oid, data, 0, flags)
		if object.Damaged(err) || errors.Is(err, object.ErrNotRecovered) {
			// Its copy is overwritten whole; make it current first
			// (the replica refuses changes to a copy not yet proven
			// current in this epoch).
			if err := g.recoverOn(ctx, node, rv, oid); err != nil && !errors.Is(err, object.ErrNoObject) {
				return err
			}
			err = g.replicas.Write(ctx, node, rv.Number, oid, data, 0, flags)
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("object %016x: a failed change may have reached some of its replicas only, and making them identical failed: %w", oid, err)
	}
	g.lag.settle(oid, settle, clearSuspect)
	g.logger.Info("gateway: made the replicas of a suspect object identical", "object", fmt.Sprintf("%016x", oid), "writes_acknowledged_in_this_zone", len(apply), "took", time.Since(started).Round(time.Millisecond))
	return nil
}

// repairSuspects repairs the suspect objects of a VDI this gateway gives
// up (the caller releases its lock) and reports whether none is left.
func (g *Gateway) repairSuspects(ctx context.Context, vdi cluster.VDI, chain []uint32) bool {
	left := 0
	for _, oid := range g.suspectsOf(chain) {
		if err := g.repairSuspect(ctx, oid, vdi.Copies); err != nil {
			g.logger.Warn("gateway: repairing a suspect object failed", "vdi", vdi.Name, "object", fmt.Sprintf("%016x", oid), "err", err)
			left++
		}
	}
	return left == 0
}
