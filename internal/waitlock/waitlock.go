// Package waitlock is a readers-writer lock for locks held across network
// round trips (see RWLock).
package waitlock

import "sync"

// RWLock is a readers-writer lock with sync.RWMutex's semantics (any
// number of readers or one writer; a waiting writer holds new readers
// back, so copies under an object's exclusive lock are not starved by a
// stream of writes), for the locks this package holds across network
// round trips: an object's exclusive lock while it is copied, a first
// write's allocation lock while the data and map entry go to every
// replica, a VDI's open lock while the cluster lock is committed.
//
// Its waiters wait on a sync.Cond rather than inside sync.Mutex, because
// testing/synctest, which runs the simulator (internal/sim) on a fake
// clock, counts a goroutine blocked in Cond.Wait as durably blocked but
// not one blocked on a mutex (golang/go#77687): with a sync.RWMutex, a
// writer waiting for the lock while its holder waits for a timeout would
// stop the fake clock for good. The internal mutex is only held for a
// few instructions. The zero value is an unlocked lock.
type RWLock struct {
	mu      sync.Mutex // guards the fields below; held briefly
	cond    sync.Cond  // signalled when the lock may have become free
	readers int        // holding it shared
	writer  bool       // holding it exclusively
	waiting int        // writers waiting: new readers wait behind them
}

func (l *RWLock) enter() {
	l.mu.Lock()
	if l.cond.L == nil {
		l.cond.L = &l.mu
	}
}

// RLock takes the lock shared.
func (l *RWLock) RLock() {
	l.enter()
	for l.writer || l.waiting > 0 {
		l.cond.Wait()
	}
	l.readers++
	l.mu.Unlock()
}

// RUnlock releases a shared hold.
func (l *RWLock) RUnlock() {
	l.mu.Lock()
	if l.readers <= 0 {
		l.mu.Unlock()
		panic("waitlock: RUnlock of a lock not held shared")
	}
	l.readers--
	if l.readers == 0 && l.waiting > 0 {
		l.cond.Broadcast()
	}
	l.mu.Unlock()
}

// Lock takes the lock exclusively.
func (l *RWLock) Lock() {
	l.enter()
	l.waiting++
	for l.writer || l.readers > 0 {
		l.cond.Wait()
	}
	l.waiting--
	l.writer = true
	l.mu.Unlock()
}

// Unlock releases an exclusive hold.
func (l *RWLock) Unlock() {
	l.mu.Lock()
	if !l.writer {
		l.mu.Unlock()
		panic("waitlock: Unlock of a lock not held exclusively")
	}
	l.writer = false
	l.cond.Broadcast()
	l.mu.Unlock()
}
