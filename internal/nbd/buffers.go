package nbd

import (
	"fmt"
	"math/bits"
	"sync"
)

// Payload buffers are pooled by size class (powers of two from 4 KiB to the
// maximum payload), so that a steady stream of requests does not allocate,
// while a buffer never wastes more than half its size.
const (
	bufferClassShiftMinimum = 12 // 4 KiB
	bufferClassShiftMaximum = 25 // 32 MiB == maximumPayloadLength
	bufferClassCount        = bufferClassShiftMaximum - bufferClassShiftMinimum + 1
)

var bufferPools [bufferClassCount]sync.Pool

// buffer is a pooled payload buffer. The pointer is what the pool stores, so
// putting it back does not allocate.
type buffer struct {
	bytes []byte
	class int
}

// bufferClass returns the size class holding n bytes.
func bufferClass(n int) int {
	if n <= 1<<bufferClassShiftMinimum {
		return 0
	}
	return bits.Len(uint(n-1)) - bufferClassShiftMinimum
}

// getBuffer returns a buffer of length n (n <= maximumPayloadLength). Its
// contents are unspecified.
func getBuffer(n int) *buffer {
	if n < 0 || n > maximumPayloadLength {
		panic(fmt.Sprintf("nbd: buffer of %d bytes requested; callers validate lengths first", n))
	}
	class := bufferClass(n)
	if pooled, ok := bufferPools[class].Get().(*buffer); ok {
		pooled.bytes = pooled.bytes[:n]
		return pooled
	}
	return &buffer{bytes: make([]byte, n, 1<<(class+bufferClassShiftMinimum)), class: class}
}

// putBuffer returns b to its pool; b must not be used afterwards.
func putBuffer(b *buffer) {
	if b == nil {
		return
	}
	b.bytes = b.bytes[:0]
	bufferPools[b.class].Put(b)
}

// byteBudget bounds the payload bytes one connection holds in memory: the
// request reader acquires before it reads a WRITE payload or dispatches a
// READ, and the request's goroutine releases when its reply is written.
type byteBudget struct {
	limit int64

	mu        sync.Mutex // guards the fields below
	available *sync.Cond
	used      int64
}

func newByteBudget(limit int64) *byteBudget {
	budget := &byteBudget{limit: limit}
	budget.available = sync.NewCond(&budget.mu)
	return budget
}

// acquire blocks until n bytes fit in the budget. A request larger than the
// whole budget is admitted alone, so that it cannot wait forever.
func (b *byteBudget) acquire(n int64) {
	if n == 0 {
		return
	}
	b.mu.Lock()
	for b.used > 0 && b.used+n > b.limit {
		b.available.Wait()
	}
	b.used += n
	b.mu.Unlock()
}

func (b *byteBudget) release(n int64) {
	if n == 0 {
		return
	}
	b.mu.Lock()
	b.used -= n
	if b.used < 0 {
		panic("nbd: byte budget released more than acquired")
	}
	b.mu.Unlock()
	b.available.Broadcast()
}

func (b *byteBudget) inUse() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}
