package store

import (
	"bytes"
	"errors"
	"os"
	"testing"

	"github.com/herd-storage/herd/internal/object"
)

// flipBit flips one bit of the object's data byte at offset in its file,
// behind the store's back (rot).
func flipBit(t testing.TB, s *Store, oid object.OID, offset int64) {
	t.Helper()
	path := s.disks[0].objectPath(oid)
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var b [1]byte
	if _, err := f.ReadAt(b[:], dataOffset+offset); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0x10
	if _, err := f.WriteAt(b[:], dataOffset+offset); err != nil {
		t.Fatal(err)
	}
}

// A flipped bit is never returned: the read of its block fails with
// ErrChecksum, reads of the other blocks succeed, a write of part of the
// bad block is refused (nothing built on it), a whole-block write or a
// Repair makes it good, and Repair leaves good blocks alone.
func TestChecksumCatchesRot(t *testing.T) {
	s := openTest(t, Options{})
	const oid = 7
	data := pattern(1, 3*blockSize)
	mustWrite(t, s, 1, oid, data, 0, object.FlagCreate)
	flipBit(t, s, oid, blockSize+100)

	p := make([]byte, 3*blockSize)
	if _, err := s.Read(oid, p, 0); !errors.Is(err, ErrChecksum) {
		t.Fatalf("read over the flipped bit: %v, want ErrChecksum", err)
	}
	for _, r := range []struct{ offset, length int }{{0, blockSize}, {2 * blockSize, blockSize}, {10, 100}, {2*blockSize + 1, 5}} {
		got, _ := mustRead(t, s, oid, r.length, uint32(r.offset))
		if !bytes.Equal(got, data[r.offset:r.offset+r.length]) {
			t.Fatalf("read %d+%d returned other bytes", r.offset, r.length)
		}
	}
	if _, err := s.Read(oid, make([]byte, 1), blockSize+4000); !errors.Is(err, ErrChecksum) {
		t.Fatalf("one byte of the bad block: %v, want ErrChecksum", err)
	}
	if err := s.Write(1, oid, []byte("partial"), blockSize+10, 0); !errors.Is(err, ErrChecksum) {
		t.Fatalf("partial write into the bad block: %v, want ErrChecksum", err)
	}
	if got := s.disks[0].checksumErrors.Load(); got < 3 {
		t.Errorf("checksum errors counted %d, want at least 3", got)
	}

	// Repair with the good bytes for all three blocks, and other bytes
	// for the good ones: only the bad block changes.
	repair := append([]byte(nil), data...)
	copy(repair[:blockSize], pattern(9, blockSize))
	copy(repair[2*blockSize:], pattern(9, blockSize))
	n, err := s.Repair(oid, repair, 0)
	if err != nil || n != 1 {
		t.Fatalf("Repair: %d blocks, %v; want 1", n, err)
	}
	got, _ := mustRead(t, s, oid, len(data), 0)
	if !bytes.Equal(got, data) {
		t.Fatal("after Repair the copy differs from what was written")
	}
	if n, err := s.Repair(oid, repair, 0); err != nil || n != 0 {
		t.Fatalf("second Repair: %d blocks, %v; want 0", n, err)
	}
	if _, err := s.Repair(oid, repair[:100], 0); !errors.Is(err, ErrInvalid) {
		t.Fatalf("Repair of part of a block: %v, want ErrInvalid", err)
	}
	if got := s.disks[0].blocksRepaired.Load(); got != 1 {
		t.Errorf("blocks repaired counted %d, want 1", got)
	}

	// A whole-block write over a bad block needs no repair first.
	flipBit(t, s, oid, 2*blockSize)
	fresh := pattern(3, blockSize)
	mustWrite(t, s, 1, oid, fresh, 2*blockSize, 0)
	got, _ = mustRead(t, s, oid, blockSize, 2*blockSize)
	if !bytes.Equal(got, fresh) {
		t.Fatal("a whole-block write over a bad block did not read back")
	}
}

// Partial-block writes, zeroes and trims keep every block's sum right, and
// checksums survive a restart; the copy reads back as a plain model says.
func TestChecksumsFollowEveryChange(t *testing.T) {
	options := Options{Disks: []Disk{{Path: tempDisk(t)}}}
	s := openTest(t, options)
	const oid = 11
	model := make([]byte, 64<<10)
	write := func(p []byte, offset int) {
		t.Helper()
		mustWrite(t, s, 1, oid, p, uint32(offset), object.FlagCreate)
		copy(model[offset:], p)
	}
	zero := func(offset, length int, trim bool) {
		t.Helper()
		var err error
		if trim {
			err = s.Trim(1, oid, uint32(offset), uint32(length), 0)
		} else {
			err = s.WriteZeroes(1, oid, uint32(offset), uint32(length), object.FlagNoHole)
		}
		if err != nil {
			t.Fatal(err)
		}
		clear(model[offset : offset+length])
	}
	check := func() {
		t.Helper()
		got, _ := mustRead(t, s, oid, len(model), 0)
		if !bytes.Equal(got, model) {
			t.Fatal("copy differs from the model")
		}
	}
	write(pattern(1, 20000), 1000)
	write(pattern(2, 10), 4090)
	write(pattern(3, 1), 12287)
	check()
	zero(5000, 3000, true)
	zero(9000, 10000, false)
	zero(20480, 8192, true)
	check()
	write(pattern(4, 4096*3), 8192)
	check()
	s = reopen(t, s, options)
	check()
	if err := s.Write(1, oid, nil, 0, object.FlagCreate|object.FlagFresh); err != nil {
		t.Fatal(err)
	}
	clear(model)
	check()
}

// A copy written before checksums (format version 1) reads as it is,
// unverified, and takes writes.
func TestLegacyCopyIsReadUnverified(t *testing.T) {
	options := Options{Disks: []Disk{{Path: tempDisk(t)}}}
	s := openTest(t, options)
	const oid = 0x0100000500000003
	data := pattern(5, 10000)
	mustWrite(t, s, 4, oid, []byte{1}, 0, object.FlagCreate)
	path := s.disks[0].objectPath(oid)
	s = reopen(t, s, options)
	// Rewrite the file the way a herd before checksums did.
	encoded := header{oid: oid, epoch: 4, legacy: true}.encode()
	file := make([]byte, headerSize+len(data))
	copy(file, encoded[:])
	copy(file[headerSize:], data)
	if err := os.WriteFile(path, file, 0o600); err != nil {
		t.Fatal(err)
	}
	s = reopen(t, s, options)
	got, info := mustRead(t, s, oid, len(data), 0)
	if !bytes.Equal(got, data) || info.Epoch != 4 {
		t.Fatalf("legacy copy read back wrong (epoch %d)", info.Epoch)
	}
	mustWrite(t, s, 4, oid, []byte("new"), 5000, 0)
	copy(data[5000:], "new")
	got, _ = mustRead(t, s, oid, len(data), 0)
	if !bytes.Equal(got, data) {
		t.Fatal("legacy copy after a write differs")
	}
	stat, err := s.Stat(oid)
	if err != nil || stat.LengthBytes != uint64(len(data)) {
		t.Fatalf("Stat: %+v, %v", stat, err)
	}
}

// The journal lists each written object once, and a Flush that finds it
// longer than journalCompactAt keeps only the objects with unsynced writes.
func TestJournalCompaction(t *testing.T) {
	defer func(at int) { journalCompactAt = at }(journalCompactAt)
	journalCompactAt = 4
	s := openTest(t, Options{})
	j := s.disks[0].journal
	for oid := uint64(1); oid <= 6; oid++ {
		mustWrite(t, s, 1, object.OID(oid), []byte("a"), 0, object.FlagCreate)
		mustWrite(t, s, 1, object.OID(oid), []byte("b"), 1, 0)
	}
	if got := j.size(); got != 6 {
		t.Fatalf("journal lists %d objects, want 6", got)
	}
	listed, err := j.listed()
	if err != nil || len(listed) != 6 {
		t.Fatalf("journal file lists %d objects (%v), want 6", len(listed), err)
	}
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	if got := j.size(); got != 0 {
		t.Fatalf("after a Flush the journal lists %d objects, want 0", got)
	}
	mustWrite(t, s, 1, 3, []byte("c"), 0, 0)
	listed, err = j.listed()
	if err != nil || len(listed) != 1 || listed[0] != 3 {
		t.Fatalf("journal file lists %v (%v), want [3]", listed, err)
	}
}

// Upgrade gives a version 1 copy checksums, keeping its bytes and stamp;
// after it rot is caught.
func TestUpgradeLegacyCopy(t *testing.T) {
	options := Options{Disks: []Disk{{Path: tempDisk(t)}}}
	s := openTest(t, options)
	const oid = 21
	mustWrite(t, s, 6, oid, []byte{1}, 0, object.FlagCreate)
	path := s.disks[0].objectPath(oid)
	s = reopen(t, s, options)
	data := pattern(8, 3*blockSize+100)
	encoded := header{oid: oid, epoch: 6, legacy: true}.encode()
	file := make([]byte, headerSize+len(data))
	copy(file, encoded[:])
	copy(file[headerSize:], data)
	if err := os.WriteFile(path, file, 0o600); err != nil {
		t.Fatal(err)
	}
	s = reopen(t, s, options)
	if done, err := s.Upgrade(oid); err != nil || !done {
		t.Fatalf("Upgrade: %v, %v", done, err)
	}
	if done, err := s.Upgrade(oid); err != nil || done {
		t.Fatalf("second Upgrade: %v, %v; want nothing to do", done, err)
	}
	got, info := mustRead(t, s, oid, len(data), 0)
	if !bytes.Equal(got, data) || info.Epoch != 6 {
		t.Fatalf("after Upgrade: bytes differ or epoch %d", info.Epoch)
	}
	flipBit(t, s, oid, 2*blockSize)
	if _, err := s.Read(oid, make([]byte, len(data)), 0); !errors.Is(err, ErrChecksum) {
		t.Fatalf("rot after Upgrade: %v, want ErrChecksum", err)
	}
}
