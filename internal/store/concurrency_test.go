package store

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/herd-storage/herd/internal/object"
)

// TestConcurrentWriters writes from many goroutines to different objects
// and to disjoint blocks of one shared object, with Flushes in between,
// then checks every byte.
func TestConcurrentWriters(t *testing.T) {
	options := Options{Disks: []Disk{{Path: tempDisk(t)}}}
	s := openTest(t, options)
	const writers = 8
	const blocks = 32 // per writer, in the shared object
	const shared = 0xffff
	var wait sync.WaitGroup
	errs := make(chan error, writers*2)
	for w := range writers {
		wait.Go(func() { // its own object, overlapping writes in order
			oid := uint64(w + 1)
			for n := range 40 {
				p := pattern(uint64(w*1000+n), 5000)
				if err := s.Write(object.Epoch(1+n/2), object.OID(oid), p, uint32(n*3000), object.FlagCreate); err != nil { // stamps rise, never go back
					errs <- err
					return
				}
				if n%8 == 0 {
					if err := s.Flush(); err != nil {
						errs <- err
						return
					}
				}
			}
		})
		wait.Go(func() { // its blocks of the shared object
			for b := range blocks {
				block := uint32(b*writers + w)
				p := pattern(uint64(block), 4096)
				if err := s.Write(7, shared, p, block*4096, object.FlagCreate); err != nil {
					errs <- err
					return
				}
				if _, err := s.Read(shared, make([]byte, 4096), block*4096); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wait.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	check := func(s *Store) {
		t.Helper()
		for w := range writers {
			want := make([]byte, 39*3000+5000)
			for n := range 40 {
				copy(want[n*3000:], pattern(uint64(w*1000+n), 5000))
			}
			got, _ := mustRead(t, s, object.OID(w+1), len(want), 0)
			checkBytes(t, fmt.Sprintf("object %d", w+1), got, want)
		}
		got, info := mustRead(t, s, shared, writers*blocks*4096, 0)
		for block := range writers * blocks {
			checkBytes(t, fmt.Sprintf("shared block %d", block), got[block*4096:(block+1)*4096], pattern(uint64(block), 4096))
		}
		if info.Epoch != 7 {
			t.Errorf("shared object epoch %d", info.Epoch)
		}
	}
	check(s)
	s = reopen(t, s, options)
	check(s)
}

// TestFDCacheEvictionUnderConcurrency runs many goroutines over more
// objects than the fd cache holds, so that handles are evicted while
// others use theirs, and checks data and the number of open files.
func TestFDCacheEvictionUnderConcurrency(t *testing.T) {
	const openFiles = 4
	s := openTest(t, Options{OpenFiles: openFiles})
	const workers = 12
	const objectsPerWorker = 5
	var maxOpen atomic.Int64
	var wait sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wait.Go(func() {
			random := seeded(t)
			// Each worker owns its objects (and checks their data) and
			// reads everyone's.
			versions := make([]uint64, objectsPerWorker)
			for n := range 200 {
				k := random.IntN(objectsPerWorker)
				oid := uint64(w*objectsPerWorker + k)
				switch op := random.IntN(10); {
				case op < 4:
					versions[k] = uint64(n + 1)
					if err := s.Write(1, object.OID(oid), pattern(oid<<32|versions[k], 1000), 100, object.FlagCreate); err != nil {
						errs <- err
						return
					}
				case op < 7:
					p := make([]byte, 1000)
					_, err := s.Read(object.OID(oid), p, 100)
					if versions[k] == 0 {
						if !errors.Is(err, ErrNotFound) {
							errs <- fmt.Errorf("read of unwritten object %d: %v", oid, err)
							return
						}
						continue
					}
					if err != nil {
						errs <- err
						return
					}
					if want := pattern(oid<<32|versions[k], 1000); string(p) != string(want) {
						errs <- fmt.Errorf("object %d: stale or torn read", oid)
						return
					}
				case op < 8:
					other := uint64(random.IntN(workers * objectsPerWorker))
					if _, err := s.Stat(object.OID(other)); err != nil && !errors.Is(err, ErrNotFound) {
						errs <- err
						return
					}
				case op < 9:
					if versions[k] != 0 {
						if err := s.Remove(object.OID(oid)); err != nil {
							errs <- err
							return
						}
						versions[k] = 0
					}
				default:
					if err := s.Flush(); err != nil {
						errs <- err
						return
					}
				}
				for {
					current, seen := s.openFiles.Load(), maxOpen.Load()
					if current <= seen || maxOpen.CompareAndSwap(seen, current) {
						break
					}
				}
			}
		})
	}
	wait.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	// Clean and unused, the cache is back within its size.
	if open := s.openFiles.Load(); open > openFiles {
		t.Errorf("%d files open after the last Flush, cache size %d", open, openFiles)
	}
	// In use, it may exceed its size by the handles in use and the dirty
	// ones waiting for writeback: no bound to check beyond the objects.
	t.Logf("at most %d files open with a cache of %d", maxOpen.Load(), openFiles)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if open := s.openFiles.Load(); open != 0 {
		t.Errorf("%d files open after Close", open)
	}
}

// TestRemoveWhileWriting races Remove against writers and readers of the
// same object: every call must succeed or report ErrNotFound, and the store
// must stay consistent.
func TestRemoveWhileWriting(t *testing.T) {
	s := openTest(t, Options{OpenFiles: 2})
	const oid = 5
	var wait sync.WaitGroup
	errs := make(chan error, 8)
	stop := make(chan struct{})
	for w := range 3 {
		wait.Go(func() {
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				var err error
				switch w {
				case 0:
					err = s.Write(1, oid, pattern(uint64(n), 4096), 0, object.FlagCreate)
				case 1:
					_, err = s.Read(oid, make([]byte, 4096), 0)
				case 2:
					err = s.Write(1, oid+1, []byte("x"), 0, object.FlagCreate|object.FlagSync)
				}
				if err != nil && !errors.Is(err, ErrNotFound) {
					errs <- err
					return
				}
			}
		})
	}
	for range 200 {
		if err := s.Remove(oid); err != nil && !errors.Is(err, ErrNotFound) {
			t.Error(err)
			break
		}
	}
	close(stop)
	wait.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
}

// TestListWhileRestamping lists objects while their headers are rewritten
// through the cache: a header read torn by a concurrent restamp must not
// be reported as damage.
func TestListWhileRestamping(t *testing.T) {
	s := openTest(t, Options{OpenFiles: 2})
	const objects = 20
	for oid := uint64(0); oid < objects; oid++ {
		mustWrite(t, s, 1, object.OID(oid), []byte("a"), 0, object.FlagCreate)
	}
	stop := make(chan struct{})
	var wait sync.WaitGroup
	errs := make(chan error, 2)
	for w := range 2 {
		wait.Go(func() {
			for n := uint64(0); ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				if err := s.SetEpoch(object.Epoch(n+2), object.OID((n*2+uint64(w))%objects)); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	for range 20 {
		err := s.List(func(oid object.OID, info Info) error {
			if info.Damaged {
				return fmt.Errorf("object %d reported damaged", oid)
			}
			return nil
		})
		if err != nil {
			t.Error(err)
			break
		}
	}
	close(stop)
	wait.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}
