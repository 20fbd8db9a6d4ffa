package store

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/herd-storage/herd/internal/object"
)

// countFiles counts the object files under each disk.
func countFiles(t *testing.T, roots []string) []int {
	t.Helper()
	counts := make([]int, len(roots))
	for i, root := range roots {
		matches, err := filepath.Glob(filepath.Join(root, "objects", "*", "*"))
		if err != nil {
			t.Fatal(err)
		}
		counts[i] = len(matches)
	}
	return counts
}

func TestMultipleDisks(t *testing.T) {
	roots := []string{tempDisk(t), tempDisk(t), tempDisk(t)}
	weights := []uint64{1, 2, 1}
	var disks []Disk
	for i, root := range roots {
		disks = append(disks, Disk{Path: root, Weight: weights[i] * 1000})
	}
	options := Options{Disks: disks, OpenFiles: 64}
	s := openTest(t, options)
	const objects = 600
	for oid := uint64(0); oid < objects; oid++ {
		mustWrite(t, s, object.Epoch(oid%3+1), object.OID(oid<<8), pattern(oid, 64), 0, object.FlagCreate)
	}
	counts := countFiles(t, roots)
	for i, count := range counts {
		want := float64(objects) * float64(weights[i]) / 4
		// Binomial: the standard deviation is at most 12 here; allow 6.
		if math.Abs(float64(count)-want) > 6*math.Sqrt(want) {
			t.Errorf("disk %d (weight %d) holds %d objects, want about %.0f", i, weights[i], count, want)
		}
	}
	t.Logf("objects per disk %v for weights %v", counts, weights)

	check := func(s *Store, what string) {
		t.Helper()
		for oid := uint64(0); oid < objects; oid++ {
			got, info := mustRead(t, s, object.OID(oid<<8), 64, 0)
			checkBytes(t, what, got, pattern(oid, 64))
			if info.Epoch != object.Epoch(oid%3+1) {
				t.Fatalf("%s: object %d epoch %d", what, oid, info.Epoch)
			}
		}
		if listed := listAll(t, s); len(listed) != objects {
			t.Fatalf("%s: List reports %d objects", what, len(listed))
		}
	}
	// The same disks, in another order: objects are where they were.
	options.Disks = []Disk{disks[2], disks[0], disks[1]}
	s = reopen(t, s, options)
	check(s, "reordered")
	if got := countFiles(t, roots); got[0] != counts[0] || got[1] != counts[1] {
		t.Fatalf("objects moved: %v, were %v", got, counts)
	}

	// A disk added and one removed: objects on the remaining disks are
	// found where they are, new ones go to the new disk too.
	extra := tempDisk(t)
	options.Disks = []Disk{disks[0], disks[1], {Path: extra, Weight: 4000}}
	s = reopen(t, s, options)
	for oid := uint64(0); oid < objects; oid++ {
		if _, err := s.Stat(object.OID(oid << 8)); err != nil && !errors.Is(err, ErrNotFound) {
			t.Fatal(err)
		}
	}
	for oid := uint64(objects); oid < objects+200; oid++ {
		mustWrite(t, s, 1, object.OID(oid<<8), pattern(oid, 64), 0, object.FlagCreate)
	}
	if n := countFiles(t, []string{extra})[0]; n < 50 {
		t.Errorf("the new disk of half the weight received %d of 200 new objects", n)
	}
	// Objects that were on the removed disk are missing; writing them
	// with Create makes new copies on the current disks.
	for oid := uint64(0); oid < 100; oid++ {
		mustWrite(t, s, 9, object.OID(oid<<8), []byte("x"), 0, object.FlagCreate)
	}

	// All four disks: objects with a copy on two disks are read from,
	// and listed for, the one probed first, once.
	options.Disks = []Disk{disks[0], disks[1], disks[2], {Path: extra, Weight: 4000}}
	s = reopen(t, s, options)
	listed := listAll(t, s)
	if len(listed) != objects+200 {
		t.Fatalf("List reports %d objects, want %d", len(listed), objects+200)
	}
	for oid := uint64(0); oid < objects+200; oid++ {
		info, err := s.Stat(object.OID(oid << 8))
		if err != nil {
			t.Fatal(err)
		}
		if info.Epoch != listed[oid<<8].Epoch {
			t.Fatalf("object %d: Stat epoch %d, List epoch %d", oid, info.Epoch, listed[oid<<8].Epoch)
		}
	}
}

func TestProbeOrderFollowsWeights(t *testing.T) {
	disks := []*diskState{
		{root: "a", weight: 1, seed: diskSeed("a")},
		{root: "b", weight: 3, seed: diskSeed("b")},
	}
	first := map[string]int{}
	var order []*diskState
	for oid := uint64(0); oid < 40000; oid++ {
		order = probeOrder(disks, object.OID(oid), order)
		first[order[0].root]++
		if len(order) != 2 || order[0] == order[1] {
			t.Fatal("probe order is not a permutation")
		}
	}
	if share := float64(first["b"]) / 40000; math.Abs(share-0.75) > 0.02 {
		t.Errorf("disk of weight 3 of 4 chosen for %.3f of objects", share)
	}
	// Adding a disk moves objects only to it.
	disks3 := append(disks[:2:2], &diskState{root: "c", weight: 4, seed: diskSeed("c")})
	var order3 []*diskState
	for oid := uint64(0); oid < 10000; oid++ {
		order = probeOrder(disks, object.OID(oid), order)
		order3 = probeOrder(disks3, object.OID(oid), order3)
		if order3[0] != order[0] && order3[0].root != "c" {
			t.Fatalf("object %d moved from %s to %s", oid, order[0].root, order3[0].root)
		}
	}
}

func TestReserve(t *testing.T) {
	var free atomic.Uint64
	free.Store(10 << 30)
	space := func(string) (Space, error) {
		return Space{FreeBytes: free.Load(), TotalBytes: 100 << 30}, nil
	}
	s := openTest(t, Options{DiskSpace: space})
	mustWrite(t, s, 1, 1, []byte("a"), 0, object.FlagCreate)

	// Default reserve: 5% of 100 GiB is 5 GiB, capped at 1 GiB.
	free.Store(1<<30 + 1)
	mustWrite(t, s, 1, 2, []byte("b"), 0, object.FlagCreate)
	free.Store(1<<30 - 1)
	err := s.Write(1, 3, []byte("c"), 0, object.FlagCreate)
	wantErr(t, "create below the reserve", err, ErrNoSpace)
	wantErr(t, "zero-create below the reserve", s.WriteZeroes(1, 3, 0, 1, object.FlagCreate), ErrNoSpace)
	if _, err := s.Stat(3); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a refused create left an object: %v", err)
	}
	// Existing objects take writes, also with Create.
	mustWrite(t, s, 1, 1, []byte("still"), 4096, 0)
	mustWrite(t, s, 1, 2, []byte("still"), 4096, object.FlagCreate)
	free.Store(2 << 30)
	mustWrite(t, s, 1, 3, []byte("c"), 0, object.FlagCreate)

	used, capacity, err := s.Usage()
	if err != nil || capacity != 100<<30 || used != 98<<30 {
		t.Fatalf("Usage %d %d %v", used, capacity, err)
	}

	// Configured and disabled reserves, and a small disk.
	for _, tc := range []struct {
		option      int64
		total, want uint64
	}{
		{0, 100 << 30, 1 << 30},
		{0, 10 << 30, 512 << 20},
		{4096, 100 << 30, 4096},
		{-1, 100 << 30, 0},
	} {
		s := &Store{reserveBytes: tc.option}
		if got := s.reserveFor(tc.total); got != tc.want {
			t.Errorf("reserve option %d on %d bytes: %d, want %d", tc.option, tc.total, got, tc.want)
		}
	}
	s2 := openTest(t, Options{DiskSpace: space, ReserveBytes: -1})
	free.Store(0)
	mustWrite(t, s2, 1, 1, []byte("a"), 0, object.FlagCreate)

	failing := func(string) (Space, error) { return Space{}, os.ErrPermission }
	_, err = Open(Options{Disks: []Disk{{Path: tempDisk(t)}}, DiskSpace: failing})
	wantErr(t, "Open with a disk space error and no weight", err, os.ErrPermission)
}

func TestUsageOfRealDisks(t *testing.T) {
	s := openTest(t, Options{Disks: []Disk{{Path: tempDisk(t)}}})
	used, capacity, err := s.Usage()
	if err != nil {
		t.Fatal(err)
	}
	if capacity == 0 || used > capacity {
		t.Fatalf("used %d of %d", used, capacity)
	}
	if s.disks[0].weight != capacity {
		t.Errorf("weight %d, want the file system size %d", s.disks[0].weight, capacity)
	}
}
