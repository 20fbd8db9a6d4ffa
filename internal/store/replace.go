package store

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"

	"github.com/herd-storage/herd/internal/object"
)

// tempPrefix names the files Replace writes before renaming them over an
// object. They are never objects: List skips them and Open deletes those
// a crashed process left behind.
const tempPrefix = ".tmp."

var tempCounter atomic.Uint64

// Replace makes data (offset 0 on) the whole content of oid's copy,
// stamped epoch, in one step: until it returns, readers see the previous
// copy (or none) with its stamp; afterwards the new one. It is how
// recovery installs a copy fetched from another node: a copy cut short
// (disk full, the process killed) never exists under the object's name,
// and a stamp never passes through a value below the previous one, so a
// node's answer about its copy is always the truth about some complete
// copy (the proof of currency relies on it).
//
// The new copy is written to a temporary file in the object's directory
// and renamed over the old one (or to the object's name). It is durable
// after the next Flush, like a write. The caller orders Replace against
// other changes to the same object (the replica's object lock): a write
// racing with it may land in the file being replaced.
func (s *Store) Replace(epoch object.Epoch, oid object.OID, data []byte) error {
	if err := checkRange("replace", oid, 0, uint64(len(data))); err != nil {
		return err
	}
	if s.closed.Load() {
		return &ObjectError{Op: "replace", OID: oid, Kind: ErrClosed}
	}
	// Where the copy lives now, or where a new one is created.
	var target *diskState
	var previous object.Epoch
	err := s.with("replace", 0, oid, accessExisting, func(h *handle) error {
		target, previous = h.disk, h.stamp()
		return nil
	})
	switch {
	case errors.Is(err, ErrNotFound):
		var orderArray [8]*diskState
		for _, d := range probeOrder(s.disks, oid, orderArray[:0]) {
			if !d.failed.Load() {
				target = d
				break
			}
		}
		if target == nil {
			return &ObjectError{Op: "replace", OID: oid, Kind: ErrIO, Err: errors.New("no disk of this node is in service")}
		}
		if err := s.checkReserve(target, oid); err != nil {
			return err
		}
	case err != nil && !errors.Is(err, ErrCorrupt):
		return err
	case err == nil && epoch < previous:
		return &ObjectError{Op: "replace", OID: oid, Kind: ErrInvalid,
			Err: fmt.Errorf("stamp %d would go back from %d", epoch, previous)}
	}
	if target == nil { // a corrupt copy: replaced where it is
		var orderArray [8]*diskState
		for _, d := range probeOrder(s.disks, oid, orderArray[:0]) {
			if _, statErr := os.Stat(d.objectPath(oid)); statErr == nil {
				target = d
				break
			}
		}
		if target == nil {
			return &ObjectError{Op: "replace", OID: oid, Kind: ErrNotFound}
		}
	}
	temp, err := s.writeTemp(target, epoch, oid, data)
	if err != nil {
		return err
	}
	if err := s.install(target, oid, temp); err != nil {
		if removeErr := os.Remove(temp); removeErr != nil && !errors.Is(removeErr, os.ErrNotExist) {
			s.logger.Warn("store: removing a temporary copy", "path", temp, "err", removeErr)
		}
		return err
	}
	// The new file is not durable yet: the next Flush syncs it and its
	// directory (install counted the rename as a change of it).
	return s.with("replace", 0, oid, accessExisting, func(h *handle) error {
		s.markDirty(h)
		return nil
	})
}

// writeTemp writes a complete copy (header stamped epoch, then data) to a
// new temporary file in oid's fan-out directory on d.
func (s *Store) writeTemp(d *diskState, epoch object.Epoch, oid object.OID, data []byte) (string, error) {
	fanout := fanoutIndex(oid)
	dir := d.fanoutPath(fanout)
	if err := os.Mkdir(dir, dirMode); err == nil {
		d.objectsDir.changed.Add(1)
	} else if !errors.Is(err, os.ErrExist) {
		return "", objectError("replace", oid, dir, err)
	}
	path := filepath.Join(dir, fmt.Sprintf("%s%016x.%d.%d", tempPrefix, oid, os.Getpid(), tempCounter.Add(1)))
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, fileMode)
	if err != nil {
		return "", objectError("replace", oid, path, err)
	}
	encoded := header{oid: oid, epoch: epoch}.encode()
	_, err = f.WriteAt(encoded[:], 0)
	if err == nil && len(data) > 0 {
		_, err = f.WriteAt(tableFor(data), headerSize)
	}
	if err == nil && len(data) > 0 {
		err = writeSparse(f, data, dataOffset)
	}
	if closeErr := f.Close(); err == nil {
		err = closeErr
	}
	if err != nil {
		os.Remove(path)
		return "", objectError("replace", oid, path, err)
	}
	return path, nil
}

// install renames temp to oid's name on d, taking the previous copy's
// handle (if any) out of service the way Remove does: requests running
// on it finish first, later ones open the new file.
func (s *Store) install(d *diskState, oid object.OID, temp string) error {
	err := s.retire("replace", oid, func(h *handle) error {
		if h.disk != d {
			// Only if the copy was removed and created again on another
			// disk since Replace looked: the caller's lock rules it out.
			return &ObjectError{Op: "replace", OID: oid, Path: h.path, Kind: ErrInvalid, Err: errors.New("the copy moved to another disk during the replace")}
		}
		if err := os.Rename(temp, h.path); err != nil {
			return objectError("replace", oid, h.path, err)
		}
		return nil
	})
	if !errors.Is(err, ErrNotFound) {
		return err
	}
	path := d.objectPath(oid)
	if err := os.Rename(temp, path); err != nil {
		return objectError("replace", oid, path, err)
	}
	d.fanout[fanoutIndex(oid)].changed.Add(1)
	return nil
}

// removeTemps deletes the temporary copies a killed process left on d.
func (s *Store) removeTemps(d *diskState) {
	for i := 0; i < fanoutCount; i++ {
		dir := d.fanoutPath(i)
		names, err := readNames(dir)
		if err != nil {
			continue
		}
		for _, name := range names {
			if !strings.HasPrefix(name, tempPrefix) {
				continue
			}
			path := filepath.Join(dir, name)
			if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
				s.logger.Warn("store: removing a temporary copy left by an earlier process", "path", path, "err", err)
			}
		}
	}
}

// writeSparse writes data at off (a multiple of blockSize) leaving its
// blocks of zeros as holes, and makes the file end where data does: a
// copy installed by recovery stays as thin as the one it came from (a
// hole reads as zeros, and its checksum entry is a block of zeros', 0).
func writeSparse(f *os.File, data []byte, off int64) error {
	zero := func(b []byte) bool {
		for _, x := range b {
			if x != 0 {
				return false
			}
		}
		return true
	}
	start := -1 // of the run of blocks with data being gathered
	for i := 0; ; i += blockSize {
		more := i < len(data)
		if more && !zero(data[i:min(i+blockSize, len(data))]) {
			if start < 0 {
				start = i
			}
			continue
		}
		if start >= 0 {
			if err := writeData(f, data[start:min(i, len(data))], off+int64(start)); err != nil {
				return err
			}
			start = -1
		}
		if !more {
			return f.Truncate(off + int64(len(data)))
		}
	}
}
