package ec

import (
	"bytes"
	"errors"
	"math"
	"math/rand/v2"
	"testing"
)

func mustScheme(t testing.TB, text string) Scheme {
	t.Helper()
	s, err := Parse(text)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func mustGeometry(t testing.TB, s Scheme, objectSize int64) Geometry {
	t.Helper()
	g, err := NewGeometry(s, objectSize)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// everyScheme lists the 21 supported schemes.
func everyScheme() []Scheme {
	var out []Scheme
	for k := MinData; k <= MaxData; k++ {
		for m := MinParity; m <= MaxParity; m++ {
			out = append(out, Scheme{K: k, M: m})
		}
	}
	return out
}

func TestNewGeometry(t *testing.T) {
	const MiB = 1 << 20
	for _, tc := range []struct {
		scheme     string
		objectSize int64
		chunkSize  int64
		dataBytes  []int64 // per data chunk
	}{
		{"4+2", 4 * MiB, MiB, []int64{MiB, MiB, MiB, MiB}},
		{"2+1", 64 << 10, 32 << 10, []int64{32 << 10, 32 << 10}},
		// 4 MiB / 3 = 1398101.33: rounded up to 342 blocks; the last
		// chunk holds 340 blocks and 2 of padding.
		{"3+1", 4 * MiB, 342 * BlockSize, []int64{342 * BlockSize, 342 * BlockSize, 340 * BlockSize}},
		{"6+3", 4 * MiB, 171 * BlockSize, []int64{171 * BlockSize, 171 * BlockSize, 171 * BlockSize, 171 * BlockSize, 171 * BlockSize, 169 * BlockSize}},
		{"7+2", 256 * MiB, 9363 * BlockSize, []int64{9363 * BlockSize, 9363 * BlockSize, 9363 * BlockSize, 9363 * BlockSize, 9363 * BlockSize, 9363 * BlockSize, 9358 * BlockSize}},
		// Smaller than one block per chunk: everything in chunk 0.
		{"4+2", 1, BlockSize, []int64{1, 0, 0, 0}},
		{"4+2", BlockSize, BlockSize, []int64{BlockSize, 0, 0, 0}},
		// One byte over: the rounding leaves two data chunks all padding.
		{"4+2", BlockSize + 1, BlockSize, []int64{BlockSize, 1, 0, 0}},
		{"8+3", 8*BlockSize + 1, 2 * BlockSize, []int64{2 * BlockSize, 2 * BlockSize, 2 * BlockSize, 2 * BlockSize, 1, 0, 0, 0}},
		{"5+1", 5*BlockSize - 1, BlockSize, []int64{BlockSize, BlockSize, BlockSize, BlockSize, BlockSize - 1}},
		{"8+1", MaxObjectSize, MaxObjectSize / 8, []int64{MaxObjectSize / 8, MaxObjectSize / 8, MaxObjectSize / 8, MaxObjectSize / 8, MaxObjectSize / 8, MaxObjectSize / 8, MaxObjectSize / 8, MaxObjectSize / 8}},
	} {
		s := mustScheme(t, tc.scheme)
		g, err := NewGeometry(s, tc.objectSize)
		if err != nil {
			t.Fatalf("%s of %d bytes: %v", tc.scheme, tc.objectSize, err)
		}
		if g.ChunkSize != tc.chunkSize {
			t.Errorf("%s of %d bytes: chunk size %d, want %d", tc.scheme, tc.objectSize, g.ChunkSize, tc.chunkSize)
		}
		var sum int64
		for i := range s.Chunks() {
			got, err := g.DataBytes(i)
			if err != nil {
				t.Fatal(err)
			}
			want := int64(0)
			if i < s.K {
				want = tc.dataBytes[i]
			}
			if got != want {
				t.Errorf("%s of %d bytes: chunk %d holds %d object bytes, want %d", tc.scheme, tc.objectSize, i, got, want)
			}
			sum += got
		}
		if sum != tc.objectSize {
			t.Errorf("%s of %d bytes: chunks hold %d bytes in all", tc.scheme, tc.objectSize, sum)
		}
	}
}

func TestNewGeometryRefuses(t *testing.T) {
	for _, tc := range []struct {
		scheme     Scheme
		objectSize int64
		err        error
	}{
		{Scheme{K: 4, M: 2}, 0, ErrGeometry},
		{Scheme{K: 4, M: 2}, -1, ErrGeometry},
		{Scheme{K: 4, M: 2}, MaxObjectSize + 1, ErrGeometry},
		{Scheme{K: 4, M: 2}, math.MaxInt64, ErrGeometry},
		{Scheme{K: 1, M: 2}, 4096, ErrScheme},
		{Scheme{}, 4096, ErrScheme},
	} {
		if g, err := NewGeometry(tc.scheme, tc.objectSize); !errors.Is(err, tc.err) {
			t.Errorf("NewGeometry(%+v, %d) = %+v, %v; want %v", tc.scheme, tc.objectSize, g, err, tc.err)
		}
	}
}

// TestBadGeometryIsAnError: the zero Geometry, or one built by hand
// with fields that disagree, fails every method instead of dividing by
// zero or mapping bytes wrongly.
func TestBadGeometryIsAnError(t *testing.T) {
	good := mustGeometry(t, Scheme{K: 4, M: 2}, 1<<20)
	wrongChunk := good
	wrongChunk.ChunkSize += BlockSize
	badScheme := good
	badScheme.Scheme.M = 0
	for name, g := range map[string]Geometry{"zero": {}, "chunk size": wrongChunk, "scheme": badScheme} {
		if _, err := g.Pieces(0, 1); !errors.Is(err, ErrGeometry) {
			t.Errorf("%s: Pieces: %v", name, err)
		}
		if _, _, err := g.ObjectRange(0, 0, 1); !errors.Is(err, ErrGeometry) {
			t.Errorf("%s: ObjectRange: %v", name, err)
		}
		if _, err := g.DataBytes(0); !errors.Is(err, ErrGeometry) {
			t.Errorf("%s: DataBytes: %v", name, err)
		}
		if _, err := g.Split(make([]byte, g.ObjectSize)); !errors.Is(err, ErrGeometry) {
			t.Errorf("%s: Split: %v", name, err)
		}
		if _, err := g.Join(nil); !errors.Is(err, ErrGeometry) {
			t.Errorf("%s: Join: %v", name, err)
		}
	}
}

// naivePieces is the reference for Pieces: byte by byte, each object
// byte b is in data chunk b/ChunkSize at b%ChunkSize, and neighbouring
// bytes in the same chunk join one piece.
func naivePieces(g Geometry, off, n int64) []Piece {
	var out []Piece
	for b := off; b < off+n; b++ {
		chunk, at := int(b/g.ChunkSize), b%g.ChunkSize
		if last := len(out) - 1; last >= 0 && out[last].Chunk == chunk && out[last].ChunkOffset+out[last].Length == at {
			out[last].Length++
			continue
		}
		out = append(out, Piece{Chunk: chunk, ChunkOffset: at, ObjectOffset: b, Length: 1})
	}
	return out
}

func samePieces(a, b []Piece) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// checkPieces checks what holds for any range: the pieces tile it in
// order, each inside one data chunk, and ObjectRange maps each back.
func checkPieces(t *testing.T, g Geometry, off, n int64, pieces []Piece) {
	t.Helper()
	at := off
	for i, p := range pieces {
		if p.ObjectOffset != at || p.Length < 1 {
			t.Fatalf("%s of %d, [%d, +%d): piece %d %+v does not continue at %d", g.Scheme, g.ObjectSize, off, n, i, p, at)
		}
		if p.Chunk < 0 || p.Chunk >= g.Scheme.K || p.ChunkOffset < 0 || p.ChunkOffset+p.Length > g.ChunkSize {
			t.Fatalf("%s of %d, [%d, +%d): piece %d %+v is not inside a data chunk of %d bytes", g.Scheme, g.ObjectSize, off, n, i, p, g.ChunkSize)
		}
		if i > 0 && pieces[i-1].Chunk+1 != p.Chunk {
			t.Fatalf("%s of %d, [%d, +%d): piece %d in chunk %d follows chunk %d", g.Scheme, g.ObjectSize, off, n, i, p.Chunk, pieces[i-1].Chunk)
		}
		objectOffset, length, err := g.ObjectRange(p.Chunk, p.ChunkOffset, p.Length)
		if err != nil || objectOffset != p.ObjectOffset || length != p.Length {
			t.Fatalf("%s of %d: ObjectRange(%d, %d, %d) = %d, %d, %v; want %d, %d", g.Scheme, g.ObjectSize, p.Chunk, p.ChunkOffset, p.Length, objectOffset, length, err, p.ObjectOffset, p.Length)
		}
		at += p.Length
	}
	if at != off+n {
		t.Fatalf("%s of %d, [%d, +%d): pieces end at %d", g.Scheme, g.ObjectSize, off, n, at)
	}
}

func TestPiecesEdgeCases(t *testing.T) {
	g := mustGeometry(t, mustScheme(t, "3+1"), 4<<20) // chunk 342 blocks, last holds 340
	c := g.ChunkSize
	for _, tc := range []struct {
		name   string
		off, n int64
		want   []Piece
	}{
		{"empty", 100, 0, nil},
		{"empty at the end", g.ObjectSize, 0, nil},
		{"one byte", 5, 1, []Piece{{0, 5, 5, 1}}},
		{"up to a boundary", c - 10, 10, []Piece{{0, c - 10, c - 10, 10}}},
		{"from a boundary", c, 10, []Piece{{1, 0, c, 10}}},
		{"across one boundary", c - 1, 2, []Piece{{0, c - 1, c - 1, 1}, {1, 0, c, 1}}},
		{"a whole chunk", c, c, []Piece{{1, 0, c, c}}},
		{"across two boundaries", c - 4096, c + 8192, []Piece{{0, c - 4096, c - 4096, 4096}, {1, 0, c, c}, {2, 0, 2 * c, 4096}}},
		{"the whole object", 0, g.ObjectSize, []Piece{{0, 0, 0, c}, {1, 0, c, c}, {2, 0, 2 * c, g.ObjectSize - 2*c}}},
		{"the last byte, in the padded chunk", g.ObjectSize - 1, 1, []Piece{{2, g.ObjectSize - 2*c - 1, g.ObjectSize - 1, 1}}},
		{"the end of the padded chunk", 2*c + 7, g.ObjectSize - 2*c - 7, []Piece{{2, 7, 2*c + 7, g.ObjectSize - 2*c - 7}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := g.Pieces(tc.off, tc.n)
			if err != nil {
				t.Fatal(err)
			}
			if !samePieces(got, tc.want) {
				t.Fatalf("Pieces(%d, %d) = %+v, want %+v", tc.off, tc.n, got, tc.want)
			}
			checkPieces(t, g, tc.off, tc.n, got)
		})
	}
}

func TestPiecesRefusesRangesOutsideTheObject(t *testing.T) {
	g := mustGeometry(t, mustScheme(t, "4+2"), 1<<20)
	for _, r := range [][2]int64{
		{-1, 1}, {0, -1}, {g.ObjectSize, 1}, {g.ObjectSize - 1, 2}, {0, g.ObjectSize + 1},
		{g.ObjectSize + 1, 0}, {math.MaxInt64, 1}, {1, math.MaxInt64}, {math.MinInt64, 1},
	} {
		if p, err := g.Pieces(r[0], r[1]); !errors.Is(err, ErrRange) {
			t.Errorf("Pieces(%d, %d) = %+v, %v; want ErrRange", r[0], r[1], p, err)
		}
	}
}

// TestPiecesAgainstNaive compares Pieces with the byte-by-byte
// reference: over ranges starting at many offsets of small objects
// (sizes around multiples of K*4096 and not), ending at every kind of
// place, and over random ranges of objects of herd's sizes, half of
// them near a chunk boundary.
func TestPiecesAgainstNaive(t *testing.T) {
	compare := func(g Geometry, off, n int64) {
		t.Helper()
		got, err := g.Pieces(off, n)
		if err != nil {
			t.Fatal(err)
		}
		if want := naivePieces(g, off, n); !samePieces(got, want) {
			t.Fatalf("%s of %d: Pieces(%d, %d) = %+v, want %+v", g.Scheme, g.ObjectSize, off, n, got, want)
		}
		checkPieces(t, g, off, n, got)
	}
	for _, s := range everyScheme() {
		if s.M != 1 {
			continue // the parity count does not change the layout
		}
		sizes := []int64{1, BlockSize - 1, BlockSize, BlockSize + 1, int64(s.K) * BlockSize, int64(s.K)*BlockSize + 1, int64(s.K+1) * BlockSize, 2*int64(s.K)*BlockSize - 3}
		for _, size := range sizes {
			g := mustGeometry(t, s, size)
			step := max(1, size/23)
			for off := int64(0); off <= size; off += step {
				nextBoundary := (off/g.ChunkSize + 1) * g.ChunkSize
				for _, end := range []int64{off, off + 1, off + BlockSize, nextBoundary - 1, nextBoundary, nextBoundary + 1, size} {
					if end >= off && end <= size {
						compare(g, off, end-off)
					}
				}
			}
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for _, s := range everyScheme() {
		for _, size := range []int64{64 << 10, 4 << 20} {
			g := mustGeometry(t, s, size)
			for i := range 40 {
				var off int64
				if i%2 == 0 {
					boundary := rng.Int64N(int64(s.K)) * g.ChunkSize
					off = clamp(boundary+rng.Int64N(4*BlockSize)-2*BlockSize, 0, size)
				} else {
					off = rng.Int64N(size + 1)
				}
				compare(g, off, rng.Int64N(min(size-off, 4*BlockSize)+1))
			}
		}
	}
}

func TestObjectRange(t *testing.T) {
	g := mustGeometry(t, mustScheme(t, "4+2"), BlockSize+100) // chunk 4096: chunk 1 holds 100 bytes
	for _, tc := range []struct {
		name                 string
		chunk                int
		off, n               int64
		objectOffset, length int64
	}{
		{"all object bytes", 0, 10, 20, 10, 20},
		{"the whole first chunk", 0, 0, BlockSize, 0, BlockSize},
		{"the padded chunk, object bytes only", 1, 0, 100, BlockSize, 100},
		{"the padded chunk, crossing the object's end", 1, 50, 100, BlockSize + 50, 50},
		{"the padded chunk, padding only", 1, 100, 10, BlockSize + 100, 0},
		{"a chunk all padding", 3, 0, BlockSize, 3 * BlockSize, 0},
		{"empty", 2, 4096, 0, 3 * BlockSize, 0},
	} {
		objectOffset, length, err := g.ObjectRange(tc.chunk, tc.off, tc.n)
		if err != nil || objectOffset != tc.objectOffset || length != tc.length {
			t.Errorf("%s: ObjectRange(%d, %d, %d) = %d, %d, %v; want %d, %d", tc.name, tc.chunk, tc.off, tc.n, objectOffset, length, err, tc.objectOffset, tc.length)
		}
	}
	for _, tc := range []struct {
		chunk  int
		off, n int64
		err    error
	}{
		{4, 0, 1, ErrChunks}, // parity
		{5, 0, 1, ErrChunks},
		{-1, 0, 1, ErrChunks},
		{0, -1, 1, ErrRange},
		{0, 0, -1, ErrRange},
		{0, BlockSize, 1, ErrRange},
		{0, 1, BlockSize, ErrRange},
		{0, 1, math.MaxInt64, ErrRange},
	} {
		if _, _, err := g.ObjectRange(tc.chunk, tc.off, tc.n); !errors.Is(err, tc.err) {
			t.Errorf("ObjectRange(%d, %d, %d): %v, want %v", tc.chunk, tc.off, tc.n, err, tc.err)
		}
	}
}

// TestSplitJoin: Split puts each object byte where Pieces says, pads
// with zeros, and Join undoes it.
func TestSplitJoin(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, s := range everyScheme() {
		for _, size := range []int64{1, BlockSize + 1, int64(s.K)*BlockSize - 1, 3*int64(s.K)*BlockSize + 4095, 100_000} {
			g := mustGeometry(t, s, size)
			object := make([]byte, size)
			fill(rng, object)
			data, err := g.Split(object)
			if err != nil {
				t.Fatal(err)
			}
			if len(data) != s.K {
				t.Fatalf("%s of %d: %d data chunks", s, size, len(data))
			}
			for i, chunk := range data {
				if int64(len(chunk)) != g.ChunkSize {
					t.Fatalf("%s of %d: chunk %d has %d bytes, want %d", s, size, i, len(chunk), g.ChunkSize)
				}
				held, _ := g.DataBytes(i)
				if !bytes.Equal(chunk[held:], make([]byte, g.ChunkSize-held)) {
					t.Fatalf("%s of %d: chunk %d's padding is not zeros", s, size, i)
				}
			}
			pieces, err := g.Pieces(0, size)
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range pieces {
				if !bytes.Equal(data[p.Chunk][p.ChunkOffset:p.ChunkOffset+p.Length], object[p.ObjectOffset:p.ObjectOffset+p.Length]) {
					t.Fatalf("%s of %d: piece %+v is not where Split put it", s, size, p)
				}
			}
			back, err := g.Join(data)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(back, object) {
				t.Fatalf("%s of %d: Join(Split(object)) differs", s, size)
			}
			object[0] ^= 1
			if data[0][0] == object[0] {
				t.Fatalf("%s of %d: Split's chunks share the caller's memory", s, size)
			}
		}
	}
}

func TestSplitJoinRefuse(t *testing.T) {
	g := mustGeometry(t, mustScheme(t, "4+2"), 3*BlockSize)
	if _, err := g.Split(make([]byte, 3*BlockSize-1)); !errors.Is(err, ErrRange) {
		t.Errorf("Split of a short object: %v", err)
	}
	chunks := func(sizes ...int) [][]byte {
		var out [][]byte
		for _, n := range sizes {
			out = append(out, make([]byte, n))
		}
		return out
	}
	for name, data := range map[string][][]byte{
		"too few":   chunks(BlockSize, BlockSize, BlockSize),
		"too many":  chunks(BlockSize, BlockSize, BlockSize, BlockSize, BlockSize),
		"one short": chunks(BlockSize, BlockSize, BlockSize-1, BlockSize),
		"one empty": chunks(BlockSize, 0, BlockSize, BlockSize),
	} {
		if _, err := g.Join(data); !errors.Is(err, ErrChunks) {
			t.Errorf("Join, %s: %v", name, err)
		}
	}
}

// FuzzPieces: for any scheme, object size and range, Pieces and
// ObjectRange never panic, refuse with an error of the package, and
// what they accept tiles the range.
func FuzzPieces(f *testing.F) {
	f.Add(4, 2, int64(4<<20), int64(1<<20-1), int64(2))
	f.Add(3, 1, int64(4<<20), int64(0), int64(4<<20))
	f.Add(8, 3, int64(8*4096+1), int64(8*4096), int64(1))
	f.Add(0, 0, int64(0), int64(0), int64(0))
	f.Fuzz(func(t *testing.T, k, m int, size, off, n int64) {
		g, err := NewGeometry(Scheme{K: k, M: m}, size)
		if err != nil {
			if !errors.Is(err, ErrScheme) && !errors.Is(err, ErrGeometry) {
				t.Fatalf("NewGeometry: %v", err)
			}
			return
		}
		if n > 1<<20 {
			n %= 1 << 20 // keep each input quick
		}
		pieces, err := g.Pieces(off, n)
		if err != nil {
			if !errors.Is(err, ErrRange) {
				t.Fatalf("Pieces(%d, %d): %v", off, n, err)
			}
			return
		}
		checkPieces(t, g, off, n, pieces)
	})
}

// fill puts random bytes in p.
func fill(rng *rand.Rand, p []byte) {
	for i := 0; i < len(p); i += 8 {
		v := rng.Uint64()
		for j := i; j < min(i+8, len(p)); j++ {
			p[j] = byte(v)
			v >>= 8
		}
	}
}
