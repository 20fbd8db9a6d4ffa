package store

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/herd-storage/herd/internal/object"
)

// Replace installs a whole copy at once: readers running meanwhile see
// the old copy with its stamp or the new one with its stamp, never the
// new data under the old stamp, a stamp below the old one, or a missing
// object (a recovery copy written in place was stamped 0 while
// it was written, and a survey then took it for the newest copy).
func TestReplaceIsAtomic(t *testing.T) {
	options := Options{Disks: []Disk{{Path: tempDisk(t)}}}
	s := openTest(t, options)
	const oid, size = 42, 1 << 20
	old, newer := bytes.Repeat([]byte{0xaa}, size), bytes.Repeat([]byte{0xbb}, size)
	mustWrite(t, s, 3, oid, old, 0, object.FlagCreate)

	var stop atomic.Bool
	var wg sync.WaitGroup
	var problems sync.Map
	for range 4 {
		wg.Go(func() {
			p := make([]byte, size)
			for !stop.Load() {
				stamp, err := s.Epoch(oid)
				if err != nil {
					problems.Store("epoch: "+err.Error(), true)
					continue
				}
				if stamp != 3 && stamp != 7 {
					problems.Store("stamp seen mid-replace", stamp)
				}
				info, err := s.Read(oid, p, 0)
				if err != nil {
					problems.Store("read: "+err.Error(), true)
					continue
				}
				switch {
				case info.Epoch == 3 && bytes.Equal(p, old):
				case info.Epoch == 7 && bytes.Equal(p, newer):
				default:
					problems.Store("read a mixed or wrongly stamped copy", info.Epoch)
				}
			}
		})
	}
	for range 20 {
		if err := s.Replace(7, oid, newer); err != nil {
			t.Fatal(err)
		}
	}
	stop.Store(true)
	wg.Wait()
	problems.Range(func(k, v any) bool {
		t.Errorf("%v (%v)", k, v)
		return true
	})
	got, info := mustRead(t, s, oid, size, 0)
	if info.Epoch != 7 || !bytes.Equal(got, newer) {
		t.Fatalf("after Replace: stamp %d, content equal %v", info.Epoch, bytes.Equal(got, newer))
	}
}

func TestReplaceNeverLowersAStamp(t *testing.T) {
	s := openTest(t, Options{Disks: []Disk{{Path: tempDisk(t)}}})
	mustWrite(t, s, 9, 1, []byte("new"), 0, object.FlagCreate)
	wantErr(t, "replace with an older stamp", s.Replace(4, 1, []byte("old")), ErrInvalid)
	wantErr(t, "write with an older stamp", s.Write(4, 1, []byte("old"), 0, 0), ErrInvalid)
	got, info := mustRead(t, s, 1, 3, 0)
	if info.Epoch != 9 || string(got) != "new" {
		t.Fatalf("copy changed by refused requests: stamp %d, %q", info.Epoch, got)
	}
}

// A Replace of a missing object creates it; the new copy, its directory
// entry and the replaced one's are durable after Flush; temporary files
// a killed process left are deleted when the store opens, and never
// listed as objects.
func TestReplaceCreatesAndIsDurableAfterFlush(t *testing.T) {
	options := Options{Disks: []Disk{{Path: tempDisk(t)}}}
	s := openTest(t, options)
	syncs := countSyncs(s)
	if err := s.Replace(2, 5, pattern(5, 3000)); err != nil {
		t.Fatal(err)
	}
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	files, dirs := syncs.take()
	path := s.disks[0].objectPath(5)
	if files[path] != 1 || dirs[filepath.Dir(path)] != 1 {
		t.Fatalf("Flush after Replace synced files %v dirs %v; want %s and its directory once", files, dirs, path)
	}
	// A leftover temporary copy, as a kill during Replace leaves it.
	leftover := filepath.Join(filepath.Dir(path), tempPrefix+"0000000000000005.1.1")
	if err := os.WriteFile(leftover, []byte("partial"), 0o640); err != nil {
		t.Fatal(err)
	}
	listed := 0
	if err := s.List(func(oid object.OID, info Info) error { listed++; return nil }); err != nil {
		t.Fatal(err)
	}
	if listed != 1 {
		t.Fatalf("List reported %d objects with a temporary file beside the one object", listed)
	}
	s = reopen(t, s, options)
	if _, err := os.Stat(leftover); !os.IsNotExist(err) {
		t.Fatalf("temporary copy left by a killed process survived Open: %v", err)
	}
	got, info := mustRead(t, s, 5, 3000, 0)
	checkBytes(t, "replaced object after reopen", got, pattern(5, 3000))
	if info.Epoch != 2 {
		t.Fatalf("stamp %d after reopen, want 2", info.Epoch)
	}
	names, _ := os.ReadDir(filepath.Dir(path))
	for _, n := range names {
		if strings.HasPrefix(n.Name(), tempPrefix) {
			t.Fatalf("temporary file %s left after Replace", n.Name())
		}
	}
}
