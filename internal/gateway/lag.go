package gateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/layout"
	"github.com/herd-storage/herd/internal/object"
)

// Zone acknowledgement (cluster.AckZone, `herd vdi set NAME --ack zone`;
// zones far apart).
//
// A write to a VDI in zone mode, without FUA, is acknowledged once every
// replica of its object in this node's zone has applied it (its near
// part); the replicas in the other zones get it in the background (its
// far part), so a write does not wait for a wide-area round trip. When
// the object has no replica in this zone, or only replicas in it, the
// write goes to every replica as usual. What holds:
//
//  1. FLUSH, FUA and the handing over, snapshot or close of the VDI wait
//     until every far part acknowledged before them has landed (drain),
//     so a FLUSH still means "on stable storage on every replica". A far
//     part that failed makes its object suspect (suspect.go), and the
//     FLUSH first makes its replicas identical, the write included
//     (rule 6), or fails.
//  2. Far parts land in the order their writes were acknowledged wherever
//     they overlap (a part waits for the pending parts of its object
//     whose ranges overlap it; a CREATE covers the whole object), and a
//     first write's map entry lands after its data.
//  3. Reads of an object with far parts pending come from the replicas
//     that acknowledged all of them, in the current epoch; otherwise they
//     wait for the parts to land. Changes that go to every replica (FUA,
//     TRIM, WRITE_ZEROES, copy-on-write, removes, suspect repairs) wait
//     for the object's pending parts first.
//  4. A far part whose epoch changed before it landed goes to every
//     replica of the new epoch (idempotent; the parts after it that
//     overlap it follow it again), and reads wait for it meanwhile.
//  5. The bytes of far parts pending on this node are bounded
//     (Options.LagBytes): beyond it a write waits, so the far zones are
//     never more than that behind. The far parts kept for a repair
//     (rule 6) are bounded too: while they reach the bound, writes go to
//     every replica, so they never exceed twice it.
//  6. A far part that failed is kept, with its data, until its object is
//     repaired, and so is every part of the object that finishes after
//     it and overlaps a kept one; the repair (repairSuspect) reads the
//     object from one replica, writes the kept parts and the pending
//     ones over it in the order they were acknowledged, and writes the
//     result to every replica. The near copies are not enough: until the
//     far part lands, the far copies miss the write under the same
//     stamp, and after an epoch change recovery, which takes copies of
//     one stamp for identical, may restamp a far copy first and then
//     make the near ones current from it (fetch it, newer now), so the
//     copy the repair reads can lack the write. What holds: every write
//     acknowledged in this zone is, at all times, on every replica of
//     some epoch (landed) or in this table (pending, or kept); a copy
//     made current in a later epoch holds every landed write (the
//     paper's Fig. 4, as for a write acknowledged by every replica), and
//     the repair writes every kept and pending one over it, later over
//     earlier wherever they overlap (rule 2 orders their finishing).
//     Parts acknowledged under a writer lock this node no longer holds
//     are dropped, not written (the VDI is unclean: its next writer
//     repairs it), and a remove of the object drops its kept parts (it
//     follows them).
//
// What is given up, and only until the next FLUSH: if this node dies
// with far parts pending, its zone's copies hold writes the other zones
// lack under the same epoch stamp, and recovery, which takes copies of
// one stamp for identical (in the default mode a write acknowledged in an
// epoch reached every replica in it), may make either content current on
// every replica. So the writes this node acknowledged since its last
// completed FLUSH may be lost, each piece wholly old or wholly new, as
// after the power loss of a disk with a volatile write cache; never a
// write acknowledged before a completed FLUSH. A client that survives the
// writer's node (and reconnects through another) can so read older data
// than it wrote: zone mode is for writers whose client fails with them
// (QEMU on the node serving it, through the local socket). Readers
// through other nodes read their own zone's copies, which may be behind
// the writer by at most the pending bytes until its next FLUSH.

// DefaultLagBytes bounds the far parts pending on one node (Options.LagBytes).
const DefaultLagBytes = 64 << 20

// lagOp is one write's far part.
type lagOp struct {
	oid        object.OID
	start, end uint32       // the bytes of the object it changes
	offset     uint32       // where data goes
	epoch      object.Epoch // the epoch its near part was applied in
	near       []string     // the nodes that acknowledged its near part
	data       []byte
	flags      object.Flags
	copies     int
	fence      *fenceCheck   // the writer lock it was acknowledged under (nil: none)
	deps       []*lagOp      // the parts it lands after
	done       chan struct{} // closed when it has landed or failed
	err        error         // why it failed; set before done closes
	// settled: a repair wrote it to every replica, or dropped it
	// (guarded by lagTable.mu): it is never kept afterwards.
	settled bool
}

// lagFailure is an object whose far part failed and that no repair has
// made whole since (rule 6).
type lagFailure struct {
	copies int
	ops    []*lagOp // kept, in the order they finished
}

// lagTable tracks the far parts pending on this gateway.
type lagTable struct {
	bytes    *semaphore
	count    atomic.Int64 // pending parts
	inFlight atomic.Int64 // their bytes
	kept     atomic.Int64 // the bytes of the parts kept in failed

	// mu guards pending, failed and every part's settled; it is taken
	// before healer.suspectMu (settle clears a suspect under it).
	mu      sync.Mutex
	pending map[object.OID][]*lagOp // by object, in the order acknowledged
	// failed are objects whose far part failed, with the parts kept for
	// their repair (rule 6): the next FLUSH repairs them, if nothing
	// did before.
	failed map[object.OID]*lagFailure
}

func newLagTable(limit int64) *lagTable {
	return &lagTable{bytes: newSemaphore("zone lag", "bytes", limit), pending: map[object.OID][]*lagOp{}, failed: map[object.OID]*lagFailure{}}
}

func overlaps(a, b *lagOp) bool { return a.start < b.end && b.start < a.end }

// add records op, after the pending parts of its object it overlaps and
// after (if not nil), and returns it.
func (t *lagTable) add(op *lagOp, after *lagOp) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, p := range t.pending[op.oid] {
		if overlaps(p, op) {
			op.deps = append(op.deps, p)
		}
	}
	if after != nil {
		op.deps = append(op.deps, after)
	}
	t.pending[op.oid] = append(t.pending[op.oid], op)
	t.count.Add(1)
	t.inFlight.Add(int64(len(op.data)))
}

// finish takes op out of the pending parts once it has landed or
// failed, and keeps it for its object's repair if it failed, or if it
// overlaps a part kept before (rule 6). A part kept marks its object
// suspect (suspect, if not nil) before done closes: a repair that waited
// for it then finds the object to repair.
func (t *lagTable) finish(op *lagOp, suspect func(oid object.OID, err error)) {
	t.mu.Lock()
	ops := t.pending[op.oid]
	if i := slices.Index(ops, op); i >= 0 {
		ops = slices.Delete(ops, i, i+1)
	}
	if len(ops) == 0 {
		delete(t.pending, op.oid)
	} else {
		t.pending[op.oid] = ops
	}
	f := t.failed[op.oid]
	keep := !op.settled && (op.err != nil || f != nil && slices.ContainsFunc(f.ops, func(p *lagOp) bool { return overlaps(p, op) }))
	if keep {
		if f == nil {
			f = &lagFailure{copies: op.copies}
			t.failed[op.oid] = f
		}
		f.ops = append(f.ops, op)
		t.kept.Add(int64(len(op.data)))
	}
	t.mu.Unlock()
	t.count.Add(-1)
	t.inFlight.Add(-int64(len(op.data)))
	t.bytes.release(int64(len(op.data)))
	if keep && suspect != nil {
		err := op.err
		if err == nil {
			err = errors.New("gateway: landed after a far part of its object that failed, and overlaps it")
		}
		suspect(op.oid, err)
	}
	close(op.done)
}

// hasFailed says whether parts of oid are kept for its repair.
func (t *lagTable) hasFailed(oid object.OID) bool {
	if t.kept.Load() == 0 {
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.failed[oid] != nil
}

// repairOps returns what a repair of oid writes over the copy it read:
// the parts kept (in the order they finished), then the pending ones (in
// the order acknowledged). Called under the object's exclusive lock, so
// no part of oid lands meanwhile: every part that is in neither landed
// before, and is in the copy read.
func (t *lagTable) repairOps(oid object.OID) []*lagOp {
	t.mu.Lock()
	defer t.mu.Unlock()
	var ops []*lagOp
	if f := t.failed[oid]; f != nil {
		ops = append(ops, f.ops...)
	}
	return append(ops, t.pending[oid]...)
}

// settle records that a repair of oid wrote (or dropped) ops on every
// replica: they are no longer kept, nor kept when they finish. If no
// part of oid is kept any more, clear runs, under t.mu, so that a part
// kept concurrently always leaves its object suspect.
func (t *lagTable) settle(oid object.OID, ops []*lagOp, clear func()) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, op := range ops {
		op.settled = true
	}
	if f := t.failed[oid]; f != nil {
		f.ops = slices.DeleteFunc(f.ops, func(op *lagOp) bool {
			if slices.Contains(ops, op) {
				t.kept.Add(-int64(len(op.data)))
				return true
			}
			return false
		})
		if len(f.ops) > 0 {
			return
		}
		delete(t.failed, oid)
	}
	clear()
}

// forget drops the parts of oid kept for its repair: the object was
// removed from every replica, after all of them (remove waits for them).
func (t *lagTable) forget(oid object.OID) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if f := t.failed[oid]; f != nil {
		for _, op := range f.ops {
			op.settled = true
			t.kept.Add(-int64(len(op.data)))
		}
		delete(t.failed, oid)
	}
}

// of returns the parts of oid pending now (nil: none).
func (t *lagTable) of(oid object.OID) []*lagOp {
	if t.count.Load() == 0 {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Clone(t.pending[oid])
}

// all returns every part pending now.
func (t *lagTable) all() []*lagOp {
	if t.count.Load() == 0 {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []*lagOp
	for _, ops := range t.pending {
		out = append(out, ops...)
	}
	return out
}

// zoneLag is acknowledgement in the writer's zone: it owns the far
// parts pending on this gateway (its lagTable) and the bound on their
// bytes, and writes, lands, reads around and drains them. It reaches
// replicas through path, the data path's operations it needs, and marks
// and repairs objects through heal.
type zoneLag struct {
	*lagTable
	limit   int64 // Options.LagBytes
	cluster interface{ ID() string }
	layouts *layout.History
	logger  *slog.Logger
	// ctx is the gateway's: a far part outlives its request, and ends
	// with the gateway.
	ctx    context.Context
	path   lagPath
	writer fenceChecker
	heal   lagHealer
}

// lagPath is what zone lag needs of the data path.
type lagPath interface {
	// write writes a piece to every replica of its object.
	write(ctx context.Context, oid object.OID, copies int, p []byte, offset uint32, flags object.Flags) error
	// writeOn writes a piece to the replicas pick chooses.
	writeOn(ctx context.Context, oid object.OID, copies int, p []byte, offset uint32, flags object.Flags, pick pickFunc) error
	// writeTo writes a piece to one replica.
	writeTo(ctx context.Context, node cluster.Node, rv *layout.Epoch, oid object.OID, copies int, p []byte, offset uint32, flags object.Flags) error
	// mutateReplicas runs a change on the replicas pick chooses,
	// recovering those that lack the object.
	mutateReplicas(ctx context.Context, oid object.OID, copies int, pick pickFunc, op replicaOp) error
	// readFrom reads from one replica.
	readFrom(ctx context.Context, node cluster.Node, rv *layout.Epoch, oid object.OID, p []byte, offset uint32) error
}

// fenceChecker fails a change whose writer lock is no longer held
// (writerLock, handover.go).
type fenceChecker interface {
	checkFence(ctx context.Context) error
}

// lagHealer is what zone lag needs of suspect-object repair (suspect.go).
type lagHealer interface {
	suspect(oid object.OID, err error)
	repairSuspect(ctx context.Context, oid object.OID, copies int) error
}

func newZoneLag(limit int64, c interface{ ID() string }, layouts *layout.History, logger *slog.Logger, ctx context.Context, path lagPath, writer fenceChecker, heal lagHealer) *zoneLag {
	return &zoneLag{lagTable: newLagTable(limit), limit: limit, cluster: c, layouts: layouts, logger: logger, ctx: ctx, path: path, writer: writer, heal: heal}
}

// LagBytes is the bytes of writes acknowledged in this node's zone and
// not yet in the other zones (herd_gateway_zone_lag_bytes).
func (g *Gateway) LagBytes() int64 { return g.lag.inFlight.Load() }

// await waits until ops have landed or failed.
func await(ctx context.Context, ops []*lagOp) error {
	for _, op := range ops {
		select {
		case <-op.done:
		case <-ctx.Done():
			return fmt.Errorf("waiting for writes to reach the other zones: %w", ctx.Err())
		}
	}
	return nil
}

// wait waits for the far parts of oid pending now: a change that goes
// to every replica follows them (rule 3).
func (z *zoneLag) wait(ctx context.Context, oid object.OID) error {
	return await(ctx, z.of(oid))
}

// drain waits for every far part pending now, then repairs every
// object whose far part failed, writing the failed parts again (rules 1
// and 6). FLUSH, handover, snapshot and close call it first.
func (z *zoneLag) drain(ctx context.Context) error {
	if err := await(ctx, z.all()); err != nil {
		return err
	}
	z.mu.Lock()
	failed := make(map[object.OID]int, len(z.failed))
	for oid, f := range z.failed {
		failed[oid] = f.copies
	}
	z.mu.Unlock()
	for oid, copies := range failed {
		// It settles what it wrote (lagTable.settle); a part that
		// failed meanwhile stays for the next FLUSH.
		if err := z.heal.repairSuspect(ctx, oid, copies); err != nil {
			return fmt.Errorf("a write acknowledged in this zone did not reach the other zones, and repairing its object failed: %w", err)
		}
	}
	return nil
}

// repairParts returns the parts of oid that a repair writes over the copy
// it read (rule 6), and those it settles: these, and the parts
// acknowledged under a writer lock this node no longer holds, dropped
// (their VDI is unclean; its next writer repairs it). Called under the
// object's exclusive lock.
func (z *zoneLag) repairParts(ctx context.Context, oid object.OID) (apply, settle []*lagOp) {
	settle = z.repairOps(oid)
	for _, op := range settle {
		if op.fence != nil && z.writer.checkFence(context.WithValue(ctx, fenceKey{}, *op.fence)) != nil {
			continue
		}
		apply = append(apply, op)
	}
	return apply, settle
}

// applyLag writes ops over data, a whole copy of their object, in order.
func applyLag(data []byte, ops []*lagOp) {
	for _, op := range ops {
		if op.flags.Has(object.FlagFresh) {
			clear(data) // a fresh create starts the copy anew
		}
		copy(data[op.offset:], op.data)
	}
}

// nearPick splits a round's targets: the replicas in this node's zone,
// when the object has some there and some elsewhere. split says whether
// it did.
func (z *zoneLag) nearPick(rv *layout.Epoch, targets []cluster.Node) (near []cluster.Node, split bool) {
	zone := rv.Nodes[z.cluster.ID()].Zone
	if zone == "" {
		return targets, false
	}
	for _, n := range targets {
		if n.Zone == zone {
			near = append(near, n)
		}
	}
	if len(near) == 0 || len(near) == len(targets) {
		return targets, false
	}
	return near, true
}

// writeNear writes p at offset of oid and returns once every replica in
// this node's zone has it, the far part pending (nil when the object's
// replicas are not split between zones: then every replica has it). The
// far part lands after after, if not nil.
func (z *zoneLag) writeNear(ctx context.Context, oid object.OID, copies int, p []byte, offset uint32, flags object.Flags, objectSize uint64, after *lagOp) (*lagOp, error) {
	rv, err := z.layouts.Current()
	if err != nil {
		return nil, err
	}
	// While the parts kept for repairs reach the bound, writes go to
	// every replica (rule 5): no more parts are started to fail.
	if _, split := z.nearPick(rv, rv.ReplicasOf(oid, copies)); !split || z.kept.Load() >= z.limit {
		if after != nil {
			if err := await(ctx, []*lagOp{after}); err != nil {
				return nil, err
			}
		}
		return nil, z.path.write(ctx, oid, copies, p, offset, flags)
	}
	size := int64(len(p))
	if err := acquire(ctx, z.logger, z.bytes, size, fmt.Sprintf("write of %d bytes to object %016x acknowledged in this zone", len(p), oid)); err != nil {
		return nil, err
	}
	op := &lagOp{oid: oid, start: offset, end: offset + uint32(len(p)), offset: offset, flags: flags, copies: copies, done: make(chan struct{})}
	if flags.Has(object.FlagCreate) {
		op.start, op.end = 0, uint32(objectSize) // a create replaces the whole copy
	}
	pick := func(rv *layout.Epoch, targets []cluster.Node) []cluster.Node {
		near, split := z.nearPick(rv, targets)
		op.epoch, op.near = rv.Number, nil
		if split {
			for _, n := range near {
				op.near = append(op.near, n.ID)
			}
		}
		return near
	}
	if err := z.path.writeOn(ctx, oid, copies, p, offset, flags, pick); err != nil {
		z.bytes.release(size)
		return nil, err
	}
	if op.near == nil {
		// The epoch changed under the write and every replica has it.
		z.bytes.release(size)
		return nil, nil
	}
	op.data = bytes.Clone(p)
	// The far part outlives the request: it ends with the gateway, and
	// keeps the request's fence (a writer lock taken away stops it, and
	// a repair drops it then: rule 6).
	far := z.ctx
	if f, ok := ctx.Value(fenceKey{}).(fenceCheck); ok {
		far = context.WithValue(far, fenceKey{}, f)
		op.fence = &f
	}
	z.add(op, after)
	go z.landFar(far, op)
	return op, nil
}

// landFar lands op's far part: after the parts it follows, on the
// replicas that did not acknowledge its near part, or on every replica
// if the epoch changed meanwhile (rule 4).
func (z *zoneLag) landFar(ctx context.Context, op *lagOp) {
	defer z.finish(op, z.heal.suspect)
	if err := await(ctx, op.deps); err != nil {
		op.err = err
		z.heal.suspect(op.oid, err)
		return
	}
	pick := func(rv *layout.Epoch, targets []cluster.Node) []cluster.Node {
		if rv.Number != op.epoch {
			return targets
		}
		return slices.DeleteFunc(targets, func(n cluster.Node) bool { return slices.Contains(op.near, n.ID) })
	}
	flags := op.flags
	// Not mutateOn: a suspect object's repair waits for this part (it
	// would wait for itself); landing on top of a repair is harmless,
	// since the parts that overlap it follow it again (rule 2).
	op.err = z.path.mutateReplicas(ctx, op.oid, op.copies, pick, replicaOp{run: func(ctx context.Context, node cluster.Node, rv *layout.Epoch) error {
		f := flags
		if rv.Number != op.epoch {
			// A node new to the placement must recover the whole
			// object (from the copies that have it), not start one
			// holding only this piece.
			f &^= object.FlagCreate | object.FlagFresh
		}
		return z.path.writeTo(ctx, node, rv, op.oid, op.copies, op.data, op.offset, f)
	}})
	if op.err != nil {
		z.heal.suspect(op.oid, op.err)
		z.logger.Warn("gateway: a write acknowledged in this zone did not reach the other zones; it is kept, and written to every replica again before its object's next use or FLUSH",
			"object", fmt.Sprintf("%016x", op.oid), "err", op.err)
	}
}

// readLagging reads oid from the replicas that acknowledged every far
// part of it pending now, if they are all of the current epoch and one of
// them answers; otherwise it waits for those parts to land (rule 3).
// served says whether p was filled.
func (z *zoneLag) readLagging(ctx context.Context, oid object.OID, p []byte, offset uint32) (served bool, err error) {
	ops := z.of(oid)
	if len(ops) == 0 {
		return false, nil
	}
	rv, err := z.layouts.Current()
	if err != nil {
		return false, err
	}
	nodes := ops[0].near
	for _, op := range ops {
		if op.epoch != rv.Number {
			nodes = nil
			break
		}
		nodes = slices.DeleteFunc(slices.Clone(nodes), func(id string) bool { return !slices.Contains(op.near, id) })
	}
	self := z.cluster.ID()
	slices.SortStableFunc(nodes, func(a, b string) int {
		if a == self {
			return -1
		}
		if b == self {
			return 1
		}
		return 0
	})
	for _, id := range nodes {
		node, ok := rv.Nodes[id]
		if !ok {
			continue
		}
		if err := z.path.readFrom(ctx, node, rv, oid, p, offset); err == nil {
			return true, nil
		}
	}
	return false, await(ctx, ops)
}
