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

// Chunks of erasure-coded objects (internal/ec, gateway/ec.go). A data
// object of a VDI with a scheme K+M keeps its bytes as K+M chunks, each
// an object of its own on its own node: chunk c of data object O in slot
// s has O's VDI and index and the type ChunkType0 + c + s*ChunkSlotStride.
// A fold writes a new generation of an object's chunks into the slot the
// current one does not use, so the current chunks are never overwritten.
const (
	ChunkType0      = 16
	ChunkSlotStride = 16
	MaxChunks       = 11 // K+M is at most 8+3
)

// ChunkOID is the id of chunk c (0 <= c < MaxChunks) of data object data
// in slot (0 or 1).
func ChunkOID(data OID, c, slot int) OID {
	t := ChunkType0 + c + (slot&1)*ChunkSlotStride
	return OID(uint64(t)<<56 | uint64(data)&(1<<56-1))
}

// IsChunk says whether oid is a chunk of an erasure-coded object: it has
// one copy, placed by its object's head rather than by the epoch, and no
// epoch stamp proves it current (its bytes are checked against the
// head's checksums instead).
func IsChunk(oid OID) bool {
	t := Type(oid)
	return (t >= ChunkType0 && t < ChunkType0+MaxChunks) ||
		(t >= ChunkType0+ChunkSlotStride && t < ChunkType0+ChunkSlotStride+MaxChunks)
}

// ChunkOf returns the data object, chunk index and slot of a chunk id;
// ok is false for an id that is not a chunk.
func ChunkOf(oid OID) (data OID, c, slot int, ok bool) {
	if !IsChunk(oid) {
		return 0, 0, 0, false
	}
	t := Type(oid) - ChunkType0
	slot = t / ChunkSlotStride
	c = t % ChunkSlotStride
	return OID(uint64(TypeData)<<56 | uint64(oid)&(1<<56-1)), c, slot, true
}
