package gateway

import (
	"context"
	"errors"
	"fmt"

	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/layout"
	"github.com/herd-storage/herd/internal/object"
)

// Blocks that fail their checksum (object.ErrChecksum).
//
// Every replica checks each 4 KiB block it reads against its checksum
// (internal/store) and never returns a bad one. The gateway then reads
// the piece from another replica; if every replica fails somewhere in the
// piece, it reads block by block, taking each block from a replica where
// it is good, so two damaged copies lose nothing as long as no block is
// bad on all of them. Afterwards each replica that failed gets the good
// blocks with the REPAIR flag: it rewrites only blocks that still fail
// there, so a repair with data read before a newer write never undoes it.
// A change (a write or zeroing of part of a block) that meets a bad block
// repairs it first and then goes on. A block bad on every replica is
// reported (logged with its VDI and offset, counted) and its reads fail
// with an I/O error; nothing rewrites it.

// checksumBlock is the granularity of data checksums (store.blockSize).
const checksumBlock = 4096

// blockRange widens [offset, offset+length) to whole checksum blocks.
func blockRange(offset uint32, length int) (start uint32, size int) {
	start = offset &^ (checksumBlock - 1)
	end := (uint64(offset) + uint64(length) + checksumBlock - 1) &^ (checksumBlock - 1)
	return start, int(end - uint64(start))
}

// ChecksumStats counts what the gateway saw of bad blocks.
type ChecksumStats struct {
	// Repairs counts repairs sent to a replica whose blocks failed.
	Repairs uint64
	// Lost counts pieces with a block bad on every replica.
	Lost uint64
}

// ChecksumStats returns the counts so far.
func (g *Gateway) ChecksumStats() ChecksumStats {
	return ChecksumStats{Repairs: g.heal.checksumRepairs.Load(), Lost: g.heal.checksumLost.Load()}
}

// healBlocks rewrites, on node, the blocks of oid over [offset,
// offset+length) that fail their checksum there, with the same blocks
// read from another replica of rv (whose read verifies them), or with
// good (already verified, whole blocks from start) when given.
func (h *healer) healBlocks(ctx context.Context, node cluster.Node, rv *layout.Epoch, oid object.OID, copies int, offset uint32, length int, good []byte) error {
	start, size := blockRange(offset, length)
	if good == nil {
		buffer := make([]byte, size)
		var last error = object.ErrChecksum
		for _, other := range rv.ReplicasOf(oid, copies) {
			if other.ID == node.ID {
				continue
			}
			if _, err := h.replicas.Read(ctx, other, rv.Number, oid, buffer, start); err != nil {
				last = err
				continue
			}
			good = buffer
			break
		}
		if good == nil {
			return fmt.Errorf("%w: no other replica has the blocks of object %016x at %d+%d good: %v", object.ErrChecksum, oid, start, size, last)
		}
	}
	if err := h.replicas.Write(ctx, node, rv.Number, oid, good, start, object.FlagRepair); err != nil {
		return err
	}
	h.checksumRepairs.Add(1)
	h.logger.Warn("gateway: repaired blocks that failed their checksum from another replica",
		"object", fmt.Sprintf("%016x", oid), "node", node.ID, "offset", start, "bytes", size)
	return nil
}

// changeHealing runs change on node; if it meets blocks that fail their
// checksum there, it repairs them from another replica and runs change
// once more.
func (h *healer) changeHealing(ctx context.Context, node cluster.Node, rv *layout.Epoch, oid object.OID, copies int, offset uint32, length int, change func() error) error {
	err := change()
	if !errors.Is(err, object.ErrChecksum) {
		return err
	}
	if err := h.healBlocks(ctx, node, rv, oid, copies, offset, length, nil); err != nil {
		return err
	}
	return change()
}

// readBlockwise fills p (oid's bytes at offset) block by block, each
// block from the first replica where it reads good. It is the read of a
// piece that failed its checksum somewhere on every replica. The
// replicas whose blocks failed are repaired. A block bad on all of them
// fails the read with object.ErrChecksum.
func (h *healer) readBlockwise(ctx context.Context, rv *layout.Epoch, oid object.OID, copies int, p []byte, offset uint32) error {
	start, size := blockRange(offset, len(p))
	whole := make([]byte, size)
	candidates := rv.ReplicasOf(oid, copies)
	bad := make(map[string]bool)
	for at := 0; at < size; at += checksumBlock {
		block := whole[at : at+checksumBlock]
		var last error
		good := false
		for _, node := range candidates {
			err := h.path.readFrom(ctx, node, rv, oid, block, start+uint32(at))
			if err == nil {
				good = true
				break
			}
			if errors.Is(err, object.ErrChecksum) {
				bad[node.ID] = true
			}
			last = err
		}
		if !good {
			if errors.Is(last, object.ErrChecksum) {
				h.checksumLost.Add(1)
				h.logger.Error("gateway: a block fails its checksum on every replica: its data is lost; reads of it fail",
					"vdi_id", object.VDI(oid), "object", fmt.Sprintf("%016x", oid), "object_offset", start+uint32(at), "replicas", len(candidates))
			}
			return &object.ReplicaError{Node: "every replica", OID: oid, Err: last}
		}
	}
	copy(p, whole[offset-start:])
	for _, node := range candidates {
		if bad[node.ID] {
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), roundTimeout)
				defer cancel()
				if err := h.healBlocks(ctx, node, rv, oid, copies, start, size, whole); err != nil {
					h.logger.Warn("gateway: repairing blocks that failed their checksum", "object", fmt.Sprintf("%016x", oid), "node", node.ID, "err", err)
				}
			}()
		}
	}
	return nil
}

// repairDamaged replaces a replica's damaged copy of oid, after another
// replica served the read: the bad copy is removed and the replica
// recovers the object from a proven current copy.
func (h *healer) repairDamaged(node cluster.Node, epoch object.Epoch, oid object.OID) {
	ctx, cancel := context.WithTimeout(context.Background(), roundTimeout)
	defer cancel()
	rv, err := h.layouts.Current()
	if err != nil || rv.Number != epoch {
		return // the next epoch's recovery sees the damage again
	}
	err = h.replicas.Remove(ctx, node, epoch, oid)
	if err == nil || errors.Is(err, object.ErrNotFound) {
		err = h.path.recoverOn(ctx, node, rv, oid)
	}
	if err != nil {
		h.logger.Warn("gateway: repairing a damaged copy failed", "object", fmt.Sprintf("%016x", oid), "node", node.ID, "err", err)
		return
	}
	h.logger.Info("gateway: repaired a damaged copy from another replica", "object", fmt.Sprintf("%016x", oid), "node", node.ID, "epoch", epoch)
}
