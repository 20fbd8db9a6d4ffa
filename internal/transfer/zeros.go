package transfer

import (
	"bytes"
	"context"
	"errors"
	"os"
	"sort"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/herd-storage/herd/internal/nbdclient"
)

// Zero maps: which byte ranges of a VDI or a file are known to read as
// zeroes, so that they are neither read nor sent.

// span is a byte range [start, end).
type span struct{ start, end uint64 }

// zeroMap lists the ranges known to read as zeroes, sorted and disjoint.
type zeroMap struct{ spans []span }

func (z *zeroMap) add(start, end uint64) {
	if start >= end {
		return
	}
	if last := len(z.spans) - 1; last >= 0 && z.spans[last].end == start {
		z.spans[last].end = end
		return
	}
	z.spans = append(z.spans, span{start, end})
}

// zeroMapOf builds the map of a block status answer from offset. Only
// NBD_STATE_ZERO counts: a hole without it has undefined contents (spec,
// "base:allocation").
func zeroMapOf(offset uint64, extents []nbdclient.Extent) zeroMap {
	var z zeroMap
	for _, extent := range extents {
		if extent.Zero {
			z.add(offset, offset+extent.Length)
		}
		offset += extent.Length
	}
	return z
}

// covers reports whether all of [offset, offset+length) reads as zeroes.
func (z zeroMap) covers(offset, length uint64) bool {
	i := sort.Search(len(z.spans), func(i int) bool { return z.spans[i].end > offset })
	return i < len(z.spans) && z.spans[i].start <= offset && z.spans[i].end >= offset+length
}

// gaps lists the parts of [from, to) not known to read as zeroes.
func (z zeroMap) gaps(from, to uint64) []span {
	var gaps []span
	position := from
	for i := sort.Search(len(z.spans), func(i int) bool { return z.spans[i].end > from }); position < to; i++ {
		if i >= len(z.spans) || z.spans[i].start >= to {
			gaps = append(gaps, span{position, to})
			break
		}
		if z.spans[i].start > position {
			gaps = append(gaps, span{position, z.spans[i].start})
		}
		position = max(position, z.spans[i].end)
	}
	return gaps
}

// zeroTail zeroes [from, to) where it does not already read as zeroes, so
// that after an import the VDI reads back as the image followed by zeroes,
// like a VDI created for it. It needs WRITE_ZEROES (herd always offers it):
// writing zeroes as data over a large tail would cost more than the import.
func zeroTail(ctx context.Context, conn *nbdclient.Conn, zeros zeroMap, from, to uint64) error {
	if from >= to || !conn.CanZero() {
		return nil
	}
	for _, gap := range zeros.gaps(from, to) {
		if err := conn.Zero(ctx, gap.start, gap.end-gap.start, 0); err != nil {
			return err
		}
	}
	return nil
}

// fileHoles maps the holes of a regular file with SEEK_DATA and SEEK_HOLE
// (lseek(2)), so that they are not even read. On file systems without them
// the map is empty and every chunk is read.
func fileHoles(f *os.File, fileSize uint64) zeroMap {
	var holes zeroMap
	for offset := uint64(0); offset < fileSize; {
		data, err := f.Seek(int64(offset), unix.SEEK_DATA)
		if errors.Is(err, syscall.ENXIO) {
			holes.add(offset, fileSize) // no data after offset
			break
		}
		if err != nil || data < int64(offset) {
			return zeroMap{}
		}
		holes.add(offset, min(uint64(data), fileSize))
		if uint64(data) >= fileSize {
			break
		}
		hole, err := f.Seek(data, unix.SEEK_HOLE)
		if err != nil || hole <= data {
			return zeroMap{}
		}
		offset = uint64(hole)
	}
	return holes
}

var zeroChunk = make([]byte, 32<<20) // read-only: compared against, written from

func allZero(p []byte) bool {
	for len(p) > 0 {
		n := min(len(p), len(zeroChunk))
		if !bytes.Equal(p[:n], zeroChunk[:n]) {
			return false
		}
		p = p[n:]
	}
	return true
}
