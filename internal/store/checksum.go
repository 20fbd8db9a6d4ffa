package store

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"hash/fnv"
	"io"
	"sync"

	"github.com/herd-storage/herd/internal/invariants"
	"github.com/herd-storage/herd/internal/object"
)

// Data checksums.
//
// Every 4 KiB block of an object's data has a CRC32C (Castagnoli, computed
// by the CPU's crc32 instruction) in the copy's checksum table, written
// with every write and checked on every read: a block whose bytes do not
// match is never returned (ErrChecksum), and the caller reads another
// replica and repairs the block (Repair). The table lies in the object
// file between the header and the data (header.go): file offset
// headerSize, 4 bytes per block, tableSize bytes for MaxObjectSize; it is
// sparse like the data, so an object pays 4 bytes per 4 KiB it holds.
//
// A table entry is the block's CRC32C XOR the CRC32C of a zero block, so
// that a block never written (a hole: zeros) has entry 0, which is also
// what an unwritten part of the table reads as. Holes punched by Trim
// and WriteZeroes set their entries to 0 the same way.
//
// A write updates data and entries under the handle's writeMu, data first:
// a partial block (a write not 4 KiB aligned) is read, verified, merged
// and summed, so a bad block is never built on. A read that sees a
// mismatch looks once more holding writeMu (a write may be between its
// data and its entries) before it reports one.
//
// After a crash, unsynced data and its entries may have reached the disk
// in any combination. journal.go keeps, durably before the first unsynced
// write, the list of objects where that can happen; Open re-hashes them,
// so an unflushed block reads as whatever the disk kept, never as a
// checksum error, while a block that was flushed keeps its verified sum.
const (
	blockSize = 4096
	sumSize   = 4
	// tableSize holds a checksum for every block of MaxObjectSize.
	tableSize = MaxObjectSize / blockSize * sumSize
	// dataOffset is where a version 2 file's data starts.
	dataOffset = headerSize + tableSize
)

// zeroBlockSum is the CRC32C of a zero block: entries are XORed with it.
var zeroBlockSum = crc32.Checksum(make([]byte, blockSize), castagnoli)

// blockSum is a block's table entry.
func blockSum(block []byte) uint32 {
	return crc32.Checksum(block, castagnoli) ^ zeroBlockSum
}

// blockBuffers holds one block for partial-block reads and writes.
var blockBuffers = sync.Pool{New: func() any { return new([blockSize]byte) }}

// blockSpan is the range of blocks [first, end) that covers length bytes
// at offset (length > 0).
func blockSpan(offset uint64, length uint64) (first, end uint64) {
	return offset / blockSize, (offset + length + blockSize - 1) / blockSize
}

// readFile reads len(p) bytes of h's file at at: bytes beyond the end of
// the file read as zeros.
func (s *Store) readFile(h *handle, p []byte, at int64) error {
	n, err := h.file.ReadAt(p, at)
	if s.readFault != nil {
		if fault := s.readFault(h.path); fault != nil {
			n, err = 0, fault
		}
	}
	if err != nil && !errors.Is(err, io.EOF) {
		return objectError("read", h.oid, h.path, err)
	}
	clear(p[n:])
	return nil
}

// badBlocks returns the indexes (relative to data) of the blocks of data
// whose sums (one entry per block) do not match.
func badBlocks(data, sums []byte) []int {
	var bad []int
	for i := 0; i*blockSize < len(data); i++ {
		if blockSum(data[i*blockSize:(i+1)*blockSize]) != binary.LittleEndian.Uint32(sums[i*sumSize:]) {
			bad = append(bad, i)
		}
	}
	return bad
}

// checksumError reports bad blocks (indexes from block first on).
func (s *Store) checksumError(op string, h *handle, first uint64, bad []int) error {
	h.disk.checksumErrors.Add(uint64(len(bad)))
	offsets := make([]uint64, 0, min(len(bad), 4))
	for _, i := range bad[:min(len(bad), 4)] {
		offsets = append(offsets, (first+uint64(i))*blockSize)
	}
	s.logger.Warn("store: data checksum mismatch: blocks not returned; to be repaired from another replica",
		"oid", oidString(h.oid), "path", h.path, "blocks", len(bad), "first_offsets", offsets)
	return &ObjectError{Op: op, OID: h.oid, Path: h.path, Kind: ErrChecksum,
		Err: fmt.Errorf("%d blocks of 4 KiB fail their checksum, the first at object offset %d", len(bad), offsets[0])}
}

// readVerified fills p with the copy's bytes at offset, each block checked
// against its sum. The caller holds h.life.
func (s *Store) readVerified(h *handle, p []byte, offset uint32) error {
	if len(p) == 0 {
		return nil
	}
	first, end := blockSpan(uint64(offset), uint64(len(p)))
	count := end - first
	data := p
	aligned := offset%blockSize == 0 && len(p)%blockSize == 0
	if !aligned {
		data = make([]byte, count*blockSize)
	}
	var sumArray [16 * sumSize]byte
	sums := sumArray[:0]
	if count*sumSize <= uint64(len(sumArray)) {
		sums = sumArray[:count*sumSize]
	} else {
		sums = make([]byte, count*sumSize)
	}
	read := func() ([]int, error) {
		if err := s.readFile(h, data, h.dataStart+int64(first*blockSize)); err != nil {
			return nil, err
		}
		if err := s.readFile(h, sums, headerSize+int64(first*sumSize)); err != nil {
			return nil, err
		}
		return badBlocks(data, sums), nil
	}
	bad, err := read()
	if err != nil {
		return err
	}
	if bad != nil {
		// A write may be between its data and its sums: look again with
		// writes held off.
		h.writeMu.Lock()
		bad, err = read()
		h.writeMu.Unlock()
		if err != nil {
			return err
		}
		if bad != nil {
			return s.checksumError("read", h, first, bad)
		}
	}
	if !aligned {
		copy(p, data[uint64(offset)-first*blockSize:])
	}
	return nil
}

// readBlock reads block b of the copy with its sum and checks it. The
// caller holds h.writeMu.
func (s *Store) readBlock(op string, h *handle, b uint64, block []byte) error {
	var sum [sumSize]byte
	if err := s.readFile(h, block, h.dataStart+int64(b*blockSize)); err != nil {
		return err
	}
	if err := s.readFile(h, sum[:], headerSize+int64(b*sumSize)); err != nil {
		return err
	}
	if blockSum(block) != binary.LittleEndian.Uint32(sum[:]) {
		return s.checksumError(op, h, b, []int{0})
	}
	return nil
}

// sumsFor computes the table entries of blocks [first, end) as they will
// be once fill has put the new bytes of [offset, offset+length) in place:
// whole blocks are summed from fill, the partial ones at either end are
// read, checked, merged and summed. fill puts the new bytes into block and
// returns the block to sum: block itself, or for a whole block the new
// bytes where they already are (no copy). A partial block that fails its
// check fails the change: nothing has been written yet. The caller holds
// h.writeMu.
func (s *Store) sumsFor(op string, h *handle, offset, length uint64, fill func(block []byte, blockOffset uint64) []byte) ([]byte, error) {
	first, end := blockSpan(offset, length)
	sums := make([]byte, (end-first)*sumSize)
	buffer := blockBuffers.Get().(*[blockSize]byte)
	defer blockBuffers.Put(buffer)
	for b := first; b < end; b++ {
		start := b * blockSize
		block := buffer[:]
		if start < offset || start+blockSize > offset+length {
			if err := s.readBlock(op, h, b, block); err != nil {
				return nil, err
			}
		}
		binary.LittleEndian.PutUint32(sums[(b-first)*sumSize:], blockSum(fill(block, start)))
	}
	return sums, nil
}

// writeSums writes table entries for the blocks from first on.
func (s *Store) writeSums(op string, h *handle, first uint64, sums []byte) error {
	if _, err := h.file.WriteAt(sums, headerSize+int64(first*sumSize)); err != nil {
		return objectError(op, h.oid, h.path, fmt.Errorf("write checksums: %w", err))
	}
	return nil
}

// writeVerified writes p at offset with its checksums. The caller holds
// h.life and h.writeMu.
func (s *Store) writeVerified(h *handle, p []byte, offset uint32) error {
	start, length := uint64(offset), uint64(len(p))
	sums, err := s.sumsFor("write", h, start, length, func(block []byte, blockOffset uint64) []byte {
		lo, hi := max(blockOffset, start), min(blockOffset+blockSize, start+length)
		if hi-lo == blockSize {
			return p[lo-start : hi-start]
		}
		copy(block[lo-blockOffset:hi-blockOffset], p[lo-start:hi-start])
		return block
	})
	if err != nil {
		return err
	}
	if err := writeData(h.file, p, h.dataStart+int64(offset)); err != nil {
		return objectError("write", h.oid, h.path, err)
	}
	first, _ := blockSpan(start, length)
	if err := s.writeSums("write", h, first, sums); err != nil {
		return err
	}
	if invariants.Enabled {
		s.checkWritten(h, p, offset)
	}
	return nil
}

// checkWritten asserts (build tag invariants) that the blocks a write
// just wrote read back as written and verify against their sums. The
// caller holds h.writeMu; a read that fails (an injected disk error) is
// not the invariant's business.
func (s *Store) checkWritten(h *handle, p []byte, offset uint32) {
	first, end := blockSpan(uint64(offset), uint64(len(p)))
	data := make([]byte, (end-first)*blockSize)
	sums := make([]byte, (end-first)*sumSize)
	if s.readFile(h, data, h.dataStart+int64(first*blockSize)) != nil || s.readFile(h, sums, headerSize+int64(first*sumSize)) != nil {
		return
	}
	start := uint64(offset) - first*blockSize
	if bad := badBlocks(data, sums); bad != nil || !bytes.Equal(data[start:start+uint64(len(p))], p) {
		invariants.Fail("store: object %s: a write of %d bytes at %d does not read back as written with its checksums (bad blocks %v)", oidString(h.oid), len(p), offset, bad)
	}
}

// zeroVerified makes [offset, offset+length) zeros (a hole, or allocated
// with allocate) and sets its checksums. The caller holds h.life and
// h.writeMu.
func (s *Store) zeroVerified(op string, h *handle, offset, length uint32, allocate bool) error {
	start, size := uint64(offset), uint64(length)
	sums, err := s.sumsFor(op, h, start, size, func(block []byte, blockOffset uint64) []byte {
		lo, hi := max(blockOffset, start), min(blockOffset+blockSize, start+size)
		clear(block[lo-blockOffset : hi-blockOffset])
		return block
	})
	if err != nil {
		return err
	}
	if err := zeroRange(h.file, h.dataStart+int64(offset), int64(length), allocate); err != nil {
		return objectError(op, h.oid, h.path, err)
	}
	first, _ := blockSpan(start, size)
	return s.writeSums(op, h, first, sums)
}

// repairBlocks writes each whole block of p (at offset, block aligned)
// where the copy's block fails its checksum, and leaves good blocks
// alone. It returns how many blocks it rewrote. The caller holds h.life
// and h.writeMu.
func (s *Store) repairBlocks(h *handle, p []byte, offset uint32) (int, error) {
	if offset%blockSize != 0 || len(p)%blockSize != 0 {
		return 0, &ObjectError{Op: "repair", OID: h.oid, Kind: ErrInvalid,
			Err: fmt.Errorf("repair of %d bytes at %d: whole 4 KiB blocks only", len(p), offset)}
	}
	buffer := blockBuffers.Get().(*[blockSize]byte)
	defer blockBuffers.Put(buffer)
	repaired := 0
	for i := 0; i*blockSize < len(p); i++ {
		b := uint64(offset)/blockSize + uint64(i)
		var sum [sumSize]byte
		if err := s.readFile(h, buffer[:], h.dataStart+int64(b*blockSize)); err != nil {
			return repaired, err
		}
		if err := s.readFile(h, sum[:], headerSize+int64(b*sumSize)); err != nil {
			return repaired, err
		}
		if blockSum(buffer[:]) == binary.LittleEndian.Uint32(sum[:]) {
			continue
		}
		good := p[i*blockSize : (i+1)*blockSize]
		if _, err := h.file.WriteAt(good, h.dataStart+int64(b*blockSize)); err != nil {
			return repaired, objectError("repair", h.oid, h.path, err)
		}
		binary.LittleEndian.PutUint32(sum[:], blockSum(good))
		if err := s.writeSums("repair", h, b, sum[:]); err != nil {
			return repaired, err
		}
		repaired++
	}
	if repaired > 0 {
		h.disk.blocksRepaired.Add(uint64(repaired))
		s.logger.Info("store: repaired blocks that failed their checksum", "oid", oidString(h.oid), "path", h.path, "blocks", repaired)
	}
	return repaired, nil
}

// contentDigest fingerprints the content of h's copy of length bytes
// (Info.Digest): FNV-1a (64 bits) of its checksum table's entries for
// those bytes, without the trailing zero entries. An entry is a
// function of its block's bytes alone, 0 for a block of zeros as for a
// hole, so two copies whose bytes read the same have the same digest,
// however they were written and whatever their stamps or lengths (a copy
// installed by Replace is ObjectSize long, the one it came from may be
// shorter: the zeros beyond read the same). Copies that differ in a
// block differ in its entry unless the two versions of the block have the
// same CRC32C (a chance of 2^-32 for unrelated bytes; never when they
// differ in one burst of at most 32 bits), then in the digest but for
// a 64-bit hash collision. 0 for a copy written before checksums (no
// table): unknown. Read under writeMu, so a write is in the digest whole
// or not at all. The caller holds h.life.
func (s *Store) contentDigest(h *handle, length uint64) (uint64, error) {
	if h.legacy {
		return 0, nil
	}
	_, blocks := blockSpan(0, min(length, MaxObjectSize))
	table := make([]byte, blocks*sumSize)
	h.writeMu.Lock()
	err := s.readFile(h, table, headerSize)
	h.writeMu.Unlock()
	if err != nil {
		return 0, err
	}
	end := len(table)
	for end >= sumSize && binary.LittleEndian.Uint32(table[end-sumSize:end]) == 0 {
		end -= sumSize
	}
	digest := fnv.New64a()
	digest.Write(table[:end])
	if sum := digest.Sum64(); sum != 0 {
		return sum, nil
	}
	return 1, nil // 0 means unknown
}

// tableFor computes the checksum table of a whole copy's data.
func tableFor(data []byte) []byte {
	count := (len(data) + blockSize - 1) / blockSize
	table := make([]byte, count*sumSize)
	var last [blockSize]byte
	for i := 0; i < count; i++ {
		block := data[i*blockSize : min((i+1)*blockSize, len(data))]
		if len(block) < blockSize {
			copy(last[:], block)
			block = last[:]
		}
		binary.LittleEndian.PutUint32(table[i*sumSize:], blockSum(block))
	}
	return table
}

// Upgrade rewrites a copy written before checksums (format version 1) in
// the current format, with the checksums of its bytes as they are, keeping
// its stamp (through Replace: whole, at once). It returns true if it did;
// a current copy is left alone. The caller orders it against changes to
// the object (the replica's exclusive lock): a write racing with it could
// be lost with the old file.
func (s *Store) Upgrade(oid object.OID) (bool, error) {
	var data []byte
	var stamp object.Epoch
	legacy := false
	err := s.with("upgrade", 0, oid, accessExisting, func(h *handle) error {
		if !h.legacy {
			return nil
		}
		legacy = true
		info, err := handleInfo(h)
		if err != nil {
			return err
		}
		if info.LengthBytes > MaxObjectSize {
			return &ObjectError{Op: "upgrade", OID: oid, Path: h.path, Kind: ErrCorrupt, Err: fmt.Errorf("length %d beyond the maximum object size", info.LengthBytes)}
		}
		data = make([]byte, info.LengthBytes)
		stamp = h.stamp()
		return s.readFile(h, data, h.dataStart)
	})
	if err != nil || !legacy {
		return false, err
	}
	if err := s.Replace(stamp, oid, data); err != nil {
		return false, err
	}
	s.logger.Info("store: gave a copy written before data checksums its checksums", "oid", oidString(oid))
	return true, nil
}
