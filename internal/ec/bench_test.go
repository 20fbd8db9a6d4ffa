package ec

import (
	"math/rand/v2"
	"testing"
)

// BenchmarkEncode4x2 encodes a 4 MiB object (herd's default size) in
// 4+2: the parity of a first write or a rebuild. MB/s counts object
// bytes.
func BenchmarkEncode4x2(b *testing.B) {
	s := Scheme{K: 4, M: 2}
	c := mustCodec(b, s)
	g := mustGeometry(b, s, 4<<20)
	object := make([]byte, g.ObjectSize)
	fill(rand.New(rand.NewPCG(1, 1)), object)
	data, err := g.Split(object)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(g.ObjectSize)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.Encode(data); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkReconstruct4x2 decodes two missing data chunks of a 4 MiB
// object in 4+2: the worst degraded read. MB/s counts object bytes.
func BenchmarkReconstruct4x2(b *testing.B) {
	s := Scheme{K: 4, M: 2}
	c := mustCodec(b, s)
	stripe := randomStripe(b, rand.New(rand.NewPCG(2, 2)), c, 1<<20)
	buffers := [][]byte{make([]byte, 1<<20), make([]byte, 1<<20)}
	b.SetBytes(4 << 20)
	b.ReportAllocs()
	for b.Loop() {
		stripe[0], stripe[2] = buffers[0][:0], buffers[1][:0]
		if err := c.ReconstructData(stripe); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkParityDelta4K computes the parity change of a 4 KiB write in
// 4+2: the small-write path. MB/s counts the bytes written.
func BenchmarkParityDelta4K(b *testing.B) {
	c := mustCodec(b, Scheme{K: 4, M: 2})
	rng := rand.New(rand.NewPCG(3, 3))
	before, after := make([]byte, BlockSize), make([]byte, BlockSize)
	fill(rng, before)
	fill(rng, after)
	b.SetBytes(BlockSize)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.ParityDelta(1, before, after); err != nil {
			b.Fatal(err)
		}
	}
}
