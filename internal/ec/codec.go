package ec

import (
	"fmt"

	"github.com/klauspost/reedsolomon"
)

// Codec encodes and decodes the stripes of one scheme. Chunks are
// passed as a slice of K data chunks, or of K+M chunks (data first,
// then parity), all of the same length; any length works (a whole
// chunk, or the same byte range of every chunk: Reed-Solomon works
// byte column by byte column, so a range of a stripe is a stripe).
//
// A Codec is safe for concurrent use: reedsolomon's encoder keeps no
// state between calls but its cache of inverted matrices, which it
// locks. The methods never keep or modify the caller's chunks, except
// that Reconstruct and ReconstructData fill in the missing entries.
type Codec struct {
	scheme  Scheme
	encoder reedsolomon.Encoder
}

// NewCodec returns the codec of scheme s.
func NewCodec(s Scheme) (*Codec, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	// The default options on purpose: the matrix they choose is part of
	// the on-disk format (see the package comment).
	encoder, err := reedsolomon.New(s.K, s.M)
	if err != nil {
		return nil, fmt.Errorf("ec: reedsolomon for %s: %w", s, err)
	}
	return &Codec{scheme: s, encoder: encoder}, nil
}

// Scheme returns the codec's scheme.
func (c *Codec) Scheme() Scheme { return c.scheme }

// Encode returns the M parity chunks of K data chunks of one length
// (at least 1 byte), newly allocated.
func (c *Codec) Encode(data [][]byte) ([][]byte, error) {
	if len(data) != c.scheme.K {
		return nil, fmt.Errorf("%w: %d data chunks given, %s has %d", ErrChunks, len(data), c.scheme, c.scheme.K)
	}
	size, err := sameSize(data, false)
	if err != nil {
		return nil, err
	}
	chunks := make([][]byte, c.scheme.Chunks())
	copy(chunks, data)
	backing := make([]byte, c.scheme.M*size)
	for j := range c.scheme.M {
		chunks[c.scheme.K+j] = backing[j*size : (j+1)*size : (j+1)*size]
	}
	if err := c.encoder.Encode(chunks); err != nil {
		return nil, fmt.Errorf("ec: encoding %s: %w", c.scheme, err)
	}
	return chunks[c.scheme.K:], nil
}

// Reconstruct fills in the missing chunks of a stripe: chunks has K+M
// entries, data then parity, and an empty (nil) entry is missing. A
// missing entry is replaced by a new slice, or filled in place when it
// has the capacity (reedsolomon's rule), so a caller may pass buf[:0]
// to decode into buf. At most M may be missing: with more,
// ErrTooFewChunks names them and nothing is filled in. The chunks
// present are trusted: a wrong one (rot that no checksum caught)
// decodes to wrong data, which Verify detects when every chunk is
// present.
func (c *Codec) Reconstruct(chunks [][]byte) error {
	return c.reconstruct(chunks, false)
}

// ReconstructData is Reconstruct for a degraded read: it fills in only
// the missing data chunks, and leaves missing parity chunks empty.
func (c *Codec) ReconstructData(chunks [][]byte) error {
	return c.reconstruct(chunks, true)
}

func (c *Codec) reconstruct(chunks [][]byte, dataOnly bool) error {
	if len(chunks) != c.scheme.Chunks() {
		return fmt.Errorf("%w: %d chunks given, a %s stripe has %d", ErrChunks, len(chunks), c.scheme, c.scheme.Chunks())
	}
	var missing []int
	for i, chunk := range chunks {
		if len(chunk) == 0 {
			missing = append(missing, i)
		}
	}
	if len(missing) > c.scheme.M {
		return fmt.Errorf("%w: %d of the %d chunks of a %s stripe are missing (%v), at most %d may be", ErrTooFewChunks, len(missing), c.scheme.Chunks(), c.scheme, missing, c.scheme.M)
	}
	if _, err := sameSize(chunks, true); err != nil {
		return err
	}
	var err error
	if dataOnly {
		err = c.encoder.ReconstructData(chunks)
	} else {
		err = c.encoder.Reconstruct(chunks)
	}
	if err != nil {
		return fmt.Errorf("ec: reconstructing a %s stripe missing chunks %v: %w", c.scheme, missing, err)
	}
	return nil
}

// Verify says whether the parity chunks of a whole stripe (K+M chunks,
// none missing) are those of its data chunks: what scrub checks.
// False names no culprit: with M >= 2, decoding from each set of K
// chunks can find the odd one out; a checksum mismatch finds it first.
func (c *Codec) Verify(chunks [][]byte) (bool, error) {
	if len(chunks) != c.scheme.Chunks() {
		return false, fmt.Errorf("%w: %d chunks given, a %s stripe has %d", ErrChunks, len(chunks), c.scheme, c.scheme.Chunks())
	}
	if _, err := sameSize(chunks, false); err != nil {
		return false, err
	}
	ok, err := c.encoder.Verify(chunks)
	if err != nil {
		return false, fmt.Errorf("ec: verifying a %s stripe: %w", c.scheme, err)
	}
	return ok, nil
}

// ParityDelta returns what a small write changes in the parity: before
// and after are the bytes of one range of data chunk chunk before and after
// the write, and delta[j] is what must be XORed (ApplyDelta) into parity
// chunk j (chunk K+j of the stripe) over the same range. The write need
// not read the other data chunks: a parity byte is a sum over GF(2^8)
// of its column's data bytes each times a constant, so changing one
// data byte by d changes parity j by coefficient(j, chunk) times d, and
// addition in GF(2^8) is XOR. The multiplication is reedsolomon's
// (Encoder.Update with parity zero, which yields the change alone).
func (c *Codec) ParityDelta(chunk int, before, after []byte) ([][]byte, error) {
	if chunk < 0 || chunk >= c.scheme.K {
		return nil, fmt.Errorf("%w: chunk %d is not a data chunk of %s (data chunks 0..%d)", ErrChunks, chunk, c.scheme, c.scheme.K-1)
	}
	if len(before) != len(after) {
		return nil, fmt.Errorf("%w: %d bytes before the write, %d after: a delta needs both of the same range", ErrChunks, len(before), len(after))
	}
	size := len(before)
	backing := make([]byte, c.scheme.M*size)
	deltas := make([][]byte, c.scheme.M)
	for j := range deltas {
		deltas[j] = backing[j*size : (j+1)*size : (j+1)*size]
	}
	if size == 0 {
		return deltas, nil
	}
	// Update XORs the new bytes into the old ones in place: give it a
	// copy, never the caller's.
	stripe := make([][]byte, c.scheme.Chunks())
	stripe[chunk] = append([]byte(nil), before...)
	copy(stripe[c.scheme.K:], deltas)
	changed := make([][]byte, c.scheme.K)
	changed[chunk] = after
	if err := c.encoder.Update(stripe, changed); err != nil {
		return nil, fmt.Errorf("ec: parity delta of %s chunk %d: %w", c.scheme, chunk, err)
	}
	return deltas, nil
}

// ApplyDelta XORs delta, from ParityDelta, into the same range of a
// parity chunk. Applying the same delta twice undoes it.
func ApplyDelta(parity, delta []byte) error {
	if len(parity) != len(delta) {
		return fmt.Errorf("%w: a %d-byte delta applied to %d parity bytes", ErrChunks, len(delta), len(parity))
	}
	// Adding in GF(2^8) is XOR: out ^= 1*in, which the library runs
	// with its vector code. Lengths are equal, so it cannot panic.
	reedsolomon.LowLevel{}.GalMulSliceXor(1, delta, parity)
	return nil
}

// sameSize returns the length shared by every chunk, empty ones
// skipped when emptyOK (missing chunks), or an error naming the first
// chunk that differs.
func sameSize(chunks [][]byte, emptyOK bool) (int, error) {
	size := -1
	first := 0
	for i, chunk := range chunks {
		if len(chunk) == 0 {
			if emptyOK {
				continue
			}
			return 0, fmt.Errorf("%w: chunk %d is empty", ErrChunks, i)
		}
		if size < 0 {
			size, first = len(chunk), i
			continue
		}
		if len(chunk) != size {
			return 0, fmt.Errorf("%w: chunk %d has %d bytes, chunk %d %d: a stripe's chunks are all the same length", ErrChunks, i, len(chunk), first, size)
		}
	}
	if size < 0 {
		return 0, fmt.Errorf("%w: every chunk is empty", ErrChunks)
	}
	return size, nil
}
