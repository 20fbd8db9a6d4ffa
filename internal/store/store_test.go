package store

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/object"
)

// TestWriteReadUnaligned compares random writes and reads at unaligned
// offsets, many across 4 KiB boundaries, with a byte slice.
func TestWriteReadUnaligned(t *testing.T) {
	s := openTest(t, Options{})
	random := seeded(t)
	const size = 256 << 10
	const oid = 0x0100000000000007
	model := make([]byte, size)
	mustWrite(t, s, 1, oid, nil, 0, object.FlagCreate)
	for i := 0; i < 300; i++ {
		offset := random.IntN(size)
		if i%3 == 0 { // straddle a 4 KiB boundary
			offset = (offset/4096+1)*4096 - 1 - random.IntN(100)
		}
		n := 1 + random.IntN(min(3*4096, size-offset))
		p := pattern(uint64(i), n)
		mustWrite(t, s, 1, oid, p, uint32(offset), 0)
		copy(model[offset:], p)

		offset = random.IntN(size)
		n = random.IntN(size - offset + 1)
		got, info := mustRead(t, s, oid, n, uint32(offset))
		checkBytes(t, fmt.Sprintf("op %d: read %d bytes at %d", i, n, offset), got, model[offset:offset+n])
		if info.Epoch != 1 {
			t.Fatalf("epoch %d, want 1", info.Epoch)
		}
	}
	got, _ := mustRead(t, s, oid, size, 0)
	checkBytes(t, "whole object", got, model)
}

func TestHolesReadZeros(t *testing.T) {
	s := openTest(t, Options{})
	const oid = 42
	data := pattern(1, 1000)
	mustWrite(t, s, 3, oid, data, 1<<20+5, object.FlagCreate)

	got, _ := mustRead(t, s, oid, 1<<20+5, 0)
	checkBytes(t, "hole before the data", got, make([]byte, 1<<20+5))
	got, _ = mustRead(t, s, oid, 3000, 1<<20)
	want := make([]byte, 3000)
	copy(want[5:], data)
	checkBytes(t, "data between holes", got, want)
	// Beyond the object's length, up to the largest object.
	got, _ = mustRead(t, s, oid, 8192, MaxObjectSize-8192)
	checkBytes(t, "beyond the length", got, make([]byte, 8192))
	got, _ = mustRead(t, s, oid, 0, MaxObjectSize)
	if len(got) != 0 {
		t.Fatal("empty read returned bytes")
	}
}

func TestSparse(t *testing.T) {
	s := openTest(t, Options{})
	const oid = 7
	const objectSize = 4 << 20
	mustWrite(t, s, 1, oid, pattern(2, 4096), objectSize-4096, object.FlagCreate|object.FlagSync)
	info, err := s.Stat(oid)
	if err != nil {
		t.Fatal(err)
	}
	if info.LengthBytes != objectSize {
		t.Errorf("length %d, want %d", info.LengthBytes, objectSize)
	}
	// Header block, one block of the checksum table and the data block;
	// file systems may round up a little
	// (ext4 counts delayed allocation, XFS may preallocate), but nowhere
	// near the 4 MiB a non-sparse file takes.
	if info.AllocatedBytes < 12288 || info.AllocatedBytes > 256<<10 {
		t.Errorf("allocated %d bytes for 4 KiB in a 4 MiB object", info.AllocatedBytes)
	}
	path := s.disks[0].objectPath(oid)
	fileInfo, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fileInfo.Size() != dataOffset+objectSize {
		t.Errorf("file size %d, want %d", fileInfo.Size(), dataOffset+objectSize)
	}
	if blocks := fileInfo.Sys().(*syscall.Stat_t).Blocks; blocks*512 != int64(info.AllocatedBytes) {
		t.Errorf("st_blocks %d disagrees with Stat's %d bytes", blocks, info.AllocatedBytes)
	}
	t.Logf("4 KiB at the end of a 4 MiB object allocates %d bytes", info.AllocatedBytes)
}

func TestLayout(t *testing.T) {
	s := openTest(t, Options{})
	const oid = 0x00abcdef00000012
	mustWrite(t, s, 9, oid, []byte("x"), 0, object.FlagCreate)
	path := s.disks[0].objectPath(oid)
	want := filepath.Join(s.disks[0].root, "objects", fmt.Sprintf("%02x", fanoutIndex(oid)), "00abcdef00000012")
	if path != want {
		t.Fatalf("path %s, want %s", path, want)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(raw) != dataOffset+1 || raw[dataOffset] != 'x' {
		t.Fatalf("file is %d bytes, data byte %q", len(raw), raw[len(raw)-1])
	}
	if !bytes.HasPrefix(raw, []byte("HERDOBJ1")) {
		t.Fatalf("file starts with %q", raw[:8])
	}
	hdr, err := decodeHeader(raw[:headerLength], oid)
	if err != nil || hdr.epoch != 9 {
		t.Fatalf("header %+v, %v", hdr, err)
	}
}

func TestEpochStampsPersist(t *testing.T) {
	options := Options{Disks: []Disk{{Path: tempDisk(t)}}}
	s := openTest(t, options)
	mustWrite(t, s, 3, 1, []byte("a"), 0, object.FlagCreate)
	mustWrite(t, s, 3, 2, []byte("b"), 0, object.FlagCreate)
	mustWrite(t, s, 5, 2, []byte("b"), 1, 0)
	if err := s.WriteZeroes(6, 3, 0, 10, object.FlagCreate); err != nil {
		t.Fatal(err)
	}
	if err := s.SetEpoch(8, 1); err != nil {
		t.Fatal(err)
	}
	if err := s.SetEpoch(8, 9); !errors.Is(err, ErrNotFound) {
		t.Fatalf("SetEpoch of a missing object: %v", err)
	}

	s = reopen(t, s, options)
	for oid, want := range map[object.OID]object.Epoch{1: 8, 2: 5, 3: 6} {
		_, info := mustRead(t, s, oid, 1, 0)
		if info.Epoch != want {
			t.Errorf("object %d: epoch %d after reopening, want %d", oid, info.Epoch, want)
		}
		stat, err := s.Stat(oid)
		if err != nil || stat.Epoch != want {
			t.Errorf("object %d: Stat %+v, %v", oid, stat, err)
		}
		if epoch, err := s.Epoch(oid); err != nil || epoch != want {
			t.Errorf("object %d: Epoch %d, %v", oid, epoch, err)
		}
	}
	if _, err := s.Epoch(9); !errors.Is(err, ErrNotFound) {
		t.Errorf("Epoch of a missing object: %v", err)
	}
}

// TestSameEpochKeepsHeader checks that a write in the copy's epoch does not
// rewrite the header, and one in another epoch does.
func TestSameEpochKeepsHeader(t *testing.T) {
	s := openTest(t, Options{})
	mustWrite(t, s, 4, 5, []byte("a"), 0, object.FlagCreate)
	path := s.disks[0].objectPath(5)
	// Overwrite the header behind the store's back with a valid one for
	// epoch 99: if a write in epoch 4 rewrote the header, it would put 4
	// back.
	behind := header{oid: 5, epoch: 99}.encode()
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(behind[:], 0); err != nil {
		t.Fatal(err)
	}
	f.Close()
	readHeader := func() uint64 {
		raw, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		hdr, err := decodeHeader(raw[:headerLength], 5)
		if err != nil {
			t.Fatal(err)
		}
		return uint64(hdr.epoch)
	}
	mustWrite(t, s, 4, 5, []byte("b"), 1, 0)
	if epoch := readHeader(); epoch != 99 {
		t.Fatalf("a write in the same epoch rewrote the header (epoch %d)", epoch)
	}
	mustWrite(t, s, 6, 5, []byte("c"), 2, 0)
	if epoch := readHeader(); epoch != 6 {
		t.Fatalf("header epoch %d after a write in epoch 6", epoch)
	}
}

func TestCorruptHeader(t *testing.T) {
	damages := []struct {
		name   string
		damage func(t *testing.T, path string)
	}{
		{"magic", func(t *testing.T, path string) { patchFile(t, path, 0, 'X') }},
		{"epoch bit flip", func(t *testing.T, path string) { patchFile(t, path, 25, 0x40) }},
		{"checksum", func(t *testing.T, path string) { patchFile(t, path, 61, 0x01) }},
		{"empty file", func(t *testing.T, path string) {
			if err := os.Truncate(path, 0); err != nil {
				t.Fatal(err)
			}
		}},
		{"another object's file", func(t *testing.T, path string) {
			other := header{oid: 12345, epoch: 1}.encode()
			f, err := os.OpenFile(path, os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if _, err := f.WriteAt(other[:], 0); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tc := range damages {
		t.Run(tc.name, func(t *testing.T) {
			options := Options{Disks: []Disk{{Path: tempDisk(t)}}}
			s := openTest(t, options)
			const oid = 77
			mustWrite(t, s, 2, oid, pattern(1, 5000), 0, object.FlagCreate)
			mustWrite(t, s, 2, oid+1, pattern(2, 10), 0, object.FlagCreate)
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			tc.damage(t, s.disks[0].objectPath(oid))
			s = openTest(t, options)

			_, err := s.Read(oid, make([]byte, 10), 0)
			wantErr(t, "Read", err, ErrCorrupt)
			wantErr(t, "Write", s.Write(2, oid, []byte("x"), 0, 0), ErrCorrupt)
			wantErr(t, "Write with Create", s.Write(2, oid, []byte("x"), 0, object.FlagCreate), ErrCorrupt)
			wantErr(t, "Trim", s.Trim(2, oid, 0, 10, 0), ErrCorrupt)
			wantErr(t, "SetEpoch", s.SetEpoch(3, oid), ErrCorrupt)
			wantErr(t, "Sync", s.Sync(oid), ErrCorrupt)
			_, err = s.Stat(oid)
			wantErr(t, "Stat", err, ErrCorrupt)
			var objectErr *ObjectError
			if !errors.As(err, &objectErr) || objectErr.OID != oid || objectErr.Path == "" {
				t.Errorf("error %#v does not name the object and its file", err)
			}

			listed := listAll(t, s)
			if !listed[oid].Damaged || listed[oid+1].Damaged || listed[oid+1].Epoch != 2 {
				t.Errorf("List: %+v", listed)
			}

			// The repair path: remove, then recover a fresh copy.
			if err := s.Remove(oid); err != nil {
				t.Fatalf("Remove of a corrupt copy: %v", err)
			}
			mustWrite(t, s, 4, oid, []byte("fresh"), 0, object.FlagCreate)
			got, info := mustRead(t, s, oid, 5, 0)
			checkBytes(t, "recovered copy", got, []byte("fresh"))
			if info.Epoch != 4 {
				t.Errorf("epoch %d", info.Epoch)
			}
		})
	}
}

// patchFile xors one byte of a file.
func patchFile(t *testing.T, path string, offset int64, xor byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var b [1]byte
	if _, err := f.ReadAt(b[:], offset); err != nil {
		t.Fatal(err)
	}
	b[0] ^= xor
	if _, err := f.WriteAt(b[:], offset); err != nil {
		t.Fatal(err)
	}
}

func listAll(t testing.TB, s *Store) map[uint64]Info {
	t.Helper()
	listed := map[uint64]Info{}
	err := s.List(func(oid object.OID, info Info) error {
		if _, dup := listed[uint64(oid)]; dup {
			t.Errorf("List reported %016x twice", oid)
		}
		listed[uint64(oid)] = info
		return nil
	})
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	return listed
}

func TestCreateFlag(t *testing.T) {
	s := openTest(t, Options{})
	const oid = 3
	wantErr(t, "Write without Create", s.Write(1, oid, []byte("x"), 0, 0), ErrNotFound)
	wantErr(t, "WriteZeroes without Create", s.WriteZeroes(1, oid, 0, 10, 0), ErrNotFound)
	wantErr(t, "Trim without Create", s.Trim(1, oid, 0, 10, object.FlagSync), ErrNotFound)
	_, err := s.Read(oid, make([]byte, 1), 0)
	wantErr(t, "Read", err, ErrNotFound)
	_, err = s.Stat(oid)
	wantErr(t, "Stat", err, ErrNotFound)
	wantErr(t, "Sync", s.Sync(oid), ErrNotFound)
	wantErr(t, "Remove", s.Remove(oid), ErrNotFound)
	if entries := listAll(t, s); len(entries) != 0 {
		t.Fatalf("List after failed writes: %v", entries)
	}

	// An empty write with Create makes an empty object.
	mustWrite(t, s, 2, oid, nil, 0, object.FlagCreate)
	info, err := s.Stat(oid)
	if err != nil || info.Epoch != 2 || info.LengthBytes != 0 {
		t.Fatalf("Stat %+v, %v", info, err)
	}
	got, _ := mustRead(t, s, oid, 100, 50)
	checkBytes(t, "empty object", got, make([]byte, 100))
	// Create on an existing object keeps its data.
	mustWrite(t, s, 2, oid, []byte("abc"), 0, object.FlagCreate)
	mustWrite(t, s, 2, oid, []byte("X"), 1, object.FlagCreate)
	got, _ = mustRead(t, s, oid, 3, 0)
	checkBytes(t, "after a second Create", got, []byte("aXc"))
	// WriteZeroes with Create makes an object too: in a clone, an
	// object of zeros must exist to hide the parent's data.
	if err := s.WriteZeroes(2, oid+1, 0, 4096, object.FlagCreate); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Stat(oid + 1); err != nil {
		t.Fatal(err)
	}
}

func TestTrimAndWriteZeroes(t *testing.T) {
	s := openTest(t, Options{})
	const oid = 11
	const size = 1 << 20
	model := pattern(3, size)
	mustWrite(t, s, 1, oid, model, 0, object.FlagCreate|object.FlagSync)
	before, err := s.Stat(oid)
	if err != nil {
		t.Fatal(err)
	}

	// Unaligned trim: partial blocks are zeroed, whole ones freed.
	if err := s.Trim(1, oid, 1000, 300000, 0); err != nil {
		t.Fatal(err)
	}
	clear(model[1000:301000])
	// Aligned hole.
	if err := s.WriteZeroes(2, oid, 512<<10, 256<<10, object.FlagSync); err != nil {
		t.Fatal(err)
	}
	clear(model[512<<10 : 768<<10])
	// Allocated zeros, and zeros beyond the end (no change).
	if err := s.WriteZeroes(2, oid, 900000, 5000, object.FlagNoHole); err != nil {
		t.Fatal(err)
	}
	clear(model[900000:905000])
	if err := s.WriteZeroes(2, oid, 2<<20, 1<<20, 0); err != nil {
		t.Fatal(err)
	}
	got, info := mustRead(t, s, oid, size, 0)
	checkBytes(t, "after trims", got, model)
	if info.Epoch != 2 {
		t.Errorf("epoch %d, want 2", info.Epoch)
	}
	after, err := s.Stat(oid)
	if err != nil {
		t.Fatal(err)
	}
	freed := int64(before.AllocatedBytes) - int64(after.AllocatedBytes)
	if freed < 500<<10 {
		t.Errorf("punching about 550 KiB freed %d bytes (%d -> %d)", freed, before.AllocatedBytes, after.AllocatedBytes)
	}
	if after.LengthBytes != size {
		t.Errorf("length %d after trims, want %d (holes keep the size)", after.LengthBytes, size)
	}

	// NoHole beyond the end extends the object like a write of zeros.
	if err := s.WriteZeroes(2, oid, size, 8192, object.FlagNoHole); err != nil {
		t.Fatal(err)
	}
	if info, _ := s.Stat(oid); info.LengthBytes != size+8192 {
		t.Errorf("length %d after zeroing beyond the end with NoHole", info.LengthBytes)
	}
	got, _ = mustRead(t, s, oid, 8192, size)
	checkBytes(t, "allocated zeros", got, make([]byte, 8192))

	// The fallback for file systems without fallocate modes.
	f, err := os.CreateTemp(tempDisk(t), "zero")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(pattern(4, 200000)); err != nil {
		t.Fatal(err)
	}
	if err := zeroRange(f, 10, 150000, true); err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(f.Name())
	want := pattern(4, 200000)
	clear(want[10:150010])
	checkBytes(t, "zeroRange", raw, want)
}

func TestRemove(t *testing.T) {
	options := Options{Disks: []Disk{{Path: tempDisk(t)}}}
	s := openTest(t, options)
	counter := countSyncs(s)
	const oid = 99
	mustWrite(t, s, 3, oid, pattern(5, 10000), 0, object.FlagCreate)
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	counter.take()
	if err := s.Remove(oid); err != nil {
		t.Fatal(err)
	}
	wantErr(t, "second Remove", s.Remove(oid), ErrNotFound)
	_, err := s.Read(oid, make([]byte, 1), 0)
	wantErr(t, "Read after Remove", err, ErrNotFound)
	if _, err := os.Stat(s.disks[0].objectPath(oid)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("file still there: %v", err)
	}
	// The removal is made durable by the next Flush.
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	_, dirs := counter.take()
	if dirs[s.disks[0].fanoutPath(fanoutIndex(oid))] != 1 {
		t.Errorf("Flush after Remove synced directories %v", dirs)
	}
	// A new copy starts empty.
	mustWrite(t, s, 4, oid, []byte("new"), 5000, object.FlagCreate)
	got, info := mustRead(t, s, oid, 10, 0)
	checkBytes(t, "new copy", got, make([]byte, 10))
	if info.Epoch != 4 {
		t.Errorf("epoch %d", info.Epoch)
	}
	s = reopen(t, s, options)
	wantErr(t, "Remove of a missing object", s.Remove(oid+1), ErrNotFound)
	if err := s.Remove(oid); err != nil {
		t.Fatal(err)
	}
	if len(listAll(t, s)) != 0 {
		t.Fatal("List after Remove")
	}
}

func TestList(t *testing.T) {
	options := Options{Disks: []Disk{{Path: tempDisk(t)}}, OpenFiles: 16}
	s := openTest(t, options)
	want := map[uint64]Info{}
	for i := uint64(0); i < 300; i++ {
		oid := i<<32 | i*7
		length := 1 + i*100
		mustWrite(t, s, object.Epoch(i%5+1), object.OID(oid), pattern(i, int(length)), 0, object.FlagCreate)
		want[oid] = Info{Epoch: object.Epoch(i%5 + 1), LengthBytes: length}
	}
	// A stray file is ignored.
	if err := os.WriteFile(filepath.Join(s.disks[0].fanoutPath(0), "notes.txt"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	check := func(s *Store) {
		t.Helper()
		listed := listAll(t, s)
		if len(listed) != len(want) {
			t.Fatalf("List reported %d objects, want %d", len(listed), len(want))
		}
		for oid, w := range want {
			got := listed[oid]
			if got.Epoch != w.Epoch || got.LengthBytes != w.LengthBytes || got.Damaged || got.AllocatedBytes == 0 {
				t.Fatalf("object %016x: %+v, want %+v", oid, got, w)
			}
		}
	}
	check(s) // some in the cache, most not
	s = reopen(t, s, options)
	check(s)

	stop := errors.New("stop")
	calls := 0
	err := s.List(func(object.OID, Info) error { calls++; return stop })
	if !errors.Is(err, stop) || calls != 1 {
		t.Fatalf("List returned %v after %d calls", err, calls)
	}
}

func TestInvalidArguments(t *testing.T) {
	s := openTest(t, Options{})
	wantErr(t, "Write beyond the maximum", s.Write(1, 1, make([]byte, 2), MaxObjectSize-1, object.FlagCreate), ErrInvalid)
	_, err := s.Read(1, make([]byte, 4097), MaxObjectSize-4096)
	wantErr(t, "Read beyond the maximum", err, ErrInvalid)
	wantErr(t, "Trim beyond the maximum", s.Trim(1, 1, MaxObjectSize, 1, object.FlagCreate), ErrInvalid)
	wantErr(t, "unknown flag", s.Write(1, 1, nil, 0, 1<<7), ErrInvalid)
	mustWrite(t, s, 1, 1, []byte("z"), MaxObjectSize-1, object.FlagCreate) // the last byte is fine

	_, err = Open(Options{})
	wantErr(t, "Open without disks", err, ErrInvalid)
	dir := tempDisk(t)
	_, err = Open(Options{Disks: []Disk{{Path: dir}, {Path: dir + "/"}}})
	wantErr(t, "Open with a disk twice", err, ErrInvalid)
	_, err = Open(Options{Disks: []Disk{{Path: filepath.Join(dir, "missing")}}})
	wantErr(t, "Open of a missing disk", err, os.ErrNotExist)
	_, err = Open(Options{Disks: []Disk{{Path: dir}}, OpenFiles: -1})
	wantErr(t, "negative OpenFiles", err, ErrInvalid)

	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	wantErr(t, "Write after Close", s.Write(1, 1, nil, 0, object.FlagCreate), ErrClosed)
	_, err = s.Read(1, nil, 0)
	wantErr(t, "Read after Close", err, ErrClosed)
	wantErr(t, "Flush after Close", s.Flush(), ErrClosed)
	wantErr(t, "List after Close", s.List(func(object.OID, Info) error { return nil }), ErrClosed)
	wantErr(t, "second Close", s.Close(), ErrClosed)
}

func TestClassify(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want error
	}{
		{&os.PathError{Op: "write", Path: "f", Err: syscall.ENOSPC}, ErrNoSpace},
		{&os.PathError{Op: "write", Path: "f", Err: syscall.EDQUOT}, ErrNoSpace},
		{&os.PathError{Op: "read", Path: "f", Err: syscall.EIO}, ErrIO},
	} {
		err := objectError("write", 1, "f", tc.err)
		if !errors.Is(err, tc.want) || !errors.Is(err, tc.err.(*os.PathError).Err) {
			t.Errorf("%v: not %v", err, tc.want)
		}
	}
	err := objectError("write", 0xab, "/d/objects/00/00000000000000ab", &os.PathError{Op: "write", Path: "f", Err: syscall.ENOSPC})
	const want = "store: write object 00000000000000ab (/d/objects/00/00000000000000ab): no space left: write f: no space left on device"
	if err.Error() != want {
		t.Errorf("message %q\nwant        %q", err.Error(), want)
	}
	if err := objectError("write", 1, "f", syscall.EPERM); errors.Is(err, ErrIO) || !errors.Is(err, syscall.EPERM) {
		t.Errorf("EPERM classified as %v", err)
	}
}

// A disk that returns EIO is taken out of service: its copies count as
// missing (lookups, List), new objects go to the other disk, usage
// leaves it out, and OnDiskFailure is told.
func TestFailedDiskTakenOutOfService(t *testing.T) {
	good, bad := tempDisk(t), tempDisk(t)
	failed := make(chan string, 1)
	s := openTest(t, Options{Disks: []Disk{{Path: good}, {Path: bad}}, OnDiskFailure: func(path string, cause error) { failed <- path }})
	var onBad, onGood []uint64
	for oid := uint64(1); len(onBad) < 3 || len(onGood) < 3; oid++ {
		mustWrite(t, s, 1, object.OID(oid), []byte("data"), 0, object.FlagCreate)
		if h := s.peek(object.OID(oid)); h != nil {
			if h.disk.root == filepath.Clean(bad) {
				onBad = append(onBad, oid)
			} else {
				onGood = append(onGood, oid)
			}
			s.release(h)
		}
	}
	s.readFault = func(path string) error {
		if strings.HasPrefix(path, filepath.Clean(bad)) {
			return &os.PathError{Op: "read", Path: path, Err: syscall.EIO}
		}
		return nil
	}
	_, err := s.Read(object.OID(onBad[0]), make([]byte, 4), 0)
	wantErr(t, "Read from the failing disk", err, ErrIO)
	select {
	case path := <-failed:
		if path != filepath.Clean(bad) {
			t.Fatalf("OnDiskFailure(%q), want %q", path, bad)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("OnDiskFailure not called")
	}
	if got := s.FailedDisks(); len(got) != 1 || got[0] != filepath.Clean(bad) {
		t.Fatalf("FailedDisks %v", got)
	}
	for _, oid := range onBad {
		_, err := s.Read(object.OID(oid), make([]byte, 4), 0)
		wantErr(t, "Read of a copy on the failed disk", err, ErrNotFound)
	}
	listed := listAll(t, s)
	for _, oid := range onBad {
		if _, ok := listed[oid]; ok {
			t.Fatalf("List reports object %d of the failed disk", oid)
		}
	}
	for _, oid := range onGood {
		if _, ok := listed[oid]; !ok {
			t.Fatalf("List lost object %d of the good disk", oid)
		}
		got := make([]byte, 4)
		if _, err := s.Read(object.OID(oid), got, 0); err != nil || string(got) != "data" {
			t.Fatalf("object %d on the good disk: %q %v", oid, got, err)
		}
	}
	// Unsynced writes to the failed disk are reported lost by the next
	// Flush, once.
	wantErr(t, "Flush after the disk failed", s.Flush(), ErrIO)
	if err := s.Flush(); err != nil {
		t.Fatalf("second Flush: %v", err)
	}
	// Recovery re-creates a lost copy: on the good disk.
	mustWrite(t, s, 2, object.OID(onBad[1]), []byte("back"), 0, object.FlagCreate)
	h := s.peek(object.OID(onBad[1]))
	if h == nil || h.disk.root != filepath.Clean(good) {
		t.Fatalf("re-created copy not on the good disk")
	}
	s.release(h)
	s.readFault = nil
}

// A Fresh write starts the object: what a copy held before is gone, and
// the rest of the object reads as zeros.
func TestFreshWriteEmptiesAnExistingCopy(t *testing.T) {
	s := openTest(t, Options{})
	const oid = 42
	old := bytes.Repeat([]byte{0xee}, 64<<10)
	if err := s.Write(3, oid, old, 0, object.FlagCreate); err != nil {
		t.Fatal(err)
	}
	if err := s.Write(4, oid, []byte("new"), 8192, object.FlagCreate|object.FlagFresh); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 64<<10)
	info, err := s.Read(oid, got, 0)
	if err != nil {
		t.Fatal(err)
	}
	want := make([]byte, 64<<10)
	copy(want[8192:], "new")
	if !bytes.Equal(got, want) {
		t.Fatalf("after a fresh write the object holds %d non-zero bytes outside the piece", bytes.Count(got, []byte{0xee}))
	}
	if info.Epoch != 4 {
		t.Fatalf("info after a fresh write: %+v", info)
	}
	// Without the flag, the same write keeps what is there.
	if err := s.Write(4, oid, old, 0, object.FlagCreate); err != nil {
		t.Fatal(err)
	}
	if err := s.Write(4, oid, []byte("new"), 8192, object.FlagCreate); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Read(oid, got, 0); err != nil || got[0] != 0xee {
		t.Fatalf("a plain write emptied the copy: %v", err)
	}
}
