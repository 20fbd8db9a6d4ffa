package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/ec"
	"github.com/herd-storage/herd/internal/layout"
	"github.com/herd-storage/herd/internal/object"
	"github.com/herd-storage/herd/internal/waitlock"
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

// healer makes replicas whose copies may differ identical again, and
// heals what a replica reports damaged: the suspect objects (a change
// to them failed, perhaps after reaching some replicas only, here), the
// blocks that fail their checksum (checksum.go) and copies found
// damaged. It reads and writes replicas through path, and consults zone
// lag (lag.go) for the writes acknowledged in this zone that a repair
// must write again.
type healer struct {
	cluster  interface{ Tree() []cluster.VDI }
	layouts  *layout.History
	replicas Replicas
	logger   *slog.Logger
	path     healPath
	lag      *zoneLag

	// checksumRepairs and checksumLost count bad blocks (checksum.go).
	checksumRepairs atomic.Uint64
	checksumLost    atomic.Uint64

	suspectMu    sync.Mutex // guards suspects and failed
	suspects     map[object.OID]bool
	suspectCount atomic.Int64
	// failed are the changes that made objects suspect, in order, for
	// their repair to re-apply (nil for an object whose failed change is
	// not known: then none is).
	failed map[object.OID][]*failedChange
}

// healPath is what healing needs of the data path.
type healPath interface {
	// objectLock is oid's lock: shared by changes, exclusive by a
	// repair.
	objectLock(oid object.OID) *waitlock.RWLock
	// replicate runs op on every replica of oid.
	replicate(ctx context.Context, oid object.OID, copies int, op func(ctx context.Context, node cluster.Node, rv *layout.Epoch) error) error
	// readReplicas reads a piece from one replica, with failover.
	readReplicas(ctx context.Context, oid object.OID, copies int, p []byte, offset uint32) error
	// readFrom reads a piece from one replica, recovering its copy first
	// if needed.
	readFrom(ctx context.Context, node cluster.Node, rv *layout.Epoch, oid object.OID, p []byte, offset uint32) error
	// recoverOn has node make its copy of oid current in rv's epoch.
	recoverOn(ctx context.Context, node cluster.Node, rv *layout.Epoch, oid object.OID) error
}

// suspect marks oid: a change to it failed, perhaps after reaching some
// of its replicas.
func (h *healer) suspect(oid object.OID, err error) {
	h.suspectMu.Lock()
	defer h.suspectMu.Unlock()
	if h.suspects == nil {
		h.suspects = map[object.OID]bool{}
	}
	if !h.suspects[oid] {
		h.suspects[oid] = true
		h.suspectCount.Add(1)
		h.logger.Warn("gateway: a change failed and may have reached some replicas only; the object is repaired before its next use",
			"object", fmt.Sprintf("%016x", oid), "err", err)
	}
}

func (h *healer) isSuspect(oid object.OID) bool {
	if h.suspectCount.Load() == 0 {
		return false
	}
	h.suspectMu.Lock()
	defer h.suspectMu.Unlock()
	return h.suspects[oid]
}

func (h *healer) clearSuspect(oid object.OID) {
	h.suspectMu.Lock()
	defer h.suspectMu.Unlock()
	if h.suspects[oid] {
		delete(h.suspects, oid)
		h.suspectCount.Add(-1)
	}
	delete(h.failed, oid)
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
func (h *healer) keepFailed(oid object.OID, change *failedChange) {
	h.suspectMu.Lock()
	defer h.suspectMu.Unlock()
	if h.failed == nil {
		h.failed = map[object.OID][]*failedChange{}
	}
	if change == nil {
		h.failed[oid] = nil
		return
	}
	kept := *change
	kept.data = slices.Clone(change.data)
	h.failed[oid] = append(h.failed[oid], &kept)
}

// failedChanges returns the failed changes kept for oid, oldest first.
func (h *healer) failedChanges(oid object.OID) []*failedChange {
	h.suspectMu.Lock()
	defer h.suspectMu.Unlock()
	return slices.Clone(h.failed[oid])
}

// dropFailed forgets the first n failed changes kept for oid: a repair
// wrote them to every replica. (The object may stay suspect for far
// parts still on their way, lag.go; re-applied after a later change,
// they would undo it.)
func (h *healer) dropFailed(oid object.OID, n int) {
	h.suspectMu.Lock()
	defer h.suspectMu.Unlock()
	if kept := h.failed[oid]; len(kept) <= n {
		delete(h.failed, oid)
	} else {
		h.failed[oid] = kept[n:]
	}
}

// suspectsOf returns the suspect objects of the VDIs in ids.
func (h *healer) suspectsOf(ids []uint32) []object.OID {
	if h.suspectCount.Load() == 0 {
		return nil
	}
	h.suspectMu.Lock()
	defer h.suspectMu.Unlock()
	var out []object.OID
	for oid := range h.suspects {
		if slices.Contains(ids, uint32(object.VDI(oid))) {
			out = append(out, oid)
		}
	}
	return out
}

// objectSizeIn is the size of oid's copies in c's tree: its VDI's object
// size (map objects have the same size as data objects), or for a data
// object of an erasure-coded VDI its replicated part's (overlay, entries
// and heads: ec.ReplicatedSize), which a repair copies whole.
func objectSizeIn(c interface{ Tree() []cluster.VDI }, oid object.OID) (uint64, error) {
	id := object.VDI(oid)
	for _, v := range c.Tree() {
		if object.VDIID(v.ID) == id {
			if object.Type(oid) == object.TypeData {
				return ec.ReplicatedSize(v.EC, v.ObjectSize)
			}
			return v.ObjectSize, nil
		}
	}
	return 0, fmt.Errorf("object %016x: no vdi %d in the cluster log", oid, id)
}

// needsRepair says whether oid is suspect or has far parts kept for its
// repair (lag.go, rule 6; a kept part leaves its object suspect, so this
// is the same, checked twice); otherwise it costs two atomic loads.
func (h *healer) needsRepair(oid object.OID) bool {
	return h.isSuspect(oid) || h.lag.hasFailed(oid)
}

// repairSuspect makes the replicas of oid identical if a failed change
// left it suspect (see above), with every write acknowledged in this
// zone that the copy it reads may lack; otherwise it costs atomic loads.
func (h *healer) repairSuspect(ctx context.Context, oid object.OID, copies int) error {
	if !h.needsRepair(oid) {
		return nil
	}
	// The repair rewrites every replica: the writes still on their way
	// to other zones land first (lag.go, rule 3).
	if err := h.lag.wait(ctx, oid); err != nil {
		return err
	}
	lock := h.path.objectLock(oid)
	lock.Lock()
	defer lock.Unlock()
	if !h.needsRepair(oid) {
		return nil // repaired by a request that held the lock before us
	}
	started := time.Now()
	size, err := objectSizeIn(h.cluster, oid)
	if err != nil {
		return err
	}
	data := make([]byte, size)
	err = h.path.readReplicas(ctx, oid, copies, data, 0)
	// The writes acknowledged in this zone that the copy read may lack:
	// its far parts that failed, and those still pending (lag.go, rule 6).
	apply, settle := h.lag.repairParts(ctx, oid)
	clearSuspect := func() { h.clearSuspect(oid) }
	if errors.Is(err, object.ErrNoObject) {
		if len(apply) == 0 {
			// No node holds it: the change never created it anywhere,
			// or a failed remove reached every replica. Nothing can
			// differ.
			h.lag.settle(oid, settle, clearSuspect)
			return nil
		}
		// No copy left, but writes acknowledged in this zone: they are
		// all of the object if the first starts it afresh, or if it is
		// a map object (absent, it reads as zeros). Otherwise the rest
		// of a data object is lost, and zeros must not stand for it.
		if !apply[0].flags.Has(object.FlagFresh) && object.Type(oid) != object.TypeMap {
			return fmt.Errorf("object %016x: writes acknowledged in this zone did not reach the other zones, and no copy of the object is left to write them on: %w", oid, err)
		}
		clear(data)
		err = nil
	}
	if err != nil {
		return fmt.Errorf("object %016x: a failed change may have reached some of its replicas only, and reading it to make them identical failed: %w", oid, err)
	}
	failed := h.failedChanges(oid)
	for _, change := range failed {
		change.apply(data)
	}
	applyLag(data, apply)
	flags := object.FlagCreate | object.FlagSync
	err = h.path.replicate(ctx, oid, copies, func(ctx context.Context, node cluster.Node, rv *layout.Epoch) error {
		err := h.replicas.Write(ctx, node, rv.Number, oid, data, 0, flags)
		if object.Damaged(err) || errors.Is(err, object.ErrNotRecovered) {
			// Its copy is overwritten whole; make it current first
			// (the replica refuses changes to a copy not yet proven
			// current in this epoch).
			if err := h.path.recoverOn(ctx, node, rv, oid); err != nil && !errors.Is(err, object.ErrNoObject) {
				return err
			}
			err = h.replicas.Write(ctx, node, rv.Number, oid, data, 0, flags)
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("object %016x: a failed change may have reached some of its replicas only, and making them identical failed: %w", oid, err)
	}
	h.dropFailed(oid, len(failed))
	h.lag.settle(oid, settle, clearSuspect)
	h.logger.Info("gateway: made the replicas of a suspect object identical", "object", fmt.Sprintf("%016x", oid), "failed_changes_applied", len(failed), "writes_acknowledged_in_this_zone", len(apply), "took", time.Since(started).Round(time.Millisecond))
	return nil
}

// repairSuspects repairs the suspect objects of a VDI this gateway gives
// up (the caller releases its lock) and reports whether none is left.
func (h *healer) repairSuspects(ctx context.Context, vdi cluster.VDI, chain []uint32) bool {
	left := 0
	for _, oid := range h.suspectsOf(chain) {
		if err := h.repairSuspect(ctx, oid, vdi.Copies); err != nil {
			h.logger.Warn("gateway: repairing a suspect object failed", "vdi", vdi.Name, "object", fmt.Sprintf("%016x", oid), "err", err)
			left++
		}
	}
	return left == 0
}
