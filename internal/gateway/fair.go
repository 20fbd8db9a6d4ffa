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
// next flow in turn (round robin, one request per turn), so a VDI with
// one request waiting is served after at most one request of each other
// busy VDI, however many they have queued.
//
// Rules:
//  1. The slot is taken after the QoS wait, the io lock and the writer
//     check (ensureWriter): a request waiting for a handover, a snapshot
//     or its limits holds no slot, so it cannot starve other VDIs.
//  2. A slot is held for the request's replica I/O only and released
//     whatever happens; a request whose context ends while it queues
//     leaves the queue (or passes on the slot it was just handed).
//  3. Lock order: vdiState.io > a slot > Gateway.zeroPieces (see the
//     package doc). Nothing takes a second slot while holding one.

// DefaultFairSlots is Options.FairSlots's default: enough requests in
// flight to keep every replica of a small cluster busy (the NBD server
// allows 64 per connection), few enough that one VDI cannot fill the
// node's queues.
const DefaultFairSlots = 32

// fairQueue hands out the node's request slots (see above).
type fairQueue struct {
	slots int

	mu       sync.Mutex // guards the fields below and every flow's waiters
	inFlight int
	// turns are the flows with waiters, the next to be served first.
	turns []*limiter
}

// waiter is a queued request; ready is closed when it is given a slot.
type waiter struct {
	ready   chan struct{}
	granted bool // guarded by fairQueue.mu
}

func newFairQueue(slots int) *fairQueue { return &fairQueue{slots: slots} }

// acquire takes a slot for a request of flow, waiting for its turn.
func (q *fairQueue) acquire(ctx context.Context, flow *limiter) error {
	q.mu.Lock()
	if q.inFlight < q.slots && len(q.turns) == 0 {
		q.inFlight++
		q.mu.Unlock()
		return nil
	}
	w := &waiter{ready: make(chan struct{})}
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
		q.release()
		return ctx.Err()
	}
	i := slices.Index(flow.waiters, w)
	flow.waiters = slices.Delete(flow.waiters, i, i+1)
	if len(flow.waiters) == 0 {
		q.turns = slices.DeleteFunc(q.turns, func(f *limiter) bool { return f == flow })
	}
	q.mu.Unlock()
	return ctx.Err()
}

// release gives a slot back: to the first waiter of the flow whose turn
// it is (that flow goes to the back of the turns if it has more), or to
// the pool.
func (q *fairQueue) release() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.turns) == 0 {
		q.inFlight--
		return
	}
	flow := q.turns[0]
	q.turns = q.turns[1:]
	w := flow.waiters[0]
	flow.waiters[0] = nil
	flow.waiters = flow.waiters[1:]
	if len(flow.waiters) > 0 {
		q.turns = append(q.turns, flow)
	}
	w.granted = true
	close(w.ready)
}

// slot takes a request slot for d's VDI (rule 1: after io and the
// writer check); the caller calls the returned release.
func (d *Disk) slot(ctx context.Context) (func(), error) {
	q := d.gateway.fair
	if err := q.acquire(ctx, d.state.limiter); err != nil {
		return nil, err
	}
	return q.release, nil
}
