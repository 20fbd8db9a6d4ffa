package ec

import (
	"fmt"
	"strconv"
	"strings"
)

// The schemes herd supports. K 1 is replication, which copies do
// without a read before each write; K above 8 makes a degraded read or
// a rebuild read more chunks than it saves. Every parity chunk is one
// more write per small write and one more node per stripe (each chunk
// of a stripe has its own node: layout.Epoch.ChunkHomes), so M
// stops at 3: a stripe of 8+3 already needs 11 nodes.
const (
	MinData   = 2
	MaxData   = 8
	MinParity = 1
	MaxParity = 3
)

// Scheme is a Reed-Solomon scheme: an object is cut into K data chunks
// and M parity chunks are computed from them; any K of the K+M chunks
// give the object back. Its text form is "K+M", as in "4+2".
type Scheme struct {
	K int // data chunks
	M int // parity chunks
}

// Parse reads a scheme written "K+M" (for example "4+2"): two decimal
// numbers joined by a plus sign, nothing else (no spaces, no signs, no
// leading zeros, so that every scheme has one spelling, the one String
// writes). The scheme must be valid (Validate).
func Parse(text string) (Scheme, error) {
	if strings.ContainsFunc(text, func(r rune) bool { return r == ' ' || r == '\t' || r == '\n' || r == '\r' }) {
		return Scheme{}, fmt.Errorf("%w %q: write it without spaces, as in \"4+2\"", ErrScheme, text)
	}
	k, m, found := strings.Cut(text, "+")
	if !found {
		return Scheme{}, fmt.Errorf("%w %q: want K+M data and parity chunks, as in \"4+2\"", ErrScheme, text)
	}
	data, err := parseCount(text, "K (data chunks)", k, MinData, MaxData)
	if err != nil {
		return Scheme{}, err
	}
	parity, err := parseCount(text, "M (parity chunks)", m, MinParity, MaxParity)
	if err != nil {
		return Scheme{}, err
	}
	s := Scheme{K: data, M: parity}
	// The text is canonical by now, so the error Validate writes names
	// the scheme exactly as the user spelt it.
	if err := s.Validate(); err != nil {
		return Scheme{}, err
	}
	return s, nil
}

// parseCount reads one side of "K+M": decimal digits only. The range
// lo..hi is only for the message of a number too long to convert.
func parseCount(text, what, digits string, lo, hi int) (int, error) {
	switch {
	case digits == "":
		return 0, fmt.Errorf("%w %q: %s is missing, as in \"4+2\"", ErrScheme, text, what)
	case strings.ContainsFunc(digits, func(r rune) bool { return r < '0' || r > '9' }):
		return 0, fmt.Errorf("%w %q: %s %q is not a number", ErrScheme, text, what, digits)
	case len(digits) > 1 && digits[0] == '0':
		return 0, fmt.Errorf("%w %q: %s %q has a leading zero", ErrScheme, text, what, digits)
	case len(digits) > 3:
		// Out of range whatever it says, and Atoi could overflow.
		return 0, fmt.Errorf("%w %q: %s must be %d..%d, not %s", ErrScheme, text, what, lo, hi, digits)
	}
	n, err := strconv.Atoi(digits)
	if err != nil {
		return 0, fmt.Errorf("%w %q: %s %q: %v", ErrScheme, text, what, digits, err)
	}
	return n, nil
}

// Validate returns nil for a scheme herd supports: K 2..8, M 1..3.
func (s Scheme) Validate() error {
	if s.K < MinData || s.K > MaxData {
		return fmt.Errorf("%w %s: K (data chunks) must be %d..%d, not %d", ErrScheme, s, MinData, MaxData, s.K)
	}
	if s.M < MinParity || s.M > MaxParity {
		return fmt.Errorf("%w %s: M (parity chunks) must be %d..%d, not %d", ErrScheme, s, MinParity, MaxParity, s.M)
	}
	return nil
}

// String returns the scheme as Parse reads it: "K+M".
func (s Scheme) String() string { return strconv.Itoa(s.K) + "+" + strconv.Itoa(s.M) }

// Chunks returns the number of chunks of a stripe, K+M: the number of
// distinct nodes an object of this scheme needs.
func (s Scheme) Chunks() int { return s.K + s.M }
