// Package gateway turns block requests on a VDI into object requests on
// every replica (DESIGN.md "Gateway and replication"). Each node's gateway
// serves the VDIs opened through it: a request is split into object
// pieces, each piece goes to all replicas of its object in parallel,
// stamped with the current epoch, and the client is answered only when
// every replica acknowledged. A replica serves only copies written or
// recovered in the current epoch (see Recovery for the proof that makes
// a copy current); the gateway asks it to recover the object when it
// refuses. A replica in another epoch refuses; the
// gateway then waits for the next epoch and retries on the new placement,
// so a write is never lost or wrongly acknowledged across an epoch change.
// Reads go to one replica, the local one when there is one, with failover.
// Nothing here serialises requests a client sent concurrently, except the
// first write to an object, which also writes its map entry.
package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/peer"
	"github.com/herd-storage/herd/internal/placement"
	"github.com/herd-storage/herd/internal/store"
)

// Cluster is what the gateway needs from the cluster log.
type Cluster interface {
	ID() string
	Epoch() uint64
	View() cluster.EpochView
	WaitEpoch(ctx context.Context, after uint64) (cluster.EpochView, error)
	Epochs() []cluster.Epoch
	Node(id string) (cluster.Node, bool)
	VDI(name string) (cluster.VDI, error)
	LookupVDI(ctx context.Context, name string) (cluster.VDI, error)
	Tree() []cluster.VDI
	Chain(id uint32) []uint32
	SnapshotVDI(ctx context.Context, name, tag, holder string) (cluster.SnapshotResult, error)
	AcquireLock(ctx context.Context, key, session string) (cluster.Lock, error)
	ReleaseLock(ctx context.Context, key, session string) error
	MarkVDIRepaired(ctx context.Context, name string) error
}

// WriteFlags qualify a replica write.
type WriteFlags struct {
	Create bool // the object may be created by this write
	Sync   bool // durable before the replica answers (FUA)
	NoHole bool // for Zero: write zeros instead of punching a hole
}

// Replicas reaches object copies on nodes: the local store for this node,
// the peer protocol for others. Implementations are safe for concurrent
// use and return ErrNotFound, a *StaleEpochError or ErrUnavailable (wrapped
// or not) for those conditions; any other error is an I/O failure of that
// replica.
type Replicas interface {
	Read(ctx context.Context, node cluster.Node, epoch, oid uint64, p []byte, offset uint32) (stamp uint64, err error)
	Write(ctx context.Context, node cluster.Node, epoch, oid uint64, p []byte, offset uint32, flags WriteFlags) error
	Zero(ctx context.Context, node cluster.Node, epoch, oid uint64, offset, length uint32, flags WriteFlags) error
	Remove(ctx context.Context, node cluster.Node, epoch, oid uint64) error
	Flush(ctx context.Context, node cluster.Node, epoch uint64) error
	Stat(ctx context.Context, node cluster.Node, epoch, oid uint64) (stamp uint64, err error)
	// Fetch reads the whole copy (len(p) bytes) whatever its stamp, for
	// recovery from a source it proved current and for checks.
	Fetch(ctx context.Context, node cluster.Node, epoch, oid uint64, p []byte) (stamp uint64, err error)
	// Recover has node make its copy of oid current in epoch: ErrNoCopy
	// if no reachable copy is provably current, ErrNotFound if no
	// reachable node holds the object.
	Recover(ctx context.Context, node cluster.Node, epoch, oid uint64) error
}

// Options tune the gateway.
type Options struct {
	// RetryTimeout bounds how long one request waits for the cluster
	// (epoch changes, unreachable replicas) before it fails with EIO.
	RetryTimeout time.Duration
}

// Gateway serves the VDIs opened through this node.
type Gateway struct {
	cluster  Cluster
	replicas Replicas
	logger   *slog.Logger
	options  Options
	session  string // this gateway's lock session

	mu   sync.Mutex // guards open, ring and past
	open map[string]*vdiState
	ring *ringView
	past map[uint64]*ringView // placements of past epochs, for proveCurrent

	dirtyMu sync.Mutex      // guards dirty
	dirty   map[string]bool // nodes written through this gateway since its last flush

	// objectLocks order a whole-object copy to a replica that lacks the
	// object against writes to it: writes hold their object's lock
	// shared, a copy exclusively. A VDI has one writer gateway, so this
	// orders every write to its objects (striped by object id).
	objectLocks [1024]sync.RWMutex
}

// New returns a gateway.
func New(c Cluster, replicas Replicas, logger *slog.Logger, options Options) *Gateway {
	if options.RetryTimeout == 0 {
		options.RetryTimeout = 30 * time.Second
	}
	return &Gateway{cluster: c, replicas: replicas, logger: logger, options: options, session: "gateway", open: map[string]*vdiState{}, past: map[uint64]*ringView{}, dirty: map[string]bool{}}
}

// ringView is the placement of one epoch.
type ringView struct {
	epoch  uint64
	ring   *placement.Ring
	nodes  map[string]cluster.Node
	format cluster.Format
}

func ringFor(nodes []cluster.Node) (*placement.Ring, error) {
	members := make([]placement.Node, 0, len(nodes))
	for _, n := range nodes {
		weight := n.Capacity
		if weight == 0 {
			weight = 1
		}
		members = append(members, placement.Node{ID: n.ID, Zone: n.Zone, Weight: weight})
	}
	return placement.New(members)
}

// placed keeps the nodes that hold objects (nil ids: all of them); a
// full node stays a member of the epoch without a share.
func placed(nodes []cluster.Node, ids []string) []cluster.Node {
	if ids == nil {
		return nodes
	}
	var out []cluster.Node
	for _, n := range nodes {
		if slices.Contains(ids, n.ID) {
			out = append(out, n)
		}
	}
	return out
}

// current returns the placement of the latest epoch this node applied.
func (g *Gateway) current() (*ringView, error) {
	// The hot path: the epoch number is cheap, the view copies the node
	// list, so build the view only when the epoch changed.
	epoch := g.cluster.Epoch()
	g.mu.Lock()
	if g.ring != nil && g.ring.epoch == epoch {
		rv := g.ring
		g.mu.Unlock()
		return rv, nil
	}
	g.mu.Unlock()
	view := g.cluster.View()
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ring != nil && g.ring.epoch == view.Number {
		return g.ring, nil
	}
	if view.Format == nil {
		return nil, ErrNotFormatted
	}
	if len(view.Nodes) == 0 {
		return nil, fmt.Errorf("%w: no nodes in epoch %d", ErrUnavailable, view.Number)
	}
	ring, err := ringFor(placed(view.Nodes, view.Placed))
	if err != nil {
		return nil, err
	}
	rv := &ringView{epoch: view.Number, ring: ring, nodes: map[string]cluster.Node{}, format: *view.Format}
	for _, n := range view.Nodes {
		rv.nodes[n.ID] = n
	}
	g.ring = rv
	if rv.ring.MaxCopies() < rv.format.Copies {
		// Reported once per epoch: writes go to every node (or zone) there
		// is, until nodes return or recovery restores redundancy.
		g.logger.Warn("gateway: fewer failure domains than copies; writing with reduced redundancy", "epoch", rv.epoch, "copies", rv.format.Copies, "available", rv.ring.MaxCopies())
	}
	return rv, nil
}

// replicasOf returns the nodes that hold oid in this epoch: copies of
// them, or all there are when fewer nodes (or zones) are alive, so that a
// cluster that lost nodes keeps serving with reduced redundancy until
// they return.
func (rv *ringView) replicasOf(oid uint64, copies int) []cluster.Node {
	copies = max(1, min(copies, rv.ring.MaxCopies()))
	ids := rv.ring.Replicas(oid, copies)
	out := make([]cluster.Node, 0, len(ids))
	for _, id := range ids {
		out = append(out, rv.nodes[id])
	}
	return out
}

// waitNextEpoch waits for an epoch after epoch, or at most a second:
// some conditions clear without a new epoch (a leader election, a peer
// connection re-established). It fails only once deadline has passed.
func (g *Gateway) waitNextEpoch(ctx context.Context, epoch uint64, deadline time.Time, why error) error {
	if time.Now().After(deadline) {
		return fmt.Errorf("%w after %v (epoch %d): %v", ErrTimeout, g.options.RetryTimeout, epoch, why)
	}
	until := time.Now().Add(time.Second)
	if deadline.Before(until) {
		until = deadline
	}
	wait, cancel := context.WithDeadline(ctx, until)
	defer cancel()
	g.cluster.WaitEpoch(wait, epoch)
	return ctx.Err()
}

// retryable says whether an error from a replica means "try again in
// the next epoch" rather than a hard failure.
func retryable(err error) bool {
	return errors.Is(err, ErrStaleEpoch) || errors.Is(err, ErrUnavailable)
}

// Bounds on one round of requests to replicas. A paused or partitioned
// node keeps its connections open and never answers; the epoch change
// that drops it cancels the round (see scoped), these only cap the wait
// when no epoch change comes.
const (
	roundTimeout = 30 * time.Second
	readTimeout  = 5 * time.Second // then fail over to the next replica
)

// scoped returns a context for one round of requests in epoch: it ends
// when a newer epoch arrives (the requests go again on the new placement)
// or after limit.
func (g *Gateway) scoped(ctx context.Context, epoch uint64, limit time.Duration) (context.Context, context.CancelFunc) {
	scope, cancel := context.WithTimeout(ctx, limit)
	go func() {
		g.cluster.WaitEpoch(scope, epoch)
		cancel()
	}()
	return scope, cancel
}

// unanswered turns the error of a request cut short by its round's scope
// (not by the caller) into "replica unavailable", which is retried.
func unanswered(ctx, scope context.Context, err error) error {
	if err != nil && ctx.Err() == nil && scope.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
		return fmt.Errorf("%w: no answer (%v)", ErrUnavailable, err)
	}
	return err
}

// replicate runs op on every replica of oid in parallel, retrying on the
// new placement when the epoch changes or a replica is unreachable, and
// returns nil only when every replica of one epoch succeeded.
func (g *Gateway) replicate(ctx context.Context, oid uint64, copies int, op func(ctx context.Context, node cluster.Node, rv *ringView) error) error {
	deadline := time.Now().Add(g.options.RetryTimeout)
	for {
		rv, err := g.current()
		if err != nil {
			return err
		}
		targets := rv.replicasOf(oid, copies)
		errs := make([]error, len(targets))
		// Marked before the operation is acknowledged, so that a FLUSH
		// that follows the acknowledgement includes these nodes.
		g.markDirty(targets)
		scope, cancel := g.scoped(ctx, rv.epoch, roundTimeout)
		var wg sync.WaitGroup
		for i, node := range targets {
			if i == len(targets)-1 {
				errs[i] = unanswered(ctx, scope, op(scope, node, rv))
				break
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[i] = unanswered(ctx, scope, op(scope, node, rv))
			}()
		}
		wg.Wait()
		cancel()
		var retry, hard error
		for i, err := range errs {
			if err == nil {
				continue
			}
			err = &ReplicaError{Node: targets[i].ID, OID: oid, Err: err}
			if retryable(err) {
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
		g.logger.Debug("gateway: retrying on the next epoch", "object", fmt.Sprintf("%016x", oid), "epoch", rv.epoch, "err", retry)
		if err := g.waitNextEpoch(ctx, rv.epoch, deadline, retry); err != nil {
			return err
		}
	}
}

// write writes a piece to every replica.
func (g *Gateway) write(ctx context.Context, oid uint64, copies int, p []byte, offset uint32, flags WriteFlags) error {
	return g.mutate(ctx, oid, copies, func(ctx context.Context, node cluster.Node, rv *ringView) error {
		err := g.replicas.Write(ctx, node, rv.epoch, oid, p, offset, flags)
		if flags.Create && errors.Is(err, ErrNotFound) {
			return fmt.Errorf("replica refused to create object: %w", err) // not "missing": never copy over a create
		}
		return err
	})
}

func (g *Gateway) objectLock(oid uint64) *sync.RWMutex {
	return &g.objectLocks[(oid^oid>>32)%uint64(len(g.objectLocks))]
}

// mutate runs a change on every replica of oid. A replica that should
// hold the object but lacks it (the placement moved and recovery has not
// copied it yet), or holds a copy not yet proven current in this epoch,
// is first asked to recover it, under the object's exclusive lock so
// that no write to the object runs meanwhile; then the change is applied
// again on every replica (changes are idempotent).
func (g *Gateway) mutate(ctx context.Context, oid uint64, copies int, op func(ctx context.Context, node cluster.Node, rv *ringView) error) error {
	lock := g.objectLock(oid)
	deadline := time.Now().Add(g.options.RetryTimeout)
	for {
		var mu sync.Mutex
		var missing []cluster.Node
		lock.RLock()
		err := g.replicate(ctx, oid, copies, func(ctx context.Context, node cluster.Node, rv *ringView) error {
			err := op(ctx, node, rv)
			if isDamaged(err) {
				// A damaged copy is replaced like a missing one.
				if rerr := g.replicas.Remove(ctx, node, rv.epoch, oid); rerr == nil || errors.Is(rerr, ErrNotFound) {
					g.logger.Warn("gateway: removed a damaged copy; recovering it", "object", fmt.Sprintf("%016x", oid), "node", node.ID, "err", err)
					err = ErrNotFound
				}
			}
			if errors.Is(err, ErrNotFound) || errors.Is(err, ErrNotRecovered) {
				mu.Lock()
				missing = append(missing, node)
				mu.Unlock()
				return nil
			}
			return err
		})
		lock.RUnlock()
		if err != nil || len(missing) == 0 {
			return err
		}
		lock.Lock()
		err = g.recoverMissing(ctx, oid, copies, missing)
		lock.Unlock()
		if err != nil && !retryable(err) {
			return err
		}
		if err != nil {
			if err := g.waitNextEpoch(ctx, g.cluster.Epoch(), deadline, err); err != nil {
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
func (g *Gateway) recoverMissing(ctx context.Context, oid uint64, copies int, nodes []cluster.Node) error {
	rv, err := g.current()
	if err != nil {
		return err
	}
	scope, cancel := g.scoped(ctx, rv.epoch, roundTimeout)
	defer cancel()
	current := rv.replicasOf(oid, copies)
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
// down can (ErrNoObject): a map object never written reads as zeros, a
// data object the map says exists is lost.
func (g *Gateway) recoverOn(ctx context.Context, node cluster.Node, rv *ringView, oid uint64) error {
	err := g.replicas.Recover(ctx, node, rv.epoch, oid)
	if errors.Is(err, ErrNotFound) {
		return &ReplicaError{Node: node.ID, OID: oid, Err: fmt.Errorf("%w: %v", ErrNoObject, err)}
	}
	if err != nil {
		return &ReplicaError{Node: node.ID, OID: oid, Err: err}
	}
	g.logger.Debug("gateway: replica recovered object on demand", "object", fmt.Sprintf("%016x", oid), "node", node.ID, "epoch", rv.epoch)
	return nil
}

// read reads a piece from one replica, preferring the local one and
// failing over to the others. A replica that lacks the object, or whose
// copy is not yet proven current in this epoch, recovers it first (on
// demand, ahead of background recovery); if no copy is provably current
// (the newest may be on nodes that are down) the read fails rather than
// return older data.
func (g *Gateway) read(ctx context.Context, oid uint64, copies int, p []byte, offset uint32) error {
	deadline := time.Now().Add(g.options.RetryTimeout)
	self := g.cluster.ID()
	for {
		rv, err := g.current()
		if err != nil {
			return err
		}
		candidates := rv.replicasOf(oid, copies)
		if i := slices.IndexFunc(candidates, func(n cluster.Node) bool { return n.ID == self }); i > 0 {
			candidates[0], candidates[i] = candidates[i], candidates[0]
		}
		var retry, hard error
		var damaged []cluster.Node
		for _, node := range candidates {
			err := g.readFrom(ctx, node, rv, oid, p, offset)
			if err == nil {
				for _, bad := range damaged {
					go g.repairDamaged(bad, rv.epoch, oid)
				}
				return nil
			}
			if isDamaged(err) {
				damaged = append(damaged, node)
			}
			if errors.Is(err, ErrNoCopy) || errors.Is(err, ErrNoObject) {
				return err // the same on every replica: the proof is global
			}
			err = &ReplicaError{Node: node.ID, OID: oid, Err: err}
			if retryable(err) {
				retry = err
			} else {
				hard = err
			}
		}
		if retry == nil {
			return hard
		}
		if err := g.waitNextEpoch(ctx, rv.epoch, deadline, retry); err != nil {
			if hard != nil {
				return hard
			}
			return err
		}
	}
}

// isDamaged says whether a replica's error means its copy (or its disk)
// failed: a bad header or checksum, or EIO.
func isDamaged(err error) bool {
	return errors.Is(err, store.ErrCorrupt) || errors.Is(err, store.ErrIO) ||
		errors.Is(err, peer.ErrCorrupt) || errors.Is(err, peer.ErrObjectIO)
}

// repairDamaged replaces a replica's damaged copy of oid, after another
// replica served the read: the bad copy is removed and the replica
// recovers the object from a proven current copy.
func (g *Gateway) repairDamaged(node cluster.Node, epoch, oid uint64) {
	ctx, cancel := context.WithTimeout(context.Background(), roundTimeout)
	defer cancel()
	rv, err := g.current()
	if err != nil || rv.epoch != epoch {
		return // the next epoch's recovery sees the damage again
	}
	err = g.replicas.Remove(ctx, node, epoch, oid)
	if err == nil || errors.Is(err, ErrNotFound) {
		err = g.recoverOn(ctx, node, rv, oid)
	}
	if err != nil {
		g.logger.Warn("gateway: repairing a damaged copy failed", "object", fmt.Sprintf("%016x", oid), "node", node.ID, "err", err)
		return
	}
	g.logger.Info("gateway: repaired a damaged copy from another replica", "object", fmt.Sprintf("%016x", oid), "node", node.ID, "epoch", epoch)
}

// readFrom reads from one replica, recovering its copy first if needed.
func (g *Gateway) readFrom(ctx context.Context, node cluster.Node, rv *ringView, oid uint64, p []byte, offset uint32) error {
	scope, cancel := g.scoped(ctx, rv.epoch, readTimeout)
	defer cancel()
	_, err := g.replicas.Read(scope, node, rv.epoch, oid, p, offset)
	if errors.Is(err, ErrNotFound) || errors.Is(err, ErrNotRecovered) {
		if err := g.recoverOn(scope, node, rv, oid); err != nil {
			return unanswered(ctx, scope, err)
		}
		_, err = g.replicas.Read(scope, node, rv.epoch, oid, p, offset)
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
// received it (issue 3: no FLUSH acknowledged before the data is on
// stable storage on every replica). Only the nodes this gateway wrote to
// since its last flush are asked; a node that failed stays in the set.
func (g *Gateway) flush(ctx context.Context) error {
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
	deadline := time.Now().Add(g.options.RetryTimeout)
	for {
		rv, err := g.current()
		if err != nil {
			return err
		}
		var errs []error
		var mu sync.Mutex
		var wg sync.WaitGroup
		scope, cancel := g.scoped(ctx, rv.epoch, roundTimeout)
		for id := range targets {
			node, alive := rv.nodes[id]
			if !alive {
				// Gone from the epoch: its copies are lost with it; the
				// other replicas of the same writes are flushed here.
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := unanswered(ctx, scope, g.replicas.Flush(scope, node, rv.epoch)); err != nil {
					mu.Lock()
					errs = append(errs, &ReplicaError{Node: node.ID, Err: err})
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		cancel()
		var retry error
		for _, err := range errs {
			if !retryable(err) {
				return err
			}
			retry = err
		}
		if retry == nil {
			return nil
		}
		if err := g.waitNextEpoch(ctx, rv.epoch, deadline, retry); err != nil {
			return err
		}
	}
}
