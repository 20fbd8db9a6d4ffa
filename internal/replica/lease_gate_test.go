package replica

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/object"
	"github.com/herd-storage/herd/internal/store"
)

// leaseWait is how long a request without a lease, or a write in an epoch
// not active yet, waits (cluster's leaseWait).
const leaseWait = 2 * time.Second

// leases is the cluster as a replica sees it with a lease that can lapse
// (cluster/lease.go, on the clock of a testing/synctest bubble): the
// lease is valid until a time the test sets, WaitLease waits up to
// leaseWait for a renewal, and WaitActive waits up to leaseWait until the
// active index the test raises reaches the entry of the node's current
// epoch.
type leases struct {
	*epochs

	mu      sync.Mutex
	until   time.Time     // the lease is valid before it
	renewed chan struct{} // closed and replaced at every renewal
	entry   uint64        // the log index of the entry that began the current epoch
	active  uint64        // the active index the leader answered
	raised  chan struct{} // closed and replaced when active rises
	// What the replica asked for.
	leaseWaits, activeWaits int
}

func newLeases(epoch, entry uint64) *leases {
	return &leases{epochs: newEpochs(epoch), renewed: make(chan struct{}), raised: make(chan struct{}), entry: entry}
}

// renew makes the lease run for d from now.
func (l *leases) renew(d time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.until = time.Now().Add(d)
	close(l.renewed)
	l.renewed = make(chan struct{})
}

// lapse ends the lease now.
func (l *leases) lapse() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.until = time.Now()
}

// begin moves the node to epoch, which began at entry.
func (l *leases) begin(epoch, entry uint64) {
	l.mu.Lock()
	l.entry = entry
	l.mu.Unlock()
	l.set(epoch)
}

// activate raises the active index to index.
func (l *leases) activate(index uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.active = max(l.active, index)
	close(l.raised)
	l.raised = make(chan struct{})
}

func (l *leases) waits() (lease, active int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.leaseWaits, l.activeWaits
}

func (l *leases) LeaseValid() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return time.Now().Before(l.until)
}

func (l *leases) LeaseValidMonotonic() bool { return l.LeaseValid() }

func (l *leases) WaitLease(ctx context.Context) error {
	l.mu.Lock()
	l.leaseWaits++
	l.mu.Unlock()
	timer := time.NewTimer(leaseWait)
	defer timer.Stop()
	for {
		l.mu.Lock()
		valid, renewed := time.Now().Before(l.until), l.renewed
		l.mu.Unlock()
		if valid {
			return nil
		}
		select {
		case <-renewed:
		case <-timer.C:
			return fmt.Errorf("%w: this node holds no lease from the leader: no renewal answered in time", cluster.ErrNoQuorum)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (l *leases) WaitActive(ctx context.Context, epoch uint64) error {
	if epoch != l.Epoch() {
		return nil
	}
	l.mu.Lock()
	l.activeWaits++
	l.mu.Unlock()
	timer := time.NewTimer(leaseWait)
	defer timer.Stop()
	for {
		l.mu.Lock()
		active, entry, raised := l.active, l.entry, l.raised
		l.mu.Unlock()
		if active >= entry {
			return nil
		}
		select {
		case <-raised:
		case <-timer.C:
			return fmt.Errorf("%w: nodes that may still serve an earlier epoch have not reported epoch %d (entry %d) yet", cluster.ErrNoQuorum, epoch, entry)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// hookedStore counts the reads of the store and runs onRead after each.
type hookedStore struct {
	ObjectStore
	mu     sync.Mutex
	reads  int
	onRead func()
}

func (h *hookedStore) Read(oid object.OID, p []byte, offset uint32) (object.Epoch, error) {
	stamp, err := h.ObjectStore.Read(oid, p, offset)
	h.mu.Lock()
	h.reads++
	onRead := h.onRead
	h.mu.Unlock()
	if onRead != nil {
		onRead()
	}
	return stamp, err
}

func (h *hookedStore) readCount() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.reads
}

// newLeasedReplica is a replica on a fresh store over c, in a synctest
// bubble (the store is closed when the bubble's test ends).
func newLeasedReplica(t *testing.T, c *leases) (*Replica, *hookedStore, *store.Store) {
	t.Helper()
	s, err := store.Open(store.Options{Disks: []store.Disk{{Path: t.TempDir(), Weight: 1}}, ReserveBytes: -1, OpenFiles: 16})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	h := &hookedStore{ObjectStore: LocalStore{Store: s}}
	return New(c, h), h, s
}

const gateOID = 0x0000000100000003

// A read on a node without a lease waits for one (WaitLease): answered
// if a renewal comes within leaseWait, refused as unavailable, without
// reading the store, when none does.
func TestReadWithoutLeaseWaitsForOne(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newLeases(5, 40)
		c.activate(40)
		c.renew(leaseWait)
		r, h, _ := newLeasedReplica(t, c)
		ctx := context.Background()
		data := bytes.Repeat([]byte{0x5a}, 4096)
		if err := r.Write(ctx, 5, gateOID, data, 0, object.FlagCreate); err != nil {
			t.Fatal(err)
		}
		time.Sleep(leaseWait) // not renewed: the lease runs out

		buffer := make([]byte, 4096)
		start := time.Now()
		_, err := r.Read(ctx, 5, gateOID, buffer, 0)
		if !errors.Is(err, object.ErrUnavailable) {
			t.Fatalf("read without a lease: %v; want unavailable", err)
		}
		if waited := time.Since(start); waited != leaseWait {
			t.Errorf("read without a lease failed after %v; want it to wait %v for a renewal", waited, leaseWait)
		}
		if leaseWaits, _ := c.waits(); leaseWaits != 1 {
			t.Errorf("the read waited for a lease %d times; want 1", leaseWaits)
		}
		if n := h.readCount(); n != 0 {
			t.Errorf("the store was read %d times without a lease", n)
		}

		// A renewal that comes while the read waits lets it through.
		type answer struct {
			stamp object.Epoch
			err   error
		}
		done := make(chan answer, 1)
		go func() {
			stamp, err := r.Read(ctx, 5, gateOID, buffer, 0)
			done <- answer{stamp, err}
		}()
		time.Sleep(leaseWait / 2)
		synctest.Wait()
		select {
		case a := <-done:
			t.Fatalf("a read without a lease was answered at once: stamp %d, %v; want it to wait for a renewal", a.stamp, a.err)
		default:
		}
		c.renew(leaseWait)
		a := <-done
		if a.err != nil || a.stamp != 5 || !bytes.Equal(buffer, data) {
			t.Fatalf("read once the lease is renewed: stamp %d, %v, data right: %v; want stamp 5", a.stamp, a.err, bytes.Equal(buffer, data))
		}
	})
}

// A lease that runs out between the check that admitted a read and the
// store read (the node paused meanwhile: SIGSTOP, a frozen host) gives
// unavailable, not the data: the node may have been dropped from the
// epoch meanwhile and its copy overwritten elsewhere.
func TestLeaseLapsedDuringReadIsUnavailable(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newLeases(5, 40)
		c.activate(40)
		c.renew(leaseWait)
		r, h, _ := newLeasedReplica(t, c)
		ctx := context.Background()
		data := bytes.Repeat([]byte{0x5a}, 4096)
		if err := r.Write(ctx, 5, gateOID, data, 0, object.FlagCreate); err != nil {
			t.Fatal(err)
		}
		buffer := make([]byte, 4096)
		if _, err := r.Read(ctx, 5, gateOID, buffer, 0); err != nil {
			t.Fatalf("read under a valid lease: %v", err)
		}

		// Paused in the store read, past the lease's end.
		h.onRead = func() { time.Sleep(leaseWait) }
		if stamp, err := r.Read(ctx, 5, gateOID, buffer, 0); !errors.Is(err, object.ErrUnavailable) {
			t.Fatalf("read whose lease ran out while the store was read: stamp %d, %v; want unavailable", stamp, err)
		}
		c.renew(leaseWait)
		if _, err := r.Fetch(ctx, 5, gateOID, buffer); !errors.Is(err, object.ErrUnavailable) {
			t.Fatalf("fetch whose lease ran out while the store was read: %v; want unavailable", err)
		}

		// Lapsed in the store read, the epoch unchanged.
		c.renew(leaseWait)
		h.onRead = c.lapse
		if stamp, err := r.Read(ctx, 5, gateOID, buffer, 0); !errors.Is(err, object.ErrUnavailable) {
			t.Fatalf("read whose lease lapsed after the store read: stamp %d, %v; want unavailable", stamp, err)
		}
	})
}

// A write (or zero) in the node's current epoch waits in WaitActive until
// the active index reaches the epoch's entry (no node serves an earlier
// epoch any more), and fails as unavailable, the copy untouched, when it
// does not within leaseWait.
func TestWriteWaitsUntilEpochIsActive(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newLeases(5, 40)
		c.activate(40)
		c.renew(time.Hour)
		r, _, s := newLeasedReplica(t, c)
		ctx := context.Background()
		old := bytes.Repeat([]byte{0x11}, 4096)
		if err := r.Write(ctx, 5, gateOID, old, 0, object.FlagCreate); err != nil {
			t.Fatal(err)
		}
		untouched := func(what string) {
			t.Helper()
			buffer := make([]byte, 4096)
			if info, err := s.Read(gateOID, buffer, 0); err != nil || info.Epoch != 6 || !bytes.Equal(buffer, old) {
				t.Fatalf("%s: the copy is stamped %d (%v), data unchanged: %v; want stamp 6 and epoch 5's data", what, info.Epoch, err, bytes.Equal(buffer, old))
			}
		}

		// Epoch 6 begins at entry 50; a node that may serve epoch 5 has
		// not reported it yet.
		_, waitsBefore := c.waits()
		c.begin(6, 50)
		if err := s.SetEpoch(6, gateOID); err != nil { // recovery proved the copy current in epoch 6
			t.Fatal(err)
		}
		newer := bytes.Repeat([]byte{0x22}, 4096)
		start := time.Now()
		err := r.Write(ctx, 6, gateOID, newer, 0, 0)
		if !errors.Is(err, object.ErrUnavailable) {
			t.Fatalf("write in an epoch not active: %v; want unavailable", err)
		}
		if waited := time.Since(start); waited != leaseWait {
			t.Errorf("write in an epoch not active failed after %v; want it to wait %v", waited, leaseWait)
		}
		if err := r.Zero(ctx, 6, gateOID, 0, 4096, object.FlagNoHole); !errors.Is(err, object.ErrUnavailable) {
			t.Fatalf("zero in an epoch not active: %v; want unavailable", err)
		}
		untouched("after the refusals")

		// The active index rises, but not to the entry: still waiting.
		done := make(chan error, 1)
		go func() { done <- r.Write(ctx, 6, gateOID, newer, 0, 0) }()
		synctest.Wait()
		c.activate(49)
		time.Sleep(leaseWait / 2)
		synctest.Wait()
		select {
		case err := <-done:
			t.Fatalf("write in epoch 6 (entry 50) with the active index at 49 returned: %v; want it to wait", err)
		default:
		}
		untouched("while the write waits")
		c.activate(50)
		if err := <-done; err != nil {
			t.Fatalf("write once the epoch is active: %v", err)
		}
		buffer := make([]byte, 4096)
		if info, err := s.Read(gateOID, buffer, 0); err != nil || info.Epoch != 6 || !bytes.Equal(buffer, newer) {
			t.Fatalf("after the write: stamped %d (%v), data written: %v; want epoch 6's", info.Epoch, err, bytes.Equal(buffer, newer))
		}
		if _, activeWaits := c.waits(); activeWaits-waitsBefore != 3 {
			t.Errorf("changes in epoch 6 waited for the active index %d times; want 3", activeWaits-waitsBefore)
		}
	})
}
