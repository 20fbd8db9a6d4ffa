package store

import (
	"os"
	"testing"

	"github.com/herd-storage/herd/internal/object"
)

// The content digest (Info.Digest) is the same for copies that read the
// same, however they were written, and differs when one block differs:
// recovery restamps a returning node's unchanged copy by it instead of
// copying it, and fetches a copy that missed a change.
func TestDigestFollowsContent(t *testing.T) {
	s := openTest(t, Options{})
	digest := func(oid object.OID) uint64 {
		t.Helper()
		info, err := s.Stat(oid)
		if err != nil {
			t.Fatal(err)
		}
		if info.Digest == 0 {
			t.Fatalf("object %d: no digest", oid)
		}
		return info.Digest
	}
	data := pattern(1, 5*blockSize+100)
	// 1: written in one piece, stamped 3.
	mustWrite(t, s, 3, 1, data, 0, object.FlagCreate)
	// 2: the same bytes in pieces not aligned on blocks, in other epochs.
	mustWrite(t, s, 4, 2, data[:7000], 0, object.FlagCreate)
	mustWrite(t, s, 5, 2, data[7000:], 7000, 0)
	// 3: installed whole, ObjectSize long: zeros beyond the data.
	whole := make([]byte, 1<<20)
	copy(whole, data)
	if err := s.Replace(9, 3, whole); err != nil {
		t.Fatal(err)
	}
	// 4: with a block of zeros past the end, written, then a hole punched
	// over what was written there.
	mustWrite(t, s, 3, 4, data, 0, object.FlagCreate)
	if err := s.WriteZeroes(3, 4, 8*blockSize, blockSize, object.FlagNoHole); err != nil {
		t.Fatal(err)
	}
	mustWrite(t, s, 3, 4, pattern(9, blockSize), 10*blockSize, 0)
	if err := s.Trim(3, 4, 10*blockSize, blockSize, 0); err != nil {
		t.Fatal(err)
	}
	want := digest(1)
	for _, oid := range []uint64{2, 3, 4} {
		if got := digest(object.OID(oid)); got != want {
			t.Errorf("object %d reads the same as object 1 but its digest is %016x, not %016x", oid, got, want)
		}
	}
	// A restamp changes nothing.
	if err := s.SetEpoch(12, 1); err != nil {
		t.Fatal(err)
	}
	if got := digest(1); got != want {
		t.Errorf("a restamp changed the digest")
	}
	// One changed byte, anywhere, does.
	for _, at := range []uint32{0, 3 * blockSize, uint32(len(data) - 1), 20 * blockSize} {
		mustWrite(t, s, 3, 5, data, 0, object.FlagCreate)
		mustWrite(t, s, 3, 5, []byte{data[min(int(at), len(data)-1)] ^ 1}, at, 0)
		if digest(5) == want {
			t.Errorf("a byte changed at %d: same digest", at)
		}
		if err := s.Remove(5); err != nil {
			t.Fatal(err)
		}
	}
	// An empty copy and a copy of zeros are the same content.
	mustWrite(t, s, 3, 6, make([]byte, blockSize), 0, object.FlagCreate)
	mustWrite(t, s, 3, 7, []byte{0}, 100, object.FlagCreate)
	if digest(6) != digest(7) || digest(6) == want {
		t.Errorf("copies of zeros: digests %016x and %016x", digest(6), digest(7))
	}
}

// A copy written before checksums has no digest: unknown, so recovery
// copies rather than trusts it.
func TestLegacyCopyHasNoDigest(t *testing.T) {
	options := Options{Disks: []Disk{{Path: tempDisk(t)}}}
	s := openTest(t, options)
	const oid = 31
	mustWrite(t, s, 4, oid, []byte{1}, 0, object.FlagCreate)
	path := s.disks[0].objectPath(oid)
	s = reopen(t, s, options)
	encoded := header{oid: oid, epoch: 4, legacy: true}.encode()
	file := make([]byte, headerSize+blockSize)
	copy(file, encoded[:])
	copy(file[headerSize:], pattern(3, blockSize))
	if err := os.WriteFile(path, file, 0o600); err != nil {
		t.Fatal(err)
	}
	s = reopen(t, s, options)
	if info, err := s.Stat(oid); err != nil || info.Digest != 0 {
		t.Fatalf("Stat of a version 1 copy: digest %016x, %v; want 0", info.Digest, err)
	}
}
