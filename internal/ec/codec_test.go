package ec

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
)

func mustCodec(t testing.TB, s Scheme) *Codec {
	t.Helper()
	c, err := NewCodec(s)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// randomStripe returns K random data chunks of size bytes and their
// parity, encoded.
func randomStripe(t testing.TB, rng *rand.Rand, c *Codec, size int) [][]byte {
	t.Helper()
	stripe := make([][]byte, c.Scheme().Chunks())
	for i := range c.Scheme().K {
		stripe[i] = make([]byte, size)
		fill(rng, stripe[i])
	}
	parity, err := c.Encode(stripe[:c.Scheme().K])
	if err != nil {
		t.Fatal(err)
	}
	copy(stripe[c.Scheme().K:], parity)
	return stripe
}

func cloneStripe(stripe [][]byte) [][]byte {
	out := make([][]byte, len(stripe))
	for i, chunk := range stripe {
		out[i] = slices.Clone(chunk)
	}
	return out
}

// subsets calls f with every subset of 0..n-1 of at most max elements.
func subsets(n, max int, f func([]int)) {
	var walk func(from int, chosen []int)
	walk = func(from int, chosen []int) {
		f(chosen)
		if len(chosen) == max {
			return
		}
		for i := from; i < n; i++ {
			walk(i+1, append(chosen, i))
		}
	}
	walk(0, nil)
}

func TestNewCodecRefusesBadSchemes(t *testing.T) {
	for _, s := range []Scheme{{}, {K: 1, M: 1}, {K: 9, M: 1}, {K: 4, M: 0}, {K: 4, M: 4}} {
		if c, err := NewCodec(s); !errors.Is(err, ErrScheme) {
			t.Errorf("NewCodec(%+v) = %v, %v; want ErrScheme", s, c, err)
		}
	}
}

// TestReconstructEveryMissingSet: for every scheme, every set of at most
// M missing chunks (231 sets at most, for 8+3) decodes to the original
// stripe, through Reconstruct and through ReconstructData. This proves
// the matrix MDS for every scheme herd supports, not just for the sets
// a random test happens to draw.
func TestReconstructEveryMissingSet(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for _, s := range everyScheme() {
		c := mustCodec(t, s)
		// 4 KiB + 17: a chunk block and an odd tail, so that both the
		// vector code and the byte loops of the library run.
		want := randomStripe(t, rng, c, BlockSize+17)
		sets := 0
		subsets(s.Chunks(), s.M, func(missing []int) {
			sets++
			for _, dataOnly := range []bool{false, true} {
				stripe := cloneStripe(want)
				for _, i := range missing {
					stripe[i] = nil
				}
				var err error
				if dataOnly {
					err = c.ReconstructData(stripe)
				} else {
					err = c.Reconstruct(stripe)
				}
				if err != nil {
					t.Fatalf("%s missing %v (data only %v): %v", s, missing, dataOnly, err)
				}
				for i := range stripe {
					if dataOnly && i >= s.K && slices.Contains(missing, i) {
						if stripe[i] != nil {
							t.Fatalf("%s missing %v: ReconstructData filled in parity chunk %d", s, missing, i)
						}
						continue
					}
					if !bytes.Equal(stripe[i], want[i]) {
						t.Fatalf("%s missing %v (data only %v): chunk %d decoded wrong", s, missing, dataOnly, i)
					}
				}
			}
		})
		if want := binomialSum(s.Chunks(), s.M); sets != want {
			t.Fatalf("%s: %d missing sets tried, want %d", s, sets, want)
		}
	}
}

func binomialSum(n, upTo int) int {
	sum, b := 0, 1
	for k := 0; k <= upTo; k++ {
		sum += b
		b = b * (n - k) / (k + 1)
	}
	return sum
}

// TestReconstructRandom: the property test. Random data of random
// sizes, for every scheme, with a random set of at most M chunks
// missing, reconstructs to what was encoded. The seed is printed on
// failure.
func TestReconstructRandom(t *testing.T) {
	seed := uint64(7)
	rng := rand.New(rand.NewPCG(seed, seed))
	for _, s := range everyScheme() {
		c := mustCodec(t, s)
		for iteration := range 25 {
			size := 1 + rng.IntN(3*BlockSize)
			if iteration%3 == 0 {
				size = (1 + rng.IntN(16)) * BlockSize // whole blocks, as the store holds them
			}
			want := randomStripe(t, rng, c, size)
			missing := rng.Perm(s.Chunks())[:rng.IntN(s.M+1)]
			stripe := cloneStripe(want)
			for _, i := range missing {
				stripe[i] = nil
			}
			if err := c.Reconstruct(stripe); err != nil {
				t.Fatalf("seed %d: %s, %d bytes, missing %v: %v", seed, s, size, missing, err)
			}
			for i := range stripe {
				if !bytes.Equal(stripe[i], want[i]) {
					t.Fatalf("seed %d: %s, %d bytes, missing %v: chunk %d decoded wrong", seed, s, size, missing, i)
				}
			}
			if ok, err := c.Verify(stripe); !ok || err != nil {
				t.Fatalf("seed %d: %s: the reconstructed stripe fails Verify: %v, %v", seed, s, ok, err)
			}
		}
	}
}

// TestReconstructIntoCallersBuffer: a missing entry with capacity is
// decoded into that memory.
func TestReconstructIntoCallersBuffer(t *testing.T) {
	c := mustCodec(t, Scheme{K: 4, M: 2})
	want := randomStripe(t, rand.New(rand.NewPCG(8, 8)), c, BlockSize)
	stripe := cloneStripe(want)
	buffer := make([]byte, BlockSize)
	stripe[1] = buffer[:0]
	if err := c.Reconstruct(stripe); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buffer, want[1]) {
		t.Fatal("chunk 1 was not decoded into the buffer given")
	}
}

// TestReconstructRefusesTooManyMissing: M+1 missing chunks, any of them
// (and every chunk missing), is ErrTooFewChunks naming them, and no
// chunk is filled in.
func TestReconstructRefusesTooManyMissing(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	for _, s := range everyScheme() {
		c := mustCodec(t, s)
		want := randomStripe(t, rng, c, 512)
		for _, count := range []int{s.M + 1, s.Chunks()} {
			for range 5 {
				missing := rng.Perm(s.Chunks())[:count]
				slices.Sort(missing)
				for _, dataOnly := range []bool{false, true} {
					stripe := cloneStripe(want)
					for _, i := range missing {
						stripe[i] = nil
					}
					var err error
					if dataOnly {
						err = c.ReconstructData(stripe)
					} else {
						err = c.Reconstruct(stripe)
					}
					if !errors.Is(err, ErrTooFewChunks) {
						t.Fatalf("%s missing %v: %v, want ErrTooFewChunks", s, missing, err)
					}
					if msg := err.Error(); !bytes.Contains([]byte(msg), []byte(fmt.Sprint(missing))) {
						t.Fatalf("%s missing %v: %q does not name them", s, missing, msg)
					}
					for _, i := range missing {
						if stripe[i] != nil {
							t.Fatalf("%s missing %v: chunk %d filled in anyway", s, missing, i)
						}
					}
				}
			}
		}
	}
}

func TestCodecRefusesBadChunks(t *testing.T) {
	s := Scheme{K: 4, M: 2}
	c := mustCodec(t, s)
	good := randomStripe(t, rand.New(rand.NewPCG(11, 12)), c, 100)
	with := func(f func(stripe [][]byte) [][]byte) [][]byte { return f(cloneStripe(good)) }

	for name, data := range map[string][][]byte{
		"no data":           nil,
		"too few":           good[:3],
		"too many":          good[:5],
		"an empty chunk":    with(func(x [][]byte) [][]byte { x[2] = nil; return x[:4] }),
		"sizes differ":      with(func(x [][]byte) [][]byte { x[3] = x[3][:99]; return x[:4] }),
		"every chunk empty": make([][]byte, 4),
	} {
		if p, err := c.Encode(data); !errors.Is(err, ErrChunks) || p != nil {
			t.Errorf("Encode, %s: %d parity, %v; want ErrChunks", name, len(p), err)
		}
	}
	for name, stripe := range map[string][][]byte{
		"too few":      good[:5],
		"too many":     append(cloneStripe(good), make([]byte, 100)),
		"sizes differ": with(func(x [][]byte) [][]byte { x[0] = nil; x[5] = x[5][:50]; return x }),
	} {
		if err := c.Reconstruct(stripe); !errors.Is(err, ErrChunks) {
			t.Errorf("Reconstruct, %s: %v, want ErrChunks", name, err)
		}
		if err := c.ReconstructData(stripe); !errors.Is(err, ErrChunks) {
			t.Errorf("ReconstructData, %s: %v, want ErrChunks", name, err)
		}
		if ok, err := c.Verify(stripe); !errors.Is(err, ErrChunks) || ok {
			t.Errorf("Verify, %s: %v, %v; want ErrChunks", name, ok, err)
		}
	}
	if ok, err := c.Verify(with(func(x [][]byte) [][]byte { x[4] = nil; return x })); !errors.Is(err, ErrChunks) || ok {
		t.Errorf("Verify with a chunk missing: %v, %v; want ErrChunks", ok, err)
	}
}

// TestVerifyFindsAnyChangedByte: what scrub relies on. Every single
// byte changed, in any chunk, data or parity, fails Verify.
func TestVerifyFindsAnyChangedByte(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 14))
	for _, s := range everyScheme() {
		c := mustCodec(t, s)
		stripe := randomStripe(t, rng, c, 64)
		if ok, err := c.Verify(stripe); !ok || err != nil {
			t.Fatalf("%s: a fresh stripe fails Verify: %v, %v", s, ok, err)
		}
		for i := range stripe {
			at := rng.IntN(64)
			stripe[i][at] ^= byte(1 + rng.IntN(255))
			if ok, err := c.Verify(stripe); ok || err != nil {
				t.Fatalf("%s: chunk %d changed at %d passes Verify (%v)", s, i, at, err)
			}
			stripe = randomStripe(t, rng, c, 64)
		}
	}
}

// TestParityDeltaEqualsReencode: the small-write path. A sequence of
// random small writes, each to one range of one data chunk, applied to
// the parity as deltas, leaves the same parity as encoding the final
// data whole, for every scheme.
func TestParityDeltaEqualsReencode(t *testing.T) {
	seed := uint64(15)
	rng := rand.New(rand.NewPCG(seed, seed))
	const chunkSize = 8 * BlockSize
	for _, s := range everyScheme() {
		c := mustCodec(t, s)
		stripe := randomStripe(t, rng, c, chunkSize)
		for write := range 20 {
			chunk := rng.IntN(s.K)
			var off, n int
			switch write % 4 {
			case 0: // one aligned block
				off, n = rng.IntN(chunkSize/BlockSize)*BlockSize, BlockSize
			case 1: // up to the chunk's end
				n = 1 + rng.IntN(2*BlockSize)
				off = chunkSize - n
			default: // anywhere, any length
				off = rng.IntN(chunkSize)
				n = 1 + rng.IntN(min(chunkSize-off, 3*BlockSize))
			}
			before := slices.Clone(stripe[chunk][off : off+n])
			after := make([]byte, n)
			fill(rng, after)
			if write%5 == 4 {
				after = make([]byte, n) // zeros: a WRITE_ZEROES
			}
			beforeCopy, afterCopy := slices.Clone(before), slices.Clone(after)
			deltas, err := c.ParityDelta(chunk, before, after)
			if err != nil {
				t.Fatalf("seed %d: %s: %v", seed, s, err)
			}
			if !bytes.Equal(before, beforeCopy) || !bytes.Equal(after, afterCopy) {
				t.Fatalf("seed %d: %s: ParityDelta changed its arguments", seed, s)
			}
			if len(deltas) != s.M {
				t.Fatalf("seed %d: %s: %d deltas, want %d", seed, s, len(deltas), s.M)
			}
			copy(stripe[chunk][off:], after)
			for j, delta := range deltas {
				if err := ApplyDelta(stripe[s.K+j][off:off+n], delta); err != nil {
					t.Fatal(err)
				}
			}
			parity, err := c.Encode(stripe[:s.K])
			if err != nil {
				t.Fatal(err)
			}
			for j := range parity {
				if !bytes.Equal(parity[j], stripe[s.K+j]) {
					t.Fatalf("seed %d: %s: write %d (chunk %d, [%d, +%d)): parity %d after the delta differs from re-encoding", seed, s, write, chunk, off, n, j)
				}
			}
		}
	}
}

// TestObjectWriteThroughPieces: a write to an object, crossing chunk
// boundaries and reaching into the padded chunk, done as the gateway
// will: one delta per piece. The stripe ends as Split and Encode of
// the written object make it, and decodes from any K chunks.
func TestObjectWriteThroughPieces(t *testing.T) {
	rng := rand.New(rand.NewPCG(16, 17))
	for _, s := range []Scheme{{K: 3, M: 2}, {K: 4, M: 2}, {K: 8, M: 3}} {
		c := mustCodec(t, s)
		g := mustGeometry(t, s, 64<<10+12345)
		object := make([]byte, g.ObjectSize)
		fill(rng, object)
		data, err := g.Split(object)
		if err != nil {
			t.Fatal(err)
		}
		parity, err := c.Encode(data)
		if err != nil {
			t.Fatal(err)
		}
		// Across one boundary or more, up to the object's end; the
		// padded chunk's tail; the whole object; one byte.
		across := min(2*g.ChunkSize+200, g.ObjectSize-(g.ChunkSize-100))
		for _, r := range [][2]int64{{g.ChunkSize - 100, across}, {g.ObjectSize - 5000, 5000}, {0, g.ObjectSize}, {7, 1}} {
			after := make([]byte, r[1])
			fill(rng, after)
			pieces, err := g.Pieces(r[0], r[1])
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range pieces {
				at := data[p.Chunk][p.ChunkOffset : p.ChunkOffset+p.Length]
				deltas, err := c.ParityDelta(p.Chunk, at, after[p.ObjectOffset-r[0]:p.ObjectOffset-r[0]+p.Length])
				if err != nil {
					t.Fatal(err)
				}
				copy(at, after[p.ObjectOffset-r[0]:])
				for j := range deltas {
					if err := ApplyDelta(parity[j][p.ChunkOffset:p.ChunkOffset+p.Length], deltas[j]); err != nil {
						t.Fatal(err)
					}
				}
			}
			copy(object[r[0]:], after)
			wantData, _ := g.Split(object)
			wantParity, _ := c.Encode(wantData)
			for i := range wantData {
				if !bytes.Equal(data[i], wantData[i]) {
					t.Fatalf("%s: write [%d, +%d): data chunk %d differs", s, r[0], r[1], i)
				}
			}
			for j := range wantParity {
				if !bytes.Equal(parity[j], wantParity[j]) {
					t.Fatalf("%s: write [%d, +%d): parity chunk %d differs", s, r[0], r[1], j)
				}
			}
			stripe := append(cloneStripe(data), cloneStripe(parity)...)
			for _, i := range rng.Perm(s.Chunks())[:s.M] {
				stripe[i] = nil
			}
			if err := c.ReconstructData(stripe); err != nil {
				t.Fatal(err)
			}
			if back, err := g.Join(stripe[:s.K]); err != nil || !bytes.Equal(back, object) {
				t.Fatalf("%s: write [%d, +%d): the object does not decode back: %v", s, r[0], r[1], err)
			}
		}
	}
}

func TestParityDeltaRefuses(t *testing.T) {
	c := mustCodec(t, Scheme{K: 4, M: 2})
	for _, chunk := range []int{-1, 4, 5, 6} {
		if d, err := c.ParityDelta(chunk, []byte{1}, []byte{2}); !errors.Is(err, ErrChunks) || d != nil {
			t.Errorf("ParityDelta to chunk %d: %v, %v; want ErrChunks", chunk, d, err)
		}
	}
	if d, err := c.ParityDelta(0, []byte{1, 2}, []byte{2}); !errors.Is(err, ErrChunks) || d != nil {
		t.Errorf("ParityDelta of ranges of different lengths: %v, %v; want ErrChunks", d, err)
	}
	d, err := c.ParityDelta(0, nil, nil)
	if err != nil || len(d) != 2 || len(d[0]) != 0 || len(d[1]) != 0 {
		t.Errorf("ParityDelta of an empty range = %v, %v; want two empty deltas", d, err)
	}
	d, err = c.ParityDelta(3, []byte{9, 9, 9}, []byte{9, 9, 9})
	if err != nil || !bytes.Equal(d[0], []byte{0, 0, 0}) || !bytes.Equal(d[1], []byte{0, 0, 0}) {
		t.Errorf("ParityDelta of a write that changes nothing = %v, %v; want zeros", d, err)
	}
}

func TestApplyDelta(t *testing.T) {
	parity := []byte{1, 2, 3, 4}
	delta := []byte{0xff, 0, 0x0f, 4}
	if err := ApplyDelta(parity, delta); err != nil || !bytes.Equal(parity, []byte{0xfe, 2, 0x0c, 0}) {
		t.Fatalf("ApplyDelta: %v, %v", parity, err)
	}
	if err := ApplyDelta(parity, delta); err != nil || !bytes.Equal(parity, []byte{1, 2, 3, 4}) {
		t.Fatalf("ApplyDelta twice does not undo it: %v, %v", parity, err)
	}
	if err := ApplyDelta(parity, delta[:3]); !errors.Is(err, ErrChunks) || !bytes.Equal(parity, []byte{1, 2, 3, 4}) {
		t.Fatalf("ApplyDelta of a short delta: %v, %v; want ErrChunks and nothing changed", parity, err)
	}
}

// TestParityIsPinned: the parity of a fixed stripe in every scheme, as
// written to disk. If a new version of reedsolomon, or a change of its
// options, changes any of these, parity already on disk no longer
// decodes: that is a format change, not an upgrade.
func TestParityIsPinned(t *testing.T) {
	want := map[string]string{
		"2+1": "e95d625917c39fcc", "2+2": "5dcabffaf221d621", "2+3": "086152469278b13c",
		"3+1": "2918a455354dcc5d", "3+2": "64d4de9051297137", "3+3": "702d9e7a539ceadb",
		"4+1": "6318d344a58d65bc", "4+2": "616b039c87d4c991", "4+3": "a6e6df40b9c2d81e",
		"5+1": "a51827daf404f99a", "5+2": "6df2efd62b36b148", "5+3": "200effa6d5d08f77",
		"6+1": "a6b64e2a944093d0", "6+2": "59f72804ac209cd8", "6+3": "b3748f9ac45e2458",
		"7+1": "aa0e61b78989e9c2", "7+2": "b5b1df3176b403df", "7+3": "058e34fde3d74883",
		"8+1": "114bfb484c75c359", "8+2": "78ee649d7470abb0", "8+3": "daf9c6d09b1810a9",
	}
	for _, s := range everyScheme() {
		c := mustCodec(t, s)
		data := make([][]byte, s.K)
		for i := range data {
			data[i] = make([]byte, 1000)
			for b := range data[i] {
				data[i][b] = byte(b*31 + i*7 + b>>8)
			}
		}
		parity, err := c.Encode(data)
		if err != nil {
			t.Fatal(err)
		}
		h := sha256.New()
		for _, p := range parity {
			h.Write(p)
		}
		if got := fmt.Sprintf("%x", h.Sum(nil))[:16]; got != want[s.String()] {
			t.Errorf("%s: parity digest %s, want %s", s, got, want[s.String()])
		}
	}
}

// TestConcurrentUse: one Codec shared by goroutines, as the gateway
// will share one per scheme (run with -race).
func TestConcurrentUse(t *testing.T) {
	c := mustCodec(t, Scheme{K: 4, M: 2})
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for worker := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(worker), 99))
			for range 20 {
				// Not randomStripe: t.Fatal must not run off the test's
				// goroutine.
				want := make([][]byte, 6)
				for i := range 4 {
					want[i] = make([]byte, 2*BlockSize)
					fill(rng, want[i])
				}
				parity, err := c.Encode(want[:4])
				if err != nil {
					errs <- err
					return
				}
				copy(want[4:], parity)
				stripe := cloneStripe(want)
				for _, i := range rng.Perm(6)[:2] {
					stripe[i] = nil
				}
				if err := c.Reconstruct(stripe); err != nil {
					errs <- err
					return
				}
				for i := range stripe {
					if !bytes.Equal(stripe[i], want[i]) {
						errs <- fmt.Errorf("worker %d: chunk %d decoded wrong", worker, i)
						return
					}
				}
				if _, err := c.ParityDelta(rng.IntN(4), want[0][:100], want[1][:100]); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
