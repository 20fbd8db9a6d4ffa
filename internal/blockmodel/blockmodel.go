// Package blockmodel is the block content that the robustness test's and
// the simulator's clients write, so that every read names the write it
// returns: a 4 KiB block holds the client, the block number and the
// write's sequence number, bytes derived from them and a CRC over it all.
// A read is then checked against a model of what the block may hold.
package blockmodel

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/crc32"
)

// BlockSize is the size of one block.
const BlockSize = 4096

// Content is what write seq of client puts in block.
func Content(client uint32, block int, seq uint64) []byte {
	p := make([]byte, BlockSize)
	binary.BigEndian.PutUint32(p[0:], client)
	binary.BigEndian.PutUint32(p[4:], uint32(block))
	binary.BigEndian.PutUint64(p[8:], seq)
	x := seq*0x9E3779B97F4A7C15 ^ uint64(block)
	for i := 16; i < BlockSize-4; i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		binary.LittleEndian.PutUint64(p[i:], x)
	}
	binary.BigEndian.PutUint32(p[BlockSize-4:], crc32.ChecksumIEEE(p[:BlockSize-4]))
	return p
}

// Decode returns the write a block holds (0 for zeros), or an error when
// it is neither zeros nor an intact write of this client to this block.
func Decode(client uint32, block int, p []byte) (uint64, error) {
	if bytes.Count(p, []byte{0}) == len(p) {
		return 0, nil
	}
	if len(p) != BlockSize {
		return 0, fmt.Errorf("block %d: %d bytes, want %d", block, len(p), BlockSize)
	}
	seq := binary.BigEndian.Uint64(p[8:])
	if binary.BigEndian.Uint32(p[0:]) != client || binary.BigEndian.Uint32(p[4:]) != uint32(block) || !bytes.Equal(p, Content(client, block, seq)) {
		return 0, fmt.Errorf("block %d holds neither zeros nor an intact write of it (header %x)", block, p[:16])
	}
	return seq, nil
}
