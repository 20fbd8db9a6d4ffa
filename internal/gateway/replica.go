package gateway

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/herd-storage/herd/internal/cluster"
)

// ObjectStore is the local store as the replica side uses it.
type ObjectStore interface {
	List(fn func(oid, stamp uint64) error) error
	Read(oid uint64, p []byte, offset uint32) (stamp uint64, err error)
	Write(oid uint64, p []byte, offset uint32, epoch uint64, flags WriteFlags) error
	Zero(oid uint64, offset, length uint32, epoch uint64, flags WriteFlags) error
	Remove(oid uint64) error
	Stat(oid uint64) (stamp uint64, err error)
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
}

func (r *Replica) lock(oid uint64) *sync.RWMutex {
	return &r.locks[(oid^oid>>32)%uint64(len(r.locks))]
}

// Recover makes this node's copy of oid current: unless it was written in
// this epoch or is at least as new as newest (the newest stamp any node
// listed), fetch returns the whole object from the node holding the
// newest copy and it replaces this one. Under the object's exclusive
// lock, so no write to it on this node interleaves: a gateway write that
// came first stamped it with this epoch (skip), one that comes later is
// applied after the copy. Reports whether it copied.
func (r *Replica) Recover(oid, newest, epoch uint64, fetch func() ([]byte, error)) (bool, error) {
	l := r.lock(oid)
	l.Lock()
	defer l.Unlock()
	stamp, err := r.store.Stat(oid)
	switch {
	case err == nil && (stamp >= epoch || stamp >= newest):
		return false, nil
	case err != nil && !errors.Is(err, ErrNotFound):
		return false, err
	}
	data, err := fetch()
	if err != nil {
		return false, err
	}
	return true, r.store.Write(oid, data, 0, epoch, WriteFlags{Create: true})
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

// Stat returns the epoch stamp of this node's copy.
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
