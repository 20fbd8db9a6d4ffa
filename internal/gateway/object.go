package gateway

// Object ids (DESIGN.md "Objects and VDIs", Sheepdog's layout): the top 8
// bits are the object type, the next 24 the VDI id, the low 32 the index.
//
//	data object:  type 0 | vdi | index of the object in the disk
//	map object:   type 1 | vdi | k, the k-th piece of the VDI's object map
//
// The object map is the VDI's table index -> owning VDI id (0 = never
// written, reads as zeros). It is stored as map objects of 4-byte entries
// and cached in pages, so the first write to an object rewrites 4 bytes of
// one map object, not a whole array (issue 3 item 4).
const (
	objectTypeData = 0
	objectTypeMap  = 1

	mapEntryBytes = 4
	pageEntries   = 4096 // entries per cached page (16 KiB)
)

// DataOID is the id of a VDI's index-th data object.
func DataOID(vdi uint32, index uint32) uint64 {
	return uint64(objectTypeData)<<56 | uint64(vdi&0xffffff)<<32 | uint64(index)
}

// MapOID is the id of a VDI's k-th map object.
func MapOID(vdi uint32, k uint32) uint64 {
	return uint64(objectTypeMap)<<56 | uint64(vdi&0xffffff)<<32 | uint64(k)
}

// ObjectVDI returns the VDI id an object belongs to.
func ObjectVDI(oid uint64) uint32 { return uint32(oid>>32) & 0xffffff }

// ObjectType returns an object's type.
func ObjectType(oid uint64) int { return int(oid >> 56) }

// mapLocation returns where the map entry of data object index lives.
func mapLocation(index uint32, objectSize uint64) (k uint32, offset uint32) {
	perObject := objectSize / mapEntryBytes
	return uint32(uint64(index) / perObject), uint32(uint64(index)%perObject) * mapEntryBytes
}
