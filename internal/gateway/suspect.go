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
// current epoch. The copy read may hold the failed change or not; the
// repair applies it over that copy (a write or a zero; a remove, or a
// change made some other way, is not known and not applied), so a failed
// change resolves as applied: a reader elsewhere that read it from a
// replica it reached never reads the older data afterwards (the same
// promise as recovery's for a change still in flight, recovery.go "Copies
// with the same stamp"). A write acknowledged in this zone whose far part
// failed was not reported failed: the copy read may lack it (lag.go, rule
// 6), so the repair writes it over that copy too, after the failed
// changes (a far part newer than a failed change over the same bytes
// would be undone by it otherwise; the reverse order, rarer, loses the
// failed change's bytes there, which its client was told had failed).
// A gateway that gives up
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
	delete(g.failed, oid)
}

// failedChange is a change to an object as its bytes: data written at
// offset (fresh: the write started the object anew, emptying it), or,
// with data nil, zeros over [offset, offset+length).
type failedChange struct {
	offset uint32
	data   []byte
	length uint32
	fresh  bool
}

// apply makes the change to data, the whole object.
func (c *failedChange) apply(data []byte) {
	if c.fresh {
		clear(data)
	}
	start := min(int(c.offset), len(data))
	if c.data != nil {
		copy(data[start:], c.data)
		return
	}
	clear(data[start:min(start+int(c.length), len(data))])
}

// keepFailed records change, which failed and made oid suspect, for the
// repair to apply (a copy: the caller's buffer is reused). An unknown
// change (nil) voids those kept before it: applied over its effects,
// they could undo them.
func (g *Gateway) keepFailed(oid uint64, change *failedChange) {
	g.suspectMu.Lock()
	defer g.suspectMu.Unlock()
	if g.failed == nil {
		g.failed = map[uint64][]*failedChange{}
	}
	if change == nil {
		g.failed[oid] = nil
		return
	}
	kept := *change
	kept.data = slices.Clone(change.data)
	g.failed[oid] = append(g.failed[oid], &kept)
}

// failedChanges returns the failed changes kept for oid, oldest first.
func (g *Gateway) failedChanges(oid uint64) []*failedChange {
	g.suspectMu.Lock()
	defer g.suspectMu.Unlock()
	return slices.Clone(g.failed[oid])
}

// dropFailed forgets the first n failed changes kept for oid: a repair
// wrote them to every replica. (The object may stay suspect for far
// parts still on their way, lag.go; re-applied after a later change,
// they would undo it.)
func (g *Gateway) dropFailed(oid uint64, n int) {
	g.suspectMu.Lock()
	defer g.suspectMu.Unlock()
	if kept := g.failed[oid]; len(kept) <= n {
		delete(g.failed, oid)
	} else {
		g.failed[oid] = kept[n:]
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
	if err := g.lag.wait(ctx, oid); err != nil {
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
	apply, settle := g.lag.repairParts(ctx, oid)
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
	failed := g.failedChanges(oid)
	for _, change := range failed {
		change.apply(data)
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
	g.dropFailed(oid, len(failed))
	g.lag.settle(oid, settle, clearSuspect)
	g.logger.Info("gateway: made the replicas of a suspect object identical", "object", fmt.Sprintf("%016x", oid), "failed_changes_applied", len(failed), "writes_acknowledged_in_this_zone", len(apply), "took", time.Since(started).Round(time.Millisecond))
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
