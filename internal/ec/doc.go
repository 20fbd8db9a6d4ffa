// Package ec is the arithmetic of erasure-coded objects: a Reed-Solomon
// scheme of K data and M parity chunks (Scheme), where each byte of an
// object lives in those chunks (Geometry), and the coding itself (Codec):
// parity from data, missing chunks from any K others, and the parity
// change a small write causes.
//
// Nothing uses it yet: it is the groundwork for erasure-coded VDIs,
// designed in docs/EC-DESIGN.md. It is a pure library: no I/O, no
// clock, no dependency inside herd, so that the gateway, recovery and
// scrub can all share it and its tests can be exhaustive.
//
// The Galois field arithmetic is github.com/klauspost/reedsolomon's, in
// its default configuration (a systematic Vandermonde matrix over
// GF(2^8)). That matrix decides the parity bytes written to disk, so it
// is part of the on-disk format: codec_test.go pins the parity of every
// scheme, and a library upgrade or option that changes it fails there
// rather than make existing parity decode to garbage.
package ec
