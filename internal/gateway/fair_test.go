package gateway

import (
	"context"
	"errors"
	"slices"
	"testing"
	"testing/synctest"
)

// With every slot busy and one VDI's requests queued, another VDI under
// its share is served at once, and past its share at the next turn, not
// after the whole queue; a queued request whose context ends leaves the
// queue.
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
		if len(served) != 0 {
			t.Fatal("bulk was served past its slots")
		}
		// small has nothing in flight, less than its share (2 slots / 2
		// busy VDIs): it goes at once, past the bound.
		queue(small)
		if got := <-served; got != "small" || q.inFlight != 3 {
			t.Fatalf("served %s, %d in flight", got, q.inFlight)
		}
		// A second request of small is at its share: it waits its turn,
		// and leaves the queue when its client goes away.
		gone, cancel := context.WithCancel(ctx)
		cancelled := make(chan error, 1)
		go func() { cancelled <- q.acquire(gone, small) }()
		synctest.Wait()
		cancel()
		if err := <-cancelled; !errors.Is(err, context.Canceled) {
			t.Fatalf("a cancelled wait: %v", err)
		}
		queue(small)
		// bulk's release brings the node back to its bound: nobody is
		// served; small's release frees a slot for the turn's flow.
		q.release(bulk)
		synctest.Wait()
		if len(served) != 0 {
			t.Fatal("served over the bound")
		}
		q.release(small)
		var order []string
		order = append(order, <-served)
		for range 10 {
			q.release(bulk)
			order = append(order, <-served)
		}
		want := []string{"bulk", "small", "bulk", "bulk", "bulk", "bulk", "bulk", "bulk", "bulk", "bulk", "bulk"}
		if !slices.Equal(order, want) {
			t.Fatalf("served %v, want %v", order, want)
		}
		// Give back every slot still held: one each.
		q.release(bulk)
		q.release(small)
		if q.inFlight != 0 || q.active != 0 || len(q.turns) != 0 || bulk.inFlight != 0 || small.inFlight != 0 {
			t.Fatalf("after releasing everything: %d in flight, %d active, turns %v", q.inFlight, q.active, q.turns)
		}
	})
}
