package store

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/herd-storage/herd/internal/invariants"
	"github.com/herd-storage/herd/internal/object"
	"golang.org/x/sys/unix"
)

// MaxObjectSize bounds an object: offset+length of every request must not
// exceed it. The cluster's object size (4 MiB by default, configurable per
// VDI) is not known to the store.
const MaxObjectSize = 256 << 20

// reserveDefaultMax is the largest default reserve (see Options.ReserveBytes).
const reserveDefaultMax = 1 << 30

// Disk is one local disk (a mounted file system, or a directory on one)
// given to the store.
type Disk struct {
	// Path is the directory; it must exist. The store keeps its objects in
	// Path/objects.
	Path string
	// Weight is the disk's share of new objects relative to the others;
	// 0 means the file system's size in bytes.
	Weight uint64
}

// Options configure Open.
type Options struct {
	// Disks are the disks of this node. Each object lives on one of them.
	Disks []Disk
	// Logger receives damage reports and unusual events; nil discards.
	Logger *slog.Logger
	// OpenFiles is the size of the fd cache (default 1024).
	OpenFiles int
	// ReserveBytes is the free space below which a disk refuses new
	// objects (writes to existing objects go on, so VDIs keep working
	// while an operator adds capacity). 0 means the default: 5% of the
	// disk, at most 1 GiB. A negative value disables the reserve.
	ReserveBytes int64
	// DiskSpace reports a disk's free and total space; nil uses statfs(2).
	// Tests inject a full disk with it.
	DiskSpace func(path string) (Space, error)
	// OnDiskFailure, if set, is called (in its own goroutine) when a disk
	// is taken out of service after an EIO: its copies are then missing,
	// to be recovered from other nodes onto the remaining disks.
	OnDiskFailure func(path string, cause error)
}

// A Write, WriteZeroes or Trim takes object.Flags: the change flags
// (object.ChangeFlags) mean
//
//   - FlagCreate creates the object if it does not exist; without it a
//     missing object gives ErrNotFound.
//   - FlagSync (force unit access) makes the operation durable before it
//     returns: the data, the header and, for a new object, its directory
//     entries.
//   - FlagNoHole makes WriteZeroes allocate the range (zeros are written)
//     instead of punching a hole. Ignored by Write and Trim.
//   - FlagFresh (for Write, with FlagCreate) empties a copy that exists
//     already before writing: the write starts the object, and what an
//     earlier failed change left must not show beside it. Ignored by
//     WriteZeroes and Trim.
//   - FlagRepair (Write, whole blocks): write only the blocks whose stored
//     bytes fail their checksum (see Store.Repair).
//
// Any other flag is refused (ErrInvalid). Flags are never stored.

// Info describes an object's copy.
type Info struct {
	// Epoch is the copy's epoch stamp: the epoch at which it was last
	// written (or restamped by SetEpoch after recovery).
	Epoch object.Epoch
	// LengthBytes is the object's length: the end of the highest byte
	// ever written. Bytes beyond it, and holes below it, read as zeros.
	LengthBytes uint64
	// AllocatedBytes is the disk space the file uses, header included
	// (st_blocks * 512).
	AllocatedBytes uint64
	// Damaged is set by List for a copy that cannot be read: corrupt
	// header, or a failed sync. It must be removed and recovered.
	Damaged bool
	// Digest fingerprints the copy's content (set by Stat; not by List):
	// a hash of its checksum table (contentDigest), equal for two copies
	// whose bytes read the same, whatever wrote them (writes, zeroes,
	// holes, a whole copy installed by Replace) and whatever their
	// stamps and lengths. Recovery compares it to tell a copy that
	// missed a change from one that did not (internal/recovery). 0: not
	// known (a copy written before checksums has no table).
	Digest uint64
}

// Store is the object store of one node. All its methods are safe for
// concurrent use, also on the same object: requests for different objects
// share no lock held across I/O, and requests for the same object run
// concurrently except Remove, which waits for them.
type Store struct {
	disks              []*diskState
	logger             *slog.Logger
	space              func(string) (Space, error)
	reserveBytes       int64
	writebackThreshold int
	onDiskFailure      func(path string, cause error)
	readFault          func(path string) error // tests: a failing disk

	shards     []cacheShard
	openFiles  atomic.Int64 // object files open now
	dirty      []dirtyShard
	dirtyCount atomic.Int64 // handles in the dirty set

	closed atomic.Bool
	// backgroundMu orders starting a background writeback (background.Add)
	// before Close's background.Wait, as sync.WaitGroup requires.
	backgroundMu     sync.Mutex
	background       sync.WaitGroup
	writebackRunning atomic.Bool

	// flushMu guards flushNext and flushRunning.
	flushMu      sync.Mutex
	flushNext    *flushRound // the round new Flush calls join; not started
	flushRunning *flushRound

	// damagedMu guards damaged: copies whose fdatasync failed.
	damagedMu sync.Mutex
	damaged   map[object.OID]*ObjectError

	// datasync and dirsync are fdatasync(2) and fsync(2); tests replace
	// them to count calls or inject failures.
	datasync func(*os.File) error
	dirsync  func(*os.File) error
}

// Open opens the store on its disks, creating the objects directories if
// needed. It first syncs each disk's file system (syncfs), so that whatever
// an earlier process left in the page cache is durable: afterwards the only
// state not on stable storage is what this Store wrote.
func Open(options Options) (*Store, error) {
	if options.OpenFiles < 0 {
		return nil, fmt.Errorf("%w: OpenFiles %d", ErrInvalid, options.OpenFiles)
	}
	if options.OpenFiles == 0 {
		options.OpenFiles = 1024
	}
	if options.Logger == nil {
		options.Logger = slog.New(slog.DiscardHandler)
	}
	if options.DiskSpace == nil {
		options.DiskSpace = statfsSpace
	}
	disks, err := openDisks(options.Disks, options.DiskSpace, options.Logger)
	if err != nil {
		return nil, err
	}
	for _, d := range disks {
		if err := syncfs(d.root); err != nil {
			return nil, fmt.Errorf("store: disk %s: %w", d.root, &classifiedError{kind: classify(err), err: err})
		}
	}
	shardCount, capacity := shardCounts(options.OpenFiles)

	s := &Store{
		disks:              disks,
		logger:             options.Logger,
		space:              options.DiskSpace,
		reserveBytes:       options.ReserveBytes,
		onDiskFailure:      options.OnDiskFailure,
		writebackThreshold: max(options.OpenFiles/2, 1),
		shards:             make([]cacheShard, shardCount),
		dirty:              make([]dirtyShard, shardCount),
		damaged:            make(map[object.OID]*ObjectError),
		datasync:           fdatasync,
		dirsync:            fsyncDir,
	}
	for i := range s.shards {
		s.shards[i].handles = make(map[object.OID]*handle)
		s.shards[i].capacity = capacity
	}
	for _, d := range disks {
		s.removeTemps(d)
	}
	for i, d := range disks {
		if err := s.openJournal(d); err != nil {
			for _, d := range disks[:i] {
				d.journal.close()
			}
			return nil, fmt.Errorf("store: disk %s: %w", d.root, &classifiedError{kind: classify(err), err: err})
		}
	}
	return s, nil
}

// openJournal opens d's journal and re-hashes the objects it lists: they
// may hold writes whose data and checksums reached the disk apart before
// a crash (journal.go). Then the journal is emptied.
func (s *Store) openJournal(d *diskState) error {
	j, err := openJournal(d.objects, s.datasync, s.dirsync)
	if err != nil {
		return err
	}
	oids, err := j.listed()
	if err != nil {
		j.close()
		return err
	}
	changed := 0
	for _, oid := range oids {
		n, err := rehash(d.objectPath(oid), oid, s.datasync)
		changed += n
		if err != nil {
			// Its blocks may fail their checksums: reads go to another
			// replica and repair them, like rot.
			s.logger.Error("store: re-hashing an object after an unclean stop", "oid", oidString(oid), "disk", d.root, "err", err)
		}
	}
	if len(oids) > 0 {
		s.logger.Info("store: re-hashed the objects an unclean stop may have left with unsynced writes",
			"disk", d.root, "objects", len(oids), "checksums_updated", changed)
	}
	if err := j.reset(); err != nil {
		j.close()
		return err
	}
	d.journal = j
	return nil
}

// Close flushes (see Flush, whose error it returns) and closes the store.
// Calls still running may finish; later calls fail with ErrClosed.
func (s *Store) Close() error {
	if !s.closed.CompareAndSwap(false, true) {
		return ErrClosed
	}
	err := s.flush()
	s.backgroundMu.Lock() // no writeback starts after this: closed is set
	s.backgroundMu.Unlock()
	s.background.Wait()
	for _, d := range s.disks {
		// After a clean flush nothing is unsynced: a restart need not
		// re-hash anything.
		if err == nil && !d.failed.Load() {
			d.journal.gate.Lock()
			if resetErr := d.journal.reset(); resetErr != nil {
				s.logger.Warn("store: emptying the journal", "disk", d.root, "err", resetErr)
			}
			d.journal.gate.Unlock()
		}
		d.journal.close()
	}
	for i := range s.shards {
		shard := &s.shards[i]
		var victims []*handle
		shard.mu.Lock()
		for oid, h := range shard.handles {
			delete(shard.handles, oid)
			h.inMap = false
			h.elem = nil
			if h.refs == 0 && !h.closed && h.file != nil {
				h.closed = true
				victims = append(victims, h)
			}
		}
		shard.lru.Init()
		shard.mu.Unlock()
		s.closeHandles(victims)
	}
	return err
}

// checkRange rejects a request beyond MaxObjectSize.
func checkRange(op string, oid object.OID, offset, length uint64) error {
	if offset+length > MaxObjectSize {
		return &ObjectError{Op: op, OID: oid, Kind: ErrInvalid,
			Err: fmt.Errorf("range %d+%d ends beyond the maximum object size %d", offset, length, MaxObjectSize)}
	}
	return nil
}

func checkFlags(op string, oid object.OID, flags object.Flags) error {
	if unknown := flags &^ object.ChangeFlags; unknown != 0 {
		return &ObjectError{Op: op, OID: oid, Kind: ErrInvalid, Err: fmt.Errorf("unknown flags %#x", uint16(unknown))}
	}
	return nil
}

// with runs fn on the handle of object oid, held against eviction and
// Remove for the duration.
func (s *Store) with(op string, epoch object.Epoch, oid object.OID, mode access, fn func(h *handle) error) error {
	for {
		h, err := s.acquire(op, epoch, oid, mode)
		if err != nil {
			return err
		}
		h.life.RLock()
		if h.removed {
			// Removed while we waited; the cache no longer has it, so
			// the next acquire opens (or creates) afresh.
			h.life.RUnlock()
			s.release(h)
			continue
		}
		if h.disk != nil && h.disk.failed.Load() {
			// Its disk was taken out of service: the copy is gone. Look
			// again (the object is missing, or created on another disk).
			h.life.RUnlock()
			s.drop(h)
			s.release(h)
			continue
		}
		err = h.usable()
		if err == nil {
			err = fn(h)
		}
		h.life.RUnlock()
		s.release(h)
		if err != nil && errors.Is(err, ErrIO) && !errors.Is(err, ErrCorrupt) && h.disk != nil {
			// EIO reading or writing (a failed sync only damages the copy:
			// see flush.go).
			s.failDisk(h.disk, err)
		}
		return err
	}
}

// failDisk takes a disk out of service after an EIO: its copies count as
// missing from now on (List skips it, lookups do not find them, new
// objects go to the other disks), so the node recovers them from other
// replicas; writes it acknowledged but had not synced are reported lost
// by the next Flush (never swallowed).
func (s *Store) failDisk(d *diskState, cause error) {
	if !d.failed.CompareAndSwap(false, true) {
		return
	}
	s.logger.Error("store: disk failed: taken out of service; its object copies will be recovered from other nodes", "disk", d.root, "err", cause)
	if s.onDiskFailure != nil {
		go s.onDiskFailure(d.root, cause)
	}
}

// FailedDisks lists the disks taken out of service.
func (s *Store) FailedDisks() []string {
	var out []string
	for _, d := range s.disks {
		if d.failed.Load() {
			out = append(out, d.root)
		}
	}
	return out
}

// Read fills p with the object's bytes at offset: holes and bytes beyond
// the object's length read as zeros. It returns the copy's epoch stamp in
// Info.Epoch (the other fields are not filled), ErrNotFound for a missing
// object and ErrCorrupt for a damaged copy.
func (s *Store) Read(oid object.OID, p []byte, offset uint32) (Info, error) {
	if err := checkRange("read", oid, uint64(offset), uint64(len(p))); err != nil {
		return Info{}, err
	}
	var info Info
	err := s.with("read", 0, oid, accessExisting, func(h *handle) error {
		info.Epoch = h.stamp()
		if h.legacy {
			return s.readFile(h, p, h.dataStart+int64(offset)) // no checksums yet
		}
		return s.readVerified(h, p, offset)
	})
	return info, err
}

// Write writes p at offset in the object, with its checksums, and stamps
// the copy with epoch. When it returns nil the kernel has the data (a
// later Read sees it); it is durable after a Flush or Sync, or at once
// with the Sync flag. A write that covers part of a block whose stored
// bytes fail their checksum is refused with ErrChecksum (nothing is
// written): the block must be repaired first.
//
// With Repair (whole blocks only), each block of p is written only where
// the copy's block fails its checksum; the stamp is not changed.
func (s *Store) Write(epoch object.Epoch, oid object.OID, p []byte, offset uint32, flags object.Flags) error {
	if err := checkRange("write", oid, uint64(offset), uint64(len(p))); err != nil {
		return err
	}
	if err := checkFlags("write", oid, flags); err != nil {
		return err
	}
	if flags&object.FlagRepair != 0 {
		if _, err := s.Repair(oid, p, offset); err != nil || flags&object.FlagSync == 0 {
			return err
		}
		return s.Sync(oid)
	}
	return s.with("write", epoch, oid, modeFor(flags), func(h *handle) error {
		if err := s.stamp("write", h, epoch); err != nil {
			return err
		}
		if flags&object.FlagFresh == 0 && len(p) == 0 {
			return s.syncIf(flags, "write", h)
		}
		err := s.change(h, func() error {
			if flags&object.FlagFresh != 0 {
				// The table goes with the data: holes, entries 0.
				if err := h.file.Truncate(headerSize); err != nil {
					return objectError("write", oid, h.path, err)
				}
			}
			if len(p) == 0 {
				return nil
			}
			if h.legacy {
				if err := writeData(h.file, p, h.dataStart+int64(offset)); err != nil {
					return objectError("write", oid, h.path, err)
				}
				return nil
			}
			return s.writeVerified(h, p, offset)
		})
		if err != nil {
			return err
		}
		return s.syncIf(flags, "write", h)
	})
}

// skipJournal is set by a test that shows what the journal is for.
var skipJournal bool

// change runs fn, a change to h's data and checksums: the journal lists
// the object first (journal.go), writes to the object are serialised
// around it (checksum.go), and the handle is marked dirty after it.
func (s *Store) change(h *handle, fn func() error) error {
	j := h.disk.journal
	j.gate.RLock()
	defer j.gate.RUnlock()
	if !h.legacy && !skipJournal && !h.journaled.Load() {
		if err := j.mark(h.oid); err != nil {
			return objectError("write", h.oid, h.path, err)
		}
		h.journaled.Store(true)
	}
	h.writeMu.Lock()
	err := fn()
	h.writeMu.Unlock()
	// Even a failed change may have written part of its bytes.
	s.markDirty(h)
	return err
}

func (s *Store) syncIf(flags object.Flags, op string, h *handle) error {
	if flags&object.FlagSync != 0 {
		return s.syncObject(op, h)
	}
	return nil
}

// Repair writes each whole 4 KiB block of p (offset and length block
// aligned) where the copy's block fails its checksum, and leaves the good
// ones alone, so that a repair with data read before a newer write never
// undoes it. It returns how many blocks it rewrote. The stamp is not
// changed. A copy without checksums (format version 1) is not repaired.
func (s *Store) Repair(oid object.OID, p []byte, offset uint32) (int, error) {
	if err := checkRange("repair", oid, uint64(offset), uint64(len(p))); err != nil {
		return 0, err
	}
	repaired := 0
	err := s.with("repair", 0, oid, accessExisting, func(h *handle) error {
		if h.legacy {
			return nil
		}
		return s.change(h, func() error {
			var err error
			repaired, err = s.repairBlocks(h, p, offset)
			return err
		})
	})
	return repaired, err
}

func modeFor(flags object.Flags) access {
	if flags&object.FlagCreate != 0 {
		return accessCreate
	}
	return accessExisting
}

// WriteZeroes makes length bytes at offset read as zeros: it punches a
// hole (the range frees its blocks), or with NoHole writes zeros (the range
// stays allocated, so a later write there cannot fail for lack of space).
// Stamps, flags and durability are as for Write.
func (s *Store) WriteZeroes(epoch object.Epoch, oid object.OID, offset, length uint32, flags object.Flags) error {
	return s.zero("write zeroes", epoch, oid, offset, length, flags, flags&object.FlagNoHole != 0)
}

// Trim discards length bytes at offset: it punches a hole, so the range
// reads as zeros afterwards. Stamps, flags and durability are as for Write.
func (s *Store) Trim(epoch object.Epoch, oid object.OID, offset, length uint32, flags object.Flags) error {
	return s.zero("trim", epoch, oid, offset, length, flags, false)
}

func (s *Store) zero(op string, epoch object.Epoch, oid object.OID, offset, length uint32, flags object.Flags, allocate bool) error {
	if err := checkRange(op, oid, uint64(offset), uint64(length)); err != nil {
		return err
	}
	if err := checkFlags(op, oid, flags); err != nil {
		return err
	}
	return s.with(op, epoch, oid, modeFor(flags), func(h *handle) error {
		if err := s.stamp(op, h, epoch); err != nil {
			return err
		}
		if length > 0 {
			err := s.change(h, func() error {
				if h.legacy {
					if err := zeroRange(h.file, h.dataStart+int64(offset), int64(length), allocate); err != nil {
						return objectError(op, oid, h.path, err)
					}
					return nil
				}
				return s.zeroVerified(op, h, offset, length, allocate)
			})
			if err != nil {
				return err
			}
		}
		return s.syncIf(flags, op, h)
	})
}

// zeroBuffer is written where the file system cannot zero a range itself.
// Only ever read.
var zeroBuffer [64 << 10]byte

// zeroRange makes [offset, offset+length) of f read as zeros: a hole
// (FALLOC_FL_PUNCH_HOLE, which requires KEEP_SIZE: a range beyond the end
// of the file reads as zeros anyway), or allocated zeros
// (FALLOC_FL_ZERO_RANGE, which extends the file like a write of zeros
// would). File systems without these modes get written zeros.
func zeroRange(f *os.File, offset, length int64, allocate bool) error {
	mode := uint32(unix.FALLOC_FL_PUNCH_HOLE | unix.FALLOC_FL_KEEP_SIZE)
	if allocate {
		mode = unix.FALLOC_FL_ZERO_RANGE
	}
	err := fallocate(f, mode, offset, length)
	if err == nil || !unsupported(err) {
		return err
	}
	for length > 0 {
		n := min(length, int64(len(zeroBuffer)))
		if _, err := f.WriteAt(zeroBuffer[:n], offset); err != nil {
			return err
		}
		offset += n
		length -= n
	}
	return nil
}

// stamp sets the copy's epoch stamp, rewriting the header only when it
// changes: writes in the same epoch only load the cached stamp.
//
// A stamp never goes back: the proof of currency reads a node's stamp as
// "no write after this epoch went through this copy", which a lower stamp
// would make a lie. A request that would lower it is refused.
func (s *Store) stamp(op string, h *handle, epoch object.Epoch) error {
	if h.stamp() == epoch {
		return nil
	}
	h.hdrMu.Lock()
	defer h.hdrMu.Unlock()
	current := h.stamp()
	if current == epoch {
		return nil
	}
	if epoch < current {
		return &ObjectError{Op: op, OID: h.oid, Path: h.path, Kind: ErrInvalid,
			Err: fmt.Errorf("stamp %d would go back from %d", epoch, current)}
	}
	encoded := header{flags: h.hdrFlags, oid: h.oid, epoch: epoch, legacy: h.legacy}.encode()
	if _, err := h.file.WriteAt(encoded[:], 0); err != nil {
		return objectError(op, h.oid, h.path, fmt.Errorf("stamp epoch %d: %w", epoch, err))
	}
	h.setStamp(epoch)
	s.markDirty(h)
	if invariants.Enabled {
		// The header on the file says what the cache says.
		var b [headerLength]byte
		if _, err := h.file.ReadAt(b[:], 0); err == nil {
			if hdr, err := decodeHeader(b[:], h.oid); err != nil || hdr.epoch != epoch || hdr.oid != h.oid {
				invariants.Fail("store: object %s stamped %d, its header reads %+v (%v)", oidString(h.oid), epoch, hdr, err)
			}
		}
	}
	return nil
}

// SetEpoch restamps the copy with epoch without touching its data:
// recovery proves a copy current for a new epoch. Durable after Flush or
// Sync.
func (s *Store) SetEpoch(epoch object.Epoch, oid object.OID) error {
	return s.with("set epoch", 0, oid, accessExisting, func(h *handle) error {
		return s.stamp("set epoch", h, epoch)
	})
}

// Epoch returns the copy's epoch stamp: ErrNotFound if missing. Cheaper
// than Stat (no fstat), for the replica's per-request check.
func (s *Store) Epoch(oid object.OID) (object.Epoch, error) {
	var epoch object.Epoch
	err := s.with("epoch", 0, oid, accessExisting, func(h *handle) error {
		epoch = h.stamp()
		return nil
	})
	return epoch, err
}

// Sync makes the object's completed writes durable: its data, header and
// directory entries.
func (s *Store) Sync(oid object.OID) error {
	return s.with("sync", 0, oid, accessExisting, func(h *handle) error {
		return s.syncObject("sync", h)
	})
}

// Stat describes the object's copy, its content digest included:
// ErrNotFound if missing, ErrCorrupt if damaged.
func (s *Store) Stat(oid object.OID) (Info, error) {
	var info Info
	err := s.with("stat", 0, oid, accessExisting, func(h *handle) error {
		var err error
		if info, err = handleInfo(h); err != nil {
			return err
		}
		info.Digest, err = s.contentDigest(h, info.LengthBytes)
		return err
	})
	return info, err
}

// handleInfo describes an open copy. The caller holds h.life.
func handleInfo(h *handle) (Info, error) {
	fileInfo, err := h.file.Stat()
	if err != nil {
		return Info{}, objectError("stat", h.oid, h.path, err)
	}
	return fileSizes(fileInfo, h.stamp(), h.dataStart), nil
}

func fileSizes(fileInfo os.FileInfo, epoch object.Epoch, dataStart int64) Info {
	info := Info{Epoch: epoch}
	if size := fileInfo.Size(); size > dataStart {
		info.LengthBytes = uint64(size - dataStart)
	}
	if st, ok := fileInfo.Sys().(*syscall.Stat_t); ok {
		info.AllocatedBytes = uint64(st.Blocks) * 512
	}
	return info
}

// Remove deletes the object's copy, damaged or not. It waits for the
// requests on the object that are running, and returns ErrNotFound if
// there is no copy. The removal is durable after the next Flush.
func (s *Store) Remove(oid object.OID) error {
	return s.retire("remove", oid, func(h *handle) error {
		if err := os.Remove(h.path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return objectError("remove", oid, h.path, err)
		}
		return nil
	})
}

// retire takes oid's file out of service (Remove, and Replace's rename
// over it): with its handle's life lock held, so that the requests
// running on it finish first, change removes or replaces the file at
// h.path; then the handle leaves the cache, and later requests open the
// object afresh. ErrNotFound if there is no copy.
func (s *Store) retire(op string, oid object.OID, change func(h *handle) error) error {
	for {
		h, err := s.acquire(op, 0, oid, accessRemove)
		if err != nil {
			return err
		}
		h.life.Lock()
		if h.removed {
			// Removed while we waited; the cache no longer has it.
			h.life.Unlock()
			s.release(h)
			continue
		}
		if err := change(h); err != nil {
			h.life.Unlock()
			s.release(h)
			return err
		}
		h.removed = true
		h.disk.fanout[h.fanout].changed.Add(1)
		s.forgetDamage(h)
		s.drop(h) // before unlocking life, so waiters retry without it
		h.life.Unlock()
		s.release(h)
		return nil
	}
}

// Usage sums the disks' space: used is their total size minus what is
// still free to the store, capacity their total size. Disks are expected to
// be separate file systems; two disks on one file system count it twice.
func (s *Store) Usage() (used, capacity uint64, err error) {
	for _, d := range s.disks {
		if d.failed.Load() {
			continue
		}
		space, err := s.space(d.root)
		if err != nil {
			return 0, 0, fmt.Errorf("store: disk %s: %w", d.root, &classifiedError{kind: classify(err), err: err})
		}
		capacity += space.TotalBytes
		used += space.TotalBytes - min(space.FreeBytes, space.TotalBytes)
	}
	return used, capacity, nil
}

// DiskUsage is one disk's space, for metrics.
type DiskUsage struct {
	Path          string
	UsedBytes     uint64
	CapacityBytes uint64
	Failed        bool // taken out of service after an I/O error
	// ChecksumErrors counts 4 KiB blocks found failing their checksum
	// since the node started; BlocksRepaired those rewritten from a good
	// copy.
	ChecksumErrors uint64
	BlocksRepaired uint64
}

// Disks reports every disk's space (a failed disk with none).
func (s *Store) Disks() []DiskUsage {
	out := make([]DiskUsage, 0, len(s.disks))
	for _, d := range s.disks {
		u := DiskUsage{Path: d.root, Failed: d.failed.Load(), ChecksumErrors: d.checksumErrors.Load(), BlocksRepaired: d.blocksRepaired.Load()}
		if !u.Failed {
			if space, err := s.space(d.root); err == nil {
				u.CapacityBytes = space.TotalBytes
				u.UsedBytes = space.TotalBytes - min(space.FreeBytes, space.TotalBytes)
			}
		}
		out = append(out, u)
	}
	return out
}

// Pressure sums the disks' free space (to the store), total size and
// reserve (the free space below which a disk takes no new objects).
func (s *Store) Pressure() (free, total, reserve uint64, err error) {
	for _, d := range s.disks {
		if d.failed.Load() {
			continue
		}
		space, err := s.space(d.root)
		if err != nil {
			return 0, 0, 0, fmt.Errorf("store: disk %s: %w", d.root, &classifiedError{kind: classify(err), err: err})
		}
		free += min(space.FreeBytes, space.TotalBytes)
		total += space.TotalBytes
		reserve += s.reserveFor(space.TotalBytes)
	}
	return free, total, reserve, nil
}

// reserveFor is the reserve of a disk of total bytes.
func (s *Store) reserveFor(total uint64) uint64 {
	switch {
	case s.reserveBytes < 0:
		return 0
	case s.reserveBytes > 0:
		return uint64(s.reserveBytes)
	}
	return min(total/20, reserveDefaultMax)
}

// checkReserve refuses a new object on a disk whose free space is below its
// reserve.
func (s *Store) checkReserve(d *diskState, oid object.OID) error {
	space, err := s.space(d.root)
	if err != nil {
		return objectError("create", oid, d.root, err)
	}
	if reserve := s.reserveFor(space.TotalBytes); space.FreeBytes < reserve {
		return &ObjectError{Op: "create", OID: oid, Kind: ErrNoSpace,
			Err: fmt.Errorf("disk %s has %d bytes free, below its reserve of %d", d.root, space.FreeBytes, reserve)}
	}
	return nil
}
