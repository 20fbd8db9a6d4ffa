package recovery

import (
	"context"
	"fmt"
	"math"
	"sync"

	"golang.org/x/time/rate"
)

// Recovery limits: how many objects one node recovers at
// once and how many bytes per second it copies, adjustable while it runs
// (`herd node recovery --max-rate --concurrency`). Only the background
// pass is limited; an object a client is waiting for is recovered at once.
const (
	defaultRecoveryConcurrency = 4
	maxRecoveryConcurrency     = 64
	throttleBurst              = 4 << 20 // one default object: no head start beyond it
)

// Limits are a node's recovery limits; zero MaxRate is unlimited.
type Limits struct {
	MaxRate     uint64 `json:"max_rate"` // bytes per second
	Concurrency int    `json:"concurrency"`
}

// throttle gates recovery workers (a resizable semaphore) and paces their
// copies (a token bucket).
type throttle struct {
	mu      sync.Mutex
	changed chan struct{} // closed when limit or running drops
	limit   int
	running int
	maxRate uint64
	bucket  *rate.Limiter
}

func newThrottle(concurrency int, maxRate uint64) *throttle {
	t := &throttle{changed: make(chan struct{}), bucket: rate.NewLimiter(rate.Inf, throttleBurst)}
	t.set(Limits{MaxRate: maxRate, Concurrency: concurrency})
	return t
}

func (t *throttle) set(l Limits) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.limit = l.Concurrency
	t.maxRate = l.MaxRate
	if l.MaxRate == 0 {
		t.bucket.SetLimit(rate.Inf)
	} else {
		t.bucket.SetLimit(rate.Limit(l.MaxRate))
	}
	close(t.changed)
	t.changed = make(chan struct{})
}

func (t *throttle) limits() Limits {
	t.mu.Lock()
	defer t.mu.Unlock()
	return Limits{MaxRate: t.maxRate, Concurrency: t.limit}
}

// enter waits for a free worker slot.
func (t *throttle) enter(ctx context.Context) error {
	for {
		t.mu.Lock()
		if t.running < t.limit {
			t.running++
			t.mu.Unlock()
			return nil
		}
		changed := t.changed
		t.mu.Unlock()
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (t *throttle) leave() {
	t.mu.Lock()
	t.running--
	close(t.changed)
	t.changed = make(chan struct{})
	t.mu.Unlock()
}

// wait paces a copy of n bytes.
func (t *throttle) wait(ctx context.Context, n uint64) error {
	for n > 0 {
		chunk := min(n, throttleBurst)
		if err := t.bucket.WaitN(ctx, int(chunk)); err != nil {
			return err
		}
		n -= chunk
	}
	return nil
}

// Pace waits until n more bytes fit this node's recovery rate
// (--max-rate): the gateway's rebuild of erasure-coded objects whose
// chunks lost their home reads through it, so that rebuilding and
// recovering copies share one budget.
func (r *Recovery) Pace(ctx context.Context, n uint64) error { return r.throttle.wait(ctx, n) }

// SetLimits changes this node's recovery limits, effective at once.
func (r *Recovery) SetLimits(l Limits) error {
	if l.Concurrency < 1 || l.Concurrency > maxRecoveryConcurrency {
		return fmt.Errorf("recovery concurrency must be 1 to %d, not %d", maxRecoveryConcurrency, l.Concurrency)
	}
	if l.MaxRate > math.MaxInt64 {
		return fmt.Errorf("recovery rate %d is too large", l.MaxRate)
	}
	if l.MaxRate != 0 && l.MaxRate < 1<<20 {
		return fmt.Errorf("recovery rate must be at least 1MiB/s (or 0 for unlimited), not %d bytes/s", l.MaxRate)
	}
	r.throttle.set(l)
	r.logger.Info("recovery: limits changed", "max_rate", l.MaxRate, "concurrency", l.Concurrency)
	return nil
}

// Limits returns this node's recovery limits.
func (r *Recovery) Limits() Limits { return r.throttle.limits() }
