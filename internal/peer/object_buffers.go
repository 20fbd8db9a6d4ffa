package peer

import (
	"fmt"
	"math/bits"
	"sync"
	"sync/atomic"
)

// Payload buffers of the object protocol are pooled by size class, powers of
// two from 4 KiB to MaxPayload, on both sides of a connection: the server
// reads WRITE payloads into them and handlers may return READ data in them;
// a gateway may read into them with ObjectClient.Do. A steady stream of
// requests then allocates nothing, and a buffer never wastes more than half
// its size.
const (
	objectBufferClassShiftMinimum = 12 // 4 KiB
	objectBufferClassShiftMaximum = 25 // 32 MiB == MaxPayload
	objectBufferClassCount        = objectBufferClassShiftMaximum - objectBufferClassShiftMinimum + 1
)

var (
	objectBufferPools [objectBufferClassCount]sync.Pool
	// objectBuffersOutstanding counts buffers taken and not released; the
	// tests check that it returns to zero.
	objectBuffersOutstanding atomic.Int64
)

// Releaser is something to give back when its user is done with it.
type Releaser interface {
	Release()
}

// ReleaseFunc adapts a function to Releaser.
type ReleaseFunc func()

// Release calls f.
func (f ReleaseFunc) Release() { f() }

// ObjectBuffer is a pooled payload buffer. The pointer is what the pool
// holds, so that returning it does not allocate.
type ObjectBuffer struct {
	// Bytes is the buffer, of the length asked for. Do not keep a reference
	// to it after Release.
	Bytes []byte

	class    int8
	released bool
}

// objectBufferClass returns the size class holding n bytes.
func objectBufferClass(n int) int {
	if n <= 1<<objectBufferClassShiftMinimum {
		return 0
	}
	return bits.Len(uint(n-1)) - objectBufferClassShiftMinimum
}

// GetObjectBuffer returns a buffer of n bytes, 0 <= n <= MaxPayload, from the
// pools. Its contents are unspecified. Release it when done.
func GetObjectBuffer(n int) *ObjectBuffer {
	if n < 0 || n > MaxPayload {
		// Callers validate lengths from the wire first: this is a bug.
		panic(fmt.Sprintf("peer: object buffer of %d bytes requested (maximum %d)", n, MaxPayload))
	}
	objectBuffersOutstanding.Add(1)
	class := objectBufferClass(n)
	if pooled, ok := objectBufferPools[class].Get().(*ObjectBuffer); ok {
		pooled.Bytes = pooled.Bytes[:n]
		pooled.released = false
		return pooled
	}
	return &ObjectBuffer{Bytes: make([]byte, n, 1<<(class+objectBufferClassShiftMinimum)), class: int8(class)}
}

// Release returns b to its pool. b must not be used afterwards; releasing it
// twice is a bug and panics.
func (b *ObjectBuffer) Release() {
	if b.released {
		panic("peer: object buffer released twice")
	}
	b.released = true
	b.Bytes = b.Bytes[:0]
	objectBuffersOutstanding.Add(-1)
	objectBufferPools[b.class].Put(b)
}

// objectByteBudget bounds the payload bytes one server connection holds in
// memory (WRITE payloads read, READ and LIST bodies being produced and
// written). The request reader acquires before it reads a payload or
// dispatches a request; the writer releases once the response is written.
// Closing the budget wakes a reader waiting in acquire, so that a dying
// connection never leaves it blocked.
type objectByteBudget struct {
	limit int64

	mu        sync.Mutex // guards the fields below
	available *sync.Cond
	used      int64
	closed    bool
}

func newObjectByteBudget(limit int64) *objectByteBudget {
	budget := &objectByteBudget{limit: limit}
	budget.available = sync.NewCond(&budget.mu)
	return budget
}

// acquire blocks until n bytes fit in the budget, and reports false if the
// budget was closed first. A request larger than the whole budget is
// admitted alone, so that it cannot wait forever.
func (b *objectByteBudget) acquire(n int64) bool {
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

// add takes n bytes without waiting: for memory that already exists (a
// handler's body larger than was reserved for it).
func (b *objectByteBudget) add(n int64) {
	b.mu.Lock()
	b.used += n
	b.mu.Unlock()
}

func (b *objectByteBudget) release(n int64) {
	if n == 0 {
		return
	}
	b.mu.Lock()
	b.used -= n
	if b.used < 0 {
		b.mu.Unlock()
		panic("peer: object byte budget released more than acquired")
	}
	b.mu.Unlock()
	b.available.Broadcast()
}

func (b *objectByteBudget) close() {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	b.available.Broadcast()
}

func (b *objectByteBudget) inUse() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}
