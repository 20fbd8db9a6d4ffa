package store

import (
	"bytes"
	"testing"

	"github.com/herd-storage/herd/internal/object"
)

func TestHeaderRoundTrip(t *testing.T) {
	for _, h := range []header{
		{oid: 0, epoch: 0},
		{oid: 1<<64 - 1, epoch: 1<<64 - 1},
		{oid: 0x0100000200000003, epoch: 42, flags: 0},
	} {
		encoded := h.encode()
		got, err := decodeHeader(encoded[:], h.oid)
		if err != nil || got != h {
			t.Errorf("%+v decoded as %+v, %v", h, got, err)
		}
		// Every single bit flip is caught.
		for bit := 0; bit < headerLength*8; bit++ {
			damaged := encoded
			damaged[bit/8] ^= 1 << (bit % 8)
			if _, err := decodeHeader(damaged[:], h.oid); err == nil {
				t.Fatalf("flip of bit %d not detected", bit)
			}
		}
	}
	damaged := header{oid: 1, flags: headerDamaged}.encode()
	if _, err := decodeHeader(damaged[:], 1); err == nil {
		t.Error("a copy marked damaged decodes")
	}
}

// TestHeaderIsPinned pins the on-disk format: changing it makes every
// existing object unreadable.
func TestHeaderIsPinned(t *testing.T) {
	for _, c := range []struct {
		legacy bool
		want   string
	}{
		// Version 2: data at 266240 (0x41000), after the checksum table.
		{false, "HERDOBJ1\x02\x00\x00\x00\x00\x00\x00\x00" +
			"\x08\x07\x06\x05\x04\x03\x02\x01\x18\x17\x16\x15\x14\x13\x12\x11" +
			"\x00\x10\x04\x00"},
		// Version 1 (before checksums), still read: data at 4096.
		{true, "HERDOBJ1\x01\x00\x00\x00\x00\x00\x00\x00" +
			"\x08\x07\x06\x05\x04\x03\x02\x01\x18\x17\x16\x15\x14\x13\x12\x11" +
			"\x00\x10\x00\x00"},
	} {
		encoded := header{oid: 0x0102030405060708, epoch: 0x1112131415161718, legacy: c.legacy}.encode()
		if !bytes.Equal(encoded[:36], []byte(c.want)) {
			t.Fatalf("header starts % x\nwant            % x", encoded[:36], []byte(c.want))
		}
		if sum := encoded[60:64]; bytes.Equal(sum, []byte{0, 0, 0, 0}) {
			t.Fatal("no checksum")
		}
		decoded, err := decodeHeader(encoded[:], 0x0102030405060708)
		if err != nil || decoded.legacy != c.legacy {
			t.Fatalf("decoded %+v, %v", decoded, err)
		}
	}
}

// FuzzDecodeHeader: a header comes from disk, so no input may crash the
// decoder, and whatever it accepts must encode back to the same bytes.
func FuzzDecodeHeader(f *testing.F) {
	valid := header{oid: 7, epoch: 3}.encode()
	f.Add(valid[:], uint64(7))
	f.Add(valid[:10], uint64(7))
	f.Add(make([]byte, headerLength), uint64(0))
	f.Fuzz(func(t *testing.T, b []byte, oid uint64) {
		h, err := decodeHeader(b, object.OID(oid))
		if err != nil {
			return
		}
		encoded := h.encode()
		if !bytes.Equal(encoded[:60], b[:60]) && !reservedDiffers(b) {
			t.Fatalf("accepted header re-encodes differently")
		}
	})
}

// reservedDiffers reports whether the reserved bytes of b are not zero (a
// later format version may use them; version 1 ignores them).
func reservedDiffers(b []byte) bool {
	return !bytes.Equal(b[36:60], make([]byte, 24))
}
