package gateway

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/exportname"
	"github.com/herd-storage/herd/internal/layout"
	"github.com/herd-storage/herd/internal/object"
	"github.com/herd-storage/herd/internal/objmap"
	"github.com/herd-storage/herd/internal/waitlock"
)

// ReadOnlyPrefix opens a VDI read-only: export name "ro/NAME"
// (internal/exportname). Many read-only opens may run beside the one
// writer. Snapshots (NAME@TAG) are always read-only.
const ReadOnlyPrefix = exportname.ReadOnlyPrefix

// vdiState is one VDI open through this node, shared by every connection
// to it (so that connections see each other's writes: CAN_MULTI_CONN).
type vdiState struct {
	key string // in Gateway.open: NAME, ro/NAME or NAME@TAG

	// refs counts opens, including those still taking the lock; guarded
	// by Gateway.mu. The state leaves Gateway.open when it drops to 0.
	refs int

	// io is held shared by every request and exclusively by a snapshot,
	// which so falls exactly between completed writes.
	io waitlock.RWLock

	// limiter paces requests to the VDI's QoS limits, before they take
	// io (qos.go); shared by the states of NAME and ro/NAME. Set at
	// creation.
	limiter *limiter

	mu       sync.Mutex // guards the fields below, up to openMu
	vdi      cluster.VDI
	chain    []uint32 // vdi.ID, then its ancestors, nearest first
	pages    map[uint64][]uint32
	writers  int
	readers  int
	lockHeld bool
	// lockGen is the generation of the writer lock held (lockHeld);
	// fenced, once set, is why changes through this state fail (the lock
	// was taken away without a handover); stopWatch ends the holder's
	// watcher (handover.go); handovers counts the locks handed over.
	lockGen   uint64
	fenced    error
	stopWatch context.CancelFunc
	handovers uint64
	disks     map[*Disk]struct{}
	// pagesGen counts the times pages was emptied: a page loaded before
	// that (by a request running beside a takeover) is not kept.
	pagesGen uint64

	openMu waitlock.RWLock // serialises taking and releasing the cluster lock at open and close
	// acquireMu serialises a standby's takeover of the lock (handover.go);
	// taken under io held shared.
	acquireMu waitlock.RWLock

	// allocation serialises first writes (and copy-on-write) to an
	// object: the data, then its map entry. Striped by index.
	allocation [64]waitlock.RWLock
}

func pageKey(vdi uint32, page uint32) uint64 { return uint64(vdi)<<32 | uint64(page) }

// dropPagesLocked empties the map cache (state.mu held).
func (s *vdiState) dropPagesLocked() {
	s.pages = map[uint64][]uint32{}
	s.pagesGen++
}

func (s *vdiState) current() (cluster.VDI, []uint32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.vdi, s.chain
}

// List returns every VDI that can be opened: writable ones and
// snapshots (NAME@TAG).
func (g *Gateway) List() []cluster.VDI {
	var out []cluster.VDI
	for _, v := range g.cluster.Tree() {
		if !v.Deleted {
			out = append(out, v)
		}
	}
	return out
}

// Open opens a VDI by name. A writable open takes the VDI's cluster lock
// (shared by every open through this node); while a writer through another
// node holds it, an exclusive VDI is refused (ErrBusy) with an error naming
// the holder, and any other opens on standby (acquireWriter). "ro/NAME" and
// snapshots "NAME@TAG" open read-only, any number at once.
func (g *Gateway) Open(ctx context.Context, name string) (*Disk, error) {
	key := name
	parsed := exportname.Parse(name)
	readOnly, name := parsed.ReadOnly, parsed.Full()
	if _, err := g.layouts.Current(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNotReady, err)
	}
	vdi, err := g.cluster.LookupVDI(ctx, name)
	switch {
	case errors.Is(err, cluster.ErrNotFound):
		return nil, fmt.Errorf("%w: %v", ErrUnknownVDI, err)
	case err != nil:
		// The lookup could not tell (this node misses the name and has
		// no leader to ask): the VDI may exist, so the open is not
		// refused as unknown.
		return nil, fmt.Errorf("%w: %w", ErrNotReady, err)
	}
	if vdi.Snapshot {
		readOnly = true
		key = vdi.FullName()
	}
	g.mu.Lock()
	state, ok := g.open[key]
	if !ok {
		state = &vdiState{key: key, vdi: vdi, chain: g.cluster.Chain(vdi.ID), pages: map[uint64][]uint32{}, disks: map[*Disk]struct{}{}, limiter: g.admit.limiterFor(vdi)}
		g.open[key] = state
	}
	state.refs++
	if readOnly {
		state.mu.Lock()
		state.readers++
		state.mu.Unlock()
	}
	g.mu.Unlock()
	if !readOnly {
		if err := g.writer.acquireWriter(ctx, state); err != nil {
			g.release(state, openAborted)
			return nil, err
		}
	}
	current, _ := state.current()
	client, _ := ctx.Value(clientKey{}).(string)
	d := &Disk{gateway: g, state: state, readOnly: readOnly, size: current.Size, client: client, since: time.Now()}
	state.mu.Lock()
	state.disks[d] = struct{}{}
	state.mu.Unlock()
	return d, nil
}

// lockGrace is how long a writable open waits for another node's writer
// to let go before it is refused: a client that has just closed the VDI
// there (qemu stopped on one host and started on the next) has sent its
// disconnect, but the lock's release may still be on its way through the
// cluster log.
const lockGrace = 2 * time.Second

// acquireLock takes the VDI's writer lock, waiting up to lockGrace while
// another node holds it.
func (wl *writerLock) acquireLock(ctx context.Context, name string) (cluster.Lock, error) {
	deadline := time.Now().Add(lockGrace)
	for {
		l, err := wl.cluster.AcquireLock(ctx, cluster.VDILockKey(name), wl.session)
		if !errors.Is(err, cluster.ErrLockHeld) || time.Now().After(deadline) {
			return l, err
		}
		select {
		case <-ctx.Done():
			return l, err
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// acquireWriter makes a writable open of state: it takes the VDI's
// writer lock when it is free (or already this node's). When another node
// holds it, an exclusive VDI is refused (ErrBusy, naming the holder); any
// other opens on standby and takes the lock over with its first change
// (handover.go).
func (wl *writerLock) acquireWriter(ctx context.Context, state *vdiState) error {
	state.openMu.Lock()
	defer state.openMu.Unlock()
	state.mu.Lock()
	held, name := state.lockHeld, state.vdi.Name
	state.mu.Unlock()
	if !held {
		vdi, err := wl.cluster.VDI(name)
		if err != nil {
			return fmt.Errorf("%w: %v", ErrUnknownVDI, err)
		}
		var l cluster.Lock
		if vdi.Exclusive {
			l, err = wl.acquireLock(ctx, name)
		} else {
			l, err = wl.cluster.AcquireLock(ctx, cluster.VDILockKey(name), wl.session)
		}
		switch {
		case err == nil:
			if err := wl.take(ctx, state, l); err != nil {
				return err
			}
		case errors.Is(err, cluster.ErrLockHeld) && !vdi.Exclusive:
			// Standby: the holder hands the lock over on our first
			// change. The refusal is not always a cluster.LockHeldError:
			// an acquire that this node sent to the leader because it
			// had not applied another node's grant yet (two opens
			// through two nodes a few milliseconds apart) is refused
			// there, and the refusal comes back as an error code. It
			// is the same refusal: the lock is held, and that holder's
			// watcher hands it over once it has taken it (it sees a
			// wish recorded before it started).
		case errors.Is(err, cluster.ErrLockHeld):
			return fmt.Errorf("%w: vdi %q is exclusive and open for writing through %s; open it read-only as %q, or close it there first (`herd vdi set %s --exclusive=false` lets a second writer take it over, as live migration needs)",
				ErrBusy, name, wl.lockHolder(ctx, name, err), ReadOnlyPrefix+name, name)
		default:
			return fmt.Errorf("%w: cannot lock vdi %q: %v", ErrNotReady, name, err)
		}
	}
	state.mu.Lock()
	state.writers++
	state.mu.Unlock()
	return nil
}

// lockHolderWait bounds how long lockHolder waits for this node to apply
// the grant that the leader refused an acquire for.
const lockHolderWait = time.Second

// lockHolder names the node that holds VDI name's writer lock, for an
// error that refused it (cluster.ErrLockHeld), as "node ID (ADDRESS)".
// A refusal made on this node carries the lock (cluster.LockHeldError);
// one the leader made, for an acquire or want this node forwarded, comes
// back as an error code and a message, and this node's applied state
// names the holder once it has applied the grant (waited for up to
// lockHolderWait).
func (wl *writerLock) lockHolder(ctx context.Context, name string, err error) string {
	var lockHeld *cluster.LockHeldError
	holder := ""
	if errors.As(err, &lockHeld) {
		holder = lockHeld.Lock.Node
	} else {
		self := wl.cluster.ID()
		wait, cancel := context.WithTimeout(ctx, lockHolderWait)
		l, held, werr := wl.cluster.WaitLock(wait, cluster.VDILockKey(name), func(l cluster.Lock, held bool) bool {
			return held && (l.Node != self || l.Session != wl.session)
		})
		cancel()
		if werr != nil || !held {
			return "another node"
		}
		holder = l.Node
	}
	if n, ok := wl.cluster.Node(holder); ok {
		return fmt.Sprintf("node %s (%s)", n.ID, n.Address)
	}
	return "node " + holder
}

// openKind says which open release undoes.
type openKind int

const (
	openReader  openKind = iota
	openWriter           // held the VDI's lock
	openAborted          // a writable open that failed to take the lock
)

// release drops one open; the last writer releases the cluster lock.
func (g *Gateway) release(state *vdiState, kind openKind) {
	state.openMu.Lock()
	defer state.openMu.Unlock()
	state.mu.Lock()
	switch kind {
	case openWriter:
		state.writers--
	case openReader:
		state.readers--
	}
	releaseLock := kind == openWriter && state.writers == 0 && state.lockHeld
	if releaseLock && state.vdi.EC != "" {
		// Erasure-coded: the overlays are folded while the lock is
		// still ours (ec.go).
		state.mu.Unlock()
		g.ecFoldClosing(state)
		state.mu.Lock()
	}
	if releaseLock {
		state.lockHeld = false
		if state.stopWatch != nil {
			state.stopWatch()
			state.stopWatch = nil
		}
	}
	name, vdi, chain := state.vdi.Name, state.vdi, state.chain
	state.mu.Unlock()
	if releaseLock {
		// The writes still on their way to other zones land before the
		// lock goes (lag.go, rule 1); one that cannot leaves its object
		// suspect, repaired below.
		drain, cancelDrain := context.WithTimeout(context.Background(), g.options.RetryTimeout)
		if err := g.lag.drain(drain); err != nil {
			g.logger.Warn("gateway: writes acknowledged in this zone did not all reach the other zones before the close", "vdi", name, "err", err)
		}
		cancelDrain()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if !g.heal.repairSuspects(ctx, vdi, chain) {
			// Its replicas may differ: the next writer must repair it.
			// If even that cannot be recorded, the lock stays ours; it
			// goes (marking the VDI unclean) when this node leaves or
			// restarts.
			if err := g.cluster.MarkVDIUnclean(ctx, name); err != nil {
				g.logger.Error("gateway: vdi has objects whose replicas may differ, and marking it unclean failed: keeping its lock", "vdi", name, "err", err)
				state.mu.Lock()
				state.lockHeld = true
				state.mu.Unlock()
				releaseLock = false
			} else {
				g.logger.Warn("gateway: vdi marked unclean: objects whose replicas may differ could not be repaired; its next writer repairs it", "vdi", name)
			}
		}
	}
	if releaseLock {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := g.cluster.ReleaseLock(ctx, cluster.VDILockKey(name), g.session); err != nil && !errors.Is(err, cluster.ErrNotFound) {
			// The lock also goes when this node leaves the cluster.
			g.logger.Warn("gateway: releasing vdi lock failed", "vdi", name, "err", err)
		}
	}
	g.mu.Lock()
	state.refs--
	if state.refs == 0 {
		if g.open[state.key] == state {
			delete(g.open, state.key)
		}
		g.admit.dropLimiter(state.limiter)
	}
	g.mu.Unlock()
}

// Snapshot takes a snapshot of a VDI. If this node holds the VDI open for
// writing, its writes are paused while the snapshot commits, so the
// snapshot holds exactly the writes completed before it; afterwards the
// open VDI continues as the new writable child. The caller (the admin
// API) sends the request to the lock holder's node when there is one.
func (g *Gateway) Snapshot(ctx context.Context, name, tag string) (cluster.SnapshotResult, error) {
	// The holder seen when the snapshot was prepared may have changed by
	// the time it commits: most often a writer that just closed (its
	// release commits after the client saw the close), or a handover.
	// The log refuses such a snapshot; prepared again, it sees the new
	// holder.
	for attempt := 1; ; attempt++ {
		result, err := g.snapshotOnce(ctx, name, tag)
		if err == nil || attempt == 10 || !errors.Is(err, cluster.ErrBusy) || !strings.Contains(err.Error(), "changed hands") {
			return result, err
		}
		select {
		case <-ctx.Done():
			return result, err
		case <-time.After(time.Duration(attempt) * 20 * time.Millisecond):
		}
	}
}

func (g *Gateway) snapshotOnce(ctx context.Context, name, tag string) (cluster.SnapshotResult, error) {
	g.mu.Lock()
	state := g.open[name]
	g.mu.Unlock()
	if state != nil {
		state.mu.Lock()
		writing := state.lockHeld
		state.mu.Unlock()
		if writing {
			state.io.Lock()
			defer state.io.Unlock()
			// The snapshot's objects are complete in every zone.
			if err := g.lag.drain(ctx); err != nil {
				return cluster.SnapshotResult{}, err
			}
			if state.standby() {
				// Handed over while the snapshot waited for the writes.
				return g.cluster.SnapshotVDI(ctx, name, tag, "")
			}
			result, err := g.cluster.SnapshotVDI(ctx, name, tag, g.cluster.ID())
			if err != nil {
				return result, err
			}
			state.mu.Lock()
			state.vdi = result.VDI
			state.chain = append([]uint32{result.VDI.ID}, state.chain...)
			state.mu.Unlock()
			return result, nil
		}
	}
	return g.cluster.SnapshotVDI(ctx, name, tag, "")
}

// entry returns the map entry of data object index in VDI vdi's own map.
func (g *Gateway) entry(ctx context.Context, state *vdiState, vdi cluster.VDI, id, index uint32, refresh bool) (uint32, error) {
	page := index / pageEntries
	key := pageKey(id, page)
	state.mu.Lock()
	entries, ok := state.pages[key]
	gen := state.pagesGen
	state.mu.Unlock()
	if !ok || refresh {
		var err error
		if entries, err = g.loadPage(ctx, vdi, id, page); err != nil {
			return 0, err
		}
		state.mu.Lock()
		switch old, ok := state.pages[key]; {
		case state.pagesGen != gen:
			// The cache was emptied while this page loaded (a takeover
			// of the lock): what was read may be older than what the
			// new view must see. Use it for this request, keep nothing.
		case ok && !refresh:
			entries = old // another loader won; keep its (possibly newer) entries
		default:
			state.pages[key] = entries
		}
		state.mu.Unlock()
	}
	state.mu.Lock()
	defer state.mu.Unlock()
	return entries[index%pageEntries], nil
}

// resolve returns the VDI whose copy of object index this VDI reads: its
// own, an ancestor's, or 0 for zeros.
func (g *Gateway) resolve(ctx context.Context, state *vdiState, vdi cluster.VDI, chain []uint32, index uint32, refresh bool) (uint32, error) {
	for depth, id := range chain {
		e, err := g.entry(ctx, state, vdi, id, index, refresh && depth == 0)
		if err != nil {
			return 0, err
		}
		switch e {
		case 0:
			continue
		case objmap.Tombstone:
			return 0, nil
		default:
			return e, nil
		}
	}
	return 0, nil
}

// loadPage reads one page of a VDI's object map from the map object's
// replicas; a missing map object means a page of inherited entries.
func (g *Gateway) loadPage(ctx context.Context, vdi cluster.VDI, id, page uint32) ([]uint32, error) {
	first := page * pageEntries
	k, offset := objmap.Location(first, vdi.ObjectSize)
	raw := make([]byte, pageEntries*objmap.EntryBytes)
	err := g.read(ctx, object.MapOID(object.VDIID(id), k), vdi.Copies, raw, offset)
	if errors.Is(err, object.ErrNoObject) {
		err = nil // never written
		clear(raw)
	}
	if err != nil {
		return nil, err
	}
	entries := make([]uint32, pageEntries)
	for i := range entries {
		entries[i] = objmap.Entry(raw, i)
	}
	return entries, nil
}

// setEntry records object index's entry in VDI id's own map.
func (g *Gateway) setEntry(ctx context.Context, state *vdiState, vdi cluster.VDI, id, index, value uint32, sync bool) error {
	return g.putEntry(ctx, state, vdi, id, index, value, func(oid object.OID, raw []byte, offset uint32, flags object.Flags) error {
		flags = flags.With(object.FlagSync, sync)
		return g.write(ctx, oid, vdi.Copies, raw, offset, flags)
	})
}

// setEntryNear is setEntry in zone mode (lag.go): acknowledged once this
// zone's replicas have it, landing in the other zones after data (the
// far part of the object's data, if any).
func (g *Gateway) setEntryNear(ctx context.Context, state *vdiState, vdi cluster.VDI, id, index, value uint32, data *lagOp) error {
	return g.putEntry(ctx, state, vdi, id, index, value, func(oid object.OID, raw []byte, offset uint32, flags object.Flags) error {
		_, err := g.lag.writeNear(ctx, oid, vdi.Copies, raw, offset, flags, vdi.ObjectSize, data)
		return err
	})
}

func (g *Gateway) putEntry(ctx context.Context, state *vdiState, vdi cluster.VDI, id, index, value uint32, write func(oid object.OID, raw []byte, offset uint32, flags object.Flags) error) error {
	k, offset := objmap.Location(index, vdi.ObjectSize)
	raw := binary.BigEndian.AppendUint32(nil, value)
	// Without CREATE first: a replica new to the placement must receive a
	// whole copy of the map object, not start an empty one holding only
	// this entry. Only a map object that exists nowhere is created.
	err := write(object.MapOID(object.VDIID(id), k), raw, offset, 0)
	if errors.Is(err, object.ErrNoObject) {
		err = write(object.MapOID(object.VDIID(id), k), raw, offset, object.FlagCreate)
	}
	if err != nil {
		return err
	}
	state.mu.Lock()
	if entries, ok := state.pages[pageKey(id, index/pageEntries)]; ok {
		entries[index%pageEntries] = value
	}
	state.mu.Unlock()
	return nil
}

// remove deletes an object from every replica (absent copies are fine).
func (g *Gateway) remove(ctx context.Context, oid object.OID, copies int) error {
	if err := g.lag.wait(ctx, oid); err != nil {
		return err
	}
	err := g.replicate(ctx, oid, copies, func(ctx context.Context, node cluster.Node, rv *layout.Epoch) error {
		err := g.replicas.Remove(ctx, node, rv.Number, oid)
		if errors.Is(err, object.ErrNotFound) {
			return nil
		}
		return err
	})
	if err != nil {
		g.heal.suspect(oid, err)
	} else {
		// Gone everywhere: nothing can differ, and the far parts kept
		// for its repair, all older, are void (lag.go, rule 6).
		g.lag.forget(oid)
		g.heal.clearSuspect(oid)
	}
	return err
}

// Map reads a VDI's whole object map: entry i is the owner of object i
// (0: inherit or zeros, objmap.Tombstone: zeros).
func (g *Gateway) Map(ctx context.Context, v cluster.VDI) ([]uint32, error) {
	objects := (v.Size + v.ObjectSize - 1) / v.ObjectSize
	perMap := objmap.PerObject(v.ObjectSize)
	entries := make([]uint32, objects)
	for k := uint64(0); k*perMap < objects; k++ {
		count := min(perMap, objects-k*perMap)
		raw := make([]byte, count*objmap.EntryBytes)
		err := g.read(ctx, object.MapOID(object.VDIID(v.ID), uint32(k)), v.Copies, raw, 0)
		if errors.Is(err, object.ErrNoObject) {
			continue
		}
		if err != nil {
			return nil, err
		}
		for i := uint64(0); i < count; i++ {
			entries[k*perMap+i] = objmap.Entry(raw, int(i))
		}
	}
	return entries, nil
}

// ReadObject reads a piece of an object from one replica (see read).
func (g *Gateway) ReadObject(ctx context.Context, oid object.OID, copies int, p []byte, offset uint32) error {
	return g.read(ctx, oid, copies, p, offset)
}

// RemoveObject deletes an object from every replica.
func (g *Gateway) RemoveObject(ctx context.Context, oid object.OID, copies int) error {
	return g.remove(ctx, oid, copies)
}
