package cluster

import (
	"testing"
	"time"
)

// The forwarded requests that are not log commands must never collide
// with one: a lease request taken for a command would be committed.
func TestLeaseAndBarrierRequestsAreNoCommands(t *testing.T) {
	for _, b := range []byte{barrierRequest, leaseRequest} {
		if commands[commandType(b)] != nil {
			t.Errorf("command type %#x is also a forwarded request", b)
		}
	}
}

// A lease runs from the time its request was sent, not from when the
// answer arrived: an answer delayed past the lease's end (the node was
// paused while it waited) extends nothing.
func TestLeaseRunsFromItsRequest(t *testing.T) {
	l := newNodeLease()
	if l.valid() {
		t.Fatal("a new node holds a lease")
	}
	sent := bootNow() - int64(leaseDuration) - 1
	l.extend(sent + int64(leaseDuration))
	if l.valid() {
		t.Fatal("an answer that came after the lease's end made it valid")
	}
	now := bootNow()
	l.extend(now + int64(leaseDuration))
	if !l.valid() {
		t.Fatal("a fresh renewal left the lease invalid")
	}
	// An older answer arriving late never shortens the lease.
	l.extend(now + int64(time.Millisecond))
	if got := l.until.Load(); got != now+int64(leaseDuration) {
		t.Fatalf("a late answer moved the lease's end to %d, want %d", got, now+int64(leaseDuration))
	}
}
