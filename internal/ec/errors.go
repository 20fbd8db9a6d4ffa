package ec

import "errors"

// Errors of the package. Each is wrapped with the offending input or the
// chunk it concerns, so test with errors.Is.
var (
	// ErrScheme: a scheme outside what herd supports (K 2..8, M 1..3), or
	// text that does not spell one ("K+M").
	ErrScheme = errors.New("ec: invalid scheme")
	// ErrGeometry: an object size the geometry cannot lay out.
	ErrGeometry = errors.New("ec: invalid geometry")
	// ErrRange: a byte range outside the object or the chunk.
	ErrRange = errors.New("ec: range out of bounds")
	// ErrChunks: a set of chunks of the wrong number or sizes for the
	// scheme, or a chunk index out of range.
	ErrChunks = errors.New("ec: invalid chunks")
	// ErrTooFewChunks: more than M chunks are missing, so the object
	// cannot be decoded: at least K chunks of a stripe are needed.
	ErrTooFewChunks = errors.New("ec: too few chunks to decode")
)
