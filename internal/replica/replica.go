// Package replica is the server side of the object protocol: how a node
// admits and serves requests for the object copies it holds, its own
// gateway's and other nodes'.
//
// Invariants (each enforced here, or in the store where named):
//   - Admission: a request is served only in the epoch it names (a
//     replica behind waits briefly to catch up, one ahead answers
//     STALE_EPOCH), and only while this node holds a lease from the
//     leader (cluster/lease.go), so the minority side of a partition, or
//     a node resumed after a pause, never serves an epoch the cluster
//     left. A read is answered only if the lease still holds, in the same
//     epoch, once the copy was read; a write or zero in an epoch is
//     admitted only once no node serves an earlier epoch (the epoch is
//     active), so no read anywhere can miss an acknowledged change.
//   - Fencing: a copy is served (read, written, zeroed) only if it was
//     written or proven current in the current epoch; an older copy
//     answers NOT_RECOVERED until recovery (internal/recovery) proves it
//     current and restamps or replaces it, a newer one (stamped in an
//     epoch after the request's) answers STALE_EPOCH with its stamp, and
//     is not removed either: the requester is behind. A missing copy may
//     only be created by a write that says so (object.Flags.Create).
//   - Chunks of erasure-coded objects (object.IsChunk) are the exception:
//     one copy each, placed by their object's head and verified end to
//     end against its checksums by the gateway, never recovered. A chunk
//     is read, written, zeroed and removed whatever its older stamp (a
//     change stamps it with the request's epoch as usual), never sent
//     to recovery, and a missing one reads as object.ErrNotFound at once.
//     A chunk stamped after the request's epoch is still refused to
//     changes (STALE_EPOCH: the requester is behind, and the store
//     never lowers a stamp); reads serve it.
//   - Stamps never go back (the store refuses it) and a recovered copy is
//     installed whole (store.Replace): a node's answer about its copy is
//     always the truth about a complete copy, which the proof of
//     currency relies on.
//
// Lock order: a replica's per-object lock (shared by changes, exclusive
// for recovery: Exclusive) is taken before the store's per-object state;
// nothing here holds it while waiting for another node, except recovery,
// whose fetch from a proven source runs under it by design (no change to
// the object may interleave with installing the copy).
package replica

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/invariants"
	"github.com/herd-storage/herd/internal/object"
	"github.com/herd-storage/herd/internal/waitlock"
)

// ObjectStore is the local store as the replica side uses it.
type ObjectStore interface {
	List(fn func(oid object.OID, stamp object.Epoch) error) error
	Read(oid object.OID, p []byte, offset uint32) (stamp object.Epoch, err error)
	Write(epoch object.Epoch, oid object.OID, p []byte, offset uint32, flags object.Flags) error
	Zero(epoch object.Epoch, oid object.OID, offset, length uint32, flags object.Flags) error
	Remove(oid object.OID) error
	// Stat returns the copy's stamp and content digest (store.Info.Digest;
	// 0: unknown).
	Stat(oid object.OID) (stamp object.Epoch, digest uint64, err error)
	Epoch(oid object.OID) (stamp object.Epoch, err error) // Stat without the file size: cheap
	SetEpoch(epoch object.Epoch, oid object.OID) error
	// Replace installs a whole copy stamped epoch at once: until then the
	// previous copy (or none) is what the store holds, so a copy cut
	// short never exists and a stamp never goes back.
	Replace(epoch object.Epoch, oid object.OID, data []byte) error
	Flush() error
}

// EpochSource is what the replica side needs from the cluster.
type EpochSource interface {
	Epoch() uint64
	View() cluster.EpochView
	WaitEpoch(ctx context.Context, after uint64) (cluster.EpochView, error)
	// LeaseValid says whether this node holds a lease to serve data
	// (asked after every read, before it is answered).
	LeaseValid() bool
	// LeaseValidMonotonic is LeaseValid without a system call, blind to
	// a host's suspension (asked to admit every request).
	LeaseValidMonotonic() bool
	// WaitLease waits a bounded time for a lease, and says why there
	// is none when it gives up.
	WaitLease(ctx context.Context) error
	// WaitActive waits a bounded time until writes in epoch may be
	// admitted: no node serves an earlier epoch any more.
	WaitActive(ctx context.Context, epoch uint64) error
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
	locks [1024]waitlock.RWLock
}

func (r *Replica) lock(oid object.OID) *waitlock.RWLock {
	return &r.locks[uint64(oid^oid>>32)%uint64(len(r.locks))]
}

// Exclusive runs fn with the object's exclusive lock held and its copy's
// stamp (found false when this node has no copy): no write to the object
// on this node interleaves with a recovery of it. A damaged copy is
// removed first and reported as missing.
func (r *Replica) Exclusive(oid object.OID, fn func(stamp object.Epoch, found bool) error) error {
	l := r.lock(oid)
	l.Lock()
	defer l.Unlock()
	stamp, err := r.store.Epoch(oid)
	if errors.Is(err, object.ErrCorrupt) {
		// A copy that cannot be trusted is recovered like a missing one.
		if err := r.store.Remove(oid); err != nil && !errors.Is(err, object.ErrNotFound) {
			return err
		}
		err = fmt.Errorf("%w: removed a damaged copy", object.ErrNotFound)
	}
	if err != nil && !errors.Is(err, object.ErrNotFound) {
		return err
	}
	return fn(stamp, err == nil)
}

// fence admits a request to the object's copy only if the copy was
// written or recovered in epoch: a copy from an earlier epoch may have
// missed writes made while this node was not its replica (the paper's
// Fig. 4), so it is not served until recovery proves it current. A
// missing copy passes (object.ErrNotFound is the caller's to report).
//
// A copy stamped with a later epoch than the request's proves that the
// cluster reached that epoch, so the requester is behind, and so is this
// node, which admitted the request as from its own epoch (a node that
// restarted and is still replaying its log, say). The copy may hold
// writes that epoch placed; a write in the older epoch would have to
// lower its stamp, which the store refuses (a lie to the proof of
// currency), and a read would be served from an epoch the copy has left.
// So it is refused as from a stale epoch, naming the copy's stamp as the
// epoch to catch up to: the requester waits for a newer epoch and
// retries there, as after any STALE_EPOCH.
//
// A chunk of an erasure-coded object (object.IsChunk) passes whatever
// its older stamp: it has one copy, which recovery never restamps or
// fetches, and its bytes are checked against its object's head by the
// gateway, not proven current by stamps. A later stamp still refuses it
// (the change would lower the stamp).
func (r *Replica) fence(epoch object.Epoch, oid object.OID) error {
	stamp, err := r.store.Epoch(oid)
	if err != nil {
		return err
	}
	if stamp < epoch && !object.IsChunk(oid) {
		return fmt.Errorf("%w: object %016x on this node is from epoch %d, now %d", object.ErrNotRecovered, oid, stamp, epoch)
	}
	return behind(epoch, oid, stamp)
}

// behind refuses a request in epoch to a copy stamped in a later epoch
// (see fence) with a *object.StaleEpochError naming the stamp.
func behind(epoch object.Epoch, oid object.OID, stamp object.Epoch) error {
	if stamp > epoch {
		return fmt.Errorf("object %016x on this node is stamped with epoch %d, after the request's %d: %w", oid, stamp, epoch, &object.StaleEpochError{Current: stamp})
	}
	return nil
}

// Store is the node's object store, for recovery (under Exclusive).
func (r *Replica) Store() ObjectStore { return r.store }

// Served is this node's side of the object protocol: its replica, and
// RECOVER, which the node's recovery carries out. The replica is made
// first (recovery works through it); Served joins the two once both
// exist, and is what objproto.ObjectServer serves and replica.Client's
// LocalRecover calls.
type Served struct {
	*Replica
	// Recoverer makes this node's copy of oid current in epoch
	// (recovery.Recovery.RecoverObject).
	Recoverer func(ctx context.Context, epoch object.Epoch, oid object.OID) error
}

// Recover makes this node's copy of oid current in epoch, once the
// request's epoch is admitted. A chunk of an erasure-coded object has
// nothing to recover (its one copy is served whatever its stamp; only
// its writer gateway rewrites it): done at once.
func (s Served) Recover(ctx context.Context, epoch object.Epoch, oid object.OID) error {
	if err := s.Check(ctx, epoch); err != nil {
		return err
	}
	if object.IsChunk(oid) {
		return nil
	}
	return s.Recoverer(ctx, epoch, oid)
}

// List calls fn for every object copy on this node with its epoch stamp.
func (r *Replica) List(fn func(oid object.OID, stamp object.Epoch) error) error {
	return r.store.List(fn)
}

// New returns the replica side of this node.
func New(c EpochSource, store ObjectStore) *Replica {
	return &Replica{cluster: c, store: store, catchUp: 2 * time.Second}
}

// Check admits a request stamped with epoch.
func (r *Replica) Check(ctx context.Context, epoch object.Epoch) error {
	if !r.cluster.LeaseValidMonotonic() {
		if err := r.cluster.WaitLease(ctx); err != nil {
			return fmt.Errorf("%w: %v", object.ErrUnavailable, err)
		}
	}
	current := object.Epoch(r.cluster.Epoch())
	if epoch == current {
		return nil
	}
	if epoch > current {
		wait, cancel := context.WithTimeout(ctx, r.catchUp)
		defer cancel()
		view, _ := r.cluster.WaitEpoch(wait, uint64(epoch-1))
		if object.Epoch(view.Number) == epoch {
			return nil
		}
		current = object.Epoch(view.Number)
	}
	return &object.StaleEpochError{Current: current}
}

// stillServing says whether what was read in epoch may be answered: the
// lease still holds and the node still applies epoch. A node paused
// between its check and its read (SIGSTOP, a frozen host) may have been
// dropped from the epoch meanwhile, and its copy overwritten elsewhere.
func (r *Replica) stillServing(epoch object.Epoch) error {
	if !r.cluster.LeaseValid() {
		return fmt.Errorf("%w: this node's lease ran out while it read", object.ErrUnavailable)
	}
	if current := object.Epoch(r.cluster.Epoch()); current != epoch {
		return &object.StaleEpochError{Current: current}
	}
	return nil
}

// Read serves a read of this node's copy. A chunk of an erasure-coded
// object is read whatever its stamp (see fence), as Fetch reads; a
// missing one answers object.ErrNotFound.
func (r *Replica) Read(ctx context.Context, epoch object.Epoch, oid object.OID, p []byte, offset uint32) (object.Epoch, error) {
	if object.IsChunk(oid) {
		return r.readAny(ctx, epoch, oid, p, offset)
	}
	if err := r.Check(ctx, epoch); err != nil {
		return 0, err
	}
	if err := r.fence(epoch, oid); err != nil {
		return 0, err
	}
	stamp, err := r.store.Read(oid, p, offset)
	if err != nil {
		return stamp, err
	}
	if err := r.stillServing(epoch); err != nil {
		return stamp, err
	}
	if invariants.Enabled && stamp != epoch {
		// Fenced at epoch, still serving epoch: no change of another
		// epoch can have been admitted here meanwhile.
		invariants.Fail("replica: read of object %016x served in epoch %d from a copy stamped %d", oid, epoch, stamp)
	}
	return stamp, nil
}

// checkStamped asserts, in a build with the tag invariants, that a change
// served in epoch left the copy stamped at least epoch (a later change
// may have stamped it higher meanwhile, or a remove deleted it: changes
// share the object's lock).
func (r *Replica) checkStamped(op string, epoch object.Epoch, oid object.OID) {
	if !invariants.Enabled {
		return
	}
	if stamp, err := r.store.Epoch(oid); (err == nil && stamp < epoch) || (err != nil && !errors.Is(err, object.ErrNotFound)) {
		invariants.Fail("replica: %s of object %016x served in epoch %d left the copy stamped %d (%v)", op, oid, epoch, stamp, err)
	}
}

// Fetch reads the whole copy whatever its stamp: recovery reading a
// source it proved current, and checks.
func (r *Replica) Fetch(ctx context.Context, epoch object.Epoch, oid object.OID, p []byte) (object.Epoch, error) {
	return r.readAny(ctx, epoch, oid, p, 0)
}

// FetchAt reads part of the copy whatever its stamp (checks reading a
// damaged copy block by block).
func (r *Replica) FetchAt(ctx context.Context, epoch object.Epoch, oid object.OID, p []byte, offset uint32) (object.Epoch, error) {
	return r.readAny(ctx, epoch, oid, p, offset)
}

func (r *Replica) readAny(ctx context.Context, epoch object.Epoch, oid object.OID, p []byte, offset uint32) (object.Epoch, error) {
	if err := r.Check(ctx, epoch); err != nil {
		return 0, err
	}
	stamp, err := r.store.Read(oid, p, offset)
	if err != nil {
		return stamp, err
	}
	return stamp, r.stillServing(epoch)
}

// checkChange admits a change (write, zero) in epoch: Check, and the
// epoch is active.
func (r *Replica) checkChange(ctx context.Context, epoch object.Epoch) error {
	if err := r.Check(ctx, epoch); err != nil {
		return err
	}
	if err := r.cluster.WaitActive(ctx, uint64(epoch)); err != nil {
		return fmt.Errorf("%w: %v", object.ErrUnavailable, err)
	}
	return nil
}

// Write serves a write to this node's copy.
func (r *Replica) Write(ctx context.Context, epoch object.Epoch, oid object.OID, p []byte, offset uint32, flags object.Flags) error {
	if err := r.checkChange(ctx, epoch); err != nil {
		return err
	}
	l := r.lock(oid)
	l.RLock()
	defer l.RUnlock()
	if err := r.fence(epoch, oid); err != nil && !(flags.Has(object.FlagCreate) && errors.Is(err, object.ErrNotFound)) {
		return err
	}
	if err := r.store.Write(epoch, oid, p, offset, flags); err != nil {
		return err
	}
	r.checkStamped("write", epoch, oid)
	return nil
}

// Zero serves TRIM and WRITE_ZEROES.
func (r *Replica) Zero(ctx context.Context, epoch object.Epoch, oid object.OID, offset, length uint32, flags object.Flags) error {
	if err := r.checkChange(ctx, epoch); err != nil {
		return err
	}
	l := r.lock(oid)
	l.RLock()
	defer l.RUnlock()
	if err := r.fence(epoch, oid); err != nil && !(flags.Has(object.FlagCreate) && errors.Is(err, object.ErrNotFound)) {
		return err
	}
	if err := r.store.Zero(epoch, oid, offset, length, flags); err != nil {
		return err
	}
	r.checkStamped("zero", epoch, oid)
	return nil
}

// Remove deletes this node's copy.
func (r *Replica) Remove(ctx context.Context, epoch object.Epoch, oid object.OID) error {
	if err := r.Check(ctx, epoch); err != nil {
		return err
	}
	l := r.lock(oid)
	l.RLock()
	defer l.RUnlock()
	// A copy any older, or damaged, may go; a newer one is fenced.
	if stamp, err := r.store.Epoch(oid); err == nil {
		if err := behind(epoch, oid, stamp); err != nil {
			return err
		}
	}
	return r.store.Remove(oid)
}

// Stat returns the epoch stamp of this node's copy, proven current or
// not, and its content digest (0: unknown).
func (r *Replica) Stat(ctx context.Context, epoch object.Epoch, oid object.OID) (stamp object.Epoch, digest uint64, err error) {
	if err := r.Check(ctx, epoch); err != nil {
		return 0, 0, err
	}
	stamp, digest, err = r.store.Stat(oid)
	if err != nil {
		return stamp, 0, err
	}
	return stamp, digest, r.stillServing(epoch)
}

// Flush makes every write this node acknowledged durable.
func (r *Replica) Flush(ctx context.Context, epoch object.Epoch) error {
	if err := r.Check(ctx, epoch); err != nil {
		return err
	}
	return r.store.Flush()
}
