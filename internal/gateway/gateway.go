// Package gateway is the client side of the data path: it turns block
// requests on a VDI into object requests on every replica (DESIGN.md
// "Gateway and replication"). Each node's gateway serves the VDIs opened
// through it (Open returns a Disk): a request is split into object
// pieces, each piece goes to all replicas of its object in parallel,
// stamped with the current epoch, and the request is acknowledged only
// when every replica acknowledged. Reads go to one replica, the local one
// when there is one, with failover.
//
// Invariants:
//   - A write is acknowledged only when every replica of one epoch applied
//     it; a replica in another epoch, or unreachable, makes the gateway
//     wait for the next epoch and retry on its layout, so no write is lost
//     or wrongly acknowledged across an epoch change.
//     (A VDI set to --ack zone is the exception, until the next FLUSH: a
//     write without FUA is acknowledged once the replicas in this node's
//     zone applied it, the others before any FLUSH after it completes;
//     lag.go says what that gives up.)
//   - A replica serves only copies written or proven current in the
//     current epoch (internal/replica); when it refuses one (not
//     recovered, missing), the gateway asks it to recover the object
//     (RECOVER, internal/recovery) before going on, and never reads an
//     older copy instead. An object whose newest copies may be on nodes
//     that are down fails (object.ErrNoCopy), never reads old.
//   - The first write to an object writes its data on every replica, then
//     its map entry: a crash between leaves an unreferenced object, never
//     an entry without data.
//   - A FLUSH reaches every node written since the last FLUSH, and is
//     acknowledged only when all of them synced.
//
// Lock order (outermost first): vdiState.openMu (open/close of the VDI's
// writer lock) > vdiState.io (shared by requests, exclusive by a
// snapshot) > a request slot (admission, fair.go; QoS waits come
// before io, qos.go) > admission.zeroPieces (a TRIM/WRITE_ZEROES
// piece's slot) > vdiState.allocation[i] (first write / copy-on-write
// of object i) > admission.copyBytes (a copy's buffer) > zoneLag.bytes
// (a write acknowledged in this zone, until its far part lands; lag.go)
// > ecObject.lock (an erasure-coded object's writes, folds and view; ec.go)
// > Gateway.objectLocks[oid] (shared by changes, exclusive while a
// replica recovers oid or the healer repairs it) > vdiState.mu,
// Gateway.mu > admission.mu, Gateway.dirtyMu, zoneLag.mu >
// healer.suspectMu (short, never held across I/O). Nothing
// serialises requests a client sent concurrently, except the first write
// to an object; what one request may spend is bounded (bounds.go).
package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/layout"
	"github.com/herd-storage/herd/internal/object"
	"github.com/herd-storage/herd/internal/waitlock"
)

// Cluster is what the gateway needs from the cluster log.
type Cluster interface {
	ID() string
	Epoch() uint64
	View() cluster.EpochView
	WaitEpoch(ctx context.Context, after uint64) (cluster.EpochView, error)
	Lock(key string) (cluster.Lock, bool)
	WaitLock(ctx context.Context, key string, done func(l cluster.Lock, held bool) bool) (cluster.Lock, bool, error)
	WantLock(ctx context.Context, key, session string) (cluster.LockWant, error)
	HandOverLock(ctx context.Context, key, session string, to cluster.LockOwner) error
	Node(id string) (cluster.Node, bool)
	VDI(name string) (cluster.VDI, error)
	WaitVDI(ctx context.Context, name string, done func(v cluster.VDI, err error) bool) (cluster.VDI, error)
	LookupVDI(ctx context.Context, name string) (cluster.VDI, error)
	Tree() []cluster.VDI
	Chain(id uint32) []uint32
	SnapshotVDI(ctx context.Context, name, tag, holder string) (cluster.SnapshotResult, error)
	AcquireLock(ctx context.Context, key, session string) (cluster.Lock, error)
	ReleaseLock(ctx context.Context, key, session string) error
	MarkVDIUnclean(ctx context.Context, name string) error
}

// Replicas reaches object copies on nodes (replica.Client: the local
// replica directly, others through the peer protocol). Implementations
// are safe for concurrent use and report conditions with internal/object's
// errors.
type Replicas interface {
	Read(ctx context.Context, node cluster.Node, epoch object.Epoch, oid object.OID, p []byte, offset uint32) (stamp object.Epoch, err error)
	Write(ctx context.Context, node cluster.Node, epoch object.Epoch, oid object.OID, p []byte, offset uint32, flags object.Flags) error
	Zero(ctx context.Context, node cluster.Node, epoch object.Epoch, oid object.OID, offset, length uint32, flags object.Flags) error
	Remove(ctx context.Context, node cluster.Node, epoch object.Epoch, oid object.OID) error
	Flush(ctx context.Context, node cluster.Node, epoch object.Epoch) error
	// Recover has node make its copy of oid current in epoch:
	// object.ErrNoCopy if no reachable copy is provably current,
	// object.ErrNotFound if no reachable node holds the object.
	Recover(ctx context.Context, node cluster.Node, epoch object.Epoch, oid object.OID) error
}

// Starter is what Replicas may also do: send a write or a flush to another
// node and return what waits for its answer (the error Write or Flush
// would return), or return nil for a node it cannot start that way (this
// one). With it, one goroutine has a write or a FLUSH on its way to every
// node at once, instead of a goroutine per node.
type Starter interface {
	StartWrite(ctx context.Context, node cluster.Node, epoch object.Epoch, oid object.OID, p *object.Payload, offset uint32, flags object.Flags) func() error
	StartFlush(ctx context.Context, node cluster.Node, epoch object.Epoch) func() error
}

// replicaOp is a change to one replica of an object. run applies it and
// returns its error. start, if set, sends it and returns what waits for
// its answer and returns the same error run would, or returns nil if the
// change cannot be started on that node (run is used instead).
type replicaOp struct {
	run   func(ctx context.Context, node cluster.Node, rv *layout.Epoch) error
	start func(ctx context.Context, node cluster.Node, rv *layout.Epoch) func() error
	// change is what the change does to its object's bytes, which a
	// repair re-applies if it fails (suspect.go); nil when not known.
	change *failedChange
}

// then returns op with after applied to the error of every run and of
// every started change's answer.
func (op replicaOp) then(after func(ctx context.Context, node cluster.Node, rv *layout.Epoch, err error) error) replicaOp {
	run := op.run
	wrapped := replicaOp{run: func(ctx context.Context, node cluster.Node, rv *layout.Epoch) error {
		return after(ctx, node, rv, run(ctx, node, rv))
	}, change: op.change}
	if start := op.start; start != nil {
		wrapped.start = func(ctx context.Context, node cluster.Node, rv *layout.Epoch) func() error {
			wait := start(ctx, node, rv)
			if wait == nil {
				return nil
			}
			return func() error { return after(ctx, node, rv, wait()) }
		}
	}
	return wrapped
}

// Options tune the gateway.
type Options struct {
	// RetryTimeout bounds how long one request waits for the cluster
	// (epoch changes, unreachable replicas) before it fails with EIO.
	RetryTimeout time.Duration
	// PiecesPerRequest bounds the object pieces of one request handled
	// at once (0: DefaultPiecesPerRequest). See bounds.go.
	PiecesPerRequest int
	// ZeroPieces bounds the TRIM and WRITE_ZEROES pieces in flight on
	// this node, over every request (0: DefaultZeroPieces).
	ZeroPieces int
	// CopyBytes bounds the bytes of copy-on-write buffers in use on this
	// node (0: DefaultCopyBytes). A copy of an object larger than the
	// whole bound runs alone.
	CopyBytes int64
	// FairSlots bounds the requests doing replica I/O on this node at
	// once; beyond it requests queue per VDI and are served in turn
	// (fair.go). 0: DefaultFairSlots; negative: no bound.
	FairSlots int
	// LagBytes bounds the bytes of writes acknowledged in this node's
	// zone and not yet in the other zones (lag.go; 0: DefaultLagBytes).
	LagBytes int64
	// Repair makes an unclean VDI's replicas identical before its next
	// writer serves it (its previous writer's node died): the node's
	// maintenance.RepairUnclean, reading the VDI through g, the gateway
	// that asks. Nil: such a VDI cannot be opened for writing here.
	Repair Repair
	// Pace, if set, paces the bytes a rebuild of erasure-coded objects
	// reads (a refold after their chunks' homes left the epoch or moved,
	// ec.go): the node's recovery rate (recovery.Recovery.Pace).
	Pace func(ctx context.Context, n uint64) error
}

// Repair is Options.Repair.
type Repair func(ctx context.Context, g *Gateway, vdi cluster.VDI) error

// Gateway serves the VDIs opened through this node.
type Gateway struct {
	cluster  Cluster
	layouts  *layout.History
	replicas Replicas
	starter  Starter // replicas, if it can start writes and flushes; else nil
	logger   *slog.Logger
	options  Options
	session  string // this gateway's lock session

	// writer takes, watches, hands over and fences the VDIs' writer
	// locks (handover.go).
	writer *writerLock

	// readSync batches the log syncs of ro/ reads of live VDIs (agree.go).
	readSync readBarrier

	// layers answers for chains' layers and diffs, and runs the merge
	// and flatten jobs (layers.go, merge.go).
	layers *layers

	mu   sync.Mutex // guards open
	open map[string]*vdiState
	// admit paces and admits requests: QoS limits (qos.go), fair sharing
	// of the request slots (fair.go), the node's bounds (bounds.go).
	admit *admission

	// ctx ends the gateway's own goroutines (the lock watchers); Close
	// cancels it.
	ctx    context.Context
	cancel context.CancelFunc

	// heal repairs suspect objects (a change to them failed, perhaps
	// after reaching some replicas; suspect.go), blocks that fail their
	// checksum (checksum.go) and damaged copies.
	heal *healer

	dirtyMu sync.Mutex      // guards dirty
	dirty   map[string]bool // nodes written through this gateway since its last flush

	// lag tracks the writes acknowledged in this zone whose other zones'
	// replicas are still to get them, and lands them (lag.go).
	lag *zoneLag

	// ec is the state of erasure-coded objects this gateway writes (ec.go).
	ec ecState

	// objectLocks order a whole-object copy to a replica that lacks the
	// object against writes to it: writes hold their object's lock
	// shared, a copy exclusively. A VDI has one writer gateway, so this
	// orders every write to its objects (striped by object id).
	objectLocks [1024]waitlock.RWLock
}

// New returns a gateway.
func New(c Cluster, layouts *layout.History, replicas Replicas, logger *slog.Logger, options Options) *Gateway {
	if options.RetryTimeout == 0 {
		options.RetryTimeout = 30 * time.Second
	}
	if options.PiecesPerRequest <= 0 {
		options.PiecesPerRequest = DefaultPiecesPerRequest
	}
	if options.ZeroPieces <= 0 {
		options.ZeroPieces = DefaultZeroPieces
	}
	if options.CopyBytes <= 0 {
		options.CopyBytes = DefaultCopyBytes
	}
	if options.LagBytes <= 0 {
		options.LagBytes = DefaultLagBytes
	}
	switch {
	case options.FairSlots == 0:
		options.FairSlots = DefaultFairSlots
	case options.FairSlots < 0:
		options.FairSlots = math.MaxInt
	}
	ctx, cancel := context.WithCancel(context.Background())
	starter, _ := replicas.(Starter)
	g := &Gateway{cluster: c, layouts: layouts, replicas: replicas, starter: starter, logger: logger, options: options, session: "gateway", open: map[string]*vdiState{}, dirty: map[string]bool{}, ctx: ctx, cancel: cancel,
		admit: newAdmission(c, logger, ctx, options),
	}
	g.heal = &healer{cluster: c, layouts: layouts, replicas: replicas, logger: logger, path: g}
	g.writer = &writerLock{cluster: c, session: g.session, timeout: options.RetryTimeout, logger: logger, ctx: ctx, path: g, heal: g.heal}
	if options.Repair != nil {
		g.writer.repair = func(ctx context.Context, vdi cluster.VDI) error { return options.Repair(ctx, g, vdi) }
	}
	g.layers = &layers{cluster: c, logger: logger, path: g, writer: g.writer}
	g.lag = newZoneLag(options.LagBytes, c, layouts, logger, ctx, g, g.writer, g.heal)
	g.heal.lag = g.lag
	return g
}

// StartFolder starts the background work of erasure-coded VDIs (ec.go):
// folding idle overlays, and after each epoch change rebuilding the
// objects whose chunks are not where the epoch places them, including
// those of VDIs nobody has open, of which this node is the steward. A
// node's server starts it; without it, it starts with the first
// erasure-coded object this gateway writes, and ends with Close.
func (g *Gateway) StartFolder() {
	g.ec.mu.Lock()
	defer g.ec.mu.Unlock()
	if !g.ec.folder {
		g.ec.folder = true
		go g.ecFolder()
	}
}

// Close stops the gateway's background goroutines (its lock watchers:
// it hands no lock over afterwards). The process is ending.
func (g *Gateway) Close() { g.cancel() }

// retryBudget is how long one request may wait for the cluster: until
// Options.RetryTimeout has passed without a new epoch. A cluster that is
// visibly reconfiguring (a node dropped, another back, the placement
// moved) is making progress, so every new epoch gives the request the
// whole timeout again, up to maxRetryFactor times it in all: a run of
// faults that each clear in time (a pause, then a partition, then a
// kill) does not fail a request that a still cluster would have served.
// A VM's disk request that fails is an I/O error in the guest, often a
// file system remounted read-only; one that waits is only slow.
type retryBudget struct {
	started, deadline time.Time
	epoch             object.Epoch
}

// maxRetryFactor caps a request's whole wait at this many RetryTimeouts.
const maxRetryFactor = 4

func (g *Gateway) newBudget() *retryBudget {
	now := time.Now()
	return &retryBudget{started: now, deadline: now.Add(g.options.RetryTimeout), epoch: object.Epoch(g.cluster.Epoch())}
}

// expired reports whether the wait is over, given the current epoch.
func (g *Gateway) expired(b *retryBudget, epoch object.Epoch) bool {
	now := time.Now()
	if epoch > b.epoch {
		b.epoch = epoch
		limit := b.started.Add(maxRetryFactor * g.options.RetryTimeout)
		b.deadline = now.Add(g.options.RetryTimeout)
		if b.deadline.After(limit) {
			b.deadline = limit
		}
	}
	return now.After(b.deadline)
}

// waitNextEpoch waits for an epoch after epoch, or at most a second:
// some conditions clear without a new epoch (a leader election, a peer
// connection re-established). It fails only once the budget is spent.
func (g *Gateway) waitNextEpoch(ctx context.Context, epoch object.Epoch, budget *retryBudget, why error) error {
	if g.expired(budget, object.Epoch(g.cluster.Epoch())) {
		return fmt.Errorf("%w after %v (epoch %d, %v without a new one): %v", ErrTimeout, time.Since(budget.started).Round(time.Second), epoch, g.options.RetryTimeout, why)
	}
	until := time.Now().Add(time.Second)
	if budget.deadline.Before(until) {
		until = budget.deadline
	}
	wait, cancel := context.WithDeadline(ctx, until)
	defer cancel()
	g.cluster.WaitEpoch(wait, uint64(epoch))
	return ctx.Err()
}

// Bounds on one round of requests to replicas. A paused or partitioned
// node keeps its connections open and never answers; the epoch change
// that drops it cancels the round (see scoped), these only cap the wait
// when no epoch change comes.
const (
	roundTimeout = 30 * time.Second
	readTimeout  = 5 * time.Second // then fail over to the next replica
)

// unanswered turns the error of a request cut short by its round's scope
// (not by the caller) into "replica unavailable", which is retried.
func unanswered(ctx, scope context.Context, err error) error {
	if err != nil && ctx.Err() == nil && scope.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
		return fmt.Errorf("%w: no answer (%v)", object.ErrUnavailable, err)
	}
	return err
}

// replicate runs op on every replica of oid in parallel, retrying on the
// new placement when the epoch changes or a replica is unreachable, and
// returns nil only when every replica of one epoch succeeded.
func (g *Gateway) replicate(ctx context.Context, oid object.OID, copies int, op func(ctx context.Context, node cluster.Node, rv *layout.Epoch) error) error {
	return g.replicateOn(ctx, oid, copies, nil, replicaOp{run: op})
}

// pickFunc chooses, in each round, which of an object's replicas a
// change goes to (lag.go); nil: all of them.
type pickFunc func(rv *layout.Epoch, targets []cluster.Node) []cluster.Node

// replicateOn is replicate on the replicas pick chooses.
//
// The changes op can start are sent first, from this goroutine; then the
// others run, each but the last in a goroutine of its own; then the
// started ones are waited for.
func (g *Gateway) replicateOn(ctx context.Context, oid object.OID, copies int, pick pickFunc, op replicaOp) error {
	budget := g.newBudget()
	for attempt := 0; ; attempt++ {
		// Every attempt, the first too: a node that lost the writer lock
		// while it was away (paused or cut off long enough to leave the
		// cluster, so the lock went with it and another node took it: a
		// merge's open on the leader) still has the lock in its open
		// state when it returns; the log it has applied to write in the
		// current epoch says the lock is another's.
		if err := g.writer.checkFence(ctx); err != nil {
			return err
		}
		rv, err := g.layouts.Current()
		if err != nil {
			return err
		}
		targets := rv.ReplicasOf(oid, copies)
		if pick != nil {
			targets = pick(rv, targets)
		}
		errs := make([]error, len(targets))
		// Marked before the operation is acknowledged, so that a FLUSH
		// that follows the acknowledgement includes these nodes.
		g.markDirty(targets)
		scope, cancel := layout.Scoped(ctx, g.cluster, rv.Number, roundTimeout)
		var waits []func() error
		last := len(targets) - 1 // the last change run rather than started
		if op.start != nil {
			waits = make([]func() error, len(targets))
			last = -1
			for i, node := range targets {
				if waits[i] = op.start(scope, node, rv); waits[i] == nil {
					last = i
				}
			}
		}
		var wg sync.WaitGroup
		for i, node := range targets {
			if waits != nil && waits[i] != nil {
				continue
			}
			if i == last {
				errs[i] = unanswered(ctx, scope, op.run(scope, node, rv))
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[i] = unanswered(ctx, scope, op.run(scope, node, rv))
			}()
		}
		for i, wait := range waits {
			if wait != nil {
				errs[i] = unanswered(ctx, scope, wait())
			}
		}
		wg.Wait()
		cancel()
		var retry, hard error
		for i, err := range errs {
			if err == nil {
				continue
			}
			err = &object.ReplicaError{Node: targets[i].ID, OID: oid, Err: err}
			if object.Retryable(err) {
				retry = err
			} else if hard == nil {
				hard = err
			}
		}
		if hard != nil {
			return hard
		}
		if retry == nil {
			return nil
		}
		g.logger.Debug("gateway: retrying on the next epoch", "object", fmt.Sprintf("%016x", oid), "epoch", rv.Number, "err", retry)
		if err := g.waitNextEpoch(ctx, rv.Number, budget, retry); err != nil {
			return err
		}
	}
}

// write writes a piece to every replica.
func (g *Gateway) write(ctx context.Context, oid object.OID, copies int, p []byte, offset uint32, flags object.Flags) error {
	return g.mutateOp(ctx, oid, copies, g.writeOp(oid, copies, p, offset, flags))
}

// writeOn writes a piece to the replicas pick chooses (lag.go).
func (g *Gateway) writeOn(ctx context.Context, oid object.OID, copies int, p []byte, offset uint32, flags object.Flags, pick pickFunc) error {
	return g.mutateOn(ctx, oid, copies, pick, g.writeOp(oid, copies, p, offset, flags))
}

// writeOp writes a piece to one replica, started (sent without waiting)
// where the replicas allow it.
func (g *Gateway) writeOp(oid object.OID, copies int, p []byte, offset uint32, flags object.Flags) replicaOp {
	op := replicaOp{run: func(ctx context.Context, node cluster.Node, rv *layout.Epoch) error {
		return g.writeTo(ctx, node, rv, oid, copies, p, offset, flags)
	}, change: &failedChange{offset: offset, data: p, fresh: flags.Has(object.FlagCreate | object.FlagFresh)}}
	if g.starter == nil {
		return op
	}
	payload := &object.Payload{Data: p} // its checksum computed once for every node
	op.start = func(ctx context.Context, node cluster.Node, rv *layout.Epoch) func() error {
		wait := g.starter.StartWrite(ctx, node, rv.Number, oid, payload, offset, flags)
		if wait == nil {
			return nil
		}
		return func() error {
			// As writeTo, with the first attempt already sent.
			sent := true
			err := g.heal.changeHealing(ctx, node, rv, oid, copies, offset, len(p), func() error {
				if sent {
					sent = false
					return wait()
				}
				return g.replicas.Write(ctx, node, rv.Number, oid, p, offset, flags)
			})
			return writeError(flags, err)
		}
	}
	return op
}

// writeTo writes a piece to one replica.
func (g *Gateway) writeTo(ctx context.Context, node cluster.Node, rv *layout.Epoch, oid object.OID, copies int, p []byte, offset uint32, flags object.Flags) error {
	err := g.heal.changeHealing(ctx, node, rv, oid, copies, offset, len(p), func() error {
		return g.replicas.Write(ctx, node, rv.Number, oid, p, offset, flags)
	})
	return writeError(flags, err)
}

// writeError is the error of a write to one replica.
func writeError(flags object.Flags, err error) error {
	if flags.Has(object.FlagCreate) && errors.Is(err, object.ErrNotFound) {
		return fmt.Errorf("replica refused to create object: %w", err) // not "missing": never copy over a create
	}
	return err
}

func (g *Gateway) objectLock(oid object.OID) *waitlock.RWLock {
	return &g.objectLocks[uint64(oid^oid>>32)%uint64(len(g.objectLocks))]
}

// mutate runs a change on every replica of oid. A replica that should
// hold the object but lacks it (the placement moved and recovery has not
// copied it yet), or holds a copy not yet proven current in this epoch,
// is first asked to recover it, under the object's exclusive lock so
// that no write to the object runs meanwhile; then the change is applied
// again on every replica (changes are idempotent).
//
// A change to every replica first waits for the writes to oid still on
// their way to other zones (lag.go, rule 3).
func (g *Gateway) mutate(ctx context.Context, oid object.OID, copies int, op func(ctx context.Context, node cluster.Node, rv *layout.Epoch) error) error {
	return g.mutateOp(ctx, oid, copies, replicaOp{run: op})
}

// mutateOp is mutate for a change that may be started (replicaOp).
func (g *Gateway) mutateOp(ctx context.Context, oid object.OID, copies int, op replicaOp) error {
	if err := g.lag.wait(ctx, oid); err != nil {
		return err
	}
	return g.mutateOn(ctx, oid, copies, nil, op)
}

// mutateOn is mutate on the replicas pick chooses, without waiting for
// the writes on their way to other zones.
func (g *Gateway) mutateOn(ctx context.Context, oid object.OID, copies int, pick pickFunc, op replicaOp) error {
	if err := g.heal.repairSuspect(ctx, oid, copies); err != nil {
		return err
	}
	err := g.mutateReplicas(ctx, oid, copies, pick, op)
	if err != nil && !reachedNoReplica(err) {
		g.heal.suspect(oid, err)
		g.heal.keepFailed(oid, op.change)
	}
	return err
}

// reachedNoReplica says whether a failed change certainly reached none of
// its object's replicas, so its replicas cannot differ because of it.
// That is so of object.ErrNoObject: mutateReplicas asks a replica that
// lacks the object to recover it, and recovery answers ErrNoObject only
// when no reachable node holds it and no node that is down can; a replica
// that had applied the change would hold it, and had just answered. It is
// the first write of a map object (putEntry: without CREATE, then with it
// once the object is found nowhere), on every new VDI, clone or restore:
// not a failure worth a warning, nor a repair that reads every replica.
func reachedNoReplica(err error) bool {
	return errors.Is(err, object.ErrNoObject)
}

func (g *Gateway) mutateReplicas(ctx context.Context, oid object.OID, copies int, pick pickFunc, op replicaOp) error {
	lock := g.objectLock(oid)
	budget := g.newBudget()
	for {
		var mu sync.Mutex
		var missing []cluster.Node
		lock.RLock()
		err := g.replicateOn(ctx, oid, copies, pick, op.then(func(ctx context.Context, node cluster.Node, rv *layout.Epoch, err error) error {
			if object.Damaged(err) {
				// A damaged copy is replaced like a missing one.
				if rerr := g.replicas.Remove(ctx, node, rv.Number, oid); rerr == nil || errors.Is(rerr, object.ErrNotFound) {
					g.logger.Warn("gateway: removed a damaged copy; recovering it", "object", fmt.Sprintf("%016x", oid), "node", node.ID, "err", err)
					err = object.ErrNotFound
				}
			}
			if errors.Is(err, object.ErrNotFound) || errors.Is(err, object.ErrNotRecovered) {
				mu.Lock()
				missing = append(missing, node)
				mu.Unlock()
				return nil
			}
			return err
		}))
		lock.RUnlock()
		if err != nil || len(missing) == 0 {
			return err
		}
		lock.Lock()
		err = g.recoverMissing(ctx, oid, copies, missing)
		lock.Unlock()
		if err != nil && !object.Retryable(err) {
			return err
		}
		if err != nil {
			if err := g.waitNextEpoch(ctx, object.Epoch(g.cluster.Epoch()), budget, err); err != nil {
				return err
			}
		}
	}
}

// recoverMissing asks each node that lacks oid, or holds a copy not yet
// proven current in this epoch, to recover it (RECOVER: it proves the
// newest reachable copy current and restamps or fetches it). Nodes that
// are no longer replicas of oid are skipped: the epoch may have changed
// while the exclusive lock was awaited (writes stuck on a node that
// stopped answering hold it until the epoch change drops that node), and
// a node that left the placement must not be waited for.
func (g *Gateway) recoverMissing(ctx context.Context, oid object.OID, copies int, nodes []cluster.Node) error {
	rv, err := g.layouts.Current()
	if err != nil {
		return err
	}
	scope, cancel := layout.Scoped(ctx, g.cluster, rv.Number, roundTimeout)
	defer cancel()
	current := rv.ReplicasOf(oid, copies)
	for _, node := range nodes {
		if !slices.ContainsFunc(current, func(n cluster.Node) bool { return n.ID == node.ID }) {
			continue
		}
		if err := g.recoverOn(scope, node, rv, oid); err != nil {
			return unanswered(ctx, scope, err)
		}
	}
	return nil
}

// recoverOn has node make its copy of oid current in rv's epoch. "Not
// found" from RECOVER means no node holds the object and none that is
// down can (object.ErrNoObject): a map object never written reads as zeros, a
// data object the map says exists is lost.
func (g *Gateway) recoverOn(ctx context.Context, node cluster.Node, rv *layout.Epoch, oid object.OID) error {
	err := g.replicas.Recover(ctx, node, rv.Number, oid)
	if errors.Is(err, object.ErrNotFound) {
		return &object.ReplicaError{Node: node.ID, OID: oid, Err: fmt.Errorf("%w: %v", object.ErrNoObject, err)}
	}
	if err != nil {
		return &object.ReplicaError{Node: node.ID, OID: oid, Err: err}
	}
	g.logger.Debug("gateway: replica recovered object on demand", "object", fmt.Sprintf("%016x", oid), "node", node.ID, "epoch", rv.Number)
	return nil
}

// read reads a piece from one replica, preferring the local one and
// failing over to the others. A replica that lacks the object, or whose
// copy is not yet proven current in this epoch, recovers it first (on
// demand, ahead of background recovery); if no copy is provably current
// (the newest may be on nodes that are down) the read fails rather than
// return older data.
func (g *Gateway) read(ctx context.Context, oid object.OID, copies int, p []byte, offset uint32) error {
	if needsAgreement(ctx, oid) {
		return g.readAgreed(ctx, oid, copies, p, offset)
	}
	// A suspect object is repaired first, even with far parts pending:
	// the near copies that acknowledged them may lack an earlier one
	// that failed (lag.go, rule 6).
	if err := g.heal.repairSuspect(ctx, oid, copies); err != nil {
		return err
	}
	if served, err := g.lag.readLagging(ctx, oid, p, offset); served || err != nil {
		return err
	}
	return g.readReplicas(ctx, oid, copies, p, offset)
}

// preferNear orders a read's candidates: this node's own copy first, then
// the copies in its zone (zones may be far apart: a read served in the
// zone costs no wide-area round trip), then the others.
func preferNear(candidates []cluster.Node, self, zone string) {
	if i := slices.IndexFunc(candidates, func(n cluster.Node) bool { return n.ID == self }); i > 0 {
		candidates[0], candidates[i] = candidates[i], candidates[0]
	}
	if zone == "" {
		return
	}
	start := 0
	if len(candidates) > 0 && candidates[0].ID == self {
		start = 1
	}
	slices.SortStableFunc(candidates[start:], func(a, b cluster.Node) int {
		near := func(n cluster.Node) int {
			if n.Zone == zone {
				return 0
			}
			return 1
		}
		return near(a) - near(b)
	})
}

func (g *Gateway) readReplicas(ctx context.Context, oid object.OID, copies int, p []byte, offset uint32) error {
	budget := g.newBudget()
	self := g.cluster.ID()
	for {
		rv, err := g.layouts.Current()
		if err != nil {
			return err
		}
		candidates := rv.ReplicasOf(oid, copies)
		preferNear(candidates, self, rv.Nodes[self].Zone)
		var retry, hard error
		var damaged, badBlocks []cluster.Node
		for _, node := range candidates {
			err := g.readFrom(ctx, node, rv, oid, p, offset)
			if err == nil {
				g.healAfterRead(rv, oid, copies, offset, len(p), damaged, badBlocks)
				return nil
			}
			if object.Damaged(err) {
				damaged = append(damaged, node)
			}
			if errors.Is(err, object.ErrChecksum) {
				badBlocks = append(badBlocks, node)
			}
			if errors.Is(err, object.ErrNoCopy) || errors.Is(err, object.ErrNoObject) {
				return err // the same on every replica: the proof is global
			}
			err = &object.ReplicaError{Node: node.ID, OID: oid, Err: err}
			if object.Retryable(err) {
				retry = err
			} else {
				hard = err
			}
		}
		if len(badBlocks) > 0 {
			// Every replica failed, some with bad blocks: take each
			// block from where it is good.
			err := g.heal.readBlockwise(ctx, rv, oid, copies, p, offset)
			if err == nil || errors.Is(err, object.ErrChecksum) {
				return err
			}
		}
		if retry == nil {
			return hard
		}
		if err := g.waitNextEpoch(ctx, rv.Number, budget, retry); err != nil {
			if hard != nil {
				return hard
			}
			return err
		}
	}
}

// healAfterRead heals, in the background, the replicas a read that
// succeeded elsewhere found damaged or with blocks failing their checksum.
func (g *Gateway) healAfterRead(rv *layout.Epoch, oid object.OID, copies int, offset uint32, length int, damaged, badBlocks []cluster.Node) {
	for _, bad := range damaged {
		go g.heal.repairDamaged(bad, rv.Number, oid)
	}
	for _, bad := range badBlocks {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), roundTimeout)
			defer cancel()
			if err := g.heal.healBlocks(ctx, bad, rv, oid, copies, offset, length, nil); err != nil {
				g.logger.Warn("gateway: repairing blocks that failed their checksum", "object", fmt.Sprintf("%016x", oid), "node", bad.ID, "err", err)
			}
		}()
	}
}

// readFrom reads from one replica, recovering its copy first if needed.
func (g *Gateway) readFrom(ctx context.Context, node cluster.Node, rv *layout.Epoch, oid object.OID, p []byte, offset uint32) error {
	scope, cancel := layout.Scoped(ctx, g.cluster, rv.Number, readTimeout)
	defer cancel()
	_, err := g.replicas.Read(scope, node, rv.Number, oid, p, offset)
	if errors.Is(err, object.ErrNotFound) || errors.Is(err, object.ErrNotRecovered) {
		if err := g.recoverOn(scope, node, rv, oid); err != nil {
			return unanswered(ctx, scope, err)
		}
		_, err = g.replicas.Read(scope, node, rv.Number, oid, p, offset)
	}
	return unanswered(ctx, scope, err)
}

func (g *Gateway) markDirty(nodes []cluster.Node) {
	g.dirtyMu.Lock()
	for _, n := range nodes {
		g.dirty[n.ID] = true
	}
	g.dirtyMu.Unlock()
}

// flush makes every acknowledged write durable on every replica that
// received it (no FLUSH acknowledged before the data is on
// stable storage on every replica). Only the nodes this gateway wrote to
// since its last flush are asked; a node that failed stays in the set.
func (g *Gateway) flush(ctx context.Context) error {
	if err := g.lag.drain(ctx); err != nil {
		return err
	}
	g.dirtyMu.Lock()
	targets := g.dirty
	g.dirty = map[string]bool{}
	g.dirtyMu.Unlock()
	err := g.flushNodes(ctx, targets)
	if err != nil {
		g.dirtyMu.Lock()
		for id := range targets {
			g.dirty[id] = true
		}
		g.dirtyMu.Unlock()
	}
	return err
}

func (g *Gateway) flushNodes(ctx context.Context, targets map[string]bool) error {
	budget := g.newBudget()
	for {
		rv, err := g.layouts.Current()
		if err != nil {
			return err
		}
		var errs []error
		var mu sync.Mutex
		var wg sync.WaitGroup
		scope, cancel := layout.Scoped(ctx, g.cluster, rv.Number, roundTimeout)
		failed := func(node cluster.Node, err error) {
			if err = unanswered(ctx, scope, err); err != nil {
				mu.Lock()
				errs = append(errs, &object.ReplicaError{Node: node.ID, Err: err})
				mu.Unlock()
			}
		}
		// Remote flushes are sent from this goroutine (with a Starter),
		// this node's own runs here, then the answers are awaited: no
		// goroutine per node. Without a Starter, one per node.
		var waits []func() error
		var waitNodes []cluster.Node
		var local []cluster.Node
		for id := range targets {
			node, alive := rv.Nodes[id]
			if !alive {
				// Gone from the epoch: its copies are lost with it; the
				// other replicas of the same writes are flushed here.
				continue
			}
			if g.starter != nil {
				if wait := g.starter.StartFlush(scope, node, rv.Number); wait != nil {
					waits = append(waits, wait)
					waitNodes = append(waitNodes, node)
					continue
				}
				local = append(local, node)
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				failed(node, g.replicas.Flush(scope, node, rv.Number))
			}()
		}
		for _, node := range local {
			failed(node, g.replicas.Flush(scope, node, rv.Number))
		}
		for i, wait := range waits {
			failed(waitNodes[i], wait())
		}
		wg.Wait()
		cancel()
		var retry error
		for _, err := range errs {
			if !object.Retryable(err) {
				return err
			}
			retry = err
		}
		if retry == nil {
			return nil
		}
		if err := g.waitNextEpoch(ctx, rv.Number, budget, retry); err != nil {
			return err
		}
	}
}
