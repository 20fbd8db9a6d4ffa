package gateway

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/herd-storage/herd/internal/bufpool"
	"github.com/herd-storage/herd/internal/cluster"
)

// Bounds on what one client, authorized but buggy or hostile, can make
// this node spend below the NBD server. The NBD server bounds the payload
// bytes a connection holds (internal/bufpool); these bound the work a
// request with a small payload can fan out to:
//
//   - Pieces of one request in flight: a 4 GiB TRIM is 1024 pieces of
//     4 MiB objects (65,536 of 64 KiB ones); they are handled at most
//     Options.PiecesPerRequest at a time, by that many goroutines, and the
//     list of pieces is never built (span computes each one).
//   - TRIM and WRITE_ZEROES pieces in flight on the node: they carry no
//     payload, so the NBD server's byte budget does not count them; a
//     semaphore of Options.ZeroPieces does, over every request and VDI.
//   - Copy-on-write buffers: the first write to an object a snapshot
//     shares copies the whole object (its size, 4 MiB by default) for as
//     little as a 512-byte write. The buffers of every copy in flight on
//     the node are counted against Options.CopyBytes; copies beyond it
//     wait. Buffers come from internal/bufpool, so a steady stream of
//     copies does not allocate.
//
// Lock order: a TRIM or WRITE_ZEROES piece takes its ZeroPieces slot
// before the object's allocation lock, and the copy budget is taken
// under the allocation lock; nothing waits for a slot while it holds the
// copy budget or an allocation lock, so the three cannot wait in a cycle.
const (
	// DefaultPiecesPerRequest is Options.PiecesPerRequest's default.
	DefaultPiecesPerRequest = 16
	// DefaultZeroPieces is Options.ZeroPieces's default.
	DefaultZeroPieces = 256
	// DefaultCopyBytes is Options.CopyBytes's default: 8 copies of
	// objects of the default size at once.
	DefaultCopyBytes = 8 * cluster.DefaultObjectSize

	// slowWait is how long a request may wait for ZeroPieces or CopyBytes
	// before the node says it is at its bound: shorter waits are the
	// bound doing its job; longer ones tell an operator that one client
	// (or many) is asking for more than the node gives.
	slowWait = time.Second
	// warnInterval spaces the warnings of one kind.
	warnInterval = time.Second
)

// span is the object pieces of a request's range, computed one by one so
// that a request over a whole disk costs no memory per object.
type span struct {
	offset, length, objectSize uint64
}

// count is the number of pieces: the objects the range touches.
func (s span) count() uint64 {
	if s.length == 0 {
		return 0
	}
	return (s.offset+s.length-1)/s.objectSize - s.offset/s.objectSize + 1
}

// piece returns piece i, 0 <= i < count().
func (s span) piece(i uint64) piece {
	index := s.offset/s.objectSize + i
	objectStart := index * s.objectSize
	start := max(s.offset, objectStart)
	end := min(s.offset+s.length, objectStart+s.objectSize)
	return piece{index: uint32(index), within: uint32(start - objectStart), start: start - s.offset, length: end - start}
}

// each runs fn for every piece of s, at most limit at once, and returns
// the errors joined. After a piece fails, or ctx ends, no new piece
// starts: the request fails either way, and a failing cluster must not
// be asked for the rest of a 2 TiB TRIM one piece at a time.
func each(ctx context.Context, s span, limit int, fn func(piece) error) error {
	n := s.count()
	if n == 1 {
		return fn(s.piece(0))
	}
	var next atomic.Uint64
	var failed atomic.Bool
	var mu sync.Mutex
	var errs []error
	work := func() {
		for !failed.Load() && ctx.Err() == nil {
			i := next.Add(1) - 1
			if i >= n {
				return
			}
			if err := fn(s.piece(i)); err != nil {
				failed.Store(true)
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		}
	}
	workers := int(min(uint64(max(limit, 1)), n))
	var wg sync.WaitGroup
	for range workers - 1 {
		wg.Go(work)
	}
	work()
	wg.Wait()
	if len(errs) == 0 && next.Load() < n {
		// Stopped early with no piece failing: ctx ended.
		return ctx.Err()
	}
	return errors.Join(errs...)
}

// semaphore is a weighted semaphore whose waiters are served in order of
// arrival (so a copy of a large object is not starved by smaller ones)
// and give up when their context ends. Each waiter waits on a channel of
// its own: testing/synctest, which runs the simulator on a fake clock,
// counts a goroutine blocked there as durably blocked (see
// internal/waitlock for why a sync.Mutex would not do).
type semaphore struct {
	name  string // for messages: "TRIM/WRITE_ZEROES pieces"
	unit  string // of limit and the amounts: "pieces", "bytes"
	limit int64

	mu      sync.Mutex // guards used, peak and waiters
	used    int64
	peak    int64      // the most ever used at once, for tests
	waiters list.List  // of *semaphoreWaiter, oldest first
	warn    rateWarner // "waited longer than slowWait"
}

type semaphoreWaiter struct {
	n     int64
	ready chan struct{} // closed when the waiter holds its n
}

func newSemaphore(name, unit string, limit int64) *semaphore {
	return &semaphore{name: name, unit: unit, limit: limit}
}

// fits says whether n more can be taken now. An amount larger than the
// whole limit is taken alone, so that it cannot wait forever.
func (s *semaphore) fits(n int64) bool {
	return s.used+n <= s.limit || s.used == 0
}

func (s *semaphore) take(n int64) {
	s.used += n
	s.peak = max(s.peak, s.used)
}

// acquire takes n, waiting behind earlier waiters; it fails only when
// ctx ends first. waited is how long it waited.
func (s *semaphore) acquire(ctx context.Context, n int64) (waited time.Duration, err error) {
	s.mu.Lock()
	if s.waiters.Len() == 0 && s.fits(n) {
		s.take(n)
		s.mu.Unlock()
		return 0, nil
	}
	start := time.Now()
	w := &semaphoreWaiter{n: n, ready: make(chan struct{})}
	element := s.waiters.PushBack(w)
	s.mu.Unlock()
	select {
	case <-w.ready:
		return time.Since(start), nil
	case <-ctx.Done():
	}
	s.mu.Lock()
	select {
	case <-w.ready:
		// Served while ctx ended: give it back.
		s.used -= n
	default:
		s.waiters.Remove(element)
	}
	s.serve()
	s.mu.Unlock()
	return time.Since(start), ctx.Err()
}

// release gives back n taken by acquire.
func (s *semaphore) release(n int64) {
	s.mu.Lock()
	s.used -= n
	if s.used < 0 {
		s.mu.Unlock()
		panic(fmt.Sprintf("gateway: %s semaphore released more than was taken", s.name))
	}
	s.serve()
	s.mu.Unlock()
}

// serve hands what is free to the waiters, in order.
func (s *semaphore) serve() {
	for {
		front := s.waiters.Front()
		if front == nil {
			return
		}
		w := front.Value.(*semaphoreWaiter)
		if !s.fits(w.n) {
			return
		}
		s.take(w.n)
		s.waiters.Remove(front)
		close(w.ready)
	}
}

// peakUsed is the most the semaphore ever had taken at once.
func (s *semaphore) peakUsed() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.peak
}

// acquire takes n from sem for a request, and warns on logger (at most
// once a second per semaphore) when it had to wait longer than
// slowWait: this node is at its bound and requests queue.
func acquire(ctx context.Context, logger *slog.Logger, sem *semaphore, n int64, what string) error {
	waited, err := sem.acquire(ctx, n)
	if waited > slowWait {
		if ok, suppressed := sem.warn.allow(time.Now()); ok {
			logger.Warn("gateway: at a resource bound, requests wait for it",
				"bound", sem.name, "limit", sem.limit, "unit", sem.unit, "request", what,
				"waited", waited.Round(time.Millisecond), "similar_waits_not_logged", suppressed)
		}
	}
	return err
}

// rateWarner lets one warning of a kind through per warnInterval and
// counts the others, so that a client hammering a bound produces a line
// a second that says how often, not a line per request.
type rateWarner struct {
	mu         sync.Mutex // guards the fields below
	last       time.Time
	suppressed int
}

// allow says whether to log now, and how many were held back since the
// last one logged.
func (w *rateWarner) allow(now time.Time) (ok bool, suppressed int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.last.IsZero() && now.Sub(w.last) < warnInterval {
		w.suppressed++
		return false, 0
	}
	suppressed, w.last, w.suppressed = w.suppressed, now, 0
	return true, suppressed
}

// objectBuffer is an object-sized buffer for a copy: pooled when the
// pool has its size (objects up to bufpool.MaximumLength), allocated
// otherwise.
type objectBuffer struct {
	Bytes  []byte
	pooled *bufpool.Buffer
}

func getObjectBuffer(size uint64) objectBuffer {
	if size <= bufpool.MaximumLength {
		b := bufpool.Get(int(size))
		return objectBuffer{Bytes: b.Bytes, pooled: b}
	}
	return objectBuffer{Bytes: make([]byte, size)}
}

func (b objectBuffer) release() {
	if b.pooled != nil {
		b.pooled.Release()
	}
}

// zeros returns a read-only buffer of size zero bytes, shared by every
// caller: writing a whole object of zeros (WRITE_ZEROES with NO_HOLE over
// an object a snapshot shares) must not allocate an object per piece.
// Nothing may write into it; replicas only read a WRITE's payload.
func zeros(size uint64) []byte {
	if b, ok := zeroBuffers.Load(size); ok {
		return b.([]byte)
	}
	b, _ := zeroBuffers.LoadOrStore(size, make([]byte, size))
	return b.([]byte)
}

// zeroBuffers holds one zero buffer per object size in use (one size per
// cluster: the format fixes it).
var zeroBuffers sync.Map // uint64 -> []byte
