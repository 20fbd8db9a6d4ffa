package gateway

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/herd-storage/herd/internal/cluster"
)

// The bucket's schedule on a fake clock: after a pause a request of any
// size goes at once; a run goes at the rate, at most qosBurst ahead.
func TestBucketPaces(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		bs := newBuckets(cluster.Limits{WriteIOPS: 100}, nil)
		ctx := context.Background()
		start := time.Now()
		for range 1000 {
			if err := bs.wait(ctx, true, 4096); err != nil {
				t.Fatal(err)
			}
		}
		// 1000 requests at 100/s: the last is due 10 s after the first,
		// less the burst.
		if got, want := time.Since(start), 10*time.Second-qosBurst-10*time.Millisecond; got != want {
			t.Fatalf("1000 writes at 100 IOPS took %v, want %v", got, want)
		}
		// Reads are not limited by a write limit.
		start = time.Now()
		for range 1000 {
			bs.wait(ctx, false, 4096)
		}
		if got := time.Since(start); got != 0 {
			t.Fatalf("reads waited %v under a write limit", got)
		}
		// After a pause, a burst of 100 ms of the rate goes at once (plus
		// the first request), then the pace is the rate again.
		time.Sleep(time.Second)
		start = time.Now()
		for range 11 {
			bs.wait(ctx, true, 4096)
		}
		if got := time.Since(start); got != 0 {
			t.Fatalf("a burst of 11 after a pause waited %v", got)
		}
		bs.wait(ctx, true, 4096)
		if got := time.Since(start); got != 10*time.Millisecond {
			t.Fatalf("the request after the burst went after %v, want 10ms", got)
		}
	})
}

// Concurrent requesters share the rate; bytes are paced by their size,
// and a request larger than the burst goes at once after a pause.
func TestBucketBytesConcurrent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		bs := newBuckets(cluster.Limits{BPS: 1 << 20}, nil) // 1 MiB/s
		start := time.Now()
		if err := bs.wait(context.Background(), true, 4<<20); err != nil || time.Since(start) != 0 {
			t.Fatalf("a 4 MiB request after a pause waited %v (%v)", time.Since(start), err)
		}
		// 16 requesters x 16 reads and writes of 64 KiB: 16 MiB more, due
		// 4 s (the first request's debt) + 16 s, less the burst.
		var wg sync.WaitGroup
		for i := range 16 {
			wg.Go(func() {
				for range 16 {
					bs.wait(context.Background(), i%2 == 0, 64<<10)
				}
			})
		}
		wg.Wait()
		want := 20*time.Second - qosBurst - time.Second/16
		if got := time.Since(start); got != want {
			t.Fatalf("took %v, want %v", got, want)
		}
	})
}

// Combined and per-kind limits: the tighter binds.
func TestBucketCombined(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		bs := newBuckets(cluster.Limits{IOPS: 100, ReadIOPS: 1000, WriteIOPS: 50}, nil)
		start := time.Now()
		for range 200 {
			bs.wait(context.Background(), false, 512) // reads: 100/s binds
		}
		if got := time.Since(start); got != 1990*time.Millisecond-qosBurst {
			t.Fatalf("200 reads under iops 100 took %v", got)
		}
		time.Sleep(time.Second)
		start = time.Now()
		for range 101 {
			bs.wait(context.Background(), true, 512) // writes: 50/s binds
		}
		if got := time.Since(start); got != 2*time.Second-qosBurst {
			t.Fatalf("101 writes under write iops 50 took %v", got)
		}
	})
}

// A waiting request gives up with its context, and gives its tokens back.
func TestBucketWaitHonoursContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		bs := newBuckets(cluster.Limits{ReadIOPS: 1}, nil)
		bs.wait(context.Background(), false, 0) // due: next is 1 s on
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		start := time.Now()
		if err := bs.wait(ctx, false, 0); !errors.Is(err, context.DeadlineExceeded) || time.Since(start) != 100*time.Millisecond {
			t.Fatalf("cancelled wait: %v after %v", err, time.Since(start))
		}
		// Its token came back: the next request is due when it would have
		// been without the cancelled one.
		bs.wait(context.Background(), false, 0)
		if got := time.Since(start); got != 900*time.Millisecond {
			t.Fatalf("the request after a cancelled one went after %v, want 900ms", got)
		}
	})
}

// A changed limit keeps the other limits' schedules.
func TestNewBucketsKeepsUnchanged(t *testing.T) {
	a := newBuckets(cluster.Limits{IOPS: 10, WriteBPS: 1 << 20}, nil)
	b := newBuckets(cluster.Limits{IOPS: 20, WriteBPS: 1 << 20}, a)
	if b.writeBandwidth != a.writeBandwidth || b.iops == a.iops || b.readIOPS != nil {
		t.Fatalf("buckets after a change: %+v from %+v", b, a)
	}
	if newBuckets(cluster.Limits{}, a) != nil {
		t.Fatal("no limits gave buckets")
	}
}

// A limited VDI's requests are paced; a limit set while the VDI is open
// takes effect without reopening; NAME and ro/NAME share one limiter and
// a snapshot's opens have none.
func TestGatewayPacesLimitedVDI(t *testing.T) {
	w := newWorld(t, 3, 3)
	w.cluster.addVDI("vm", 1, 8*objectSize)
	g := w.gateway("node00")
	d := open(t, g, "vm")
	ro := open(t, g, "ro/vm")
	if d.state.limiter != ro.state.limiter || d.state.limiter == g.admit.snapshots {
		t.Fatal("vm and ro/vm do not share a limiter")
	}
	ctx := context.Background()
	writes := func(n int) time.Duration {
		t.Helper()
		start := time.Now()
		var wg sync.WaitGroup
		for i := range 8 {
			wg.Go(func() {
				for j := i; j < n; j += 8 {
					if err := d.WriteAt(ctx, make([]byte, 4096), uint64(j)*4096, false); err != nil {
						t.Error(err)
					}
				}
			})
		}
		wg.Wait()
		return time.Since(start)
	}
	writes(16) // unlimited: nothing to check but that it works
	// Set while open: the gateway learns it from the log.
	w.cluster.setLimits("vm", cluster.Limits{WriteIOPS: 40})
	waitLimits(t, g, "vm", cluster.Limits{WriteIOPS: 40})
	// 30 writes at 40/s: the last is due 29/40 s after the first, less
	// the 100 ms burst (a lower bound the limit makes certain).
	if took := writes(30); took < 29*time.Second/40-qosBurst {
		t.Fatalf("30 writes at 40 IOPS took %v", took)
	}
	// Reads through ro/vm are not write-limited; a read limit paces them.
	w.cluster.setLimits("vm", cluster.Limits{WriteIOPS: 40, ReadIOPS: 20})
	waitLimits(t, g, "vm", cluster.Limits{WriteIOPS: 40, ReadIOPS: 20})
	start := time.Now()
	for i := range 10 {
		if err := ro.ReadAt(ctx, make([]byte, 4096), uint64(i)*4096); err != nil {
			t.Fatal(err)
		}
	}
	if took := time.Since(start); took < 9*time.Second/20-qosBurst {
		t.Fatalf("10 reads through ro/vm at 20 IOPS took %v", took)
	}
	// A snapshot's opens are not limited.
	if _, err := g.Snapshot(ctx, "vm", "s1"); err != nil {
		t.Fatal(err)
	}
	if s := open(t, g, "vm@s1"); s.state.limiter != g.admit.snapshots {
		t.Fatal("a snapshot's open is limited")
	}
	// Removed: back to one atomic load.
	w.cluster.setLimits("vm", cluster.Limits{})
	waitLimits(t, g, "vm", cluster.Limits{})
	if d.state.limiter.buckets.Load() != nil {
		t.Fatal("buckets left after the limits were removed")
	}
	// The last close forgets the limiter and stops its watcher.
	d.Close()
	ro.Close()
	g.mu.Lock()
	left := len(g.admit.limiters)
	g.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d limiters left after every open closed", left)
	}
}

// A request waiting for its tokens holds nothing: a snapshot (which takes
// the VDI's io lock exclusively) completes meanwhile, and the waiting
// request gives up when its client goes away.
func TestThrottledRequestDoesNotStallSnapshot(t *testing.T) {
	w := newWorld(t, 3, 3)
	w.cluster.addVDI("vm", 1, 8*objectSize)
	w.cluster.setLimits("vm", cluster.Limits{WriteBPS: cluster.MinBPSLimit})
	g := w.gateway("node00")
	d := open(t, g, "vm")
	ctx := context.Background()
	// After a pause a 4 MiB write goes at once; the next is due 64 s on.
	if err := d.WriteAt(ctx, make([]byte, 4*objectSize), 0, false); err != nil {
		t.Fatal(err)
	}
	waiting, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- d.WriteAt(waiting, []byte("late"), 0, false) }()
	snapshotCtx, stop := context.WithTimeout(ctx, 20*time.Second)
	defer stop()
	if _, err := g.Snapshot(snapshotCtx, "vm", "s1"); err != nil {
		t.Fatalf("snapshot beside a throttled write: %v", err)
	}
	select {
	case err := <-done:
		t.Fatalf("the throttled write returned before its client went away: %v", err)
	default:
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("throttled write after its client went away: %v", err)
	}
}

func waitLimits(t *testing.T, g *Gateway, name string, want cluster.Limits) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for g.Limits(name) != want {
		if time.Now().After(deadline) {
			t.Fatalf("the gateway applies %+v to %s, want %+v", g.Limits(name), name, want)
		}
		time.Sleep(time.Millisecond)
	}
}

// The price of QoS for an unlimited VDI: one atomic load per request.
func BenchmarkLimiterUnlimited(b *testing.B) {
	l := &limiter{}
	ctx := context.Background()
	for b.Loop() {
		l.wait(ctx, true, 4096)
	}
}

func BenchmarkLimiterLimitedNoWait(b *testing.B) {
	l := &limiter{}
	l.set(cluster.Limits{WriteIOPS: cluster.MaxIOPSLimit})
	ctx := context.Background()
	for b.Loop() {
		l.wait(ctx, true, 4096)
	}
}
