package object

// Object ids (DESIGN.md "Objects and VDIs", Sheepdog's layout): the top 8
// bits are the object type, the next 24 the VDI id, the low 32 the index.
//
//	data object:  type 0 | vdi | index of the object in the disk
//	map object:   type 1 | vdi | k, the k-th piece of the VDI's object map
const (
	TypeData = 0
	TypeMap  = 1
)

// DataOID is the id of a VDI's index-th data object.
func DataOID(vdi uint32, index uint32) uint64 {
	return uint64(TypeData)<<56 | uint64(vdi&0xffffff)<<32 | uint64(index)
}

// MapOID is the id of a VDI's k-th map object.
func MapOID(vdi uint32, k uint32) uint64 {
	return uint64(TypeMap)<<56 | uint64(vdi&0xffffff)<<32 | uint64(k)
}

// VDI returns the VDI id an object belongs to.
func VDI(oid uint64) uint32 { return uint32(oid>>32) & 0xffffff }

// Type returns an object's type.
func Type(oid uint64) int { return int(oid >> 56) }
