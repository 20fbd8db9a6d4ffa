package store

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"

	"github.com/herd-storage/herd/internal/object"
)

// The object file header. The first headerSize bytes of every object file
// are reserved for it. Only the first headerLength bytes are written; the
// rest of the block is a hole and reads as zeros.
//
//	offset size field
//	     0    8 magic "HERDOBJ1"
//	     8    4 format version (2; 1 for copies written before data checksums)
//	    12    4 flags (headerDamaged)
//	    16    8 object id
//	    24    8 epoch stamp: the epoch at which the copy was last written
//	    32    4 data offset (266240 in version 2, 4096 in version 1)
//	    36   24 reserved, zero
//	    60    4 CRC32C (Castagnoli) of bytes 0-59
//
// Version 2 files hold the data checksum table (checksum.go) between the
// header and the data: file offset headerSize, tableSize bytes, then the
// data at dataOffset, 4 KiB aligned (file offset = dataOffset + object
// offset), so an aligned guest write maps onto whole file system blocks.
// Version 1 files have no table and their data at headerSize; they are
// read unverified until a scrub pass rewrites them as version 2.
//
// All integers are little-endian. A restamp rewrites these 64 bytes with
// one pwrite: they lie in one sector, so a crash leaves either the old or
// the new header on disks with atomic sector writes, and the CRC catches a
// torn one on the others.
// FormatVersion is the object file format this store writes (it reads
// it and legacyVersion); nodes report it (cluster.Build).
const FormatVersion = 2

const (
	headerSize    = 4096
	headerLength  = 64
	headerMagic   = "HERDOBJ1"
	headerVersion = FormatVersion

	// legacyVersion is the format before data checksums: no table, data
	// at headerSize.
	legacyVersion = 1

	// headerDamaged marks a copy whose data sync failed: what the kernel
	// dropped is unknown, so the copy is never read again (see flush.go).
	headerDamaged    uint32 = 1 << 0
	headerFlagsKnown        = headerDamaged
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

type header struct {
	flags uint32
	oid   object.OID
	epoch object.Epoch
	// legacy is a version 1 file: no checksum table, data at headerSize.
	legacy bool
}

// dataStart is where the object's byte 0 lies in the file.
func (h header) dataStart() int64 {
	if h.legacy {
		return headerSize
	}
	return dataOffset
}

func (h header) encode() [headerLength]byte {
	var b [headerLength]byte
	copy(b[0:8], headerMagic)
	version := uint32(headerVersion)
	if h.legacy {
		version = legacyVersion
	}
	binary.LittleEndian.PutUint32(b[8:], version)
	binary.LittleEndian.PutUint32(b[12:], h.flags)
	binary.LittleEndian.PutUint64(b[16:], uint64(h.oid))
	binary.LittleEndian.PutUint64(b[24:], uint64(h.epoch))
	binary.LittleEndian.PutUint32(b[32:], uint32(h.dataStart()))
	binary.LittleEndian.PutUint32(b[60:], crc32.Checksum(b[:60], castagnoli))
	return b
}

// decodeHeader parses and checks the header of the file that should hold
// object oid. Its error says what is wrong; the caller wraps it in
// ErrCorrupt. b comes from disk, so nothing in it is trusted.
func decodeHeader(b []byte, oid object.OID) (header, error) {
	if len(b) < headerLength {
		return header{}, fmt.Errorf("header truncated to %d bytes", len(b))
	}
	if string(b[0:8]) != headerMagic {
		return header{}, fmt.Errorf("bad magic %q", b[0:8])
	}
	if sum, want := crc32.Checksum(b[:60], castagnoli), binary.LittleEndian.Uint32(b[60:]); sum != want {
		return header{}, fmt.Errorf("header checksum %08x, want %08x", sum, want)
	}
	version := binary.LittleEndian.Uint32(b[8:])
	if version != headerVersion && version != legacyVersion {
		return header{}, fmt.Errorf("unknown format version %d", version)
	}
	h := header{legacy: version == legacyVersion}
	if offset := binary.LittleEndian.Uint32(b[32:]); int64(offset) != h.dataStart() {
		return header{}, fmt.Errorf("data offset %d, want %d for format version %d", offset, h.dataStart(), version)
	}
	h = header{legacy: h.legacy,
		flags: binary.LittleEndian.Uint32(b[12:]),
		oid:   object.OID(binary.LittleEndian.Uint64(b[16:])),
		epoch: object.Epoch(binary.LittleEndian.Uint64(b[24:])),
	}
	if unknown := h.flags &^ headerFlagsKnown; unknown != 0 {
		return header{}, fmt.Errorf("unknown header flags %#x", unknown)
	}
	if h.oid != oid {
		return header{}, fmt.Errorf("header names object %016x", h.oid)
	}
	if h.flags&headerDamaged != 0 {
		return header{}, fmt.Errorf("copy marked damaged by a failed sync")
	}
	return h, nil
}
