// Package recovery makes every node hold, after every epoch change, the
// objects the epoch places on it, as copies proven current (DESIGN.md
// "Recovery"; the paper's Fig. 4): it surveys every node's copies, proves
// the newest current (Proof), restamps its own copy or installs a fetched
// one whole, then deletes the copies the epoch places elsewhere once their
// replacements are durable. It also serves RECOVER (a replica asked to
// make one object current now, on demand) and throttles the background
// pass, never client I/O.
//
// Invariants:
//   - A copy is made current only by a proof: every epoch from the
//     object's VDI's first one (cluster.VDI.Since) after the newest
//     reachable stamp has a replica that answered. A silent member of the
//     epoch fails the proof with object.ErrUnavailable (retried); only
//     replicas out of the epoch make it object.ErrNoCopy.
//   - A fetched copy is installed whole and stamped at once
//     (store.Replace): a copy cut short never exists, stamps never go back.
//   - Copies with the newest stamp are not taken for identical: a change
//     in flight (sent, not acknowledged, still retried) may have reached
//     some of them only. Every node ranks their holders the same way
//     (holders that stayed members of every epoch since the stamp first,
//     then by id: rankHolders), and a node that left those epochs keeps
//     its own tied copy only if its content digest equals the first
//     ranked holder's that stayed (tie); otherwise it fetches that copy.
//   - No copy is deleted before its replacement exists: a surplus copy is
//     removed only when every replica of the current epoch holds a copy
//     stamped with it, flushed, and only while that epoch lasts.
//   - Chunks of erasure-coded objects (object.IsChunk) are never touched:
//     each has one copy, on the node its object's head names (not the
//     epoch's placement), written only by its VDI's writer gateway and
//     checked by it against the head's checksums, not proven current by
//     stamps. The pass neither fetches, restamps, counts nor removes
//     them, and RecoverObject of one has nothing to do.
//
// Lock order: the replica's exclusive object lock (replica.Exclusive) is
// taken after the throttle's worker slot and never while waiting for the
// rate limit (a client needing the object recovers it meanwhile).
package recovery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/ec"
	"github.com/herd-storage/herd/internal/layout"
	"github.com/herd-storage/herd/internal/object"
	"github.com/herd-storage/herd/internal/replica"
)

// Cluster is what recovery needs of the cluster log.
type Cluster interface {
	Epoch() uint64
	View() cluster.EpochView
	WaitEpoch(ctx context.Context, after uint64) (cluster.EpochView, error)
	Epochs() []cluster.Epoch
	VDIByID(id uint32) (cluster.VDI, bool)
	// VDICopies is the number of copies of VDI id's objects, false for
	// an id the node does not know (cluster.State.CopiesOf).
	VDICopies(id uint32) (copies int, ok bool)
	// MaintenanceHold names the nodes down inside their maintenance
	// window, and the earliest end of those windows.
	MaintenanceHold(now time.Time) (until time.Time, nodes []string)
}

// Replicas reaches every node's replica (replica.Client).
type Replicas interface {
	// Stat returns the stamp of node's copy and its content digest
	// (store.Info.Digest), 0 when not known: a node whose herd predates
	// digests, or a cluster below cluster.LevelCopyDigests.
	Stat(ctx context.Context, node cluster.Node, epoch object.Epoch, oid object.OID) (stamp object.Epoch, digest uint64, err error)
	// Fetch reads the whole copy, whatever its stamp.
	Fetch(ctx context.Context, node cluster.Node, epoch object.Epoch, oid object.OID, p []byte) (stamp object.Epoch, err error)
	Flush(ctx context.Context, node cluster.Node, epoch object.Epoch) error
	// List returns a node's copies with their stamps.
	List(ctx context.Context, node cluster.Node, epoch object.Epoch) (map[object.OID]object.Epoch, error)
}

// Recovery is one node's recovery. It lists the objects of every node of
// the epoch and, for each object placed on this node, proves the newest
// listed copy current (Proof.Current), then restamps its own copy with
// the epoch when it is that copy, or fetches that copy otherwise. A
// replica serves only copies stamped with the current epoch; the gateway
// asks for an object's recovery on demand (RecoverObject) when it meets
// one that is not, so I/O never waits for the background pass. An object
// whose newest copies may be on nodes that are down is left unrecovered:
// it is refused, never served old, until one of them returns. A newer
// epoch arriving mid-way cancels the run and starts the next one, which
// skips what is already current.
//
// Copies this node holds but the epoch places elsewhere are deleted once
// every replica of their object holds a current, durable copy
// (removeSurplus).
type Recovery struct {
	cluster  Cluster
	layouts  *layout.History
	replicas Replicas
	proof    *Proof
	local    *replica.Replica
	self     string
	logger   *slog.Logger
	throttle *throttle
	kick     chan struct{} // Kick: another pass over the current epoch

	mu     sync.Mutex // guards status
	status Status
}

// Status is what `herd node recovery` shows for one node.
type Status struct {
	Epoch     object.Epoch `json:"epoch"`
	State     string       `json:"state"` // idle, listing, pulling, done, retrying
	Objects   int          `json:"objects"`
	Copied    int          `json:"copied"`
	Remaining int          `json:"remaining"`
	Bytes     uint64       `json:"bytes"`
	// Unavailable counts objects placed here whose newest copies may be
	// on nodes that are down: refused until one returns.
	Unavailable int `json:"unavailable,omitempty"`
	// Surplus counts copies held here that this epoch places elsewhere
	// and that are not deleted yet: each waits until every replica of its
	// object holds a current, durable copy. Removed counts those deleted.
	Surplus int `json:"surplus"`
	Removed int `json:"removed"`
	// Deferred counts the objects placed here that the pass leaves as
	// they are until a maintenance window closes (HeldBy: the nodes down
	// in one, HeldUntil: its end); clients' objects are recovered on
	// demand meanwhile.
	Deferred  int       `json:"deferred,omitempty"`
	HeldBy    []string  `json:"held_by,omitempty"`
	HeldUntil time.Time `json:"held_until,omitzero"`
	// Progress of the pass in bytes: the copy rate so far, an estimate of
	// the bytes left (objects left times the share of objects that needed
	// a copy so far) and of the time left at that rate.
	Rate           uint64  `json:"rate_bytes_per_second"`
	BytesRemaining uint64  `json:"bytes_remaining"`
	ETASeconds     float64 `json:"eta_seconds"`
	// The limits in force (`herd node recovery --max-rate --concurrency`).
	Limits Limits `json:"limits"`

	objectSize uint64
	Started    time.Time `json:"started,omitzero"`
	Finished   time.Time `json:"finished,omitzero"`
	LastError  string    `json:"last_error,omitempty"`
}

// New returns the recovery of node self, whose replica is local. The
// node serves RECOVER requests with its RecoverObject (replica.Served).
func New(c Cluster, layouts *layout.History, replicas Replicas, local *replica.Replica, self string, logger *slog.Logger) *Recovery {
	r := &Recovery{cluster: c, layouts: layouts, replicas: replicas, proof: NewProof(c, layouts, replicas), local: local, self: self, logger: logger,
		throttle: newThrottle(defaultRecoveryConcurrency, 0), kick: make(chan struct{}, 1), status: Status{State: "idle"}}
	return r
}

// Proof is the prover recovery uses, for checks that must prove copies
// current the same way.
func (r *Recovery) Proof() *Proof { return r.proof }

// Status returns the current recovery state.
func (r *Recovery) Status() Status {
	r.mu.Lock()
	s := r.status
	r.mu.Unlock()
	s.Limits = r.throttle.limits()
	if s.State == "pulling" || s.State == "retrying" {
		if elapsed := time.Since(s.Started).Seconds(); elapsed > 0 {
			s.Rate = uint64(float64(s.Bytes) / elapsed)
		}
		share := 1.0
		if done := s.Objects - s.Remaining; done > 0 {
			share = float64(s.Copied) / float64(done)
		}
		s.BytesRemaining = uint64(float64(s.Remaining) * float64(s.objectSize) * share)
		if s.Rate > 0 {
			s.ETASeconds = float64(s.BytesRemaining) / float64(s.Rate)
		}
	}
	return s
}

func (r *Recovery) update(fn func(s *Status)) {
	r.mu.Lock()
	fn(&r.status)
	r.mu.Unlock()
}

// Kick asks for another pass over the current epoch: this node lost
// copies without an epoch change (a disk was taken out of service).
func (r *Recovery) Kick() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// waitWork waits for an epoch after epoch, or for a Kick.
func (r *Recovery) waitWork(ctx context.Context, epoch object.Epoch) (cluster.EpochView, error) {
	wait, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-r.kick:
			cancel()
		case <-wait.Done():
		}
	}()
	view, err := r.cluster.WaitEpoch(wait, uint64(epoch))
	if err != nil && ctx.Err() == nil {
		return r.cluster.View(), nil // kicked
	}
	return view, err
}

// Run recovers every epoch until ctx ends.
func (r *Recovery) Run(ctx context.Context) {
	var epoch object.Epoch
	for ctx.Err() == nil {
		view, err := r.waitWork(ctx, epoch)
		if err != nil {
			return
		}
		epoch = object.Epoch(view.Number)
		run, cancel := context.WithCancel(ctx)
		go func(epoch object.Epoch) {
			// A newer epoch ends this run; the next one continues. (epoch
			// is passed: the loop assigns the next one while this may
			// not have started yet.)
			r.cluster.WaitEpoch(run, uint64(epoch))
			cancel()
		}(epoch)
		for attempt := 0; run.Err() == nil; attempt++ {
			err := r.recover(run, epoch)
			if errors.Is(err, errNotFormatted) {
				// Nothing to recover yet, but the format adds no epoch:
				// this epoch's pass runs once the cluster is formatted
				// (a pass never run left the status at epoch 0, idle,
				// until a node next joined or left).
				select {
				case <-run.Done():
				case <-time.After(time.Second):
				}
				attempt = -1
				continue
			}
			var held *heldError
			if errors.As(err, &held) {
				r.waitHold(run)
				attempt = -1
				continue
			}
			if err == nil || run.Err() != nil {
				break
			}
			r.update(func(s *Status) { s.State, s.LastError = "retrying", err.Error() })
			r.logger.Warn("recovery: will retry", "epoch", epoch, "err", err)
			select {
			case <-run.Done():
			case <-time.After(time.Duration(min(attempt+1, 10)) * time.Second):
			}
		}
		r.removeSurplus(run, epoch)
		cancel()
	}
}

// errNotFormatted: the cluster is not formatted yet; Run tries the same
// epoch again.
var errNotFormatted = errors.New("recovery: the cluster is not formatted yet")

// heldError ends a pass that deferred copies for a maintenance window.
type heldError struct {
	nodes    []string
	until    time.Time
	deferred int
}

func (e *heldError) Error() string {
	return fmt.Sprintf("recovery: %d objects wait for the maintenance of %v (until %s)", e.deferred, e.nodes, e.until.UTC().Format(time.RFC3339))
}

// returnGrace is how long a pass leaves the objects it shares with a
// node back from maintenance (this node itself included), so that every
// holder's pass lists them before any restamps them.
const returnGrace = 5 * time.Second

// returningFromMaintenance names the nodes of rv, this one included, that
// were not in the epoch before it and have had a maintenance window
// (an operator's, or their own clean stop's): nodes coming back from one.
func (r *Recovery) returningFromMaintenance(rv *layout.Epoch) map[string]bool {
	var before map[string]bool
	for _, e := range r.cluster.Epochs() {
		if object.Epoch(e.Number)+1 == rv.Number {
			before = map[string]bool{}
			for _, id := range e.Nodes {
				before[id] = true
			}
		}
	}
	out := map[string]bool{}
	if before == nil {
		return out
	}
	for id, n := range rv.Nodes {
		if !before[id] && !n.MaintenanceUntil.IsZero() {
			out[id] = true
		}
	}
	return out
}

// waitHold waits until no node is down inside a maintenance window (its
// window closed or was ended), or ctx ends (the node returned: a new
// epoch).
func (r *Recovery) waitHold(ctx context.Context) {
	for ctx.Err() == nil {
		until, nodes := r.cluster.MaintenanceHold(time.Now())
		if len(nodes) == 0 {
			return
		}
		select {
		case <-ctx.Done():
		case <-time.After(min(time.Until(until), 5*time.Second)):
		}
	}
}

func (r *Recovery) recover(ctx context.Context, epoch object.Epoch) error {
	rv, err := r.layouts.Current()
	if errors.Is(err, layout.ErrNotFormatted) {
		return errNotFormatted
	}
	if err != nil {
		return err
	}
	if rv.Number != epoch {
		return nil // a newer epoch is already here; its run follows
	}
	if _, member := rv.Nodes[r.self]; !member {
		return nil
	}
	started := time.Now()
	r.update(func(s *Status) {
		*s = Status{Epoch: epoch, State: "listing", Started: started}
	})
	// Every node's objects, and the newest stamp and its holders (in
	// id order) of each.
	type best struct {
		stamp   object.Epoch
		holders []cluster.Node
	}
	newest := map[object.OID]best{}
	ids := make([]string, 0, len(rv.Nodes))
	for id := range rv.Nodes {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		node := rv.Nodes[id]
		objects, err := r.replicas.List(ctx, node, epoch)
		if err != nil {
			return fmt.Errorf("listing node %s: %w", id, err)
		}
		for oid, stamp := range objects {
			if stamp == 0 {
				continue // never a source: no complete copy is stamped 0
			}
			if object.IsChunk(oid) {
				continue // placed by its object's head, never recovered
			}
			switch b, ok := newest[oid]; {
			case !ok || stamp > b.stamp:
				newest[oid] = best{stamp: stamp, holders: []cluster.Node{node}}
			case stamp == b.stamp:
				// Every holder: copies of one stamp may differ
				// (makeCurrentLocked).
				b.holders = append(b.holders, node)
				newest[oid] = b
			}
		}
	}
	// Each object's replicas are its VDI's copies of them (copiesOf).
	copies := r.copiesOf(rv)
	placedCopies := map[object.OID]int{}
	// Objects that a node just back from a maintenance window also holds
	// come last, after a grace: restamped here first, they would look
	// newer than that node's unchanged copies when its own pass lists
	// them (a restamp in this epoch cannot be told from a write in it), and
	// it would fetch them all. The node back waits the same grace before
	// restamping its own, or the others, listing after it, would fetch
	// every object they share with it (seen: 8 of 24 objects copied
	// whole by a peer of a node back from its clean stop). Using this
	// listing's stamps for them later is what the pass does for every
	// object anyway.
	returning := r.returningFromMaintenance(rv)
	var mine []object.OID
	later := map[object.OID]bool{}
	for oid := range newest {
		n, _ := copies.of(oid) // unknown: the format's (copiesOf)
		placedHere, shared := false, false
		for _, node := range rv.ReplicasOf(oid, n) {
			placedHere = placedHere || node.ID == r.self
			shared = shared || returning[node.ID]
		}
		if placedHere {
			mine = append(mine, oid)
			placedCopies[oid] = n
			if shared {
				later[oid] = true
			}
		}
	}
	sort.Slice(mine, func(i, j int) bool {
		if later[mine[i]] != later[mine[j]] {
			return !later[mine[i]]
		}
		return mine[i] < mine[j]
	})
	r.update(func(s *Status) {
		s.State, s.Objects, s.Remaining, s.objectSize = "pulling", len(mine), len(mine), rv.Format.ObjectSize
	})
	// Every node of the epoch answered the listing; no other node did.
	answered := func(id string) bool { _, ok := rv.Nodes[id]; return ok || bugEveryNodeWitnesses }
	// While a node is down inside its maintenance window, the pass makes
	// nothing current: clients' objects are made current on demand, and
	// the others keep their stamps. (Restamping them would make the
	// returning node's unchanged copies look older than the others' and
	// so fetch them all; left alone, its copies are proven current.)
	heldUntil, heldBy := r.cluster.MaintenanceHold(time.Now())
	if len(heldBy) > 0 {
		r.update(func(s *Status) {
			s.State, s.Remaining, s.Deferred, s.HeldBy, s.HeldUntil = "held for maintenance", 0, len(mine), heldBy, heldUntil
		})
		r.logger.Info("recovery: waits for a maintenance window", "epoch", epoch, "objects", len(mine), "nodes", heldBy, "until", heldUntil)
		return &heldError{nodes: heldBy, until: heldUntil, deferred: len(mine)}
	}
	throttle := r.throttle.wait
	work := make(chan object.OID)
	var failed error
	var failedOnce sync.Once
	var unavailable []object.OID
	var mu sync.Mutex
	var noSpace int
	var wg sync.WaitGroup
	for w := 0; w < maxRecoveryConcurrency; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for oid := range work {
				if err := r.throttle.enter(ctx); err != nil {
					continue
				}
				b := newest[oid]
				copied, err := r.makeCurrent(ctx, rv, oid, placedCopies[oid], b.stamp, b.holders, nil, answered, throttle)
				r.throttle.leave()
				switch {
				case errors.Is(err, object.ErrNoCopy):
					mu.Lock()
					unavailable = append(unavailable, oid)
					mu.Unlock()
				case errors.Is(err, object.ErrNoSpace):
					mu.Lock()
					noSpace++
					mu.Unlock()
				case err != nil:
					failedOnce.Do(func() { failed = fmt.Errorf("object %016x: %w", oid, err) })
				}
				r.update(func(s *Status) {
					s.Remaining--
					if copied {
						s.Copied++
						s.Bytes += rv.Format.ObjectSize
					}
				})
			}
		}()
	}
	waited := false
	for _, oid := range mine {
		if later[oid] && !waited {
			waited = true
			select {
			case <-ctx.Done():
			case <-time.After(returnGrace):
			}
		}
		select {
		case work <- oid:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
	}
	close(work)
	wg.Wait()
	if noSpace > 0 {
		// The copies elsewhere stay (removeSurplus waits for this node's
		// copy): nothing is lost, redundancy waits for space.
		return fmt.Errorf("%w: this node's disk is full: %d objects placed here could not be copied; their other copies are kept until space is freed", object.ErrNoSpace, noSpace)
	}
	if failed != nil {
		return failed
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if len(unavailable) > 0 {
		sort.Slice(unavailable, func(i, j int) bool { return unavailable[i] < unavailable[j] })
		r.update(func(s *Status) { s.Unavailable = len(unavailable) })
		r.logger.Warn("recovery: objects whose newest copies may be on nodes that are down are unavailable until one returns",
			"epoch", epoch, "objects", len(unavailable), "first", fmt.Sprintf("%016x", unavailable[0]))
	}
	// Recovered copies are durable before this node says it is done, so
	// that other nodes may delete the copies they replace.
	if err := r.local.Store().Flush(); err != nil {
		return fmt.Errorf("flushing recovered copies: %w", err)
	}
	status := r.Status()
	r.update(func(s *Status) { s.State, s.Finished = "done", time.Now() })
	if status.Copied > 0 {
		r.logger.Info("recovery: done", "epoch", epoch, "objects", status.Objects, "copied", status.Copied, "took", time.Since(started).Round(time.Millisecond))
	}
	return nil
}

// RecoverObject makes this node's copy of oid current in epoch, on
// demand (a gateway met a missing or unproven copy here): it asks every
// node of the epoch for its stamp of the object and proceeds as the
// background pass does. object.ErrNoCopy if no reachable copy is provably
// current, object.ErrNotFound if no node holds the object.
//
// A chunk of an erasure-coded object (object.IsChunk) has nothing to
// recover: nil at once. Its one copy is served whatever its stamp
// (replica.Replica), only its VDI's writer gateway writes it, and the
// gateway checks its bytes against the checksums in its object's head.
func (r *Recovery) RecoverObject(ctx context.Context, epoch object.Epoch, oid object.OID) error {
	if object.IsChunk(oid) {
		return nil
	}
	rv, err := r.layouts.Current()
	if err != nil {
		return err
	}
	if rv.Number != epoch {
		return &object.StaleEpochError{Current: rv.Number}
	}
	if stamp, err := r.local.Store().Epoch(oid); err == nil && stamp >= epoch {
		return nil // recovered meanwhile
	}
	copies, _ := r.copiesOf(rv).of(oid)
	stamps, digests, answered := r.proof.Survey(ctx, rv, oid)
	var newest object.Epoch
	var holders []cluster.Node
	for id, stamp := range stamps {
		switch {
		case stamp == 0:
			// Never a source: only a recovery copy cut short by an older
			// binary (which wrote copies in place, stamped 0) has it.
		case stamp > newest:
			newest, holders = stamp, []cluster.Node{rv.Nodes[id]}
		case stamp == newest:
			holders = append(holders, rv.Nodes[id])
		}
	}
	if len(holders) == 0 {
		if err := r.proof.Current(oid, copies, rv, 0, answered); err != nil {
			return err
		}
		return fmt.Errorf("%w: object %016x: no node of epoch %d holds it", object.ErrNotFound, oid, epoch)
	}
	copied, err := r.makeCurrent(ctx, rv, oid, copies, newest, holders, digests, answered, nil) // I/O waits: never throttled
	if errors.Is(err, object.ErrNoCopy) {
		var silent []string
		for id := range rv.Nodes {
			if !answered(id) {
				silent = append(silent, id)
			}
		}
		sort.Strings(silent)
		r.logger.Warn("recovery: object refused on demand", "object", fmt.Sprintf("%016x", oid), "epoch", epoch,
			"stamps", fmt.Sprint(stamps), "unanswered", strings.Join(silent, ","), "err", err)
	}
	if copied {
		r.logger.Info("recovery: recovered object on demand", "object", fmt.Sprintf("%016x", oid), "epoch", epoch, "stamp", newest)
	}
	return err
}

// makeCurrent makes this node's copy of oid current in rv's epoch, given
// its VDI's copies, the newest stamp any answering node holds, the nodes
// holding it and, where a survey learnt them, their content digests (nil:
// none known): it proves that copy current, then restamps its own copy
// if that is one with the newest content (tie), or fetches the object
// from a holder. Under the object's exclusive lock. Reports whether it
// copied data.
func (r *Recovery) makeCurrent(ctx context.Context, rv *layout.Epoch, oid object.OID, copies int, newest object.Epoch, holders []cluster.Node, digests map[string]uint64, answered func(string) bool, throttle func(ctx context.Context, bytes uint64) error) (bool, error) {
	copied, err := r.makeCurrentLocked(ctx, rv, oid, copies, newest, holders, digests, answered, throttle != nil)
	if errors.Is(err, errNeedTokens) {
		if err := throttle(ctx, rv.Format.ObjectSize); err != nil {
			return false, err
		}
		copied, err = r.makeCurrentLocked(ctx, rv, oid, copies, newest, holders, digests, answered, false)
	}
	return copied, err
}

// errNeedTokens: makeCurrentLocked found it must copy, and the copy is
// rate-limited.
var errNeedTokens = errors.New("recovery: copy waits for the rate limit")

func (r *Recovery) makeCurrentLocked(ctx context.Context, rv *layout.Epoch, oid object.OID, copies int, newest object.Epoch, holders []cluster.Node, digests map[string]uint64, answered func(string) bool, throttle bool) (bool, error) {
	copied := false
	err := r.local.Exclusive(oid, func(stamp object.Epoch, found bool) error {
		if found && stamp >= rv.Number {
			return nil // written or recovered in this epoch meanwhile
		}
		if found && stamp > newest {
			newest, holders = stamp, []cluster.Node{rv.Nodes[r.self]}
		}
		if err := r.proof.Current(oid, copies, rv, newest, answered); err != nil {
			return err
		}
		stayed := r.stayedSince(newest, rv.Number)
		sources := rankHolders(holders, stayed)
		if found && stamp == newest && stamp > 0 {
			keep, from, err := r.tie(ctx, rv, oid, newest, sources, digests, stayed)
			if err != nil {
				return err
			}
			if keep {
				return r.local.Store().SetEpoch(rv.Number, oid)
			}
			sources = from
		}
		var last error
		for _, h := range sources {
			if h.ID == r.self {
				continue
			}
			if throttle {
				// Wait for the rate limit without the object's lock: a
				// client needing the object recovers it meanwhile.
				return errNeedTokens
			}
			data := make([]byte, r.copySize(oid, rv.Format.ObjectSize))
			if _, err := r.replicas.Fetch(ctx, h, rv.Number, oid, data); err != nil {
				last = fmt.Errorf("fetching from node %s: %w", h.ID, err)
				continue
			}
			// Installed whole, stamped with the epoch, in one step: until
			// then this node's answer about the object is its previous
			// copy (or none), so a copy cut short (disk full, this process
			// killed) never passes for the newest, and a survey meanwhile
			// never sees a stamp that went back.
			if err := r.local.Store().Replace(rv.Number, oid, data); err != nil {
				return err
			}
			copied = true
			return nil
		}
		if last == nil {
			last = fmt.Errorf("%w: object %016x: no holder of the newest copy (epoch %d) answered", object.ErrUnavailable, oid, newest)
		}
		return last
	})
	return copied, err
}

// Copies with the same stamp.
//
// A change acknowledged in epoch e reached every replica of e, so the
// copies stamped e that hold it are identical, and recovery used to take
// any of them for the newest (restamping its own). A change still in
// flight is another matter: sent in e to every replica, it may have
// reached some and not others (a node killed just before it arrived),
// and the gateway retries it through the epochs that follow without
// failing it (so suspect repair, gateway/suspect.go, does not run). A
// reader may read it from a copy that has it; if recovery then makes
// current a copy of the same stamp that lacks it, a later read returns
// the older data: not linearizable (TestRobustness, object
// 0000000300000000: node 2 restarted with its copy stamped 17 without the
// write in flight, restamped it in epoch 20 and served it; the gateway's
// TestInFlightWriteNeverReadOldAfterNew replays it).
//
// A replica misses a change sent to it when it cannot be reached, and
// one that stays unreachable is taken out of the next epoch; one that was
// a member of every epoch after its copy's stamp got the change, or will
// get its retry, which the gateway sends to every replica of the epoch it
// retries in. So the holders of the newest stamp that stayed members
// since it are the sources: every node ranks them first, the same way
// (then by id), and a node that must copy fetches from the first it
// reaches, rolling the partial change forward everywhere. A node that
// left those epochs keeps its own tied copy only when its content digest
// (store.Info.Digest) equals that of the first holder that stayed, so a
// node back from a restart or a maintenance window still restamps its
// unchanged copies instead of copying them (the "down, not out" promise).
// A digest that is not known (a herd before digests, a cluster below
// cluster.LevelCopyDigests, a copy written before checksums) counts as
// different: it costs a copy, never data. When no holder stayed (every
// holder left and came back) each keeps its own, as before.
//
// Not covered: a holder that stayed but missed a change in flight (its
// connection broke, and the retry in the same epoch has not reached it
// yet) ties with those that have it and may rank first; until the retry
// lands, a read through it may return the older data after a read
// elsewhere returned the newer, as for any write in flight whose replicas
// readers meet in a different order.

// stayedSince returns whether a node was a member of every epoch after
// stamp up to now. It reads the epoch history once, on first use.
func (r *Recovery) stayedSince(stamp, now object.Epoch) func(id string) bool {
	var epochs int
	var in map[string]int // epochs of the range each node was a member of
	return func(id string) bool {
		if in == nil {
			in = map[string]int{}
			for _, e := range r.cluster.Epochs() {
				if number := object.Epoch(e.Number); number <= stamp || number > now {
					continue
				}
				epochs++
				for _, n := range e.Nodes {
					in[n]++
				}
			}
		}
		return in[id] == epochs
	}
}

// rankHolders orders the holders of the newest stamp as every node does:
// those that stayed members since the stamp first, then by id.
func rankHolders(holders []cluster.Node, stayed func(string) bool) []cluster.Node {
	out := slices.Clone(holders)
	slices.SortFunc(out, func(a, b cluster.Node) int {
		if sa, sb := stayed(a.ID), stayed(b.ID); sa != sb {
			if sa {
				return -1
			}
			return 1
		}
		return strings.Compare(a.ID, b.ID)
	})
	return slices.CompactFunc(out, func(a, b cluster.Node) bool { return a.ID == b.ID })
}

// tie decides about this node's copy of oid, stamped newest like the
// ranked holders' (see "Copies with the same stamp"): keep it (restamp)
// or fetch, from the holders that stayed members since newest, in rank
// order. The caller holds the object's exclusive lock.
func (r *Recovery) tie(ctx context.Context, rv *layout.Epoch, oid object.OID, newest object.Epoch, ranked []cluster.Node, digests map[string]uint64, stayed func(string) bool) (keep bool, from []cluster.Node, err error) {
	if stayed(r.self) {
		return true, nil, nil
	}
	for _, h := range ranked {
		if h.ID != r.self && stayed(h.ID) {
			from = append(from, h)
		}
	}
	if len(from) == 0 {
		return true, nil, nil
	}
	_, own, err := r.local.Store().Stat(oid)
	if err != nil {
		return false, nil, err
	}
	if own == 0 {
		return false, from, nil
	}
	first := from[0]
	digest, known := digests[first.ID]
	if !known {
		// The background pass listed stamps only: ask (bounded as a
		// survey). An error leaves it unknown; the fetch will tell. Its
		// copy may be stamped with this epoch by now (its own pass
		// restamped it, or a client wrote it): it is current then, and
		// the same content here is as current as a fetch of it would be
		// (a write to the object in this epoch waits for this lock here,
		// then lands on this copy too).
		scope, cancel := layout.Scoped(ctx, r.cluster, rv.Number, surveyTimeout)
		stamp, d, err := r.replicas.Stat(scope, first, rv.Number, oid)
		cancel()
		if err == nil && stamp >= newest {
			digest = d
		}
	}
	if digest != 0 && digest == own {
		return true, nil, nil
	}
	return false, from, nil
}

// removeSurplus deletes the copies this node holds but epoch places on
// other nodes, once they are no longer needed: every replica of the
// object in epoch holds a copy written or recovered in epoch (so proven
// current), made durable by a flush of that replica. Until then the copy
// stays, so no copy is deleted before its replacement exists. Repeats,
// backing off, until none is left or the epoch changes.
func (r *Recovery) removeSurplus(ctx context.Context, epoch object.Epoch) {
	for delay := time.Second; ctx.Err() == nil; delay = min(2*delay, 30*time.Second) {
		left, err := r.removeSurplusOnce(ctx, epoch)
		if errors.Is(err, layout.ErrNotFormatted) {
			return // no objects exist before the cluster is formatted
		}
		if err != nil && ctx.Err() == nil {
			r.logger.Warn("recovery: removing surplus copies", "epoch", epoch, "err", err)
		}
		if err == nil && left == 0 {
			return
		}
		select {
		case <-ctx.Done():
		case <-time.After(delay):
		}
	}
}

func (r *Recovery) removeSurplusOnce(ctx context.Context, epoch object.Epoch) (int, error) {
	rv, err := r.layouts.Current()
	if err != nil {
		return 0, err
	}
	if rv.Number != epoch {
		return 0, nil
	}
	if _, member := rv.Nodes[r.self]; !member {
		return 0, nil
	}
	// A copy is surplus only when its VDI's copies are known and do not
	// place it here. A copy of a VDI this node does not know is kept:
	// the VDI may have been created after the entries this node applied
	// (a gateway elsewhere writes its objects to every replica of the
	// VDI's own copies, this node among them, while this node lags), and
	// the format's copies (or a guess) could place it elsewhere and
	// delete a copy the VDI needs. Keeping it costs the space of a copy
	// of a VDI freed for good (an orphan), which nothing else deletes
	// either; deleting it could cost data.
	copies := r.copiesOf(rv)
	var surplus []object.OID
	var unknown int
	placed := map[object.OID][]cluster.Node{}
	err = r.local.List(func(oid object.OID, stamp object.Epoch) error {
		if object.IsChunk(oid) {
			return nil // one copy, on the node its object's head names: never surplus
		}
		n, known := copies.of(oid)
		if !known {
			unknown++
			return nil
		}
		replicas := rv.ReplicasOf(oid, n)
		if !slices.ContainsFunc(replicas, func(n cluster.Node) bool { return n.ID == r.self }) {
			surplus = append(surplus, oid)
			placed[oid] = replicas
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	r.update(func(s *Status) { s.Surplus = len(surplus) })
	if unknown > 0 {
		r.logger.Debug("recovery: kept copies of VDIs this node does not know", "epoch", epoch, "copies", unknown)
	}
	if len(surplus) == 0 {
		return 0, nil
	}
	// Which copies are replaced: every replica current in this epoch.
	var replaced []object.OID
	flush := map[string]cluster.Node{}
	for _, oid := range surplus {
		targets := placed[oid]
		ok := true
		for _, n := range targets {
			stamp, _, err := r.replicas.Stat(ctx, n, epoch, oid)
			if err != nil || stamp < epoch {
				ok = false
				break
			}
		}
		if ok {
			replaced = append(replaced, oid)
			for _, n := range targets {
				flush[n.ID] = n
			}
		}
		if ctx.Err() != nil {
			return len(surplus), ctx.Err()
		}
	}
	for _, n := range flush {
		if err := r.replicas.Flush(ctx, n, epoch); err != nil {
			return len(surplus), fmt.Errorf("flushing node %s before removing copies it replaces: %w", n.ID, err)
		}
	}
	removed := 0
	for _, oid := range replaced {
		err := r.local.Exclusive(oid, func(object.Epoch, bool) error {
			if object.Epoch(r.cluster.Epoch()) != epoch {
				return context.Canceled // placement may have changed
			}
			// Invariant: a copy the epoch places here is never surplus.
			if slices.ContainsFunc(placed[oid], func(n cluster.Node) bool { return n.ID == r.self }) {
				return fmt.Errorf("recovery: refusing to delete object %016x: epoch %d places it on this node", oid, epoch)
			}
			return r.local.Store().Remove(oid)
		})
		if err != nil && !errors.Is(err, object.ErrNotFound) {
			return len(surplus) - removed, err
		}
		removed++
	}
	if err := r.local.Store().Flush(); err != nil {
		return len(surplus) - removed, err
	}
	left := len(surplus) - removed
	r.update(func(s *Status) { s.Surplus, s.Removed = left, s.Removed+removed })
	if removed > 0 {
		r.logger.Info("recovery: removed copies placed elsewhere", "epoch", epoch, "removed", removed, "left", left)
	}
	return left, nil
}

// vdiCopies looks up the number of copies of objects' VDIs for one pass:
// each VDI id is asked of the cluster once (cluster.State.CopiesOf walks
// the VDIs). VDI copies never change, so a pass may keep the answers; an
// id unknown at first is asked again, as the node may have applied its
// VDI's creation meanwhile. Not safe for concurrent use.
type vdiCopies struct {
	cluster Cluster
	format  int
	known   map[uint32]int
}

// copiesOf returns a lookup of copies for a pass over rv.
func (r *Recovery) copiesOf(rv *layout.Epoch) *vdiCopies {
	return &vdiCopies{cluster: r.cluster, format: rv.Format.Copies, known: map[uint32]int{}}
}

// of returns the copies of oid's VDI, and whether the VDI is known. For
// an unknown VDI it returns the format's copies, for uses that need a
// number and for which any is safe: recovery makes such an object
// current where the format's copies place it (a VDI created after the
// epoch began had its objects written to every replica in this epoch
// already; one freed for good needs no copy), and the proof for it is
// what it was before VDIs had their own copies. Surplus removal never
// deletes such a copy (removeSurplusOnce).
func (c *vdiCopies) of(oid object.OID) (int, bool) {
	id := object.VDI(oid)
	if n, ok := c.known[uint32(id)]; ok {
		return n, true
	}
	if n, ok := c.cluster.VDICopies(uint32(id)); ok {
		c.known[uint32(id)] = n
		return n, true
	}
	return c.format, false
}

// copySize is how many bytes a copy of oid holds at most: the object
// size, or for a data object of an erasure-coded VDI the size of its
// replicated part (overlay, entries and heads past the object's bytes:
// ec.ReplicatedSize), which a fetch must carry whole.
func (r *Recovery) copySize(oid object.OID, objectSize uint64) uint64 {
	if object.Type(oid) != object.TypeData {
		return objectSize
	}
	v, ok := r.cluster.VDIByID(uint32(object.VDI(oid)))
	if !ok || v.EC == "" {
		return objectSize
	}
	size, err := ec.ReplicatedSize(v.EC, v.ObjectSize)
	if err != nil {
		r.logger.Error("recovery: the erasure-coding scheme of a vdi", "vdi", v.Name, "err", err)
		return objectSize
	}
	return size
}
