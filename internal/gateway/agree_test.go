package gateway

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/object"
)

// heldWrite holds the writes of one object to one node until released,
// and counts the reads of that object from that node (agree.go).
type heldWrite struct {
	node    string
	oid     object.OID
	holding chan struct{} // closed once a write is held
	release chan struct{}
	reads   atomic.Int64
	once    sync.Once
}

func holdWrites(w *world, node string, oid object.OID) *heldWrite {
	h := &heldWrite{node: node, oid: oid, holding: make(chan struct{}), release: make(chan struct{})}
	w.replicas.before = func(op, n string, o object.OID, p []byte) {
		if n != h.node || o != h.oid {
			return
		}
		switch op {
		case "write":
			h.once.Do(func() { close(h.holding) })
			<-h.release
		case "read":
			h.reads.Add(1)
		}
	}
	return h
}

// TestReadOnlyReadsWaitForAgreement: a write in flight has reached two
// replicas of its object and not the third (held). A ro/ reader through
// a node holding the new data and one through the node lacking it must
// both wait: had the first returned the new data (its own copy) and the
// second the old (its own), a read that began after another ended would
// have returned older data, which no order of the operations explains.
// Both return the new data once the write lands everywhere. On the code
// before agree.go (one replica per read: the seeded bug
// one-replica-reads) the first returned the new data at once and the
// second the old.
func TestReadOnlyReadsWaitForAgreement(t *testing.T) {
	w := newWorld(t, 3, 3)
	w.cluster.addVDI("disk", 1, 2*objectSize)
	writer := open(t, w.gateway("node00"), "disk")
	ctx := context.Background()
	old := pattern(1, 4096)
	if err := writer.WriteAt(ctx, old, 0, false); err != nil {
		t.Fatal(err)
	}
	onNode01 := open(t, w.gateway("node01"), "ro/disk")
	onNode02 := open(t, w.gateway("node02"), "ro/disk")
	got := make([]byte, 4096)
	if err := onNode02.ReadAt(ctx, got, 0); err != nil || !bytes.Equal(got, old) {
		t.Fatalf("the ro/ read before the write: %v, same data %v", err, bytes.Equal(got, old))
	}

	oid := object.DataOID(1, 0)
	h := holdWrites(w, "node02", oid)
	newer := pattern(2, 4096)
	written := make(chan error, 1)
	go func() { written <- writer.WriteAt(ctx, newer, 0, false) }()
	<-h.holding // node02 does not hold the new data
	deadline := time.Now().Add(10 * time.Second)
	for !w.replicas.holds("node00", oid, newer) || !w.replicas.holds("node01", oid, newer) {
		if time.Now().After(deadline) {
			t.Fatal("node00 and node01 did not apply the write within 10 s")
		}
		time.Sleep(time.Millisecond)
	}

	type result struct {
		data []byte
		err  error
	}
	read := func(d *Disk) <-chan result {
		out := make(chan result, 1)
		go func() {
			p := make([]byte, 4096)
			err := d.ReadAt(ctx, p, 0)
			out <- result{p, err}
		}()
		return out
	}
	first := read(onNode01)
	// The reader reads node02's copy again and again while the copies
	// differ: wait for several rounds; it must not have returned.
	deadline = time.Now().Add(10 * time.Second)
	for h.reads.Load() < 5 {
		select {
		case r := <-first:
			t.Fatalf("a ro/ read returned while a write in flight had reached some replicas only (same as the new data: %v, err %v): a later read through another node could return the old", bytes.Equal(r.data, newer), r.err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the ro/ read did not read node02's copy again within 10 s (%d reads)", h.reads.Load())
		}
		time.Sleep(time.Millisecond)
	}
	second := read(onNode02)
	close(h.release)
	if err := <-written; err != nil {
		t.Fatal(err)
	}
	for i, ch := range []<-chan result{first, second} {
		r := <-ch
		if r.err != nil {
			t.Fatalf("ro/ read %d: %v", i+1, r.err)
		}
		if !bytes.Equal(r.data, newer) {
			t.Fatalf("ro/ read %d, ended after the write was acknowledged everywhere, returned other data than the write", i+1)
		}
	}
}

// TestReadOnlyReadOfDisagreeingReplicasFails: replicas that keep
// differing (a change the writer neither completes nor repairs) make a
// ro/ read fail after the retry budget with an error that names the
// object, not hang or return either copy.
func TestReadOnlyReadOfDisagreeingReplicasFails(t *testing.T) {
	w := newWorld(t, 3, 3)
	w.cluster.addVDI("disk", 1, 2*objectSize)
	writer := open(t, w.gateway("node00"), "disk")
	ctx := context.Background()
	if err := writer.WriteAt(ctx, pattern(1, 4096), 0, false); err != nil {
		t.Fatal(err)
	}
	oid := object.DataOID(1, 0)
	h := holdWrites(w, "node02", oid)
	defer close(h.release)
	go writer.WriteAt(ctx, pattern(2, 4096), 0, false)
	<-h.holding
	// The write lands on the two other replicas (it may still be on its
	// way to them when node02's is held).
	for deadline := time.Now().Add(10 * time.Second); !w.replicas.holds("node00", oid, pattern(2, 4096)) || !w.replicas.holds("node01", oid, pattern(2, 4096)); {
		if time.Now().After(deadline) {
			t.Fatal("the write never reached node00 and node01")
		}
		time.Sleep(time.Millisecond)
	}
	g := w.gatewayWith("node01", quiet(), Options{RetryTimeout: 300 * time.Millisecond})
	reader := open(t, g, "ro/disk")
	err := reader.ReadAt(ctx, make([]byte, 4096), 0)
	if !errors.Is(err, ErrReplicasDisagree) {
		t.Fatalf("a ro/ read of replicas that stay different: %v, want ErrReplicasDisagree", err)
	}
	t.Logf("as the client sees it: %v", err)
}

// holds says whether node's copy of oid begins with p.
func (m *memoryReplicas) holds(node string, oid object.OID, p []byte) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	data := m.objects[node][oid]
	return len(data) >= len(p) && bytes.Equal(data[:len(p)], p)
}

// TestReadBarrierWaitsForARoundStartedAfterIt: a ro/ read that arrives
// while a sync runs (begun before the read, so it may miss what was
// committed since) waits for the next one, and the reads that arrive
// meanwhile share it: two rounds for three reads.
func TestReadBarrierWaitsForARoundStartedAfterIt(t *testing.T) {
	var b readBarrier
	started := make(chan int64, 4)
	release := make(chan struct{})
	var rounds atomic.Int64
	sync := func(ctx context.Context) error {
		started <- rounds.Add(1)
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	wait := func() <-chan error {
		done := make(chan error, 1)
		go func() { done <- b.wait(context.Background(), context.Background(), time.Minute, sync) }()
		return done
	}
	first := wait()
	if n := <-started; n != 1 {
		t.Fatalf("round %d started first", n)
	}
	second, third := wait(), wait()
	// Both arrived while round 1 ran: give them time to join a round.
	deadline := time.Now().Add(10 * time.Second)
	for {
		b.mu.Lock()
		joined := b.next != nil && b.next.waiters == 2
		b.mu.Unlock()
		if joined {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the reads arriving during round 1 did not wait for a next round")
		}
		time.Sleep(time.Millisecond)
	}
	release <- struct{}{}
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if n := <-started; n != 2 {
		t.Fatalf("round %d started after round 1", n)
	}
	select {
	case <-second:
		t.Fatal("a read that arrived while round 1 ran returned with round 1")
	case <-third:
		t.Fatal("a read that arrived while round 1 ran returned with round 1")
	default:
	}
	release <- struct{}{}
	for _, done := range []<-chan error{second, third} {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	if n := rounds.Load(); n != 2 {
		t.Fatalf("%d rounds for three reads, want 2", n)
	}
}
