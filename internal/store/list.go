package store

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/herd-storage/herd/internal/object"
)

// List calls fn for every object copy on the node's disks, in no
// particular order, for recovery to learn what this node holds. A damaged
// copy (corrupt header, failed sync) is reported with Info.Damaged set
// rather than as an error, so that one bad file does not hide the rest.
// Objects created or removed while List runs may or may not be reported.
// An error from fn stops List and is returned.
//
// List reads object headers directly rather than through the fd cache, so
// that a scan does not push the objects serving I/O out of it.
func (s *Store) List(fn func(oid object.OID, info Info) error) error {
	if s.closed.Load() {
		return ErrClosed
	}
	for _, d := range s.disks {
		if d.failed.Load() {
			continue
		}
		for i := 0; i < fanoutCount; i++ {
			dir := d.fanoutPath(i)
			names, err := readNames(dir)
			if errors.Is(err, os.ErrNotExist) {
				continue
			}
			if err != nil {
				return fmt.Errorf("store: list %s: %w", dir, &classifiedError{kind: classify(err), err: err})
			}
			for _, name := range names {
				if strings.HasPrefix(name, tempPrefix) {
					continue // a copy being written by Replace
				}
				oid, ok := parseObjectName(name)
				if !ok || fanoutIndex(oid) != i {
					s.logger.Warn("store: ignoring a file that is not an object", "path", filepath.Join(dir, name))
					continue
				}
				if s.shadowed(d, oid) {
					continue
				}
				info, err := s.listInfo(d, oid)
				if errors.Is(err, ErrNotFound) {
					continue // removed meanwhile
				}
				if err != nil {
					return err
				}
				if err := fn(oid, info); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

func readNames(dir string) ([]string, error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return f.Readdirnames(-1)
}

// shadowed reports whether the copy of oid on disk d is hidden by one on a
// disk probed before it: the store reads and writes that one, so List
// reports only it.
func (s *Store) shadowed(d *diskState, oid object.OID) bool {
	if len(s.disks) == 1 {
		return false
	}
	var orderArray [8]*diskState
	for _, other := range probeOrder(s.disks, oid, orderArray[:0]) {
		if other == d {
			return false
		}
		if _, err := os.Lstat(other.objectPath(oid)); err == nil {
			return true
		}
	}
	return false
}

// listInfo describes the copy of oid on disk d.
func (s *Store) listInfo(d *diskState, oid object.OID) (Info, error) {
	if h := s.peek(oid); h != nil {
		defer s.release(h)
		if h.disk == d {
			return cachedInfo(h)
		}
	}
	path := d.objectPath(oid)
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return Info{}, ErrNotFound
	}
	if err != nil {
		return Info{}, objectError("list", oid, path, err)
	}
	defer f.Close()
	var buffer [headerLength]byte
	n, err := f.ReadAt(buffer[:], 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return Info{}, objectError("list", oid, path, err)
	}
	fileInfo, err := f.Stat()
	if err != nil {
		return Info{}, objectError("list", oid, path, err)
	}
	hdr, err := decodeHeader(buffer[:n], oid)
	if err != nil {
		// Perhaps torn by a restamp that started after the cache check:
		// open it through the cache, which reads the header with no
		// restamp running and keeps the verdict.
		h, err := s.acquire("list", 0, oid, accessRemove)
		if err != nil {
			return Info{}, err
		}
		defer s.release(h)
		return cachedInfo(h)
	}
	return fileSizes(fileInfo, hdr.epoch, hdr.dataStart()), nil
}

// cachedInfo describes a copy from its cached handle, on which the caller
// holds a reference.
func cachedInfo(h *handle) (Info, error) {
	h.life.RLock()
	defer h.life.RUnlock()
	if h.removed {
		return Info{}, ErrNotFound
	}
	if h.usable() != nil {
		return Info{Epoch: h.stamp(), Damaged: true}, nil
	}
	return handleInfo(h)
}

// peek returns the cached, open handle of oid with a reference, or nil. It
// does not make the object more recently used.
func (s *Store) peek(oid object.OID) *handle {
	shard := s.shard(oid)
	shard.mu.Lock()
	defer shard.mu.Unlock()
	h := shard.handles[oid]
	if h == nil || h.elem == nil { // absent, or still opening
		return nil
	}
	h.refs++
	return h
}
