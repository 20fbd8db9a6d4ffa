package waitlock

import (
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

func TestWaitLockExcludes(t *testing.T) {
	var l RWLock
	var inside, readers atomic.Int32
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(2)
		go func() {
			defer wg.Done()
			for j := 0; j < 200; j++ {
				l.Lock()
				if inside.Add(1) != 1 || readers.Load() != 0 {
					t.Error("a writer shares the lock")
				}
				inside.Add(-1)
				l.Unlock()
			}
		}()
		go func() {
			defer wg.Done()
			for j := 0; j < 200; j++ {
				l.RLock()
				readers.Add(1)
				if inside.Load() != 0 {
					t.Error("a reader shares the lock with a writer")
				}
				readers.Add(-1)
				l.RUnlock()
			}
		}()
	}
	wg.Wait()
}

// A waiting writer holds new readers back (sync.RWMutex's rule), so a
// copy under an object's exclusive lock is not starved by writes.
func TestWaitLockWriterFirst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var l RWLock
		l.RLock()
		var order []string
		var mu sync.Mutex
		note := func(s string) { mu.Lock(); order = append(order, s); mu.Unlock() }
		go func() { l.Lock(); note("writer"); l.Unlock() }()
		synctest.Wait()
		go func() { l.RLock(); note("reader"); l.RUnlock() }()
		synctest.Wait()
		l.RUnlock()
		synctest.Wait()
		if len(order) != 2 || order[0] != "writer" {
			t.Fatalf("order %v, want the waiting writer first", order)
		}
	})
}

// The reason for RWLock: a goroutine waiting for the lock while its
// holder waits for time must not stop a synctest bubble's clock.
func TestWaitLockLetsTheFakeClockRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var l RWLock
		start := time.Now()
		l.Lock()
		go func() { time.Sleep(time.Second); l.Unlock() }()
		l.RLock()
		l.RUnlock()
		if elapsed := time.Since(start); elapsed != time.Second {
			t.Fatalf("waited %v of fake time, want 1s", elapsed)
		}
	})
}
