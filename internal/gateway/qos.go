package gateway

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/herd-storage/herd/internal/cluster"
)

// Per-VDI QoS: each gateway paces the requests of a VDI's opens through
// it to the VDI's limits (cluster.Limits, set by `herd vdi set`).
//
// Rules, and why:
//  1. One limiter per VDI name per gateway, shared by every open of NAME
//     and ro/NAME through this node: the limits are the name's. Snapshots
//     (NAME@TAG) are not limited (their opens share no limiter).
//  2. A request waits for its tokens before it takes the VDI's io lock:
//     a snapshot or handover, which takes io exclusively, must never
//     stall behind a request that is only waiting for its turn. The wait
//     honours the request's context (the client went away).
//  3. An unlimited VDI costs one atomic load per request (limiter.wait).
//  4. Each limit is a token bucket kept as a GCRA schedule (the ATM
//     forum's generic cell rate algorithm; the same as a token bucket):
//     a request of cost c (1 for IOPS, its bytes for BPS) at rate r is
//     due at next-τ, where next is when the bucket's previous requests
//     have been paid for, and τ, the burst, is 100 ms of the rate. So
//     after a pause a request of any size goes at once, and a run of
//     requests may go 100 ms ahead of the rate, never more: about 1/10 s
//     worth or one request, whichever is larger.
//  5. New limits take effect without reopening: a watcher per limiter
//     follows the cluster log (Cluster.WaitVDI) and swaps the limiter's
//     buckets; requests already waiting keep the schedule they got (at
//     most their place in the old rate's queue).

// qosBurst is the burst a bucket allows beyond one request (rule 4).
const qosBurst = 100 * time.Millisecond

// bucket is one limit's schedule. Safe for concurrent use.
type bucket struct {
	rate float64 // tokens per second

	mu   sync.Mutex // guards next
	next time.Time  // when every token handed out so far is paid for
}

func newBucket(rate uint64) *bucket {
	if rate == 0 {
		return nil
	}
	return &bucket{rate: float64(rate)}
}

// reserve takes cost tokens and returns when the request may go (rule 4).
func (b *bucket) reserve(now time.Time, cost float64) time.Time {
	b.mu.Lock()
	defer b.mu.Unlock()
	start := b.next
	if start.Before(now) {
		start = now
	}
	b.next = start.Add(time.Duration(cost / b.rate * float64(time.Second)))
	due := start.Add(-qosBurst)
	if due.Before(now) {
		return now
	}
	return due
}

// refund gives back the tokens of a request that will not go (its client
// went away while it waited), so that they pace nobody else.
func (b *bucket) refund(now time.Time, cost float64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.next = b.next.Add(-time.Duration(cost / b.rate * float64(time.Second)))
	if b.next.Before(now) {
		b.next = now
	}
}

// buckets are one set of limits' schedules; nil when a limit is 0.
type buckets struct {
	limits                                   cluster.Limits
	iops, readIOPS, writeIOPS                *bucket
	bandwidth, readBandwidth, writeBandwidth *bucket
}

// newBuckets returns the schedules of limits, keeping those of old whose
// rate did not change (so a change of one limit does not forgive the
// debt of the others); nil for no limits.
func newBuckets(limits cluster.Limits, old *buckets) *buckets {
	if limits.Unlimited() {
		return nil
	}
	keep := func(rate uint64, oldRate func(cluster.Limits) uint64, oldBucket func(*buckets) *bucket) *bucket {
		if old != nil && oldRate(old.limits) == rate {
			return oldBucket(old)
		}
		return newBucket(rate)
	}
	return &buckets{limits: limits,
		iops:           keep(limits.IOPS, func(l cluster.Limits) uint64 { return l.IOPS }, func(b *buckets) *bucket { return b.iops }),
		readIOPS:       keep(limits.ReadIOPS, func(l cluster.Limits) uint64 { return l.ReadIOPS }, func(b *buckets) *bucket { return b.readIOPS }),
		writeIOPS:      keep(limits.WriteIOPS, func(l cluster.Limits) uint64 { return l.WriteIOPS }, func(b *buckets) *bucket { return b.writeIOPS }),
		bandwidth:      keep(limits.BPS, func(l cluster.Limits) uint64 { return l.BPS }, func(b *buckets) *bucket { return b.bandwidth }),
		readBandwidth:  keep(limits.ReadBPS, func(l cluster.Limits) uint64 { return l.ReadBPS }, func(b *buckets) *bucket { return b.readBandwidth }),
		writeBandwidth: keep(limits.WriteBPS, func(l cluster.Limits) uint64 { return l.WriteBPS }, func(b *buckets) *bucket { return b.writeBandwidth }),
	}
}

// wait waits until a request may go: a read or a write (TRIM and
// WRITE_ZEROES are writes of 0 bytes) of bytes.
func (bs *buckets) wait(ctx context.Context, write bool, bytes uint64) error {
	var iops, bandwidth *bucket
	if write {
		iops, bandwidth = bs.writeIOPS, bs.writeBandwidth
	} else {
		iops, bandwidth = bs.readIOPS, bs.readBandwidth
	}
	type reservation struct {
		b    *bucket
		cost float64
	}
	var reserved [4]reservation
	n := 0
	now := time.Now()
	due := now
	take := func(b *bucket, cost float64) {
		if b == nil || cost == 0 {
			return
		}
		if at := b.reserve(now, cost); at.After(due) {
			due = at
		}
		reserved[n] = reservation{b, cost}
		n++
	}
	take(iops, 1)
	take(bs.iops, 1)
	take(bandwidth, float64(bytes))
	take(bs.bandwidth, float64(bytes))
	wait := due.Sub(now)
	if wait <= 0 {
		return nil
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		now = time.Now()
		for _, r := range reserved[:n] {
			r.b.refund(now, r.cost)
		}
		return fmt.Errorf("waiting for the vdi's QoS limits (%s): %w", bs.limits, ctx.Err())
	}
}

// limiter paces one VDI name's requests through this gateway (rule 1).
type limiter struct {
	name    string
	buckets atomic.Pointer[buckets] // nil: unlimited
	// ackZone: the VDI's writes are acknowledged once the writer's zone
	// has them (cluster.AckZone, lag.go); kept current by the watcher.
	ackZone atomic.Bool

	// refs counts the vdiStates using the limiter, guarded by admission.mu;
	// stop ends its watcher.
	refs int
	stop context.CancelFunc

	// inFlight counts the VDI's requests holding a slot, waiters those
	// queued for one (fair.go); guarded by fairQueue.mu.
	inFlight int
	waiters  []*waiter
}

// wait waits until a request of the VDI may go (rule 3: one atomic load
// when unlimited).
func (l *limiter) wait(ctx context.Context, write bool, bytes uint64) error {
	bs := l.buckets.Load()
	if bs == nil {
		return nil
	}
	return bs.wait(ctx, write, bytes)
}

// set installs limits (rule 5).
func (l *limiter) set(limits cluster.Limits) {
	l.buckets.Store(newBuckets(limits, l.buckets.Load()))
}

// limits returns the limits in force.
func (l *limiter) limits() cluster.Limits {
	if bs := l.buckets.Load(); bs != nil {
		return bs.limits
	}
	return cluster.Limits{}
}

// admission lets a request in and bounds what it spends on this node:
// the QoS limiters of the VDI names open here (this file), the fair
// sharing of the node's request slots between VDIs (fair.go), and the
// node-wide bounds on TRIM/WRITE_ZEROES pieces and copy-on-write
// buffers (bounds.go). It watches the cluster log for limit changes.
type admission struct {
	cluster interface {
		WaitVDI(ctx context.Context, name string, done func(v cluster.VDI, err error) bool) (cluster.VDI, error)
	}
	logger *slog.Logger
	// ctx is the gateway's: the limiters' watchers end with it.
	ctx context.Context

	mu sync.Mutex // guards limiters and their refs; taken under Gateway.mu
	// limiters pace each open VDI name's requests; snapshots is the one
	// of every snapshot's opens, never limited.
	limiters  map[string]*limiter
	snapshots *limiter
	// fair shares the node's request slots between VDIs (fair.go).
	fair *fairQueue
	// zeroPieces counts TRIM and WRITE_ZEROES pieces in flight
	// (Options.ZeroPieces); copyBytes the copy-on-write buffers in use
	// (Options.CopyBytes). See bounds.go.
	zeroPieces *semaphore
	copyBytes  *semaphore
}

func newAdmission(c Cluster, logger *slog.Logger, ctx context.Context, options Options) *admission {
	return &admission{cluster: c, logger: logger, ctx: ctx, limiters: map[string]*limiter{}, snapshots: &limiter{}, fair: newFairQueue(options.FairSlots),
		zeroPieces: newSemaphore("TRIM/WRITE_ZEROES pieces in flight", "pieces", int64(options.ZeroPieces)),
		copyBytes:  newSemaphore("copy-on-write buffers", "bytes", options.CopyBytes),
	}
}

// limiterFor returns the limiter of vdi's name, starting its watcher
// with the first user. Snapshots share a.snapshots, never limited.
func (a *admission) limiterFor(vdi cluster.VDI) *limiter {
	if vdi.Snapshot {
		return a.snapshots
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	l, ok := a.limiters[vdi.Name]
	if !ok {
		l = &limiter{name: vdi.Name}
		l.set(vdi.Limits)
		l.ackZone.Store(vdi.Ack == cluster.AckZone)
		ctx, cancel := context.WithCancel(a.ctx)
		l.stop = cancel
		a.limiters[vdi.Name] = l
		go a.watchLimits(ctx, l)
	}
	l.refs++
	return l
}

// dropLimiter forgets a user of l; the last stops its watcher.
func (a *admission) dropLimiter(l *limiter) {
	if l == a.snapshots {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	l.refs--
	if l.refs == 0 {
		l.stop()
		if a.limiters[l.name] == l {
			delete(a.limiters, l.name)
		}
	}
}

// watchLimits keeps l's limits those the cluster log holds for its VDI
// until ctx ends (rule 5). A VDI that is gone (deleted while open) keeps
// its last limits.
func (a *admission) watchLimits(ctx context.Context, l *limiter) {
	for ctx.Err() == nil {
		v, err := a.cluster.WaitVDI(ctx, l.name, func(v cluster.VDI, err error) bool {
			return err == nil && (v.Limits != l.limits() || (v.Ack == cluster.AckZone) != l.ackZone.Load())
		})
		if ctx.Err() != nil {
			return
		}
		if err == nil && v.Limits != l.limits() {
			l.set(v.Limits)
			a.logger.Info("gateway: vdi limits changed", "vdi", l.name, "limits", v.Limits.String())
		}
		if zone := v.Ack == cluster.AckZone; err == nil && zone != l.ackZone.Load() {
			l.ackZone.Store(zone)
			a.logger.Info("gateway: vdi acknowledgement changed", "vdi", l.name, "zone", zone)
		}
	}
}

// Limits returns the QoS limits this gateway applies to VDI name's opens
// now (unlimited when none is open through it).
func (g *Gateway) Limits(name string) cluster.Limits {
	a := g.admit
	a.mu.Lock()
	defer a.mu.Unlock()
	if l, ok := a.limiters[name]; ok {
		return l.limits()
	}
	return cluster.Limits{}
}
