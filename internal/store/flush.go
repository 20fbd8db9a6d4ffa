package store

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/herd-storage/herd/internal/object"
)

// Dirty tracking and Flush.
//
// The promise (DESIGN.md, "Consistency and durability promises"): when
// Flush returns nil, every write acknowledged before Flush was called is on
// stable storage. How it is kept:
//
//  1. A write marks its handle dirty after its pwrite returned and before it
//     returns (markDirty): dirtyGen++, and the handle enters the dirty set
//     unless it is in it already (inDirty).
//  2. A flush round takes the whole dirty set, then for each handle clears
//     inDirty, reads dirtyGen and fdatasyncs the file (unless an fdatasync
//     that began after that generation already succeeded: syncedGen). A
//     write that saw inDirty set before the round cleared it incremented
//     dirtyGen before, so the round's fdatasync covers it; a write that
//     sees it clear puts the handle in the next round's set. So a write
//     concurrent with Flush is synced by this round or the next, never
//     lost from the set.
//  3. Rounds run one at a time, and a Flush waits for a round that starts
//     after it was called (several callers share it). A round that began
//     earlier may have taken a handle out of the set, so a later caller must
//     not start before that round has finished syncing it.
//  4. Directory entries: a round fsyncs every fan-out directory (and
//     objects/) whose entries changed since its last fsync (dirState).
//
// A failed fdatasync cannot be retried: Linux marks the dirty pages clean
// (or drops them) after reporting the error once, so a second fdatasync
// would succeed without the data being on disk (the PostgreSQL "fsyncgate"
// of 2018). The copy is then marked damaged (in memory, and in its header
// when that still works), it is never read again, and every later Flush
// reports it until it is removed: a write acknowledged before any of those
// Flush calls may be the one the kernel lost.

// flushParallel bounds the fdatasyncs and fsyncs a round runs at once: enough
// to keep an NVMe queue busy, few enough not to flood a disk with threads
// (each blocked syscall holds an OS thread).
const flushParallel = 16

// errorsReportedMax bounds the errors one Flush returns; a dead disk could
// otherwise produce one per dirty object.
const errorsReportedMax = 8

// dirtyShard holds part of the dirty set. Sharded like the cache, so
// that the first write to an object after a flush rarely waits for
// another object's.
type dirtyShard struct {
	mu      sync.Mutex
	handles []*handle // mu guards handles
	_       [64]byte
}

// flushRound is one pass over the dirty set, shared by the Flush calls
// that wait for it.
type flushRound struct {
	done    chan struct{} // closed when err is set
	started bool          // guarded by Store.flushMu
	err     error
}

// markDirty records that h's file has data not yet synced. The caller has
// completed the write (pwrite, fallocate) and holds a reference on h.
func (s *Store) markDirty(h *handle) {
	h.dirtyGen.Add(1)
	if h.inDirty.Load() || !h.inDirty.CompareAndSwap(false, true) {
		return
	}
	shard := &s.dirty[mix64(uint64(h.oid))&uint64(len(s.dirty)-1)]
	shard.mu.Lock()
	shard.handles = append(shard.handles, h)
	shard.mu.Unlock()
	// Dirty handles cannot be evicted. When many are waiting, write them
	// back in the background so that the fd cache stays near its size.
	if s.dirtyCount.Add(1) > int64(s.writebackThreshold) && s.writebackRunning.CompareAndSwap(false, true) {
		s.startWriteback()
	}
}

// startWriteback runs a flush round in the background, unless the store is
// closing (Close waits for the ones started before).
func (s *Store) startWriteback() {
	s.backgroundMu.Lock()
	defer s.backgroundMu.Unlock()
	if s.closed.Load() {
		s.writebackRunning.Store(false)
		return
	}
	s.background.Add(1)
	go func() {
		defer s.background.Done()
		defer s.writebackRunning.Store(false)
		if err := s.flush(); err != nil {
			s.logger.Error("store: background writeback failed", "err", err)
		}
	}()
}

// syncFile makes every write to h completed before the call durable, with
// one fdatasync unless one that began later has already succeeded.
func (s *Store) syncFile(h *handle) error {
	if damage := h.damage.Load(); damage != nil {
		return damage
	}
	generation := h.dirtyGen.Load()
	if h.syncedGen.Load() >= generation {
		return nil
	}
	h.syncMu.Lock()
	defer h.syncMu.Unlock()
	if damage := h.damage.Load(); damage != nil {
		return damage
	}
	if h.syncedGen.Load() >= generation {
		return nil
	}
	generation = h.dirtyGen.Load() // every write counted now precedes the fdatasync
	if err := s.datasync(h.file); err != nil {
		return s.markDamaged(h, err)
	}
	h.syncedGen.Store(generation)
	return nil
}

// syncEntry makes h's directory entry durable if it may not be: after the
// file was created, and after its fan-out directory was.
func (s *Store) syncEntry(op string, h *handle) error {
	d := h.disk
	if d.fanout[h.fanout].needsSync(h.createGen) {
		path := d.fanoutPath(h.fanout)
		if err := d.fanout[h.fanout].sync(path, s.dirsync); err != nil {
			return objectError(op, h.oid, path, err)
		}
	}
	if d.objectsDir.needsSync(h.objectsGen) {
		if err := d.objectsDir.sync(d.objects, s.dirsync); err != nil {
			return objectError(op, h.oid, d.objects, err)
		}
	}
	return nil
}

// syncObject makes h durable: data, header and directory entries.
func (s *Store) syncObject(op string, h *handle) error {
	if err := s.syncFile(h); err != nil {
		return err
	}
	return s.syncEntry(op, h)
}

// markDamaged records a failed fdatasync of h (see the comment at the top
// of this file) and returns the error to report.
func (s *Store) markDamaged(h *handle, cause error) error {
	damage := &ObjectError{
		Op: "sync", OID: h.oid, Path: h.path, Kind: ErrCorrupt,
		Err: &classifiedError{kind: classify(cause), err: fmt.Errorf("fdatasync failed, written data may be lost: %w", cause)},
	}
	if !h.damage.CompareAndSwap(nil, damage) {
		return h.damage.Load()
	}
	s.damagedMu.Lock()
	s.damaged[h.oid] = damage
	s.damagedMu.Unlock()
	s.logger.Error("store: object copy damaged by a failed sync; it must be recovered from another replica",
		"oid", oidString(h.oid), "path", h.path, "err", cause)

	// Persist the mark, so that the copy is refused after a restart too.
	// Best effort: the disk is failing, and the in-memory mark already
	// protects this process.
	h.hdrMu.Lock()
	h.hdrFlags |= headerDamaged
	encoded := header{flags: h.hdrFlags, oid: h.oid, epoch: h.stamp(), legacy: h.legacy}.encode()
	_, err := h.file.WriteAt(encoded[:], 0)
	h.hdrMu.Unlock()
	if err == nil {
		err = s.datasync(h.file)
	}
	if err != nil {
		s.logger.Error("store: could not mark the damaged copy in its header", "oid", oidString(h.oid), "path", h.path, "err", err)
	}
	return damage
}

// forgetDamage drops the damage record of a removed handle.
func (s *Store) forgetDamage(h *handle) {
	damage := h.damage.Load()
	if damage == nil {
		return
	}
	s.damagedMu.Lock()
	if s.damaged[h.oid] == damage {
		delete(s.damaged, h.oid)
	}
	s.damagedMu.Unlock()
}

// Flush makes every write acknowledged before the call durable: it
// fdatasyncs every object file written, created, punched or restamped
// since the last flush and fsyncs the directories where objects were
// created or removed. Calls may overlap; overlapping calls share work. An
// error means some write may not be durable; it names the objects (each an
// *ObjectError). A copy whose sync failed is reported by every Flush until
// it is removed.
func (s *Store) Flush() error {
	if s.closed.Load() {
		return ErrClosed
	}
	return s.flush()
}

// flush runs or joins a round that starts after the call (point 3 above).
func (s *Store) flush() error {
	s.flushMu.Lock()
	round := s.flushNext
	if round == nil {
		round = &flushRound{done: make(chan struct{})}
		s.flushNext = round
	}
	for s.flushRunning != nil && !round.started {
		running := s.flushRunning
		s.flushMu.Unlock()
		<-running.done
		s.flushMu.Lock()
	}
	if round.started {
		s.flushMu.Unlock()
		<-round.done
		return round.err
	}
	round.started = true
	s.flushNext = nil
	s.flushRunning = round
	s.flushMu.Unlock()

	round.err = s.flushRound()
	if round.err == nil {
		s.compactJournals()
	}

	s.flushMu.Lock()
	s.flushRunning = nil
	s.flushMu.Unlock()
	close(round.done)
	return round.err
}

// compactJournals rewrites each journal that lists more than
// journalCompactAt objects with only those that have unsynced writes now
// (journal.go). Writes to the disk wait meanwhile, so none runs between
// the list and the rewrite. The caller is the running flush round.
func (s *Store) compactJournals() {
	for _, d := range s.disks {
		if d.failed.Load() || d.journal.size() <= journalCompactAt {
			continue
		}
		d.journal.gate.Lock()
		var keep []object.OID
		for i := range s.dirty {
			shard := &s.dirty[i]
			shard.mu.Lock()
			for _, h := range shard.handles {
				if h.disk == d {
					keep = append(keep, h.oid)
				}
			}
			shard.mu.Unlock()
		}
		err := d.journal.rewrite(keep)
		if err == nil {
			kept := make(map[object.OID]bool, len(keep))
			for _, oid := range keep {
				kept[oid] = true
			}
			for i := range s.shards {
				shard := &s.shards[i]
				shard.mu.Lock()
				for oid, h := range shard.handles {
					// elem is set once the opener filled h.disk.
					if h.elem != nil && h.disk == d && !kept[oid] {
						h.journaled.Store(false)
					}
				}
				shard.mu.Unlock()
			}
		}
		d.journal.gate.Unlock()
		if err != nil {
			// The longer journal stays: a restart re-hashes more.
			s.logger.Warn("store: compacting the journal", "disk", d.root, "err", err)
		}
	}
}

// flushRound syncs the current dirty set and changed directories.
func (s *Store) flushRound() error {
	var handles []*handle
	for i := range s.dirty {
		shard := &s.dirty[i]
		shard.mu.Lock()
		handles = append(handles, shard.handles...)
		clear(shard.handles)
		if cap(shard.handles) > 1024 {
			shard.handles = nil // do not keep a burst's array forever
		} else {
			shard.handles = shard.handles[:0]
		}
		shard.mu.Unlock()
	}
	s.dirtyCount.Add(-int64(len(handles)))

	// Directories are listed after the handles were taken: a create
	// counts its directory change before it marks its handle dirty.
	type dirTask struct {
		dir  *dirState
		path string
	}
	var dirs []dirTask
	for _, d := range s.disks {
		if d.failed.Load() {
			continue
		}
		for i := range d.fanout {
			if d.fanout[i].needsSync(d.fanout[i].changed.Load()) {
				dirs = append(dirs, dirTask{&d.fanout[i], d.fanoutPath(i)})
			}
		}
		if d.objectsDir.needsSync(d.objectsDir.changed.Load()) {
			dirs = append(dirs, dirTask{&d.objectsDir, d.objects})
		}
	}

	var errs errorList
	parallel(len(handles)+len(dirs), func(i int) {
		if i < len(handles) {
			if h := handles[i]; h.disk != nil && h.disk.failed.Load() {
				// Reported by this flush, once: the copy is gone with its
				// disk and will be recovered from another replica.
				h.inDirty.Store(false)
				errs.add(&ObjectError{Op: "sync", OID: h.oid, Path: h.path, Kind: ErrIO, Err: fmt.Errorf("disk %s failed: written data lost on this node", h.disk.root)})
				s.drop(h)
				return
			}
			errs.add(s.flushHandle(handles[i]))
			return
		}
		task := dirs[i-len(handles)]
		if err := task.dir.sync(task.path, s.dirsync); err != nil {
			errs.add(fmt.Errorf("store: sync directory %s: %w", task.path, &classifiedError{kind: classify(err), err: err}))
		}
	})

	// Copies damaged by an earlier failed sync (see the top of this file).
	s.damagedMu.Lock()
	for _, damage := range s.damaged {
		errs.addOnce(damage)
	}
	s.damagedMu.Unlock()
	return errs.err()
}

// flushHandle syncs one handle taken from the dirty set.
func (s *Store) flushHandle(h *handle) error {
	// Pin the file before clearing inDirty, which is what kept the
	// cache from closing it.
	shard := s.shard(h.oid)
	shard.mu.Lock()
	if h.closed {
		shard.mu.Unlock()
		return nil // removed, or dropped by Close after its final flush
	}
	h.refs++
	shard.mu.Unlock()
	defer s.release(h)

	h.inDirty.Store(false)
	h.life.RLock()
	defer h.life.RUnlock()
	if h.removed {
		return nil
	}
	return s.syncFile(h)
}

// parallel calls task(0) ... task(n-1), at most flushParallel at once.
func parallel(n int, task func(i int)) {
	workers := min(n, flushParallel)
	if workers <= 1 {
		for i := 0; i < n; i++ {
			task(i)
		}
		return
	}
	var next atomic.Int64
	var wait sync.WaitGroup
	for range workers {
		wait.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				task(i)
			}
		})
	}
	wait.Wait()
}

// errorList collects the errors of a round, keeping the first few.
type errorList struct {
	mu      sync.Mutex
	errs    []error
	dropped int
}

func (l *errorList) add(err error) {
	if err == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.errs) < errorsReportedMax {
		l.errs = append(l.errs, err)
	} else {
		l.dropped++
	}
}

// addOnce adds err unless it is already in the list.
func (l *errorList) addOnce(err error) {
	l.mu.Lock()
	for _, e := range l.errs {
		if e == err {
			l.mu.Unlock()
			return
		}
	}
	l.mu.Unlock()
	l.add(err)
}

func (l *errorList) err() error {
	if l.dropped > 0 {
		return errors.Join(append(l.errs, fmt.Errorf("store: and %d more errors", l.dropped))...)
	}
	return errors.Join(l.errs...)
}
