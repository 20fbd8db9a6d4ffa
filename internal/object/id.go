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

// OID is an object id. On the wire and on disk it is the 64-bit number;
// logs and file names print it as 16 hex digits (%016x). It has no String
// method on purpose: fmt would then print the string's bytes in hex for
// %x, and every %016x of an id would change.
type OID uint64

// Epoch is an epoch number: the epoch a request is made in, a node's
// current epoch, or a copy's epoch stamp (the epoch it was last written
// or proven current in). The cluster log numbers epochs as uint64; the
// data path converts at its edge with internal/cluster.
type Epoch uint64

// VDIID is a VDI's id: 24 bits in an object id (the cluster log keeps it
// as uint32, cluster.VDI.ID).
type VDIID uint32

// DataOID is the id of a VDI's index-th data object.
func DataOID(vdi VDIID, index uint32) OID {
	return OID(uint64(TypeData)<<56 | uint64(vdi&0xffffff)<<32 | uint64(index))
}

// MapOID is the id of a VDI's k-th map object.
func MapOID(vdi VDIID, k uint32) OID {
	return OID(uint64(TypeMap)<<56 | uint64(vdi&0xffffff)<<32 | uint64(k))
}

// VDI returns the VDI id an object belongs to.
func VDI(oid OID) VDIID { return VDIID(oid>>32) & 0xffffff }

// Type returns an object's type.
func Type(oid OID) int { return int(oid >> 56) }
