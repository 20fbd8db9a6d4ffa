package store

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/herd-storage/herd/internal/object"
)

var crashIterations = flag.Int("store.crash-iterations", 2000, "write/crash/restart iterations of TestCrashKeepsDataAndChecksumsConsistent")

// abandon stops s the way a killed process does: files closed, nothing
// synced, the journal left as it is.
func (s *Store) abandon() {
	s.closed.Store(true)
	s.background.Wait()
	for i := range s.shards {
		shard := &s.shards[i]
		shard.mu.Lock()
		for _, h := range shard.handles {
			if h.file != nil && !h.closed {
				h.file.Close()
				h.closed = true
			}
		}
		shard.mu.Unlock()
	}
	for _, d := range s.disks {
		d.journal.close()
	}
}

// objectFiles reads every object file under root's objects/.
func objectFiles(t testing.TB, root string) map[string][]byte {
	t.Helper()
	files := make(map[string][]byte)
	err := filepath.WalkDir(filepath.Join(root, "objects"), func(path string, entry os.DirEntry, err error) error {
		if err != nil || entry.IsDir() || entry.Name() == journalName || strings.HasPrefix(entry.Name(), tempPrefix) {
			return err
		}
		b, err := os.ReadFile(path)
		files[path] = b
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// powerLoss turns each object file into what a power loss may leave of it
// when synced is what its last fdatasync made durable: each 4 KiB page
// (header, checksum table and data alike) is the synced one or the
// current one, and the size either. The journal is not touched: every
// entry in it was fdatasynced before the write it covers.
func powerLoss(t testing.TB, random *rand.Rand, synced map[string][]byte) {
	t.Helper()
	for path, old := range synced {
		current, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		size := len(current)
		if random.IntN(2) == 0 {
			size = len(old)
		}
		torn := make([]byte, max(len(old), len(current)))
		for page := 0; page*4096 < len(torn); page++ {
			source := current
			if random.IntN(2) == 0 {
				source = old
			}
			lo, hi := page*4096, min((page+1)*4096, len(torn))
			if lo < len(source) {
				copy(torn[lo:hi], source[lo:min(hi, len(source))])
			}
		}
		if err := os.WriteFile(path, torn[:size], 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// crashRun does one iteration: objects written and flushed, then random
// writes, zeroes, trims and flushes, a power loss, a restart. It returns
// an error naming what went wrong: a read that fails (a checksum error the
// VM would see as EIO), or a block that reads as neither its content at
// the last flush nor its newest content (for a block not written since
// the last flush: anything but that content).
func crashRun(t testing.TB, root string, random *rand.Rand) error {
	options := Options{Disks: []Disk{{Path: root}}}
	s, err := Open(options)
	if err != nil {
		t.Fatal(err)
	}
	const objects, size = 2, 16 * blockSize
	current := make([][]byte, objects)
	for oid := range current {
		current[oid] = pattern(random.Uint64(), size)
		mustWrite(t, s, 1, object.OID(oid+1), current[oid], 0, object.FlagCreate)
	}
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	flushed := make([][]byte, objects)
	synced := objectFiles(t, root)
	for oid := range current {
		flushed[oid] = append([]byte(nil), current[oid]...)
	}
	for op := 0; op < 2+random.IntN(10); op++ {
		oid := random.IntN(objects)
		offset := random.IntN(size - 1)
		if random.IntN(2) == 0 {
			offset -= offset % blockSize
		}
		length := 1 + random.IntN(min(3*blockSize, size-offset))
		switch k := random.IntN(10); {
		case k < 6:
			p := pattern(random.Uint64(), length)
			mustWrite(t, s, 1, object.OID(oid+1), p, uint32(offset), 0)
			copy(current[oid][offset:], p)
		case k < 8:
			var err error
			if k == 6 {
				err = s.Trim(1, object.OID(oid+1), uint32(offset), uint32(length), 0)
			} else {
				err = s.WriteZeroes(1, object.OID(oid+1), uint32(offset), uint32(length), object.FlagNoHole)
			}
			if err != nil {
				t.Fatal(err)
			}
			clear(current[oid][offset : offset+length])
		default:
			if err := s.Flush(); err != nil {
				t.Fatal(err)
			}
			synced = objectFiles(t, root)
			for oid := range current {
				copy(flushed[oid], current[oid])
			}
		}
	}
	s.abandon()
	powerLoss(t, random, synced)

	s, err = Open(options)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}()
	for oid := range current {
		got := make([]byte, size)
		if _, err := s.Read(object.OID(oid+1), got, 0); err != nil {
			return fmt.Errorf("object %d after the restart: %w", oid+1, err)
		}
		for b := 0; b < size/blockSize; b++ {
			block := got[b*blockSize : (b+1)*blockSize]
			old, now := flushed[oid][b*blockSize:(b+1)*blockSize], current[oid][b*blockSize:(b+1)*blockSize]
			if bytes.Equal(old, now) && !bytes.Equal(block, old) {
				return fmt.Errorf("object %d block %d: flushed and not written since, but it reads otherwise", oid+1, b)
			}
			if !bytes.Equal(block, old) && !bytes.Equal(block, now) {
				return fmt.Errorf("object %d block %d reads as neither its flushed nor its newest content", oid+1, b)
			}
		}
	}
	return nil
}

// The store crash test: thousands of write/crash/restart iterations with
// unsynced pages dropped: no read of an unflushed block fails its
// checksum, no flushed block is lost.
func TestCrashKeepsDataAndChecksumsConsistent(t *testing.T) {
	iterations := *crashIterations
	if testing.Short() || raceEnabled {
		iterations = min(iterations, 200)
	}
	seed := rand.Uint64()
	t.Logf("seed %d, %d iterations", seed, iterations)
	random := rand.New(rand.NewPCG(seed, 0))
	defer func(at int) { journalCompactAt = at }(journalCompactAt)
	for i := 0; i < iterations; i++ {
		// Every other iteration compacts the journal at every Flush
		// (more than one object listed).
		journalCompactAt = []int{1024, 1}[i%2]
		root := crashDisk(t)
		if err := crashRun(t, root, random); err != nil {
			t.Fatalf("iteration %d (seed %d): %v", i, seed, err)
		}
		os.RemoveAll(root)
	}
}

// The crash test can fail: without the journal's re-hash, a power loss
// that keeps a block's new data and its old sum (or the reverse) turns an
// unflushed write into a checksum error.
func TestCrashWithoutJournalFails(t *testing.T) {
	skipJournal = true
	defer func() { skipJournal = false }()
	random := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 500; i++ {
		root := crashDisk(t)
		err := crashRun(t, root, random)
		os.RemoveAll(root)
		if errors.Is(err, ErrChecksum) {
			t.Logf("iteration %d: %v", i, err)
			return
		}
		if err != nil {
			t.Fatalf("iteration %d: %v", i, err)
		}
	}
	t.Fatal("500 crashes without the journal and never a checksum error: the crash test cannot see what the journal is for")
}

// crashDisk is a fresh disk directory, in memory where possible (each
// iteration opens a store, which syncs the file system).
func crashDisk(t testing.TB) string {
	base := ""
	if info, err := os.Stat("/dev/shm"); err == nil && info.IsDir() {
		base = "/dev/shm"
	}
	dir, err := os.MkdirTemp(base, "herd-store-crash-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	return dir
}
