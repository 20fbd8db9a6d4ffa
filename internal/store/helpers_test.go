package store

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"testing"

	"github.com/herd-storage/herd/internal/object"
)

// tempDisk returns a fresh directory for a disk. t.TempDir makes it 0777
// less the umask: group-writable under the common umask 002, which Open
// refuses (checkRootMode).
func tempDisk(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	return dir
}

// openTest opens a store on one fresh disk unless options name disks, and
// closes it at the end of the test.
func openTest(t testing.TB, options Options) *Store {
	t.Helper()
	if len(options.Disks) == 0 {
		options.Disks = []Disk{{Path: tempDisk(t)}}
	}
	s, err := Open(options)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil && !errors.Is(err, ErrClosed) {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

// reopen closes s and opens a new store with the same options.
func reopen(t testing.TB, s *Store, options Options) *Store {
	t.Helper()
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	return openTest(t, options)
}

// pattern returns n bytes that depend on seed and on the position, so that
// a piece read from the wrong place does not match.
func pattern(seed uint64, n int) []byte {
	p := make([]byte, n)
	x := seed*0x9e3779b97f4a7c15 + 1
	for i := range p {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		p[i] = byte(x)
	}
	return p
}

func mustWrite(t testing.TB, s *Store, epoch object.Epoch, oid object.OID, p []byte, offset uint32, flags object.Flags) {
	t.Helper()
	if err := s.Write(epoch, oid, p, offset, flags); err != nil {
		t.Fatalf("Write(%016x, %d bytes at %d): %v", oid, len(p), offset, err)
	}
}

func mustRead(t testing.TB, s *Store, oid object.OID, n int, offset uint32) ([]byte, Info) {
	t.Helper()
	p := bytes.Repeat([]byte{0xee}, n) // not zeros: holes must be filled
	info, err := s.Read(oid, p, offset)
	if err != nil {
		t.Fatalf("Read(%016x, %d bytes at %d): %v", oid, n, offset, err)
	}
	return p, info
}

// checkBytes fails the test at the first difference.
func checkBytes(t testing.TB, what string, got, want []byte) {
	t.Helper()
	if bytes.Equal(got, want) {
		return
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("%s: byte %d is %#x, want %#x (%d bytes compared)", what, i, got[i], want[i], len(got))
		}
	}
	t.Fatalf("%s: lengths %d and %d", what, len(got), len(want))
}

func wantErr(t testing.TB, what string, err error, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("%s: error %v, want %v", what, err, target)
	}
}

// seeded returns a random source and logs its seed, so that a failure can
// be replayed by setting the seed in the test.
func seeded(t testing.TB) *rand.Rand {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	return rand.New(rand.NewPCG(seed, seed))
}

// syncCounter wraps a store's sync hooks to count calls per file.
type syncCounter struct {
	mu    sync.Mutex
	files map[string]int
	dirs  map[string]int
	fail  func(path string) error // injected file sync failure, or nil
}

func countSyncs(s *Store) *syncCounter {
	c := &syncCounter{files: map[string]int{}, dirs: map[string]int{}}
	datasync, dirsync := s.datasync, s.dirsync
	s.datasync = func(f *os.File) error {
		c.mu.Lock()
		c.files[f.Name()]++
		fail := c.fail
		c.mu.Unlock()
		if fail != nil {
			if err := fail(f.Name()); err != nil {
				return err
			}
		}
		return datasync(f)
	}
	s.dirsync = func(f *os.File) error {
		c.mu.Lock()
		c.dirs[f.Name()]++
		c.mu.Unlock()
		return dirsync(f)
	}
	return c
}

// take returns the counts so far and resets them.
func (c *syncCounter) take() (files, dirs map[string]int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	files, dirs = c.files, c.dirs
	c.files, c.dirs = map[string]int{}, map[string]int{}
	return files, dirs
}

func (c *syncCounter) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return fmt.Sprintf("files %v dirs %v", c.files, c.dirs)
}
