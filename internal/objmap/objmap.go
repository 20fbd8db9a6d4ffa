// Package objmap is the format of a VDI's object map, shared by the
// gateway (which reads and writes it), maintenance (which walks it to
// check, account and free a VDI's objects) and anything else that reads
// map objects.
//
// The map is the VDI's table index -> owning VDI id (0 = never written,
// reads as zeros or inherits; Tombstone = zeros even if an ancestor has
// data). It is stored as map objects (object.MapOID) of 4-byte big-endian
// entries, so the first write to an object rewrites 4 bytes of one map
// object, not a whole array.
package objmap

import "encoding/binary"

const (
	// EntryBytes is the size of one map entry.
	EntryBytes = 4
	// Tombstone is the entry of an object zeroed in a VDI that has an
	// ancestor: it reads as zeros instead of inheriting.
	Tombstone = 0xffffffff
)

// PerObject is the number of entries one map object of objectSize bytes
// holds.
func PerObject(objectSize uint64) uint64 { return objectSize / EntryBytes }

// Location returns where the map entry of data object index lives: map
// object k, at offset bytes into it.
func Location(index uint32, objectSize uint64) (k uint32, offset uint32) {
	perObject := PerObject(objectSize)
	return uint32(uint64(index) / perObject), uint32(uint64(index)%perObject) * EntryBytes
}

// Entry decodes entry i of raw, bytes of a map object.
func Entry(raw []byte, i int) uint32 { return binary.BigEndian.Uint32(raw[i*EntryBytes:]) }
