package cluster

import (
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/cluster/statemachine"
)

// The forwarded requests that are not log commands must never collide
// with one: a lease request taken for a command would be committed.
func TestLeaseAndBarrierRequestsAreNoCommands(t *testing.T) {
	for _, b := range []byte{barrierRequest, leaseRequest} {
		if statemachine.Known([]byte{b}) {
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
	sent, sentMono := bootNow()-int64(leaseDuration)-1, monoNow()-int64(leaseDuration)-1
	l.extend(sent+int64(leaseDuration), sentMono+int64(leaseDuration))
	if l.valid() || l.validMonotonic() {
		t.Fatal("an answer that came after the lease's end made it valid")
	}
	now := bootNow()
	l.extend(now+int64(leaseDuration), monoNow()+int64(leaseDuration))
	if !l.valid() || !l.validMonotonic() {
		t.Fatal("a fresh renewal left the lease invalid")
	}
	// An older answer arriving late never shortens the lease.
	l.extend(now+int64(time.Millisecond), 0)
	if got := l.until.Load(); got != now+int64(leaseDuration) {
		t.Fatalf("a late answer moved the lease's end to %d, want %d", got, now+int64(leaseDuration))
	}
}

// The active index is the lowest floor among the leases that may still
// run: a node that stopped renewing holds it down until its lease is
// over, and in a new leader's first lease period a node alive in the log
// that has not asked yet may hold its predecessor's lease.
func TestActiveIndexWaitsForEveryServingNode(t *testing.T) {
	hold := int64(leaseDuration + leaseMargin)
	g := leaseGrants{}
	g.begin(1)
	start := g.since
	g.record("a", start, 90, 95)
	g.record("b", start, 120, 125)
	alive := []string{"a", "b", "c"}
	if got := g.activeLocked(start+1, 150, alive); got != 0 {
		t.Fatalf("with c alive and not heard from in the term's first lease period: active %d, want 0", got)
	}
	g.record("c", start, 130, 135)
	if got := g.activeLocked(start+1, 150, alive); got != 90 {
		t.Fatalf("active %d, want a's floor 90", got)
	}
	// a renews with a higher floor; b's report is the lowest now.
	g.record("a", start+hold/2, 140, 145)
	if got := g.activeLocked(start+hold/2, 150, alive); got != 120 {
		t.Fatalf("active %d, want b's floor 120", got)
	}
	// b and c stop renewing: once their leases may have run out, only a
	// counts, and a serves nothing below its unexpired grant's 145.
	if got := g.activeLocked(start+hold+1, 150, alive); got != 145 {
		t.Fatalf("after b's and c's leases ran out: active %d, want a's floor 145", got)
	}
	// No lease may run at all: everything committed is active.
	if got := g.activeLocked(start+2*hold, 150, alive); got != 150 {
		t.Fatalf("with no lease running: active %d, want the commit index 150", got)
	}
	// A node catching up reports a low applied index, but serves nothing
	// until it applied its grant's commit index: once no predecessor's
	// lease can run, the grant's index is its floor.
	late := start + 2*hold
	g.record("a", late, 200, 300)
	g.record("d", late, 5, 290)
	if got := g.activeLocked(late, 310, alive); got != 290 {
		t.Fatalf("with a catching-up node granted at 290: active %d, want 290", got)
	}
	// In the term's first lease period its report alone counts: it may
	// still hold its predecessor's lease.
	g.since = late
	if got := g.activeLocked(late, 310, alive); got != 5 {
		t.Fatalf("in the term's first lease period: active %d, want the reported 5", got)
	}
	// A new term forgets the grants of the old one.
	g.begin(2)
	if len(g.last) != 0 || len(g.floor) != 0 || len(g.granted) != 0 {
		t.Fatal("a new term kept the previous term's grants")
	}
}

// BenchmarkLeaseValid is what every replica request pays for its lease
// check (twice for a read): a CLOCK_BOOTTIME read and an atomic load.
func BenchmarkLeaseValid(b *testing.B) {
	l := newNodeLease()
	l.extend(bootNow()+int64(time.Hour), monoNow()+int64(time.Hour))
	for b.Loop() {
		if !l.valid() {
			b.Fatal("lease ran out")
		}
	}
}

// BenchmarkLeaseValidMonotonic is the admission check.
func BenchmarkLeaseValidMonotonic(b *testing.B) {
	l := newNodeLease()
	l.extend(bootNow()+int64(time.Hour), monoNow()+int64(time.Hour))
	for b.Loop() {
		if !l.validMonotonic() {
			b.Fatal("lease ran out")
		}
	}
}

// BenchmarkMonotonicNow is the baseline: Go's monotonic clock (vDSO).
func BenchmarkMonotonicNow(b *testing.B) {
	start := time.Now()
	for b.Loop() {
		if time.Since(start) < 0 {
			b.Fatal("clock went back")
		}
	}
}
