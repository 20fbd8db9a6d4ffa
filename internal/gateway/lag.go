package gateway

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/layout"
	"github.com/herd-storage/herd/internal/object"
)

// Zone acknowledgement (cluster.AckZone, `herd vdi set NAME --ack zone`;
// issue 14, zones far apart).
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
//     FLUSH first makes its replicas identical from the near copies, or
//     fails.
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
//     never more than that behind.
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
	oid        uint64
	start, end uint32   // the bytes of the object it changes
	offset     uint32   // where data goes
	epoch      uint64   // the epoch its near part was applied in
	near       []string // the nodes that acknowledged its near part
	data       []byte
	flags      object.Flags
	copies     int
	deps       []*lagOp      // the parts it lands after
	done       chan struct{} // closed when it has landed or failed
	err        error         // why it failed; set before done closes
}

// lagTable tracks the far parts pending on this gateway.
type lagTable struct {
	bytes    *semaphore
	count    atomic.Int64 // pending parts
	inFlight atomic.Int64 // their bytes

	mu      sync.Mutex
	pending map[uint64][]*lagOp // by object, in the order acknowledged
	// failed are objects whose far part failed since the last FLUSH,
	// with their copies: the FLUSH repairs them first.
	failed map[uint64]int
}

func newLagTable(limit int64) *lagTable {
	return &lagTable{bytes: newSemaphore("zone lag", "bytes", limit), pending: map[uint64][]*lagOp{}, failed: map[uint64]int{}}
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

// finish takes op out of the table once it has landed or failed.
func (t *lagTable) finish(op *lagOp) {
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
	if op.err != nil {
		t.failed[op.oid] = op.copies
	}
	t.mu.Unlock()
	t.count.Add(-1)
	t.inFlight.Add(-int64(len(op.data)))
	t.bytes.release(int64(len(op.data)))
	close(op.done)
}

// of returns the parts of oid pending now (nil: none).
func (t *lagTable) of(oid uint64) []*lagOp {
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

// waitLag waits for the far parts of oid pending now: a change that goes
// to every replica follows them (rule 3).
func (g *Gateway) waitLag(ctx context.Context, oid uint64) error {
	return await(ctx, g.lag.of(oid))
}

// drainLag waits for every far part pending now, then makes the replicas
// of every object whose far part failed identical from its near copies
// (rule 1). FLUSH, handover, snapshot and close call it first.
func (g *Gateway) drainLag(ctx context.Context) error {
	if err := await(ctx, g.lag.all()); err != nil {
		return err
	}
	g.lag.mu.Lock()
	failed := make(map[uint64]int, len(g.lag.failed))
	for oid, copies := range g.lag.failed {
		failed[oid] = copies
	}
	g.lag.mu.Unlock()
	for oid, copies := range failed {
		if err := g.repairSuspect(ctx, oid, copies); err != nil {
			return fmt.Errorf("a write acknowledged in this zone did not reach the other zones, and repairing its object failed: %w", err)
		}
		g.lag.mu.Lock()
		delete(g.lag.failed, oid)
		g.lag.mu.Unlock()
	}
	return nil
}

// nearPick splits a round's targets: the replicas in this node's zone,
// when the object has some there and some elsewhere. split says whether
// it did.
func (g *Gateway) nearPick(rv *layout.Epoch, targets []cluster.Node) (near []cluster.Node, split bool) {
	zone := rv.Nodes[g.cluster.ID()].Zone
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
func (g *Gateway) writeNear(ctx context.Context, oid uint64, copies int, p []byte, offset uint32, flags object.Flags, objectSize uint64, after *lagOp) (*lagOp, error) {
	rv, err := g.layouts.Current()
	if err != nil {
		return nil, err
	}
	if _, split := g.nearPick(rv, rv.ReplicasOf(oid, copies)); !split {
		if after != nil {
			if err := await(ctx, []*lagOp{after}); err != nil {
				return nil, err
			}
		}
		return nil, g.write(ctx, oid, copies, p, offset, flags)
	}
	size := int64(len(p))
	if err := g.acquire(ctx, g.lag.bytes, size, fmt.Sprintf("write of %d bytes to object %016x acknowledged in this zone", len(p), oid)); err != nil {
		return nil, err
	}
	op := &lagOp{oid: oid, start: offset, end: offset + uint32(len(p)), offset: offset, flags: flags, copies: copies, done: make(chan struct{})}
	if flags.Create {
		op.start, op.end = 0, uint32(objectSize) // a create replaces the whole copy
	}
	pick := func(rv *layout.Epoch, targets []cluster.Node) []cluster.Node {
		near, split := g.nearPick(rv, targets)
		op.epoch, op.near = rv.Number, nil
		if split {
			for _, n := range near {
				op.near = append(op.near, n.ID)
			}
		}
		return near
	}
	if err := g.writeOn(ctx, oid, copies, p, offset, flags, pick); err != nil {
		g.lag.bytes.release(size)
		return nil, err
	}
	if op.near == nil {
		// The epoch changed under the write and every replica has it.
		g.lag.bytes.release(size)
		return nil, nil
	}
	op.data = bytes.Clone(p)
	g.lag.add(op, after)
	// The far part outlives the request: it ends with the gateway, and
	// keeps the request's fence (a writer lock taken away stops it).
	far := g.ctx
	if f, ok := ctx.Value(fenceKey{}).(fenceCheck); ok {
		far = context.WithValue(far, fenceKey{}, f)
	}
	go g.landFar(far, op)
	return op, nil
}

// landFar lands op's far part: after the parts it follows, on the
// replicas that did not acknowledge its near part, or on every replica
// if the epoch changed meanwhile (rule 4).
func (g *Gateway) landFar(ctx context.Context, op *lagOp) {
	defer g.lag.finish(op)
	if err := await(ctx, op.deps); err != nil {
		op.err = err
		g.suspect(op.oid, err)
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
	op.err = g.mutateReplicas(ctx, op.oid, op.copies, pick, replicaOp{run: func(ctx context.Context, node cluster.Node, rv *layout.Epoch) error {
		f := flags
		if rv.Number != op.epoch {
			// A node new to the placement must recover the whole
			// object (from the copies that have it), not start one
			// holding only this piece.
			f.Create, f.Fresh = false, false
		}
		return g.writeTo(ctx, node, rv, op.oid, op.copies, op.data, op.offset, f)
	}})
	if op.err != nil {
		g.suspect(op.oid, op.err)
		g.logger.Warn("gateway: a write acknowledged in this zone did not reach the other zones; its object is repaired from this zone's copies before its next use or FLUSH",
			"object", fmt.Sprintf("%016x", op.oid), "err", op.err)
	}
}

// readLagging reads oid from the replicas that acknowledged every far
// part of it pending now, if they are all of the current epoch and one of
// them answers; otherwise it waits for those parts to land (rule 3).
// served says whether p was filled.
func (g *Gateway) readLagging(ctx context.Context, oid uint64, p []byte, offset uint32) (served bool, err error) {
	ops := g.lag.of(oid)
	if len(ops) == 0 {
		return false, nil
	}
	rv, err := g.layouts.Current()
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
	self := g.cluster.ID()
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
		if err := g.readFrom(ctx, node, rv, oid, p, offset); err == nil {
			return true, nil
		}
	}
	return false, await(ctx, ops)
}
