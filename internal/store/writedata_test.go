package store

import (
	"bytes"
	"errors"
	"testing"
)

// pieces records the writes it gets into a byte slice.
type pieces struct {
	data   []byte
	writes [][2]int64 // offset, length
	failAt int        // the index of the write that fails, or -1
}

func (w *pieces) WriteAt(p []byte, off int64) (int, error) {
	if len(w.writes) == w.failAt {
		return 0, errors.New("disk on fire")
	}
	w.writes = append(w.writes, [2]int64{off, int64(len(p))})
	copy(w.data[off:], p)
	return len(p), nil
}

func TestWriteDataPieces(t *testing.T) {
	const size = 8 * dataWriteChunk
	for _, c := range []struct {
		off, length int64
		pieces      int
	}{
		{0, 4096, 1},
		{dataOffset, 1 << 20, 9}, // 1 MiB at the data's start: 65 pages into the file
		{0, 1 << 20, 8},
		{dataWriteChunk - 512, 1024, 2},
		{3 * dataWriteChunk, dataWriteChunk, 1},
		{100, 0, 0},
	} {
		w := &pieces{data: make([]byte, size+dataOffset), failAt: -1}
		p := bytes.Repeat([]byte{0xa5, 0x3c, 0x01}, int(c.length)/3+1)[:c.length]
		if err := writeData(w, p, c.off); err != nil {
			t.Fatal(err)
		}
		if len(w.writes) != c.pieces {
			t.Errorf("%d bytes at %d: %d writes %v, want %d", c.length, c.off, len(w.writes), w.writes, c.pieces)
		}
		next := c.off
		for _, piece := range w.writes {
			if piece[0] != next || piece[1] > dataWriteChunk || piece[0]/dataWriteChunk != (piece[0]+piece[1]-1)/dataWriteChunk {
				t.Errorf("%d bytes at %d: piece %v crosses a %d-byte boundary or leaves a gap", c.length, c.off, piece, dataWriteChunk)
			}
			next = piece[0] + piece[1]
		}
		if !bytes.Equal(w.data[c.off:c.off+c.length], p) {
			t.Errorf("%d bytes at %d: the written data differs", c.length, c.off)
		}
	}
}

func TestWriteDataFailure(t *testing.T) {
	w := &pieces{data: make([]byte, 4<<20), failAt: 2}
	err := writeData(w, make([]byte, 1<<20), 0)
	if err == nil || err.Error() != "disk on fire" {
		t.Fatalf("a failed piece gave %v, want its error", err)
	}
	if len(w.writes) != 2 {
		t.Fatalf("%d pieces written before the failure, want 2 (none after it)", len(w.writes))
	}
}
