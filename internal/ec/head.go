package ec

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
)

// The layout of an erasure-coded data object's replicated part.
//
// A data object of S bytes in an erasure-coded VDI is an ordinary
// replicated object (M+1 copies) of Layout.Size() bytes:
//
//	[0, S)                       the overlay: blocks written since the
//	                             last fold, at their own offsets
//	[S, S+EntriesSize)           one Entry per block of the object
//	[HeadOffset(0), +HeadSize)   head slot 0
//	[HeadOffset(1), +HeadSize)   head slot 1
//
// Its folded bytes live in K+M chunks (Geometry), one object each
// (object.ChunkOID), written by a fold as a whole new generation into the
// chunk slot the current generation does not use, synced, and only then
// made current by writing a head of the next generation into the head
// slot of that parity. A head names each chunk's node and carries the
// CRC32C of every block of every chunk, so a chunk's bytes are checked
// end to end whatever node or epoch stamp they come from.
//
// Block b of the object reads from the overlay when its entry's tag is
// the current generation + 1 (written since the current head was made)
// and the overlay block checks against the entry; otherwise from the
// chunks of the current generation (zeros before the first fold).
// docs/ARCHITECTURE.md, "Erasure-coded VDIs", argues why no crash
// decodes a block nobody wrote.

// EntrySize is the size of one block's Entry on disk.
const EntrySize = 16

// Entry says where one block of an object reads from. Tag is the
// generation of the head current when the block was written, plus one;
// 0: never written through the overlay. CRC is the CRC32C of the block
// as that write left it. Prev, when HasPrev, is the CRC32C of the
// block's overlay content before that write (the same tag): the
// overlay block is overwritten in place, and after a power loss its
// bytes may be the previous ones while the entry is already the new
// one, or the reverse.
type Entry struct {
	Tag     uint32
	HasPrev bool
	CRC     uint32
	Prev    uint32
}

// Encode writes e into b (EntrySize bytes).
func (e Entry) Encode(b []byte) {
	binary.LittleEndian.PutUint32(b[0:], e.Tag)
	var flags uint32
	if e.HasPrev {
		flags = 1
	}
	binary.LittleEndian.PutUint32(b[4:], flags)
	binary.LittleEndian.PutUint32(b[8:], e.CRC)
	binary.LittleEndian.PutUint32(b[12:], e.Prev)
}

// DecodeEntry reads an Entry from b (EntrySize bytes).
func DecodeEntry(b []byte) Entry {
	return Entry{
		Tag:     binary.LittleEndian.Uint32(b[0:]),
		HasPrev: binary.LittleEndian.Uint32(b[4:])&1 != 0,
		CRC:     binary.LittleEndian.Uint32(b[8:]),
		Prev:    binary.LittleEndian.Uint32(b[12:]),
	}
}

// Source is where a block's current content is.
type Source int

const (
	// FromChunks: the block reads from the current generation's chunks
	// (zeros when there is none yet).
	FromChunks Source = iota
	// FromOverlay: the block reads from the overlay.
	FromOverlay
	// Corrupt: the overlay block matches neither its entry's content
	// nor its previous content: not a torn write, so never replaced by
	// older bytes.
	Corrupt
)

// Resolve says where block content data (the overlay's bytes of the
// block) is current, for a block with entry e in an object whose head is
// of generation gen (0: none).
func Resolve(e Entry, gen uint32, overlay []byte) Source {
	if e.Tag != gen+1 {
		return FromChunks
	}
	sum := Checksum(overlay)
	switch {
	case sum == e.CRC, e.HasPrev && sum == e.Prev:
		return FromOverlay
	case !e.HasPrev:
		// The block's first write since the fold, torn by a power loss:
		// its entry reached the disk, its data did not. Its previous
		// content is in the chunks.
		return FromChunks
	default:
		return Corrupt
	}
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Checksum is the CRC32C of p, as the heads and entries record blocks.
func Checksum(p []byte) uint32 { return crc32.Checksum(p, castagnoli) }

// MaxNodeID is the longest node id a head records.
const MaxNodeID = 64

// Head is one generation of an object's chunks.
type Head struct {
	Generation uint32
	// Homes[c] is the id of the node that holds chunk c.
	Homes []string
	// Sums[c][i] is the CRC32C of block i of chunk c.
	Sums [][]uint32
}

// Layout is where the parts of an object of one geometry are.
type Layout struct {
	Geometry Geometry
}

// NewLayout returns the layout of an object of objectSize bytes in
// scheme s.
func NewLayout(s Scheme, objectSize int64) (Layout, error) {
	g, err := NewGeometry(s, objectSize)
	if err != nil {
		return Layout{}, err
	}
	if objectSize%BlockSize != 0 {
		return Layout{}, fmt.Errorf("%w: object size %d is not a multiple of %d", ErrGeometry, objectSize, BlockSize)
	}
	return Layout{Geometry: g}, nil
}

// Blocks is the number of blocks in the object.
func (l Layout) Blocks() int64 { return l.Geometry.ObjectSize / BlockSize }

// ChunkBlocks is the number of blocks in each chunk.
func (l Layout) ChunkBlocks() int64 { return l.Geometry.ChunkSize / BlockSize }

// EntriesOffset is where the entries start.
func (l Layout) EntriesOffset() int64 { return l.Geometry.ObjectSize }

// EntriesSize is the entries' size, rounded to blocks.
func (l Layout) EntriesSize() int64 { return roundUp(l.Blocks() * EntrySize) }

// headFixed is a head's size before its homes and sums: magic, version,
// K, M, object size, chunk size, generation.
const headFixed = 8 + 4 + 1 + 1 + 2 + 8 + 8 + 4

// HeadSize is one head slot's size.
func (l Layout) HeadSize() int64 {
	n := int64(l.Geometry.Scheme.Chunks())
	return roundUp(headFixed + n*(1+MaxNodeID) + n*l.ChunkBlocks()*4 + 4)
}

// HeadOffset is where head slot (0 or 1) starts.
func (l Layout) HeadOffset(slot int) int64 {
	return l.EntriesOffset() + l.EntriesSize() + int64(slot&1)*l.HeadSize()
}

// Size is the whole replicated object's size.
func (l Layout) Size() int64 { return l.HeadOffset(1) + l.HeadSize() }

func roundUp(n int64) int64 { return (n + BlockSize - 1) / BlockSize * BlockSize }

var headMagic = []byte("HERDECH1")

const headVersion = 1

// ErrNoHead: a head slot holds no valid head (never written, or torn).
var ErrNoHead = errors.New("ec: no valid head in the slot")

// EncodeHead returns h as the bytes of its slot (HeadSize).
func (l Layout) EncodeHead(h Head) ([]byte, error) {
	s := l.Geometry.Scheme
	if h.Generation == 0 {
		return nil, fmt.Errorf("ec: head of generation 0: generations start at 1")
	}
	if len(h.Homes) != s.Chunks() || len(h.Sums) != s.Chunks() {
		return nil, fmt.Errorf("%w: a %s head needs %d homes and sums, got %d and %d", ErrChunks, s, s.Chunks(), len(h.Homes), len(h.Sums))
	}
	b := make([]byte, l.HeadSize())
	copy(b, headMagic)
	binary.LittleEndian.PutUint32(b[8:], headVersion)
	b[12], b[13] = byte(s.K), byte(s.M)
	binary.LittleEndian.PutUint64(b[16:], uint64(l.Geometry.ObjectSize))
	binary.LittleEndian.PutUint64(b[24:], uint64(l.Geometry.ChunkSize))
	binary.LittleEndian.PutUint32(b[32:], h.Generation)
	at := headFixed
	for c, home := range h.Homes {
		if len(home) == 0 || len(home) > MaxNodeID {
			return nil, fmt.Errorf("ec: chunk %d's home %q: a node id of 1..%d bytes", c, home, MaxNodeID)
		}
		b[at] = byte(len(home))
		copy(b[at+1:], home)
		at += 1 + MaxNodeID
	}
	for c, sums := range h.Sums {
		if int64(len(sums)) != l.ChunkBlocks() {
			return nil, fmt.Errorf("%w: chunk %d has %d block sums, a chunk has %d blocks", ErrChunks, c, len(sums), l.ChunkBlocks())
		}
		for _, sum := range sums {
			binary.LittleEndian.PutUint32(b[at:], sum)
			at += 4
		}
	}
	binary.LittleEndian.PutUint32(b[at:], Checksum(b[:at]))
	return b, nil
}

// DecodeHead reads a head slot's bytes: ErrNoHead when it holds none
// (zeros, or a torn write), another error when it holds a head of
// another geometry (an object is never re-laid-out, so that is damage).
func (l Layout) DecodeHead(b []byte) (Head, error) {
	s := l.Geometry.Scheme
	if int64(len(b)) < l.HeadSize() {
		return Head{}, fmt.Errorf("%w: head slot of %d bytes, want %d", ErrNoHead, len(b), l.HeadSize())
	}
	if !bytes.Equal(b[:8], headMagic) {
		return Head{}, ErrNoHead
	}
	n := s.Chunks()
	end := headFixed + n*(1+MaxNodeID) + n*int(l.ChunkBlocks())*4
	if v := binary.LittleEndian.Uint32(b[8:]); v != headVersion {
		return Head{}, fmt.Errorf("ec: head version %d, this herd reads %d", v, headVersion)
	}
	if int(b[12]) != s.K || int(b[13]) != s.M ||
		int64(binary.LittleEndian.Uint64(b[16:])) != l.Geometry.ObjectSize ||
		int64(binary.LittleEndian.Uint64(b[24:])) != l.Geometry.ChunkSize {
		return Head{}, fmt.Errorf("ec: head of a %d+%d object of %d bytes in %d-byte chunks, expected %s of %d bytes in %d-byte chunks",
			b[12], b[13], binary.LittleEndian.Uint64(b[16:]), binary.LittleEndian.Uint64(b[24:]), s, l.Geometry.ObjectSize, l.Geometry.ChunkSize)
	}
	if binary.LittleEndian.Uint32(b[end:]) != Checksum(b[:end]) {
		return Head{}, fmt.Errorf("%w: checksum mismatch (a torn write)", ErrNoHead)
	}
	h := Head{Generation: binary.LittleEndian.Uint32(b[32:]), Homes: make([]string, n), Sums: make([][]uint32, n)}
	at := headFixed
	for c := range n {
		size := int(b[at])
		if size == 0 || size > MaxNodeID {
			return Head{}, fmt.Errorf("ec: head names chunk %d's home with %d bytes", c, size)
		}
		h.Homes[c] = string(b[at+1 : at+1+size])
		at += 1 + MaxNodeID
	}
	for c := range n {
		h.Sums[c] = make([]uint32, l.ChunkBlocks())
		for i := range h.Sums[c] {
			h.Sums[c][i] = binary.LittleEndian.Uint32(b[at:])
			at += 4
		}
	}
	if h.Generation == 0 {
		return Head{}, fmt.Errorf("ec: head of generation 0")
	}
	return h, nil
}

// Current picks the current head from the two slots' bytes: the valid
// head of the higher generation, found in the slot of its parity. ok is
// false when neither slot holds one (the object was never folded).
func (l Layout) Current(slot0, slot1 []byte) (h Head, ok bool, err error) {
	for slot, b := range [][]byte{slot0, slot1} {
		got, err := l.DecodeHead(b)
		if errors.Is(err, ErrNoHead) {
			continue
		}
		if err != nil {
			return Head{}, false, fmt.Errorf("head slot %d: %w", slot, err)
		}
		if int(got.Generation%2) != slot {
			return Head{}, false, fmt.Errorf("ec: head slot %d holds generation %d", slot, got.Generation)
		}
		if !ok || got.Generation > h.Generation {
			h, ok = got, true
		}
	}
	return h, ok, nil
}

// ReplicatedSize is the size of the replicated part of a data object of
// objectSize bytes in scheme text ("K+M"): what recovery, repairs and
// checks copy and compare of it. For "" (a VDI of copies) it is
// objectSize.
func ReplicatedSize(scheme string, objectSize uint64) (uint64, error) {
	if scheme == "" {
		return objectSize, nil
	}
	s, err := Parse(scheme)
	if err != nil {
		return 0, err
	}
	l, err := NewLayout(s, int64(objectSize))
	if err != nil {
		return 0, err
	}
	return uint64(l.Size()), nil
}
