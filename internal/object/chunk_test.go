package object

import "testing"

func TestChunkIDsRoundTrip(t *testing.T) {
	data := DataOID(0xabcdef, 0x12345678)
	seen := map[OID]bool{}
	for slot := range 2 {
		for c := range MaxChunks {
			oid := ChunkOID(data, c, slot)
			if seen[oid] {
				t.Fatalf("chunk %d slot %d: id %016x given twice", c, slot, oid)
			}
			seen[oid] = true
			if VDI(oid) != VDI(data) {
				t.Fatalf("chunk %016x: vdi %x, want %x", oid, VDI(oid), VDI(data))
			}
			d, gotC, gotSlot, ok := ChunkOf(oid)
			if !ok || d != data || gotC != c || gotSlot != slot {
				t.Fatalf("ChunkOf(%016x) = %016x %d %d %v, want %016x %d %d", oid, d, gotC, gotSlot, ok, data, c, slot)
			}
		}
	}
	for _, oid := range []OID{data, MapOID(3, 4), OID(uint64(ChunkType0+MaxChunks) << 56), OID(uint64(ChunkType0-1) << 56)} {
		if IsChunk(oid) {
			t.Fatalf("%016x is taken for a chunk", oid)
		}
	}
}
