package object

import (
	"hash/crc32"
	"sync/atomic"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Checksum is the CRC32C of p: the checksum the object protocol sends with
// every payload (objproto.ObjectChecksum is this function).
func Checksum(p []byte) uint32 { return crc32.Checksum(p, castagnoli) }

// Payload is data a gateway writes to several replicas. Its Checksum is
// computed once, when the first replica on another node needs it, however
// many nodes the data goes to (a 1 MiB write to three replicas otherwise
// hashed its data once per remote replica: 10% of the gateway's CPU).
type Payload struct {
	Data []byte
	// sum holds the checksum in its low 32 bits once bit 32 is set.
	sum atomic.Uint64
}

// Checksum returns Checksum(p.Data), computing it on the first call. Safe
// for concurrent use; Data must not change once it has been called.
func (p *Payload) Checksum() uint32 {
	if v := p.sum.Load(); v&(1<<32) != 0 {
		return uint32(v)
	}
	sum := Checksum(p.Data)
	p.sum.Store(1<<32 | uint64(sum))
	return sum
}
