package ec

import "fmt"

// BlockSize is the granularity of chunk sizes: the store's checksum
// block (docs/ARCHITECTURE.md, "Data checksums"). A chunk of whole
// blocks puts every block of it at a block boundary of its copy's file,
// so a write of whole chunk blocks never merges a partial block, and a
// chunk block is checked, repaired and rebuilt as a unit.
const BlockSize = 4096

// MaxObjectSize is the largest object a Geometry lays out: far above
// herd's largest object (256 MiB), and small enough that no offset
// computed here can overflow an int64.
const MaxObjectSize = 1 << 40

// Geometry says where the bytes of one object of ObjectSize bytes live
// in its chunks. Every chunk of the stripe, data or parity, is
// ChunkSize bytes: ceil(ObjectSize/K) rounded up to BlockSize. Data
// chunk i holds the object's bytes [i*ChunkSize, (i+1)*ChunkSize); what
// lies past the object's end reads as zeros (padding), which parity
// covers like any other byte. The rounding may leave the last data
// chunks partly or wholly padding (4+2 of 4097 bytes: ChunkSize 4096,
// chunk 0 holds 4096 bytes, chunk 1 one byte, chunks 2 and 3 none).
//
// Build one with NewGeometry; the zero Geometry, or one whose fields
// disagree, makes every method fail with ErrGeometry.
type Geometry struct {
	Scheme     Scheme
	ObjectSize int64 // bytes in the object, 1..MaxObjectSize
	ChunkSize  int64 // bytes in every chunk, a multiple of BlockSize
}

// NewGeometry lays out an object of objectSize bytes in scheme s.
func NewGeometry(s Scheme, objectSize int64) (Geometry, error) {
	if err := s.Validate(); err != nil {
		return Geometry{}, err
	}
	if objectSize < 1 || objectSize > MaxObjectSize {
		return Geometry{}, fmt.Errorf("%w: object size %d bytes: must be 1..%d", ErrGeometry, objectSize, int64(MaxObjectSize))
	}
	return Geometry{Scheme: s, ObjectSize: objectSize, ChunkSize: chunkSize(s, objectSize)}, nil
}

func chunkSize(s Scheme, objectSize int64) int64 {
	perChunk := (objectSize + int64(s.K) - 1) / int64(s.K)
	return (perChunk + BlockSize - 1) / BlockSize * BlockSize
}

// check returns nil when g is what NewGeometry returns for its scheme
// and size: methods check first, so that a hand-built or zero Geometry
// is an error, not a division by zero.
func (g Geometry) check() error {
	if err := g.Scheme.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrGeometry, err)
	}
	if g.ObjectSize < 1 || g.ObjectSize > MaxObjectSize {
		return fmt.Errorf("%w: object size %d bytes: must be 1..%d", ErrGeometry, g.ObjectSize, int64(MaxObjectSize))
	}
	if want := chunkSize(g.Scheme, g.ObjectSize); g.ChunkSize != want {
		return fmt.Errorf("%w: chunk size %d for a %d-byte object in %s, want %d (use NewGeometry)", ErrGeometry, g.ChunkSize, g.ObjectSize, g.Scheme, want)
	}
	return nil
}

// DataBytes returns how many of the object's bytes chunk holds: from
// ChunkSize down to 0 for a data chunk, the rest of which is padding,
// and 0 for a parity chunk.
func (g Geometry) DataBytes(chunk int) (int64, error) {
	if err := g.check(); err != nil {
		return 0, err
	}
	if chunk < 0 || chunk >= g.Scheme.Chunks() {
		return 0, fmt.Errorf("%w: chunk %d of a %s stripe (chunks 0..%d)", ErrChunks, chunk, g.Scheme, g.Scheme.Chunks()-1)
	}
	if chunk >= g.Scheme.K {
		return 0, nil
	}
	return clamp(g.ObjectSize-int64(chunk)*g.ChunkSize, 0, g.ChunkSize), nil
}

// Piece is the part of an object byte range that one data chunk holds.
type Piece struct {
	Chunk        int   // the data chunk, 0..K-1
	ChunkOffset  int64 // where the piece starts in the chunk
	ObjectOffset int64 // where the piece starts in the object
	Length       int64 // bytes, at least 1
}

// Pieces maps the object's bytes [off, off+n) to the data chunks that
// hold them, in object order: one piece per chunk the range touches
// (a range crossing a chunk boundary touches two or more). These are
// the only chunks a healthy read of the range reads, and the only data
// chunks a write of it changes. An empty range has no pieces.
func (g Geometry) Pieces(off, n int64) ([]Piece, error) {
	if err := g.check(); err != nil {
		return nil, err
	}
	if off < 0 || n < 0 || off > g.ObjectSize-n {
		return nil, fmt.Errorf("%w: bytes [%d, %d+%d) of a %d-byte object", ErrRange, off, off, n, g.ObjectSize)
	}
	var pieces []Piece
	for end := off + n; off < end; {
		chunk := off / g.ChunkSize
		inChunk := off % g.ChunkSize
		length := min(end-off, g.ChunkSize-inChunk)
		pieces = append(pieces, Piece{Chunk: int(chunk), ChunkOffset: inChunk, ObjectOffset: off, Length: length})
		off += length
	}
	return pieces, nil
}

// ObjectRange maps bytes [off, off+n) of data chunk chunk back to the
// object: the range starts at objectOffset in the object and holds
// length of its bytes, the rest being padding past the object's end
// (length 0 when the range is all padding). A parity chunk holds no
// object bytes and is refused with ErrChunks.
func (g Geometry) ObjectRange(chunk int, off, n int64) (objectOffset, length int64, err error) {
	if err := g.check(); err != nil {
		return 0, 0, err
	}
	if chunk < 0 || chunk >= g.Scheme.K {
		return 0, 0, fmt.Errorf("%w: chunk %d is not a data chunk of %s (data chunks 0..%d)", ErrChunks, chunk, g.Scheme, g.Scheme.K-1)
	}
	if off < 0 || n < 0 || off > g.ChunkSize-n {
		return 0, 0, fmt.Errorf("%w: bytes [%d, %d+%d) of a %d-byte chunk", ErrRange, off, off, n, g.ChunkSize)
	}
	objectOffset = int64(chunk)*g.ChunkSize + off
	return objectOffset, clamp(g.ObjectSize-objectOffset, 0, n), nil
}

// Split cuts a whole object into its K data chunks, each ChunkSize
// bytes, padding zeroed. The chunks are copies: object may be reused.
func (g Geometry) Split(object []byte) ([][]byte, error) {
	if err := g.check(); err != nil {
		return nil, err
	}
	if int64(len(object)) != g.ObjectSize {
		return nil, fmt.Errorf("%w: an object of %d bytes given to a geometry for %d", ErrRange, len(object), g.ObjectSize)
	}
	backing := make([]byte, int64(g.Scheme.K)*g.ChunkSize)
	copy(backing, object)
	data := make([][]byte, g.Scheme.K)
	for i := range data {
		data[i] = backing[int64(i)*g.ChunkSize : int64(i+1)*g.ChunkSize : int64(i+1)*g.ChunkSize]
	}
	return data, nil
}

// Join puts an object back together from its K data chunks (Split's
// inverse), dropping the padding.
func (g Geometry) Join(data [][]byte) ([]byte, error) {
	if err := g.check(); err != nil {
		return nil, err
	}
	if len(data) != g.Scheme.K {
		return nil, fmt.Errorf("%w: %d data chunks given, %s has %d", ErrChunks, len(data), g.Scheme, g.Scheme.K)
	}
	object := make([]byte, 0, g.ObjectSize)
	for i, chunk := range data {
		if int64(len(chunk)) != g.ChunkSize {
			return nil, fmt.Errorf("%w: data chunk %d has %d bytes, want %d", ErrChunks, i, len(chunk), g.ChunkSize)
		}
		object = append(object, chunk[:min(g.ChunkSize, g.ObjectSize-int64(len(object)))]...)
	}
	return object, nil
}

func clamp(x, lo, hi int64) int64 { return max(lo, min(x, hi)) }
