// Package bufpool holds the payload buffers of herd's network servers and
// bounds the bytes a connection keeps in them. The NBD server
// (internal/nbd) and the object protocol of the peer port (internal/peer)
// both read request payloads into pooled buffers and stop reading requests
// while a connection holds too many bytes; this is that logic, once.
//
// Buffers are pooled by size class, powers of two from 4 KiB to
// MaximumLength, so that a steady stream of requests does not allocate,
// while a buffer never wastes more than half its size. The pools are
// shared by every user in the process.
package bufpool

import (
	"fmt"
	"math/bits"
	"sync"
	"sync/atomic"
)

const (
	classShiftMinimum = 12 // 4 KiB
	classShiftMaximum = 25 // 32 MiB
	classCount        = classShiftMaximum - classShiftMinimum + 1

	// MaximumLength is the largest buffer Get returns: 32 MiB, the
	// largest payload of both protocols.
	MaximumLength = 1 << classShiftMaximum
)

var (
	pools [classCount]sync.Pool
	// outstanding counts buffers taken and not released, for tests.
	outstanding atomic.Int64
)

// Buffer is a pooled buffer. The pointer is what the pool holds, so that
// returning it does not allocate.
type Buffer struct {
	// Bytes is the buffer, of the length asked for. Do not keep a reference
	// to it after Release.
	Bytes []byte

	class    int8
	released bool
}

// class returns the size class holding n bytes.
func class(n int) int {
	if n <= 1<<classShiftMinimum {
		return 0
	}
	return bits.Len(uint(n-1)) - classShiftMinimum
}

// Get returns a buffer of n bytes, 0 <= n <= MaximumLength. Its contents
// are unspecified. Release it when done.
func Get(n int) *Buffer {
	if n < 0 || n > MaximumLength {
		// Callers validate lengths from the wire first: this is a bug.
		panic(fmt.Sprintf("bufpool: buffer of %d bytes requested (maximum %d)", n, MaximumLength))
	}
	outstanding.Add(1)
	c := class(n)
	if pooled, ok := pools[c].Get().(*Buffer); ok {
		pooled.Bytes = pooled.Bytes[:n]
		pooled.released = false
		return pooled
	}
	return &Buffer{Bytes: make([]byte, n, 1<<(c+classShiftMinimum)), class: int8(c)}
}

// Release returns b to its pool. b must not be used afterwards; releasing it
// twice is a bug and panics.
func (b *Buffer) Release() {
	if b.released {
		panic("bufpool: buffer released twice")
	}
	b.released = true
	b.Bytes = b.Bytes[:0]
	outstanding.Add(-1)
	pools[b.class].Put(b)
}

// Outstanding is the number of buffers taken and not yet released, in the
// whole process; tests check that it returns to where it was.
func Outstanding() int64 { return outstanding.Load() }

// Budget bounds the payload bytes one connection holds in memory. The
// request reader acquires before it reads a payload or dispatches a
// request that will produce one; the bytes are released once the response
// is written. Closing the budget wakes a reader waiting in Acquire, so that
// a dying connection never leaves it blocked. Its methods are safe for
// concurrent use.
type Budget struct {
	limit int64

	mu        sync.Mutex // guards the fields below
	available *sync.Cond
	used      int64
	closed    bool
}

// NewBudget returns a budget of limit bytes.
func NewBudget(limit int64) *Budget {
	budget := &Budget{limit: limit}
	budget.available = sync.NewCond(&budget.mu)
	return budget
}

// Acquire blocks until n bytes fit in the budget, and reports false if the
// budget was closed first. A request larger than the whole budget is
// admitted alone, so that it cannot wait forever.
func (b *Budget) Acquire(n int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	for !b.closed && b.used > 0 && b.used+n > b.limit {
		b.available.Wait()
	}
	if b.closed {
		return false
	}
	b.used += n
	return true
}

// TryAcquire takes n bytes if they fit now (or the budget is empty), and
// reports whether it did; it never waits. A caller uses it to notice that
// the budget is exhausted (to say so in its log) before waiting in Acquire.
func (b *Budget) TryAcquire(n int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed || (b.used > 0 && b.used+n > b.limit) {
		return false
	}
	b.used += n
	return true
}

// Add takes n bytes without waiting: for memory that already exists (a
// response body larger than was reserved for it).
func (b *Budget) Add(n int64) {
	b.mu.Lock()
	b.used += n
	b.mu.Unlock()
}

// Release gives back n bytes taken by Acquire or Add.
func (b *Budget) Release(n int64) {
	if n == 0 {
		return
	}
	b.mu.Lock()
	b.used -= n
	if b.used < 0 {
		b.mu.Unlock()
		panic("bufpool: budget released more than acquired")
	}
	b.mu.Unlock()
	b.available.Broadcast()
}

// Close makes every Acquire, waiting or to come, report false.
func (b *Budget) Close() {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	b.available.Broadcast()
}

// InUse is the number of bytes taken and not released.
func (b *Budget) InUse() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}
