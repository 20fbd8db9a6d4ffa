package gateway

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
)

// With every slot busy and one VDI's requests queued, another VDI's
// request is served at the next turn, not after the whole queue; a
// queued request whose context ends leaves the queue.
func TestFairQueueTakesTurns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := newFairQueue(2)
		bulk, small := &limiter{name: "bulk"}, &limiter{name: "small"}
		ctx := context.Background()
		for range 2 {
			if err := q.acquire(ctx, bulk); err != nil {
				t.Fatal(err)
			}
		}
		var order []string
		served := make(chan string, 100)
		queue := func(f *limiter) {
			go func() {
				if err := q.acquire(ctx, f); err != nil {
					t.Error(err)
					return
				}
				served <- f.name
			}()
			synctest.Wait() // queued in this order
		}
		for range 10 {
			queue(bulk)
		}
		gone, cancel := context.WithCancel(ctx)
		cancelled := make(chan error, 1)
		go func() { cancelled <- q.acquire(gone, small) }()
		synctest.Wait()
		cancel()
		if err := <-cancelled; !errors.Is(err, context.Canceled) {
			t.Fatalf("a cancelled wait: %v", err)
		}
		queue(small)
		queue(small)
		for range 12 {
			q.release()
			order = append(order, <-served)
		}
		// bulk was first in turn; small's first request goes next, then
		// they alternate while both have requests queued.
		want := []string{"bulk", "small", "bulk", "small", "bulk", "bulk", "bulk", "bulk", "bulk", "bulk", "bulk", "bulk"}
		for i := range want {
			if order[i] != want[i] {
				t.Fatalf("served %v, want %v", order, want)
			}
		}
		// Every slot given back: 2 free, none queued.
		q.release()
		q.release()
		if q.inFlight != 0 || len(q.turns) != 0 {
			t.Fatalf("after releasing everything: %d in flight, turns %v", q.inFlight, q.turns)
		}
	})
}
