package store

import (
	"container/list"
	"errors"
	"io"
	"os"
	"sync"
	"sync/atomic"

	"github.com/herd-storage/herd/internal/object"
)

// handle is an open object file, shared by every request for that object
// while it is in the fd cache. There is at most one handle per object in
// the cache, so header stamps, dirty tracking and Remove coordinate through
// it without any lock shared by different objects.
//
// Life cycle: acquire puts a handle in its cache shard, the first acquirer
// opens (or creates) the file while the others wait on ready; every
// acquire is paired with a release. A handle leaves the cache when it is
// evicted (least recently used, and only when refs == 0, it is not dirty and
// not damaged), removed, or the store closes; its file is closed when it has
// left the cache and refs drops to 0, so no fd is ever closed under a
// goroutine that uses it.
type handle struct {
	oid   object.OID
	ready chan struct{} // closed when the opener has set the fields below

	// Set by the opener before ready is closed, read-only afterwards.
	err        error // the open failed; the handle never entered use
	file       *os.File
	disk       *diskState
	path       string
	fanout     int
	corrupt    error  // the header is bad: only Remove may use the handle
	dataStart  int64  // file offset of the object's byte 0 (header.go)
	legacy     bool   // a version 1 file: no checksums
	createGen  uint64 // the fan-out directory's change count this file's entry needs durable
	objectsGen uint64 // the same for objects/, in case the fan-out directory is new

	// refs, elem, inMap and closed are guarded by the cache shard's mu.
	refs   int
	elem   *list.Element // position in the shard's LRU list; nil while opening
	inMap  bool          // the shard's map points to this handle
	closed bool          // file has been closed

	// life is read-held by every operation for its duration and
	// write-held by Remove, so that an object is removed between
	// operations, never under one. removed is guarded by life.
	life    sync.RWMutex
	removed bool

	// epoch caches the header's epoch stamp (an object.Epoch: read it
	// with stamp, set it with setStamp) so that writes in the same epoch
	// do not rewrite the header. hdrMu serialises header rewrites;
	// hdrFlags (guarded by hdrMu) are the header's flags.
	epoch    atomic.Uint64
	hdrMu    sync.Mutex
	hdrFlags uint32

	// writeMu serialises changes to the copy's data and checksums (and
	// the second look of a read that saw a mismatch): see checksum.go.
	writeMu sync.Mutex
	// journaled: the disk's journal lists this object durably (so a write
	// need not ask it); cleared by a compaction that drops it.
	journaled atomic.Bool

	// Dirty tracking, see flush.go. dirtyGen counts completed writes,
	// syncedGen is the dirtyGen read before the last successful fdatasync
	// began, inDirty says the handle is in the store's dirty set. syncMu
	// serialises fdatasyncs of the file. damage is set when one failed.
	inDirty   atomic.Bool
	dirtyGen  atomic.Uint64
	syncedGen atomic.Uint64
	syncMu    sync.Mutex
	damage    atomic.Pointer[ObjectError]
}

// stamp is the copy's cached epoch stamp.
func (h *handle) stamp() object.Epoch { return object.Epoch(h.epoch.Load()) }

// setStamp caches the copy's epoch stamp.
func (h *handle) setStamp(epoch object.Epoch) { h.epoch.Store(uint64(epoch)) }

// usable returns the error that forbids reading or writing the object's
// copy, if any.
func (h *handle) usable() error {
	if h.corrupt != nil {
		return h.corrupt
	}
	if damage := h.damage.Load(); damage != nil {
		return damage
	}
	return nil
}

// evictable reports whether the cache may close h. The caller holds the
// shard's mu. A dirty handle stays open until Flush has synced it, so that
// Flush never has to reopen a file (an fdatasync through a new fd may miss
// a writeback error reported before it was opened). A damaged handle stays
// so that the damage is not forgotten.
func (h *handle) evictable() bool {
	return h.refs == 0 && !h.inDirty.Load() && h.damage.Load() == nil
}

// cacheShard is one part of the fd cache. Objects are spread over shards by
// a hash of their id so that requests for different objects rarely take
// the same mutex, and it is only held for map and list updates, never
// across I/O.
type cacheShard struct {
	mu       sync.Mutex
	handles  map[object.OID]*handle // mu guards handles and lru
	lru      list.List              // open handles, most recently used first
	capacity int
	_        [64]byte // keep shards on separate cache lines
}

// access says what acquire does with a missing object or a bad header.
type access int

const (
	accessExisting access = iota // missing: ErrNotFound
	accessCreate                 // missing: create it
	accessRemove                 // missing: ErrNotFound; a bad header is fine
)

// shardCounts splits openFiles over shards: up to 64 shards of at least 16
// files, so that a small cache stays (nearly) a true LRU.
func shardCounts(openFiles int) (shards, capacity int) {
	shards = 1
	for shards < 64 && openFiles/(shards*2) >= 16 {
		shards *= 2
	}
	return shards, openFiles / shards
}

func (s *Store) shard(oid object.OID) *cacheShard {
	return &s.shards[mix64(uint64(oid))&uint64(len(s.shards)-1)]
}

// acquire returns the handle of object oid with a reference, opening or
// (with accessCreate) creating the file if it is not in the cache. epoch
// stamps a created object. The caller must release the handle and must
// check usable() unless it is Remove.
func (s *Store) acquire(op string, epoch object.Epoch, oid object.OID, mode access) (*handle, error) {
	shard := s.shard(oid)
	for {
		shard.mu.Lock()
		if s.closed.Load() {
			shard.mu.Unlock()
			return nil, &ObjectError{Op: op, OID: oid, Kind: ErrClosed}
		}
		if h := shard.handles[oid]; h != nil {
			h.refs++
			if h.elem != nil {
				shard.lru.MoveToFront(h.elem)
			}
			shard.mu.Unlock()
			<-h.ready
			if h.err != nil {
				s.release(h)
				if mode == accessCreate && errors.Is(h.err, ErrNotFound) {
					continue // another request looked without creating; create it now
				}
				return nil, h.err
			}
			return h, nil
		}
		h := &handle{oid: oid, ready: make(chan struct{}), refs: 1, inMap: true}
		shard.handles[oid] = h
		shard.mu.Unlock()

		// Open outside the shard's lock: other objects of the shard are
		// not held up by this one's I/O.
		err := s.open(h, mode, epoch)

		var victims []*handle
		shard.mu.Lock()
		if err != nil {
			h.err = err
			if h.inMap {
				delete(shard.handles, oid)
				h.inMap = false
			}
		} else if h.inMap { // not dropped by Close meanwhile
			h.elem = shard.lru.PushFront(h)
			victims = shard.evictLocked()
		}
		shard.mu.Unlock()
		close(h.ready)
		s.closeHandles(victims)
		if err != nil {
			s.release(h)
			return nil, err
		}
		return h, nil
	}
}

// release drops a reference taken by acquire (or by Flush).
func (s *Store) release(h *handle) {
	shard := s.shard(h.oid)
	var victims []*handle
	shard.mu.Lock()
	h.refs--
	if h.refs < 0 {
		shard.mu.Unlock()
		panic("store: handle released more often than acquired")
	}
	if h.refs == 0 {
		if !h.inMap {
			if !h.closed && h.file != nil {
				h.closed = true
				victims = append(victims, h)
			}
		} else if shard.lru.Len() > shard.capacity {
			victims = shard.evictLocked()
		}
	}
	shard.mu.Unlock()
	s.closeHandles(victims)
}

// evictLocked takes least recently used handles out of the cache until it
// is within capacity or only handles in use, dirty or damaged are left.
// The caller holds mu and closes the returned handles after unlocking it.
// The cache may exceed its capacity while requests hold handles or
// writes are waiting for a Flush; Store.markDirty starts a background
// flush when too many are dirty.
func (shard *cacheShard) evictLocked() []*handle {
	var victims []*handle
	for e := shard.lru.Back(); e != nil && shard.lru.Len() > shard.capacity; {
		previous := e.Prev()
		h := e.Value.(*handle)
		if h.evictable() {
			shard.lru.Remove(e)
			h.elem = nil
			delete(shard.handles, h.oid)
			h.inMap = false
			h.closed = true
			victims = append(victims, h)
		}
		e = previous
	}
	return victims
}

// drop takes h out of the cache (Remove, Close). Its file is closed now if
// no one uses it, otherwise by the last release.
func (s *Store) drop(h *handle) {
	shard := s.shard(h.oid)
	var victims []*handle
	shard.mu.Lock()
	if h.inMap {
		if shard.handles[h.oid] == h {
			delete(shard.handles, h.oid)
		}
		h.inMap = false
		if h.elem != nil {
			shard.lru.Remove(h.elem)
			h.elem = nil
		}
	}
	if h.refs == 0 && !h.closed && h.file != nil {
		h.closed = true
		victims = append(victims, h)
	}
	shard.mu.Unlock()
	s.closeHandles(victims)
}

// closeHandles closes the files of handles that have left the cache. A
// close error is only logged: the handle is clean (never dirty when
// evicted), so close cannot lose data that a Flush promised.
func (s *Store) closeHandles(handles []*handle) {
	for _, h := range handles {
		if err := h.file.Close(); err != nil {
			s.logger.Warn("store: closing object file", "oid", oidString(h.oid), "path", h.path, "err", err)
		}
		s.openFiles.Add(-1)
	}
}

// open finds object oid on the disks, or creates it with mode accessCreate,
// and fills h.
func (s *Store) open(h *handle, mode access, epoch object.Epoch) error {
	var orderArray [8]*diskState
	order := probeOrder(s.disks, h.oid, orderArray[:0])
	var create *diskState // the first disk in service, in probe order
	for i, d := range order {
		if d.failed.Load() {
			continue
		}
		if create == nil {
			create = d
		}
		path := d.objectPath(h.oid)
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		if err == nil {
			if i > 0 {
				s.logger.Debug("store: object found on another disk than rendezvous hashing chooses",
					"oid", oidString(h.oid), "path", path, "expected", order[0].root)
			}
			return s.attach(h, d, path, f)
		}
		if !errors.Is(err, os.ErrNotExist) {
			err = objectError("open", h.oid, path, err)
			if errors.Is(err, ErrIO) {
				s.failDisk(d, err)
				continue
			}
			return err
		}
	}
	if mode != accessCreate {
		return &ObjectError{Op: "open", OID: h.oid, Kind: ErrNotFound}
	}
	if create == nil {
		return &ObjectError{Op: "create", OID: h.oid, Kind: ErrIO, Err: errors.New("no disk of this node is in service")}
	}
	return s.create(h, create, epoch)
}

// attach reads and checks the header of an existing object file and fills h.
// A bad header does not fail the open: it is recorded in h.corrupt so that
// every access reports ErrCorrupt and Remove can still delete the file.
func (s *Store) attach(h *handle, d *diskState, path string, f *os.File) error {
	var buffer [headerLength]byte
	n, err := f.ReadAt(buffer[:], 0)
	if err != nil && !errors.Is(err, io.EOF) {
		f.Close()
		return objectError("read header", h.oid, path, err)
	}
	hdr, err := decodeHeader(buffer[:n], h.oid)
	if err != nil {
		h.corrupt = &ObjectError{Op: "open", OID: h.oid, Path: path, Kind: ErrCorrupt, Err: err}
		s.logger.Warn("store: object header is corrupt", "oid", oidString(h.oid), "path", path, "err", err)
	}
	h.file, h.disk, h.path = f, d, path
	h.fanout = fanoutIndex(h.oid)
	h.dataStart, h.legacy = hdr.dataStart(), hdr.legacy
	// The file may have been created by this process since the last
	// directory sync (then evicted and reopened): assume it was, at the
	// cost of one more directory fsync after a create in the same
	// directory. Files from before Open are durable (Open calls syncfs).
	h.createGen = d.fanout[h.fanout].changed.Load()
	h.objectsGen = d.objectsDir.changed.Load()
	h.setStamp(hdr.epoch)
	h.hdrFlags = hdr.flags
	s.openFiles.Add(1)
	return nil
}

// createLegacy makes create write copies without checksums (format
// version 1): the benchmarks' baseline in the same binary.
var createLegacy bool

// BenchmarkWithoutChecksums makes every copy this process creates from
// now on a copy without checksums (format version 1, read unverified),
// as herd wrote before checksums. It exists only so that benchmarks can
// measure what checksums cost with one binary (bench/ab.sh, env
// HERD_BENCH_NO_CHECKSUMS=1); the first scrub pass would add them.
func BenchmarkWithoutChecksums() { createLegacy = true }

// create makes a new object file on disk d with its header stamped epoch.
func (s *Store) create(h *handle, d *diskState, epoch object.Epoch) error {
	if err := s.checkReserve(d, h.oid); err != nil {
		return err
	}
	path := d.objectPath(h.oid)
	fanout := fanoutIndex(h.oid)
	var f *os.File
	for attempt := 0; ; attempt++ {
		var err error
		f, err = os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, fileMode)
		if err == nil {
			break
		}
		if errors.Is(err, os.ErrNotExist) && attempt == 0 {
			// The first object of this fan-out directory. Count the
			// change of objects/ even if a concurrent create made the
			// directory: that one may not have counted it yet.
			if err := os.Mkdir(d.fanoutPath(fanout), dirMode); err != nil && !errors.Is(err, os.ErrExist) {
				return objectError("create", h.oid, path, err)
			}
			d.objectsDir.changed.Add(1)
			continue
		}
		if errors.Is(err, os.ErrExist) {
			// Created behind this store's back (another process on the
			// same disk): use it as it is.
			f, err = os.OpenFile(path, os.O_RDWR, 0)
			if err != nil {
				return objectError("open", h.oid, path, err)
			}
			return s.attach(h, d, path, f)
		}
		return objectError("create", h.oid, path, err)
	}
	hdr := header{oid: h.oid, epoch: epoch, legacy: createLegacy}
	encoded := hdr.encode()
	if _, err := f.WriteAt(encoded[:], 0); err != nil {
		f.Close()
		if removeErr := os.Remove(path); removeErr != nil {
			s.logger.Error("store: removing a half-created object", "oid", oidString(h.oid), "path", path, "err", removeErr)
		}
		d.fanout[fanout].changed.Add(1)
		return objectError("create", h.oid, path, err)
	}
	h.file, h.disk, h.path, h.fanout = f, d, path, fanout
	h.dataStart, h.legacy = hdr.dataStart(), hdr.legacy
	h.createGen = d.fanout[fanout].changed.Add(1)
	h.objectsGen = d.objectsDir.changed.Load()
	h.setStamp(epoch)
	s.openFiles.Add(1)
	s.markDirty(h) // the header is not durable yet
	return nil
}
