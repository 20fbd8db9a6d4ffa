package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"

	"github.com/herd-storage/herd/internal/object"
)

// The unsynced-objects journal: crash consistency of data and checksums.
//
// A write puts its data and its checksums in the page cache; after a crash
// (power loss, kernel panic) any of those pages may have reached the disk
// and any not, so a block written but not flushed can be new data with an
// old sum or the reverse. Such a block must read as its old or new
// content, never as a checksum error that makes the VM see EIO, and a
// block that was flushed must always verify.
//
// So each disk keeps objects/journal: the ids of objects that may hold
// writes not yet synced. An object's id is appended and the journal
// fdatasynced before the first write to it that the journal does not
// already cover (a group commit: writers arriving during a sync share the
// next one). Open re-hashes every block of every object the journal names
// (a block whose sum does not match takes the sum of what the disk kept:
// its old or its new content), syncs them, and empties the journal. An
// object stays listed after its writes are synced, so a workload's hot
// objects pay for the journal once; when the journal holds more than
// journalCompactAt objects, a Flush rewrites it with only the objects that
// have unsynced writes, with writes held off meanwhile (the gate), so no
// write slips between the list and the rewrite. A clean Close empties it.
//
// What the journal does not cover, and why that is safe: Replace writes a
// whole new file that is not listed, so a crash that tears it leaves
// blocks that fail their checksum and are repaired from another replica
// like rot, rather than accepted; header restamps carry their own CRC.
//
// The cost of the re-hash at an unclean start is bounded by journalCompactAt
// objects (plus those written since the last compaction).
// (A variable: the crash test compacts at every Flush.)
var journalCompactAt = 1024

const journalName = "journal"

type journal struct {
	path     string
	dir      string // objects/, fsynced after a rewrite
	datasync func(*os.File) error
	dirsync  func(*os.File) error

	// gate is held shared by a write from its mark to the end of its
	// pwrites, exclusively by a rewrite.
	gate sync.RWMutex

	mu      sync.Mutex
	cond    sync.Cond
	file    *os.File
	entries map[object.OID]uint64 // object -> the batch that lists it
	pending []object.OID          // ids of batch next, not yet written
	next    uint64                // the batch being filled
	synced  uint64                // every batch up to this one is durable
	syncing bool
	failed  uint64 // a batch whose write or sync failed, with failure
	failure error
}

func openJournal(objects string, datasync, dirsync func(*os.File) error) (*journal, error) {
	j := &journal{
		path:     filepath.Join(objects, journalName),
		dir:      objects,
		datasync: datasync,
		dirsync:  dirsync,
		entries:  make(map[object.OID]uint64),
		next:     1,
	}
	j.cond.L = &j.mu
	f, err := os.OpenFile(j.path, os.O_RDWR|os.O_CREATE|os.O_APPEND, fileMode)
	if err != nil {
		return nil, err
	}
	j.file = f
	return j, nil
}

// listed reads the object ids in the journal (a torn last entry is
// ignored: its write had not finished, so no data write followed it).
func (j *journal) listed() ([]object.OID, error) {
	b, err := io.ReadAll(io.NewSectionReader(j.file, 0, 1<<62))
	if err != nil {
		return nil, err
	}
	seen := make(map[object.OID]bool)
	var oids []object.OID
	for len(b) >= 8 {
		oid := object.OID(binary.LittleEndian.Uint64(b))
		b = b[8:]
		if !seen[oid] {
			seen[oid] = true
			oids = append(oids, oid)
		}
	}
	return oids, nil
}

// mark makes sure the journal durably lists oid before the caller writes
// to it. The caller holds the gate shared.
func (j *journal) mark(oid object.OID) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	batch, ok := j.entries[oid]
	if !ok {
		batch = j.next
		j.entries[oid] = batch
		j.pending = append(j.pending, oid)
	}
	for j.synced < batch {
		if j.failed == batch {
			return j.failure
		}
		if j.syncing {
			j.cond.Wait()
			continue
		}
		j.syncing = true
		ids, number := j.pending, j.next
		j.pending = nil
		j.next++
		j.mu.Unlock()
		err := j.append(ids)
		j.mu.Lock()
		j.syncing = false
		if err != nil {
			for _, id := range ids {
				delete(j.entries, id)
			}
			j.failed, j.failure = number, fmt.Errorf("journal %s: %w", j.path, err)
		} else {
			j.synced = number
		}
		j.cond.Broadcast()
	}
	return nil
}

func (j *journal) append(ids []object.OID) error {
	b := make([]byte, 8*len(ids))
	for i, id := range ids {
		binary.LittleEndian.PutUint64(b[8*i:], uint64(id))
	}
	if _, err := j.file.Write(b); err != nil {
		return err
	}
	return j.datasync(j.file)
}

// reset empties the journal, durably: every object it listed is synced.
func (j *journal) reset() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if err := j.file.Truncate(0); err != nil {
		return err
	}
	if err := j.datasync(j.file); err != nil {
		return err
	}
	clear(j.entries)
	j.pending = nil
	return nil
}

// size is the number of objects listed.
func (j *journal) size() int {
	j.mu.Lock()
	defer j.mu.Unlock()
	return len(j.entries)
}

// rewrite replaces the journal by one listing keep (durably: a temporary
// file, synced, renamed over it, the directory synced). The caller holds
// the gate exclusively, so no mark or write runs.
func (j *journal) rewrite(keep []object.OID) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	temp := j.path + ".new"
	f, err := os.OpenFile(temp, os.O_RDWR|os.O_CREATE|os.O_TRUNC|os.O_APPEND, fileMode)
	if err != nil {
		return err
	}
	b := make([]byte, 8*len(keep))
	for i, id := range keep {
		binary.LittleEndian.PutUint64(b[8*i:], uint64(id))
	}
	_, err = f.Write(b)
	if err == nil {
		err = j.datasync(f)
	}
	if err == nil {
		err = os.Rename(temp, j.path)
	}
	if err == nil {
		err = syncDirectory(j.dir, j.dirsync)
	}
	if err != nil {
		f.Close()
		os.Remove(temp)
		return err
	}
	j.file.Close()
	j.file = f
	clear(j.entries)
	for _, id := range keep {
		j.entries[id] = 0 // durable
	}
	j.pending = nil
	return nil
}

func syncDirectory(path string, dirsync func(*os.File) error) error {
	d, err := os.Open(path)
	if err != nil {
		return err
	}
	defer d.Close()
	return dirsync(d)
}

func (j *journal) close() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.file.Close()
}

// rehash makes the sums of every block of the version 2 copy at path
// match its data, and syncs it. It returns how many sums it changed.
func rehash(path string, oid object.OID, datasync func(*os.File) error) (int, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil // removed since
	}
	if err != nil {
		return 0, err
	}
	defer f.Close()
	var buffer [headerLength]byte
	n, err := f.ReadAt(buffer[:], 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return 0, err
	}
	hdr, err := decodeHeader(buffer[:n], oid)
	if err != nil || hdr.legacy {
		return 0, nil // a bad header is reported when the copy is opened; version 1 has no sums
	}
	info, err := f.Stat()
	if err != nil {
		return 0, err
	}
	// Every block with data is checked; beyond the data every entry in
	// the file must be 0 (the blocks read as zeros).
	size := info.Size()
	dataBlocks := int64(0)
	if size > dataOffset {
		dataBlocks = (size - dataOffset + blockSize - 1) / blockSize
	}
	table := make([]byte, max(0, min(size-headerSize, tableSize)))
	if _, err := f.ReadAt(table, headerSize); err != nil && !errors.Is(err, io.EOF) {
		return 0, err
	}
	changed := 0
	var block [blockSize]byte
	for b := int64(0); b < max(dataBlocks, int64(len(table)/sumSize)); b++ {
		entry := uint32(0)
		if (b+1)*sumSize <= int64(len(table)) {
			entry = binary.LittleEndian.Uint32(table[b*sumSize:])
		}
		if b >= dataBlocks && entry == 0 {
			continue
		}
		clear(block[:])
		if b < dataBlocks {
			n, err := f.ReadAt(block[:], dataOffset+b*blockSize)
			if err != nil && !errors.Is(err, io.EOF) {
				return changed, err
			}
			clear(block[n:])
		}
		sum := blockSum(block[:])
		if entry == sum {
			continue
		}
		var fixed [sumSize]byte
		binary.LittleEndian.PutUint32(fixed[:], sum)
		if _, err := f.WriteAt(fixed[:], headerSize+b*sumSize); err != nil {
			return changed, err
		}
		changed++
	}
	if changed > 0 {
		if err := datasync(f); err != nil {
			return changed, err
		}
	}
	return changed, nil
}
