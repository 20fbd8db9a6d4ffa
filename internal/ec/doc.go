// Package ec is the arithmetic of erasure-coded objects: a Reed-Solomon
// scheme of K data and M parity chunks (Scheme), where each byte of an
// object lives in those chunks (Geometry), the coding itself (Codec):
// parity from data, missing chunks from any K others, and the parity
// change a small write causes; and the layout of an erasure-coded
// object's replicated part (Layout: overlay, block entries, heads).
//
// The gateway's data path uses it (internal/gateway/ec.go;
// docs/ARCHITECTURE.md, "Erasure-coded VDIs"). It is a pure library: no I/O, no
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
