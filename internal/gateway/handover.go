package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/herd-storage/herd/internal/cluster"
)

// Writer handover (docs/ARCHITECTURE.md "Writer handover").
//
// A VDI that is not exclusive may be open for writing through several
// nodes at once, as a live migration needs: QEMU on the destination opens
// its disk when it starts, long before the source stops writing. Only the
// gateway holding the VDI's writer lock (cluster.Lock) writes; the others
// are on standby: they read through (no cached map page, the VDI
// re-read from the log on every request, so they see every write the
// holder completed), and their first change asks for the lock:
//
//  1. the standby records in the log that it wants the lock (LockWant);
//  2. the holder's watcher sees it, takes the VDI's io lock exclusively
//     (so every request in flight has completed and no new one starts),
//     flushes every node it wrote, repairs its suspect objects (or marks
//     the VDI unclean), forgets its cached map pages, and hands the lock
//     over in one log entry (LockHandover), with a new generation;
//  3. the standby, seeing itself holder, starts with a fresh view (the VDI
//     re-read, an empty map cache) and writes.
//
// A write on the old side afterwards asks for the lock back the same way.
// No two gateways write at once: a gateway writes only under its io lock
// held shared, and only while it holds the lock; it hands the lock over
// only with its io lock held exclusively. A lock taken away without a
// handover (`herd vdi unlock --force`, or the holder's node dropped)
// fences the old holder: its state is marked fenced and every later
// change through it fails, and the new epoch that the break begins makes
// every replica refuse the changes it still had in flight.

// ErrFenced: the VDI's writer lock was taken away from this open; it can
// no longer write. Reopening it starts afresh.
var ErrFenced = errors.New("gateway: this open of the vdi was fenced")

// writerLock is the VDI writer lock as this gateway holds it: taking
// it for a writable open (acquireWriter, ensureWriter), watching it and
// handing it over when another node wants it (after a FLUSH and the
// repair of the VDI's suspect objects), and fencing the changes made
// under a lock that was taken away (withFence, checkFence).
type writerLock struct {
	cluster Cluster
	session string        // this gateway's lock session
	timeout time.Duration // Options.RetryTimeout
	logger  *slog.Logger
	// ctx is the gateway's: the lock watchers end with it.
	ctx context.Context
	// repair makes an unclean VDI's replicas identical before this node
	// writes it (Options.Repair; nil: none).
	repair func(ctx context.Context, vdi cluster.VDI) error
	path   writerPath
	heal   *healer
}

// writerPath is what the writer lock needs of the data path: a FLUSH
// before a handover.
type writerPath interface {
	flush(ctx context.Context) error
}

// handoverTimeout bounds how long a standby's first change waits for the
// holder to hand the lock over (the holder drains and flushes first).
func (wl *writerLock) handoverTimeout() time.Duration { return wl.timeout }

// standby says whether state is open for writing here without the lock.
func (s *vdiState) standby() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return !s.lockHeld
}

// ensureWriter returns once this gateway holds state's writer lock,
// asking the holder to hand it over if another does. The caller holds
// state.io shared, so a handover of this state waits for its change.
// check, if set (Disk.SetTakeoverCheck), is asked before the lock is
// asked for and again once it is this node's; its error is returned.
func (wl *writerLock) ensureWriter(ctx context.Context, state *vdiState, check func() error) error {
	state.mu.Lock()
	held, fenced, gen, name := state.lockHeld, state.fenced, state.lockGen, state.vdi.Name
	state.mu.Unlock()
	if fenced != nil {
		return fenced
	}
	if held {
		// The watcher notices a lock taken away at once; this cheap look
		// at the applied log closes the gap before it does.
		l, ok := wl.cluster.Lock(cluster.VDILockKey(name))
		if ok && l.Generation == gen {
			return nil
		}
		if err := wl.fence(state, gen, "it is no longer this node's"); err != nil {
			return err
		}
		// Lost, not broken: take it again below.
	}
	state.acquireMu.Lock()
	defer state.acquireMu.Unlock()
	state.mu.Lock()
	held, fenced = state.lockHeld, state.fenced
	state.mu.Unlock()
	if fenced != nil {
		return fenced
	}
	if held {
		return nil
	}
	if err := checkTake(check); err != nil {
		return err
	}
	key := cluster.VDILockKey(name)
	started := time.Now()
	deadline := started.Add(wl.handoverTimeout())
	self := wl.cluster.ID()
	for {
		if time.Now().After(deadline) {
			// Other standbys kept replacing this one's wish, or the lock
			// kept changing hands elsewhere.
			return fmt.Errorf("%w after %v: vdi %q: could not get its writer lock (other nodes want it too)", ErrTimeout, wl.handoverTimeout(), name)
		}
		w, err := wl.cluster.WantLock(ctx, key, wl.session)
		switch {
		case errors.Is(err, cluster.ErrLockHeld):
			// Refused on this node or by the leader (then an error
			// code, not a cluster.LockHeldError): the VDI became
			// exclusive since it was opened.
			return fmt.Errorf("%w: vdi %q is exclusive and open for writing through %s", ErrBusy, name, wl.lockHolder(ctx, name, err))
		case err != nil && ctx.Err() == nil && time.Now().Before(deadline):
			wl.logger.Debug("gateway: asking for a writer lock failed; trying again", "vdi", name, "err", err)
			if werr := sleepCtx(ctx, 100*time.Millisecond); werr != nil {
				return werr
			}
			continue
		case err != nil:
			return fmt.Errorf("%w: vdi %q: asking for its writer lock: %v", ErrNotReady, name, err)
		case w.Granted:
			if err := wl.take(ctx, state, w.Lock); err != nil {
				return err
			}
			wl.logger.Info("gateway: took over the writer lock", "vdi", name, "generation", w.Lock.Generation, "waited", time.Since(started).Round(time.Microsecond))
			return checkTake(check) // again: the wait for the holder to hand it over can be long
		}
		wait, cancel := context.WithDeadline(ctx, deadline)
		l, held, err := wl.cluster.WaitLock(wait, key, func(l cluster.Lock, held bool) bool {
			return !held || l.Node == self && l.Session == wl.session || l.Wanted == nil || l.Wanted.Node != self
		})
		cancel()
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err != nil {
			return fmt.Errorf("%w after %v: vdi %q: node %s holds its writer lock and did not hand it over; if that node's writer is gone, `herd vdi unlock %s --force` takes the lock away", ErrTimeout, wl.handoverTimeout(), name, l.Node, name)
		}
		if held && l.Node == self && l.Session == wl.session {
			if err := wl.take(ctx, state, l); err != nil {
				return err
			}
			wl.logger.Info("gateway: writer lock handed over to this node", "vdi", name, "generation", l.Generation, "waited", time.Since(started).Round(time.Microsecond))
			return checkTake(check) // again: the wait for the holder to hand it over can be long
		}
		// Released, or another node's wish replaced this one: ask again.
	}
}

// checkTake asks a Disk's take-over check (nil: none).
func checkTake(check func() error) error {
	if check == nil {
		return nil
	}
	return check()
}

// take makes state the holder of lock l, which was just granted: the VDI
// is re-read (snapshotted, rolled back or resized meanwhile), repaired if
// its previous writer left it unclean, and its map cache starts empty
// (another node may have written it). On failure the lock is released.
func (wl *writerLock) take(ctx context.Context, state *vdiState, l cluster.Lock) error {
	state.mu.Lock()
	name := state.vdi.Name
	state.mu.Unlock()
	giveUp := func() {
		if err := wl.cluster.ReleaseLock(context.Background(), l.Key, wl.session); err != nil {
			wl.logger.Warn("gateway: releasing a writer lock after a failed open", "vdi", name, "err", err)
		}
	}
	vdi, err := wl.cluster.VDI(name)
	if err != nil {
		giveUp()
		return fmt.Errorf("%w: %v", ErrUnknownVDI, err)
	}
	if vdi.Unclean {
		if wl.repair == nil {
			giveUp()
			return fmt.Errorf("%w: vdi %q must be repaired (its previous writer's node died) and this node cannot repair it", ErrNotReady, name)
		}
		if err := wl.repair(ctx, vdi); err != nil {
			giveUp()
			return fmt.Errorf("%w: vdi %q: the node of its previous writer died, and making its replicas identical failed: %v", ErrNotReady, name, err)
		}
	}
	watch, stop := context.WithCancel(wl.ctx)
	state.mu.Lock()
	state.vdi, state.chain = vdi, wl.cluster.Chain(vdi.ID)
	state.dropPagesLocked()
	state.lockHeld, state.lockGen, state.fenced = true, l.Generation, nil
	if state.stopWatch != nil {
		state.stopWatch()
	}
	state.stopWatch = stop
	state.mu.Unlock()
	go wl.watchLock(watch, state, l.Key, l.Generation)
	return nil
}

// watchLock runs while this gateway holds generation gen of state's
// lock: it hands the lock over when another node wants it, and fences
// state when the lock is taken away.
func (wl *writerLock) watchLock(ctx context.Context, state *vdiState, key string, gen uint64) {
	for ctx.Err() == nil {
		l, held, err := wl.cluster.WaitLock(ctx, key, func(l cluster.Lock, held bool) bool {
			return !held || l.Generation != gen || l.Wanted != nil
		})
		if err != nil {
			return // released here
		}
		if !held || l.Generation != gen {
			reason := "it was released"
			if held {
				reason = fmt.Sprintf("node %s holds it now", l.Node)
			}
			wl.fence(state, gen, reason)
			return
		}
		done, err := wl.handOver(ctx, state, gen, *l.Wanted)
		if done {
			return
		}
		wl.logger.Warn("gateway: handing a writer lock over failed; trying again", "lock", key, "to", l.Wanted.Node, "err", err)
		if sleepCtx(ctx, 200*time.Millisecond) != nil {
			return
		}
	}
}

// handOver gives state's lock (generation gen) to the owner that wants
// it, once every change in flight has completed and is durable. It
// reports whether this state no longer holds the lock.
func (wl *writerLock) handOver(ctx context.Context, state *vdiState, gen uint64, to cluster.LockOwner) (bool, error) {
	started := time.Now()
	state.io.Lock() // every request in flight completes; none starts
	defer state.io.Unlock()
	state.mu.Lock()
	held := state.lockHeld && state.lockGen == gen
	vdi, chain := state.vdi, state.chain
	state.mu.Unlock()
	if !held {
		return true, nil
	}
	ctx, cancel := context.WithTimeout(ctx, wl.timeout)
	defer cancel()
	if err := wl.path.flush(ctx); err != nil {
		return false, fmt.Errorf("flushing before the handover: %w", err)
	}
	if !wl.heal.repairSuspects(ctx, vdi, chain) {
		if err := wl.cluster.MarkVDIUnclean(ctx, vdi.Name); err != nil {
			return false, fmt.Errorf("objects whose replicas may differ could not be repaired, and marking the vdi unclean failed: %w", err)
		}
		wl.logger.Warn("gateway: vdi marked unclean before a handover: objects whose replicas may differ could not be repaired; its next writer repairs it", "vdi", vdi.Name)
	}
	err := wl.cluster.HandOverLock(ctx, cluster.VDILockKey(vdi.Name), wl.session, to)
	if err != nil && !errors.Is(err, cluster.ErrNotLockOwner) && !errors.Is(err, cluster.ErrNotFound) {
		return false, err
	}
	state.mu.Lock()
	state.lockHeld, state.lockGen = false, 0
	state.dropPagesLocked()
	state.handovers++
	if state.stopWatch != nil {
		state.stopWatch()
		state.stopWatch = nil
	}
	state.mu.Unlock()
	if err != nil {
		wl.fence(state, gen, err.Error())
	}
	wl.logger.Info("gateway: handed the writer lock over", "vdi", vdi.Name, "to", to.Node, "generation", gen, "took", time.Since(started).Round(time.Microsecond))
	return true, nil
}

// fence handles state's loss of generation gen of its lock without a
// handover. A lock an operator broke (`herd vdi unlock --force`: the
// VDI's BrokenGeneration is gen) fences the state for good: every later
// request through it fails, and that error is returned. A lock lost
// otherwise (this node was dropped from the cluster for a while and came
// back) only puts the state on standby: its next request takes the lock
// again, with a fresh view (the VDI is unclean, so it is repaired
// first); fence then returns nil.
func (wl *writerLock) fence(state *vdiState, gen uint64, why string) error {
	state.mu.Lock()
	name := state.vdi.Name
	state.mu.Unlock()
	broken := false
	if v, err := wl.cluster.VDI(name); err == nil && gen != 0 && v.BrokenGeneration == gen {
		broken = true
	}
	state.mu.Lock()
	defer state.mu.Unlock()
	if state.fenced != nil {
		return state.fenced
	}
	if gen != 0 && state.lockGen != gen {
		return nil
	}
	state.lockHeld, state.lockGen = false, 0
	state.dropPagesLocked()
	if state.stopWatch != nil {
		state.stopWatch()
		state.stopWatch = nil
	}
	if !broken {
		wl.logger.Warn("gateway: this node lost the vdi's writer lock; its next request takes it again", "vdi", name, "why", why)
		return nil
	}
	state.fenced = fmt.Errorf("%w: vdi %q: its writer lock was taken away from this node (%s); changes through this open fail: reopen the vdi", ErrFenced, name, why)
	wl.logger.Warn("gateway: writer lock broken by an operator: this node's opens of the vdi can no longer write", "vdi", name, "why", why)
	return state.fenced
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// OpenInfo describes one open of a VDI through this node.
type OpenInfo struct {
	VDI       string    `json:"vdi"`
	ReadOnly  bool      `json:"read_only"`
	Writer    bool      `json:"writer"` // this node holds the VDI's writer lock
	Standby   bool      `json:"standby,omitempty"`
	Fenced    bool      `json:"fenced,omitempty"`
	Client    string    `json:"client,omitempty"`
	Since     time.Time `json:"since"`
	Handovers uint64    `json:"handovers_given,omitempty"`
}

// Opens lists the VDIs open through this node, one entry per open.
func (g *Gateway) Opens() []OpenInfo {
	g.mu.Lock()
	states := make([]*vdiState, 0, len(g.open))
	for _, s := range g.open {
		states = append(states, s)
	}
	g.mu.Unlock()
	var out []OpenInfo
	for _, s := range states {
		s.mu.Lock()
		for d := range s.disks {
			out = append(out, OpenInfo{VDI: s.vdi.FullName(), ReadOnly: d.readOnly, Writer: !d.readOnly && s.lockHeld, Standby: !d.readOnly && !s.lockHeld && s.fenced == nil,
				Fenced: !d.readOnly && s.fenced != nil, Client: d.client, Since: d.since, Handovers: s.handovers})
		}
		s.mu.Unlock()
	}
	return out
}

type clientKey struct{}

// WithClient names the client (its address) of opens made with ctx.
func WithClient(ctx context.Context, client string) context.Context {
	return context.WithValue(ctx, clientKey{}, client)
}

// fenceCheck is what a change's retries check: that the lock it started
// under is still this state's (see withFence).
type fenceCheck struct {
	state *vdiState
	gen   uint64
}

type fenceKey struct{}

// withFence marks ctx as a change made under state's current lock: a
// round retried after an epoch change first checks that the lock was not
// taken away meanwhile (a lock break begins a new epoch precisely so that
// the holder's changes in flight come back here).
func (wl *writerLock) withFence(ctx context.Context, state *vdiState) context.Context {
	state.mu.Lock()
	gen := state.lockGen
	state.mu.Unlock()
	return context.WithValue(ctx, fenceKey{}, fenceCheck{state: state, gen: gen})
}

// checkFence fails a change whose lock was taken away.
func (wl *writerLock) checkFence(ctx context.Context) error {
	f, ok := ctx.Value(fenceKey{}).(fenceCheck)
	if !ok {
		return nil
	}
	f.state.mu.Lock()
	fenced, name := f.state.fenced, f.state.vdi.Name
	f.state.mu.Unlock()
	if fenced != nil {
		return fenced
	}
	if l, held := wl.cluster.Lock(cluster.VDILockKey(name)); !held || l.Generation != f.gen {
		if err := wl.fence(f.state, f.gen, "it is no longer this node's"); err != nil {
			return err
		}
		return fmt.Errorf("%w: vdi %q: this node lost its writer lock while the change was under way; the next request takes it again", ErrNotReady, name)
	}
	return nil
}
