package object

import (
	"sync"
	"testing"
)

func TestPayloadChecksum(t *testing.T) {
	// The CRC32C check value (RFC 3720, appendix B.4).
	if got := Checksum([]byte("123456789")); got != 0xe3069283 {
		t.Fatalf("Checksum(\"123456789\") = %#08x, want 0xe3069283", got)
	}
	if got := Checksum(nil); got != 0 {
		t.Fatalf("Checksum(nil) = %#08x, want 0", got)
	}
	p := &Payload{Data: []byte("123456789")}
	var wg sync.WaitGroup
	sums := make([]uint32, 8)
	for i := range sums {
		wg.Go(func() { sums[i] = p.Checksum() })
	}
	wg.Wait()
	for i, sum := range sums {
		if sum != 0xe3069283 {
			t.Fatalf("concurrent Checksum %d = %#08x, want 0xe3069283", i, sum)
		}
	}
	// Computed once: later calls do not hash Data again.
	p.Data[0] = 'x'
	if got := p.Checksum(); got != 0xe3069283 {
		t.Fatalf("Checksum after the first call = %#08x, want the first result", got)
	}
	// A payload whose checksum is zero is still computed only once.
	zero := &Payload{}
	if zero.Checksum() != 0 || zero.sum.Load() != 1<<32 {
		t.Fatalf("empty payload: checksum %#08x, state %#x", zero.Checksum(), zero.sum.Load())
	}
}
