package sim

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/herd-storage/herd/internal/gateway"
	"github.com/herd-storage/herd/internal/nbd"
)

// readerTimeouts bound one read of a reader's lanes, as test/robustness's
// readers' do. A read through a paused node, or one cut off from the
// majority, answers nothing: the impatient lane gives up after a second
// and reads again, so its reads begin while the node is away, later than
// the writes acknowledged meanwhile, and a node that answers one from a
// copy it kept from before must be caught. The patient lane outwaits the
// gateway's failover from a replica that does not answer (5 s), so its
// reads through the other nodes succeed while a replica is away.
var readerTimeouts = []time.Duration{time.Second, 8 * time.Second}

// reader is a VM (or a backup job) on one node that reads the writers'
// VDIs through that node's read-only export (ro/NAME) beside their
// writers, whichever node those run on: every node has one, so reads
// go through nodes that are paused, cut off on the minority side of a
// partition, resumed and catching up, or lagging, not only through the
// writer's node. Each read is checked against its writer's model
// (client.checkRead): it must never return a write older than one the
// writer saw acknowledged before the read began.
//
// A reader has a lane per timeout (readerTimeouts). It stays on its node: when the node's process dies, so does the
// reader's export, and it opens one again once the node runs again. Its
// operations (which VDI, which block, when) come from a generator of its
// own, so they are a function of the seed.
type reader struct {
	w    *World
	node int

	mu      sync.Mutex         // guards exports and proc
	exports map[int]nbd.Export // per client (its VDI), on proc
	proc    *process

	reads, failures atomic.Int64
	errs            []string // the first ones; guarded by mu
}

func newReader(w *World, node int) *reader {
	return &reader{w: w, node: node, exports: map[int]nbd.Export{}}
}

func (r *reader) recordError(what string, err error) {
	r.failures.Add(1)
	r.mu.Lock()
	if len(r.errs) < 5 {
		r.errs = append(r.errs, fmt.Sprintf("t=%6.2fs reader on %s: %s: %v", r.w.elapsed().Seconds(), r.w.nodes[r.node].id, what, err))
	}
	r.mu.Unlock()
}

// open returns the reader's export of client c's VDI on its node's
// current process, opening it if needed. It returns false while the
// node's process is dead, or when the open failed (recorded).
func (r *reader) open(c *client) (nbd.Export, *process, bool) {
	w := r.w
	w.mu.Lock()
	p := w.nodes[r.node].proc
	dead := p.dead
	w.mu.Unlock()
	r.mu.Lock()
	if r.proc != p {
		// A new process (or a dead one): the old exports went with the
		// old one.
		for i, e := range r.exports {
			e.Close()
			delete(r.exports, i)
		}
		r.proc = p
	}
	export, ok := r.exports[c.index()]
	r.mu.Unlock()
	if dead {
		return nil, nil, false
	}
	if ok {
		return export, p, true
	}
	ctx, cancel := context.WithTimeout(p.ctx, 10*time.Second)
	export, err := p.openExport(ctx, gateway.ReadOnlyPrefix+c.vdi, nbd.Session{ID: uint64(100 + r.node)})
	cancel()
	if err != nil {
		r.recordError("open ro/"+c.vdi+" on "+p.incarnation, err)
		return nil, nil, false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.proc != p {
		export.Close()
		return nil, nil, false
	}
	if old, ok := r.exports[c.index()]; ok {
		export.Close()
		return old, p, true
	}
	r.exports[c.index()] = export
	return export, p, true
}

// close closes the reader's exports.
func (r *reader) close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, e := range r.exports {
		e.Close()
		delete(r.exports, i)
	}
}

// lane reads, giving each read up after timeout, until stop closes.
func (r *reader) lane(lane int, timeout time.Duration, stop <-chan struct{}) {
	w := r.w
	rnd := rand.New(rand.NewPCG(w.seed, 0x72656164<<16|uint64(r.node)<<8|uint64(lane)))
	for {
		think := time.Duration(rnd.Int64N(int64(thinkMax)))
		c := w.clients[rnd.IntN(len(w.clients))]
		block := rnd.IntN(len(c.acked))
		select {
		case <-stop:
			return
		case <-time.After(think):
		}
		if !c.running() {
			continue // its VDI is created after the upgrade (World.late)
		}
		export, proc, ok := r.open(c)
		if !ok {
			select {
			case <-stop:
				return
			case <-time.After(time.Second):
			}
			continue
		}
		ackedBefore := c.ackedNow(block)
		began := readClock.Add(1)
		p := make([]byte, blockSize)
		ctx, cancel := context.WithTimeout(proc.ctx, timeout)
		call := c.history.Invoke(readerID(r.node, lane))
		err := export.ReadAt(ctx, p, uint64(block)*blockSize)
		cancel()
		if err != nil {
			r.recordError(fmt.Sprintf("read of %s block %d through %s", c.vdi, block, proc.incarnation), err)
			if errors.Is(err, nbd.ErrShutdown) {
				r.mu.Lock()
				if r.exports[c.index()] == export {
					delete(r.exports, c.index())
					export.Close()
				}
				r.mu.Unlock()
			}
			continue
		}
		r.reads.Add(1)
		c.recordRead(call, block, p)
		who := fmt.Sprintf("reader on %s (process %s, ro/%s)", w.nodes[r.node].id, proc.incarnation, c.vdi)
		c.checkRead(who, block, p, ackedBefore)
		c.checkReadFloor(who, block, p, began)
	}
}

// readerID is the history's client id of a reader's lane.
func readerID(node, lane int) int { return 1000 + 100*node + lane }

// readClock orders the readers' reads: a read that ended (its mark
// taken) before another began (its mark taken) has the lower mark.
var readClock atomic.Uint64

// readMark is a step of a block's read floor: from mark on, a completed
// read had returned write (and none newer before).
type readMark struct {
	mark, write uint64
}

// checkReadFloor checks a reader's read of block, begun at mark began,
// against the reads that completed before it began: it must not return
// a write older than one of them returned (a reader read a write in
// flight through one node, then, later, the data it overwrote through
// another: the replicas of a write in flight, or of the map entry of an
// object's first write, met in different orders; gateway/agree.go). A write whose outcome the writer does
// not know may be read at any time (it may take effect after any read).
// Then it records what the read returned.
func (c *client) checkReadFloor(who string, block int, p []byte, began uint64) {
	got, err := decode(c.id, block, p)
	if err != nil {
		return // checkRead reported it
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.seen == nil {
		c.seen = map[int][]readMark{}
	}
	marks := c.seen[block]
	var floor uint64
	if i, _ := slices.BinarySearchFunc(marks, began, func(m readMark, t uint64) int { return cmp.Compare(m.mark, t) }); i > 0 {
		floor = marks[i-1].write
	}
	if got < floor && !slices.Contains(c.uncertain[block], got) {
		c.w.violation("%s: block %d read write #%d of client %d, but a read that ended before this one began returned write #%d (a newer write read, then an older one: not linearizable)", who, block, got, c.id, floor)
	}
	ended := readClock.Add(1)
	if n := len(marks); n == 0 || got > marks[n-1].write {
		c.seen[block] = append(marks, readMark{mark: ended, write: got})
	}
}

// index is the client's position in World.clients.
func (c *client) index() int { return int(c.id) - 1 }

// ackedNow is the write to block last acknowledged so far: a read that
// begins now must return it or a later one.
func (c *client) ackedNow(block int) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.acked[block]
}

// checkRead checks a read of block by another reader than the writer,
// which ran concurrently with the writer's operations: it must return
// the write acknowledged before it began (ackedBefore), a later write the
// writer had begun by the time it ended (in flight, acknowledged since,
// or failed), or one whose outcome the writer does not know. Anything
// older is a stale read (invariant (a)); anything newer was never
// attempted.
func (c *client) checkRead(who string, block int, p []byte, ackedBefore uint64) {
	got, err := decode(c.id, block, p)
	c.mu.Lock()
	attempted, uncertain, acked := c.seq, slices.Clone(c.uncertain[block]), c.acked[block]
	c.mu.Unlock()
	switch {
	case err != nil:
		c.w.violation("%s: %v", who, err)
	case got == ackedBefore || slices.Contains(uncertain, got) || (got > ackedBefore && got <= attempted):
	case got < ackedBefore:
		c.w.violation("%s: block %d read write #%d of client %d, but write #%d was acknowledged before the read began (stale read)", who, block, got, c.id, ackedBefore)
	default:
		c.w.violation("%s: block %d read write #%d of client %d, which was never attempted before the read ended (acknowledged #%d, unknown outcomes %v)", who, block, got, c.id, acked, uncertain)
	}
}
