package gateway

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/store"
)

// ObjectStore is the local store as the replica side uses it.
type ObjectStore interface {
	List(fn func(oid, stamp uint64) error) error
	Read(oid uint64, p []byte, offset uint32) (stamp uint64, err error)
	Write(oid uint64, p []byte, offset uint32, epoch uint64, flags WriteFlags) error
	Zero(oid uint64, offset, length uint32, epoch uint64, flags WriteFlags) error
	Remove(oid uint64) error
	Stat(oid uint64) (stamp uint64, err error)
	Epoch(oid uint64) (stamp uint64, err error) // Stat without the file size: cheap
	SetEpoch(oid, epoch uint64) error
	Flush() error
}

// EpochSource is what the replica side needs from the cluster.
type EpochSource interface {
	Epoch() uint64
	View() cluster.EpochView
	WaitEpoch(ctx context.Context, after uint64) (cluster.EpochView, error)
	QuorumStatus() (ok bool, detail string)
}

// Replica serves this node's copies to gateways, its own and other
// nodes'. Every request carries the sender's epoch; a request from
// another epoch is refused (DESIGN.md: "A replica rejects a request from
// another epoch"), and a node without quorum serves nothing, so the
// minority side of a partition cannot diverge from the majority.
type Replica struct {
	cluster EpochSource
	store   ObjectStore
	// catchUp bounds how long a replica that is behind the sender waits
	// for its own log to reach the sender's epoch.
	catchUp time.Duration
	// locks make "create this object unless it exists" (recovery's pull)
	// atomic against every other change to the object on this node:
	// changes hold the object's lock shared, a pull exclusively. Striped
	// by object id.
	locks [1024]sync.RWMutex
	// recoverer serves RECOVER requests.
	recoverer atomic.Pointer[func(ctx context.Context, epoch, oid uint64) error]
}

func (r *Replica) lock(oid uint64) *sync.RWMutex {
	return &r.locks[(oid^oid>>32)%uint64(len(r.locks))]
}

// exclusive runs fn with the object's exclusive lock held and its copy's
// stamp (found false when this node has no copy): no write to the object
// on this node interleaves with a recovery of it.
func (r *Replica) exclusive(oid uint64, fn func(stamp uint64, found bool) error) error {
	l := r.lock(oid)
	l.Lock()
	defer l.Unlock()
	stamp, err := r.store.Epoch(oid)
	if errors.Is(err, store.ErrCorrupt) {
		// A copy that cannot be trusted is recovered like a missing one.
		if err := r.store.Remove(oid); err != nil && !errors.Is(err, ErrNotFound) {
			return err
		}
		err = fmt.Errorf("%w: removed a damaged copy", ErrNotFound)
	}
	if err != nil && !errors.Is(err, ErrNotFound) {
		return err
	}
	return fn(stamp, err == nil)
}

// fence admits a request to the object's copy only if the copy was
// written or recovered in epoch: a copy from an earlier epoch may have
// missed writes made while this node was not its replica (the paper's
// Fig. 4), so it is not served until recovery proves it current. A
// missing copy passes (ErrNotFound is the caller's to report).
func (r *Replica) fence(oid, epoch uint64) error {
	stamp, err := r.store.Epoch(oid)
	if err != nil {
		return err
	}
	if stamp < epoch {
		return fmt.Errorf("%w: object %016x on this node is from epoch %d, now %d", ErrNotRecovered, oid, stamp, epoch)
	}
	return nil
}

// SetRecoverer installs what serves RECOVER (the node's Recovery).
func (r *Replica) SetRecoverer(fn func(ctx context.Context, epoch, oid uint64) error) {
	r.recoverer.Store(&fn)
}

// Recover makes this node's copy of oid current in epoch (see
// Recovery.RecoverObject).
func (r *Replica) Recover(ctx context.Context, epoch, oid uint64) error {
	if err := r.Check(ctx, epoch); err != nil {
		return err
	}
	fn := r.recoverer.Load()
	if fn == nil {
		return fmt.Errorf("%w: recovery is not running on this node yet", ErrUnavailable)
	}
	return (*fn)(ctx, epoch, oid)
}

// List calls fn for every object copy on this node with its epoch stamp.
func (r *Replica) List(fn func(oid, stamp uint64) error) error { return r.store.List(fn) }

// NewReplica returns the replica side of this node.
func NewReplica(c EpochSource, store ObjectStore) *Replica {
	return &Replica{cluster: c, store: store, catchUp: 2 * time.Second}
}

// Check admits a request stamped with epoch.
func (r *Replica) Check(ctx context.Context, epoch uint64) error {
	if ok, detail := r.cluster.QuorumStatus(); !ok {
		return fmt.Errorf("%w: this node has no quorum (%s)", ErrUnavailable, detail)
	}
	current := r.cluster.Epoch()
	if epoch == current {
		return nil
	}
	if epoch > current {
		wait, cancel := context.WithTimeout(ctx, r.catchUp)
		defer cancel()
		view, _ := r.cluster.WaitEpoch(wait, epoch-1)
		if view.Number == epoch {
			return nil
		}
		current = view.Number
	}
	return &StaleEpochError{Current: current}
}

// Read serves a read of this node's copy.
func (r *Replica) Read(ctx context.Context, epoch, oid uint64, p []byte, offset uint32) (uint64, error) {
	if err := r.Check(ctx, epoch); err != nil {
		return 0, err
	}
	if err := r.fence(oid, epoch); err != nil {
		return 0, err
	}
	return r.store.Read(oid, p, offset)
}

// Fetch reads the whole copy whatever its stamp: recovery reading a
// source it proved current, and checks.
func (r *Replica) Fetch(ctx context.Context, epoch, oid uint64, p []byte) (uint64, error) {
	return r.readAny(ctx, epoch, oid, p, 0)
}

func (r *Replica) readAny(ctx context.Context, epoch, oid uint64, p []byte, offset uint32) (uint64, error) {
	if err := r.Check(ctx, epoch); err != nil {
		return 0, err
	}
	return r.store.Read(oid, p, offset)
}

// Write serves a write to this node's copy.
func (r *Replica) Write(ctx context.Context, epoch, oid uint64, p []byte, offset uint32, flags WriteFlags) error {
	if err := r.Check(ctx, epoch); err != nil {
		return err
	}
	l := r.lock(oid)
	l.RLock()
	defer l.RUnlock()
	if err := r.fence(oid, epoch); err != nil && !(flags.Create && errors.Is(err, ErrNotFound)) {
		return err
	}
	return r.store.Write(oid, p, offset, epoch, flags)
}

// Zero serves TRIM and WRITE_ZEROES.
func (r *Replica) Zero(ctx context.Context, epoch, oid uint64, offset, length uint32, flags WriteFlags) error {
	if err := r.Check(ctx, epoch); err != nil {
		return err
	}
	l := r.lock(oid)
	l.RLock()
	defer l.RUnlock()
	if err := r.fence(oid, epoch); err != nil && !(flags.Create && errors.Is(err, ErrNotFound)) {
		return err
	}
	return r.store.Zero(oid, offset, length, epoch, flags)
}

// Remove deletes this node's copy.
func (r *Replica) Remove(ctx context.Context, epoch, oid uint64) error {
	if err := r.Check(ctx, epoch); err != nil {
		return err
	}
	l := r.lock(oid)
	l.RLock()
	defer l.RUnlock()
	return r.store.Remove(oid)
}

// Stat returns the epoch stamp of this node's copy, proven current or not.
func (r *Replica) Stat(ctx context.Context, epoch, oid uint64) (uint64, error) {
	if err := r.Check(ctx, epoch); err != nil {
		return 0, err
	}
	return r.store.Stat(oid)
}

// Flush makes every write this node acknowledged durable.
func (r *Replica) Flush(ctx context.Context, epoch uint64) error {
	if err := r.Check(ctx, epoch); err != nil {
		return err
	}
	return r.store.Flush()
}
