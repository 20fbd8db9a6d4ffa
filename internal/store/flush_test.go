package store

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/herd-storage/herd/internal/object"
)

func TestFlushSyncsWhatChanged(t *testing.T) {
	s := openTest(t, Options{})
	counter := countSyncs(s)
	d := s.disks[0]
	oids := []uint64{1, 2, 3}
	for _, oid := range oids {
		mustWrite(t, s, 1, object.OID(oid), pattern(oid, 100), 0, object.FlagCreate)
	}
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	files, dirs := counter.take()
	for _, oid := range oids {
		if files[d.objectPath(object.OID(oid))] != 1 {
			t.Errorf("object %d synced %d times: %v", oid, files[d.objectPath(object.OID(oid))], files)
		}
		if dirs[d.fanoutPath(fanoutIndex(object.OID(oid)))] != 1 {
			t.Errorf("directory of object %d not synced once: %v", oid, dirs)
		}
	}
	if len(files) != len(oids) || dirs[d.objects] != 1 {
		t.Errorf("synced files %v, directories %v", files, dirs)
	}

	// Nothing changed: nothing to sync.
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	if files, dirs := counter.take(); len(files)+len(dirs) != 0 {
		t.Errorf("idle Flush synced %v %v", files, dirs)
	}

	// A rewrite syncs the file only; a restamp and a punch count as writes.
	mustWrite(t, s, 1, 1, []byte("x"), 0, 0)
	if err := s.SetEpoch(5, 2); err != nil {
		t.Fatal(err)
	}
	if err := s.Trim(1, 3, 0, 4096, 0); err != nil {
		t.Fatal(err)
	}
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	files, dirs = counter.take()
	if len(files) != 3 || len(dirs) != 0 {
		t.Errorf("after rewrite: files %v, directories %v", files, dirs)
	}

	// FUA: synced before Write returns, with the new file's directories,
	// and not again by the next Flush.
	const fresh = 0x5555
	mustWrite(t, s, 1, fresh, []byte("fua"), 0, object.FlagCreate|object.FlagSync)
	files, dirs = counter.take()
	if files[d.objectPath(fresh)] != 1 || dirs[d.fanoutPath(fanoutIndex(fresh))] != 1 {
		t.Errorf("FUA create: files %v, directories %v", files, dirs)
	}
	mustWrite(t, s, 1, fresh, []byte("fua"), 0, object.FlagSync)
	files, dirs = counter.take()
	if files[d.objectPath(fresh)] != 1 || len(dirs) != 0 {
		t.Errorf("FUA rewrite: files %v, directories %v", files, dirs)
	}
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	if files, dirs := counter.take(); len(files)+len(dirs) != 0 {
		t.Errorf("Flush after FUA writes synced %v %v", files, dirs)
	}

	// Sync(oid) syncs one object.
	mustWrite(t, s, 1, 1, []byte("y"), 0, 0)
	mustWrite(t, s, 5, 2, []byte("y"), 0, 0)
	if err := s.Sync(1); err != nil {
		t.Fatal(err)
	}
	files, _ = counter.take()
	if len(files) != 1 || files[d.objectPath(1)] != 1 {
		t.Errorf("Sync(1) synced %v", files)
	}
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	files, _ = counter.take()
	if len(files) != 1 || files[d.objectPath(2)] != 1 {
		t.Errorf("Flush after Sync(1) synced %v", files)
	}
}

// TestFlushContract runs writers and flushers concurrently and checks the
// promise: when Flush returns, every write acknowledged before it was
// called has been covered by an fdatasync that began after the write
// started.
func TestFlushContract(t *testing.T) {
	s := openTest(t, Options{OpenFiles: 8})
	const objects = 24
	const writers = 6
	const writesPerWriter = 150

	// started[oid] is the number of the last write begun on oid, set
	// before Write is called; a datasync records the value it saw when
	// it began in covered[oid].
	var started, covered [objects]atomic.Int64
	var syncs atomic.Int64
	oidOf := map[string]int{}
	for i := range objects {
		oidOf[s.disks[0].objectPath(object.OID(i))] = i
	}
	datasync := s.datasync
	s.datasync = func(f *os.File) error {
		syncs.Add(1)
		i := oidOf[f.Name()]
		seen := started[i].Load()
		if err := datasync(f); err != nil {
			return err
		}
		for {
			old := covered[i].Load()
			if old >= seen || covered[i].CompareAndSwap(old, seen) {
				return nil
			}
		}
	}

	var sequence atomic.Int64
	var wait sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wait.Go(func() {
			random := seeded(t)
			for n := range writesPerWriter {
				// Writer w owns objects w, w+writers, ... so that the
				// numbers of one object's writes increase.
				i := w + writers*random.IntN(objects/writers)
				number := sequence.Add(1)
				started[i].Store(number)
				err := s.Write(1, object.OID(i), pattern(uint64(number), 512), uint32(random.IntN(64))*4096, object.FlagCreate)
				if err != nil {
					errs <- err
					return
				}
				if n%10 != 0 {
					continue
				}
				// Every write acknowledged so far on any object must be
				// covered once this Flush returns.
				var acknowledged [objects]int64
				for j := range objects {
					acknowledged[j] = started[j].Load()
				}
				acknowledged[i] = number
				if err := s.Flush(); err != nil {
					errs <- err
					return
				}
				for j := range objects {
					// started[j] may be a write still in flight; only
					// writes by this writer are known acknowledged.
					if j%writers == w && covered[j].Load() < acknowledged[j] {
						errs <- fmt.Errorf("object %d: Flush returned, write %d acknowledged before it, last covered %d",
							j, acknowledged[j], covered[j].Load())
						return
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
	if n := s.dirtyCount.Load(); n != 0 {
		t.Fatalf("%d handles still dirty after the last Flush", n)
	}
	t.Logf("%d writes, %d fdatasyncs", writers*writesPerWriter, syncs.Load())
}

func TestFailedSyncDamagesCopy(t *testing.T) {
	options := Options{Disks: []Disk{{Path: tempDisk(t)}}}
	s := openTest(t, options)
	counter := countSyncs(s)
	const bad, good = 10, 11
	badPath := s.disks[0].objectPath(bad)
	counter.fail = func(path string) error {
		if path == badPath {
			return &os.PathError{Op: "fdatasync", Path: path, Err: syscall.EIO}
		}
		return nil
	}
	mustWrite(t, s, 2, bad, pattern(1, 4096), 0, object.FlagCreate)
	mustWrite(t, s, 2, good, pattern(2, 4096), 0, object.FlagCreate)
	err := s.Flush()
	wantErr(t, "Flush", err, ErrCorrupt)
	wantErr(t, "Flush", err, ErrIO)
	var objectErr *ObjectError
	if !errors.As(err, &objectErr) || objectErr.OID != bad {
		t.Fatalf("Flush error %v does not name the object", err)
	}
	counter.fail = nil

	// The copy is refused, and every Flush reports it until removed.
	_, err = s.Read(bad, make([]byte, 10), 0)
	wantErr(t, "Read of a damaged copy", err, ErrCorrupt)
	wantErr(t, "Write to a damaged copy", s.Write(2, bad, []byte("x"), 0, object.FlagCreate), ErrCorrupt)
	wantErr(t, "Sync of a damaged copy", s.Sync(bad), ErrCorrupt)
	wantErr(t, "second Flush", s.Flush(), ErrCorrupt)
	if listed := listAll(t, s); !listed[bad].Damaged || listed[good].Damaged {
		t.Fatalf("List: %+v", listed)
	}
	if _, err := s.Read(good, make([]byte, 10), 0); err != nil {
		t.Fatal(err)
	}

	// The mark is in the header: a restart does not make the copy good.
	wantErr(t, "Close", s.Close(), ErrCorrupt)
	s = openTest(t, options)
	_, err = s.Read(bad, make([]byte, 10), 0)
	wantErr(t, "Read after restart", err, ErrCorrupt)
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}

	// Removing and recovering it repairs it.
	if err := s.Remove(bad); err != nil {
		t.Fatal(err)
	}
	mustWrite(t, s, 3, bad, []byte("recovered"), 0, object.FlagCreate|object.FlagSync)

	// A failed FUA write damages the copy too.
	counter = countSyncs(s)
	counter.fail = func(path string) error {
		return &os.PathError{Op: "fdatasync", Path: path, Err: syscall.EIO}
	}
	mustWrite(t, s, 2, good, []byte("y"), 0, 0)
	wantErr(t, "FUA write", s.Write(2, good, []byte("y"), 0, object.FlagSync), ErrIO)
	counter.fail = nil
	wantErr(t, "Flush after a failed FUA write", s.Flush(), ErrCorrupt)
	if err := s.Remove(good); err != nil {
		t.Fatal(err)
	}
	if err := s.Flush(); err != nil {
		t.Fatalf("Flush after removing the damaged copy: %v", err)
	}
	mustWrite(t, s, 3, good, []byte("recovered"), 0, object.FlagCreate|object.FlagSync)
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
}

// TestCreatedFileNeedsDirectorySync checks the FUA path for a file that
// was created, left the cache and was reopened before any Flush: its
// directory entry is still synced before the FUA write returns.
func TestCreatedFileNeedsDirectorySync(t *testing.T) {
	s := openTest(t, Options{})
	counter := countSyncs(s)
	mustWrite(t, s, 1, 1, []byte("a"), 0, object.FlagCreate)
	h := s.peek(1)
	s.release(h)
	s.drop(h) // as if evicted
	if s.peek(1) != nil {
		t.Fatal("handle still cached")
	}
	mustWrite(t, s, 1, 1, []byte("a"), 0, object.FlagSync)
	_, dirs := counter.take()
	if dirs[s.disks[0].fanoutPath(fanoutIndex(1))] != 1 || dirs[s.disks[0].objects] != 1 {
		t.Errorf("FUA write to a created, reopened file synced directories %v", dirs)
	}
	// Once synced, FUA writes to files opened later sync no directory.
	h = s.peek(1)
	s.release(h)
	s.drop(h)
	mustWrite(t, s, 1, 1, []byte("a"), 0, object.FlagSync)
	if _, dirs := counter.take(); len(dirs) != 0 {
		t.Errorf("FUA write synced directories %v", dirs)
	}
}
