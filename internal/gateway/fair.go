package gateway

import (
	"context"
	"slices"
	"sync"
)

// Fair sharing between VDIs on one gateway. Measured without it
// (docs/BENCHMARKS.md "Per-VDI QoS"): a VDI driven at QD128 keeps the NBD
// server's 64 requests of its connection in flight, each fanning out to
// every replica; on a small node its requests fill the run queue and the
// replicas' queues, and a QD1 job on another VDI through the same node
// saw its p99 latency rise twenty-fold. Nothing in the data path told
// the two apart.
//
// So every read, write, TRIM and WRITE_ZEROES takes one of the node's
// Options.FairSlots request slots for its replica I/O. While slots are
// free a request takes one at once (one uncontended mutex); when none
// is, requests queue per VDI name (their limiter: NAME and ro/NAME are
// one flow, all snapshots another) and each released slot goes to the
// next flow in turn (round robin, one request per turn). And a VDI with
// fewer requests in flight than its share of the slots (the slots over
// the busy VDIs) takes one at once even when none is free: the node then
// does a few more requests than its slots for a moment, and the VDI with
// more than its share gets no slot back until the total is under the
// bound again. So a QD1 VDI beside a QD128 one does not wait for a slot
// at all, and the QD128 one keeps the rest.
//
// Rules:
//  1. The slot is taken after the QoS wait, the io lock and the writer
//     check (ensureWriter): a request waiting for a handover, a snapshot
//     or its limits holds no slot, so it cannot starve other VDIs.
//  2. A slot is held for the request's replica I/O only and released
//     whatever happens; a request whose context ends while it queues
//     leaves the queue (or passes on the slot it was just handed).
//  3. Lock order: vdiState.io > a slot > admission.zeroPieces (see the
//     package doc). Nothing takes a second slot while holding one.
//  4. Share: Options.FairSlots divided by the busy VDIs (those with
//     requests in flight or queued), at least 1.

// DefaultFairSlots is Options.FairSlots's default. Measured on 2 cores
// running 3 nodes (docs/BENCHMARKS.md "Per-VDI QoS"): the fewer slots,
// the less a QD128 VDI fills the node's CPU queues and the lower a QD1
// VDI's p99 beside it (unbounded 15 ms, 16 slots 7 ms, 8 slots 3-5 ms
// for 4 KiB reads), at some cost to the QD128 VDI's throughput (within
// the run-to-run spread at 16). 16 requests in flight still keep every
// replica of a small cluster busy for one heavy VDI; a node with more
// cores or slower replicas may want more (--fair-slots).
const DefaultFairSlots = 16

// fairQueue hands out the node's request slots (see above).
type fairQueue struct {
	slots int

	mu       sync.Mutex // guards the fields below and every flow's inFlight and waiters
	inFlight int
	// active counts the flows with requests in flight or queued.
	active int
	// turns are the flows with waiters, the next to be served first.
	turns []*limiter
}

// waiter is a queued request; ready is closed when it is given a slot.
type waiter struct {
	ready   chan struct{}
	granted bool // guarded by fairQueue.mu
}

func newFairQueue(slots int) *fairQueue { return &fairQueue{slots: slots} }

// busy says whether flow has requests in flight or queued (q.mu held).
func busy(flow *limiter) bool { return flow.inFlight > 0 || len(flow.waiters) > 0 }

// admitLocked gives flow a slot (q.mu held).
func (q *fairQueue) admitLocked(flow *limiter) {
	if !busy(flow) {
		q.active++
	}
	q.inFlight++
	flow.inFlight++
}

// acquire takes a slot for a request of flow, waiting for its turn when
// every slot is taken, unless flow has fewer in flight than its share
// (rule 4).
func (q *fairQueue) acquire(ctx context.Context, flow *limiter) error {
	q.mu.Lock()
	active := q.active
	if !busy(flow) {
		active++
	}
	free := q.inFlight < q.slots && len(q.turns) == 0
	if len(flow.waiters) == 0 && (free || flow.inFlight < max(1, q.slots/active)) {
		q.admitLocked(flow)
		q.mu.Unlock()
		return nil
	}
	w := &waiter{ready: make(chan struct{})}
	if !busy(flow) {
		q.active++
	}
	flow.waiters = append(flow.waiters, w)
	if len(flow.waiters) == 1 {
		q.turns = append(q.turns, flow)
	}
	q.mu.Unlock()
	select {
	case <-w.ready:
		return nil
	case <-ctx.Done():
	}
	q.mu.Lock()
	if w.granted {
		// Handed a slot as the context ended: pass it on (rule 2).
		q.mu.Unlock()
		q.release(flow)
		return ctx.Err()
	}
	i := slices.Index(flow.waiters, w)
	flow.waiters = slices.Delete(flow.waiters, i, i+1)
	if len(flow.waiters) == 0 {
		q.turns = slices.DeleteFunc(q.turns, func(f *limiter) bool { return f == flow })
	}
	if !busy(flow) {
		q.active--
	}
	q.mu.Unlock()
	return ctx.Err()
}

// release gives flow's slot back, and the free slots to the first
// waiters of the flows whose turn it is (each goes to the back of the
// turns if it has more).
func (q *fairQueue) release(flow *limiter) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.inFlight--
	flow.inFlight--
	if !busy(flow) {
		q.active--
	}
	for q.inFlight < q.slots && len(q.turns) > 0 {
		next := q.turns[0]
		q.turns = q.turns[1:]
		w := next.waiters[0]
		next.waiters[0] = nil
		next.waiters = next.waiters[1:]
		if len(next.waiters) > 0 {
			q.turns = append(q.turns, next)
		}
		// Still busy: admitLocked counts no new active flow.
		q.inFlight++
		next.inFlight++
		w.granted = true
		close(w.ready)
	}
}

// slot takes a request slot for d's VDI (rule 1: after io and the
// writer check); the caller calls the returned release.
func (d *Disk) slot(ctx context.Context) (func(), error) {
	q, flow := d.gateway.admit.fair, d.state.limiter
	if err := q.acquire(ctx, flow); err != nil {
		return nil, err
	}
	return func() { q.release(flow) }, nil
}
