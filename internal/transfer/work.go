package transfer

import (
	"context"
	"sync"

	"github.com/herd-storage/herd/internal/nbdclient"
)

// Parallel work: chunks handed to requests-per-connection workers, and the
// buffers they read into.

// bufferPool recycles chunk buffers; it never holds more than it was given.
type bufferPool struct {
	length int
	free   chan []byte
}

func newBufferPool(length, capacity int) *bufferPool {
	return &bufferPool{length: length, free: make(chan []byte, capacity)}
}

func (p *bufferPool) get() []byte {
	select {
	case b := <-p.free:
		return b
	default:
		return make([]byte, p.length)
	}
}

func (p *bufferPool) put(b []byte) {
	if cap(b) < p.length {
		return
	}
	select {
	case p.free <- b[:p.length]:
	default:
	}
}

// runWorkers runs work for every job sent to the returned channel, with
// requests goroutines per connection. The first error cancels ctx (its
// cause is the error). wait closes the channel, waits for the workers and
// returns the first error.
func runWorkers[J any](ctx context.Context, cancel context.CancelCauseFunc, conns []*nbdclient.Conn, requests int, work func(context.Context, *nbdclient.Conn, J) error) (jobs chan<- J, wait func() error) {
	channel := make(chan J, len(conns)*requests)
	var group sync.WaitGroup
	for _, conn := range conns {
		for range requests {
			group.Go(func() {
				for job := range channel {
					if ctx.Err() != nil {
						continue // drain
					}
					if err := work(ctx, conn, job); err != nil {
						cancel(err)
					}
				}
			})
		}
	}
	return channel, func() error {
		close(channel)
		group.Wait()
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		return nil
	}
}

// send hands job to the workers unless ctx ends first.
func send[J any](ctx context.Context, jobs chan<- J, job J) bool {
	if ctx.Err() != nil {
		return false
	}
	select {
	case jobs <- job:
		return true
	case <-ctx.Done():
		return false
	}
}
