package gateway

// The object map is the VDI's table index -> owning VDI id (0 = never
// written, reads as zeros; Tombstone = zeros even if an ancestor has
// data). It is stored as map objects (object.MapOID) of 4-byte
// big-endian entries and cached in pages, so the first write to an
// object rewrites 4 bytes of one map object, not a whole array.
const (
	// MapEntryBytes is the size of one map entry.
	MapEntryBytes = 4
	// Tombstone is the entry of an object zeroed in a VDI that has an
	// ancestor: it reads as zeros instead of inheriting.
	Tombstone = 0xffffffff

	pageEntries = 4096 // entries per cached page (16 KiB)
)

// mapLocation returns where the map entry of data object index lives.
func mapLocation(index uint32, objectSize uint64) (k uint32, offset uint32) {
	perObject := objectSize / MapEntryBytes
	return uint32(uint64(index) / perObject), uint32(uint64(index)%perObject) * MapEntryBytes
}
