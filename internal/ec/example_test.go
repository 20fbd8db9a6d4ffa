package ec_test

import (
	"bytes"
	"fmt"

	"github.com/herd-storage/herd/internal/ec"
)

// A 4+2 object written whole, changed by a small write through parity
// deltas, and read back with two chunks lost.
func Example() {
	scheme, err := ec.Parse("4+2")
	if err != nil {
		panic(err)
	}
	geometry, _ := ec.NewGeometry(scheme, 64<<10)
	codec, _ := ec.NewCodec(scheme)

	object := bytes.Repeat([]byte("herd"), 16<<10)
	data, _ := geometry.Split(object)
	parity, _ := codec.Encode(data)
	fmt.Println("chunk size:", geometry.ChunkSize)

	// A 6-byte write across the boundary of chunks 0 and 1.
	write := []byte("ERASED")
	pieces, _ := geometry.Pieces(geometry.ChunkSize-3, int64(len(write)))
	for _, p := range pieces {
		at := data[p.Chunk][p.ChunkOffset : p.ChunkOffset+p.Length]
		after := write[p.ObjectOffset-(geometry.ChunkSize-3):][:p.Length]
		deltas, _ := codec.ParityDelta(p.Chunk, at, after)
		copy(at, after)
		for j := range deltas {
			_ = ec.ApplyDelta(parity[j][p.ChunkOffset:p.ChunkOffset+p.Length], deltas[j])
		}
		fmt.Printf("data chunk %d, bytes [%d, +%d)\n", p.Chunk, p.ChunkOffset, p.Length)
	}

	// Chunks 1 and 4 lost: any four of the six decode.
	stripe := append(data, parity...)
	stripe[1], stripe[4] = nil, nil
	if err := codec.ReconstructData(stripe); err != nil {
		panic(err)
	}
	back, _ := geometry.Join(stripe[:scheme.K])
	fmt.Printf("%s\n", back[geometry.ChunkSize-5:geometry.ChunkSize+5])
	// Output:
	// chunk size: 16384
	// data chunk 0, bytes [16381, +3)
	// data chunk 1, bytes [0, +3)
	// dhERASEDdh
}
