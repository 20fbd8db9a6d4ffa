package ec

import (
	"errors"
	"testing"
)

func TestHeadRoundTripAndTornSlots(t *testing.T) {
	l, err := NewLayout(Scheme{K: 4, M: 2}, 4<<20)
	if err != nil {
		t.Fatal(err)
	}
	if l.HeadSize()%BlockSize != 0 || l.EntriesSize() != 16<<10 || l.HeadOffset(0) != 4<<20+16<<10 {
		t.Fatalf("layout: head %d entries %d head0 at %d", l.HeadSize(), l.EntriesSize(), l.HeadOffset(0))
	}
	h := Head{Generation: 3, Homes: []string{"a", "b", "c", "d", "e", "f"}, Sums: make([][]uint32, 6)}
	for c := range h.Sums {
		h.Sums[c] = make([]uint32, l.ChunkBlocks())
		for i := range h.Sums[c] {
			h.Sums[c][i] = uint32(c*1000 + i)
		}
	}
	b, err := l.EncodeHead(h)
	if err != nil {
		t.Fatal(err)
	}
	got, ok, err := l.Current(make([]byte, l.HeadSize()), b)
	if err != nil || !ok || got.Generation != 3 || got.Homes[5] != "f" || got.Sums[4][7] != 4007 {
		t.Fatalf("Current = %+v %v %v", got.Generation, ok, err)
	}
	// A newer head torn in the other slot leaves generation 3 current.
	h.Generation = 4
	newer, err := l.EncodeHead(h)
	if err != nil {
		t.Fatal(err)
	}
	newer[100] ^= 1
	if got, ok, err := l.Current(newer, b); err != nil || !ok || got.Generation != 3 {
		t.Fatalf("torn newer head: Current = %d %v %v, want 3", got.Generation, ok, err)
	}
	newer[100] ^= 1
	if got, ok, err := l.Current(newer, b); err != nil || !ok || got.Generation != 4 {
		t.Fatalf("newer head: Current = %d %v %v, want 4", got.Generation, ok, err)
	}
	// A head in the slot of the other parity is damage, not a head.
	if _, _, err := l.Current(b, newer); err == nil {
		t.Fatal("heads in the wrong slots accepted")
	}
	if _, ok, err := l.Current(make([]byte, l.HeadSize()), make([]byte, l.HeadSize())); ok || err != nil {
		t.Fatalf("empty slots: ok %v err %v", ok, err)
	}
	other, _ := NewLayout(Scheme{K: 2, M: 1}, 4<<20)
	if _, err := other.DecodeHead(b); err == nil || errors.Is(err, ErrNoHead) {
		t.Fatalf("a 4+2 head read as 2+1: %v", err)
	}
}

func TestResolveBlockSource(t *testing.T) {
	old, cur := make([]byte, BlockSize), make([]byte, BlockSize)
	old[0], cur[0] = 1, 2
	fresh := Entry{Tag: 6, CRC: Checksum(cur)}
	rewrite := Entry{Tag: 6, CRC: Checksum(cur), HasPrev: true, Prev: Checksum(old)}
	for _, tc := range []struct {
		name    string
		e       Entry
		gen     uint32
		overlay []byte
		want    Source
	}{
		{"written since the fold", fresh, 5, cur, FromOverlay},
		{"written before the fold", fresh, 6, cur, FromChunks},
		{"never written", Entry{}, 0, make([]byte, BlockSize), FromChunks},
		{"first write torn: entry without data", fresh, 5, old, FromChunks},
		{"rewrite torn: entry without data", rewrite, 5, old, FromOverlay},
		{"rewrite landed", rewrite, 5, cur, FromOverlay},
		{"rewrite of rotten bytes", rewrite, 5, make([]byte, BlockSize), Corrupt},
	} {
		if got := Resolve(tc.e, tc.gen, tc.overlay); got != tc.want {
			t.Errorf("%s: Resolve = %d, want %d", tc.name, got, tc.want)
		}
	}
	var b [EntrySize]byte
	rewrite.Encode(b[:])
	if DecodeEntry(b[:]) != rewrite {
		t.Fatalf("entry round trip: %+v", DecodeEntry(b[:]))
	}
}
