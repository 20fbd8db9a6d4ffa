package replica

import (
	"context"
	"fmt"
	"sort"

	"github.com/herd-storage/herd/internal/object"
	"github.com/herd-storage/herd/internal/peer"
)

// ServeObject implements peer.ObjectHandler: other nodes' gateways reach
// this node's copies through it.
func (r *Replica) ServeObject(ctx context.Context, request *peer.ObjectRequest, payload []byte) (peer.ObjectResponse, []byte) {
	epoch := r.cluster.Epoch()
	fail := func(err error) (peer.ObjectResponse, []byte) { return peer.ObjectErrorResponse(epoch, err) }
	flags := object.Flags{
		Create: request.Flags&peer.ObjectFlagCreate != 0,
		Sync:   request.Flags&peer.ObjectFlagForceUnitAccess != 0,
		NoHole: request.Flags&peer.ObjectFlagNoHole != 0,
		Fresh:  request.Flags&peer.ObjectFlagFresh != 0,
		Repair: request.Flags&peer.ObjectFlagRepair != 0,
	}
	switch request.Opcode {
	case peer.ObjectRead:
		buffer := peer.GetObjectBuffer(int(request.Length))
		read := r.Read
		if request.Flags&peer.ObjectFlagAnyStamp != 0 {
			read = r.readAny
		}
		stamp, err := read(ctx, request.Epoch, request.OID, buffer.Bytes, request.Offset)
		if err != nil {
			buffer.Release()
			return fail(err)
		}
		return peer.ObjectResponse{Epoch: epoch, ObjectEpoch: stamp, Release: buffer}, buffer.Bytes
	case peer.ObjectWrite:
		if err := r.Write(ctx, request.Epoch, request.OID, payload, request.Offset, flags); err != nil {
			return fail(err)
		}
	case peer.ObjectWriteZeroes:
		flags.NoHole = true
		if err := r.Zero(ctx, request.Epoch, request.OID, request.Offset, request.Length, flags); err != nil {
			return fail(err)
		}
	case peer.ObjectTrim:
		flags.NoHole = false
		if err := r.Zero(ctx, request.Epoch, request.OID, request.Offset, request.Length, flags); err != nil {
			return fail(err)
		}
	case peer.ObjectRemove:
		if err := r.Remove(ctx, request.Epoch, request.OID); err != nil {
			return fail(err)
		}
	case peer.ObjectFlush:
		if err := r.Flush(ctx, request.Epoch); err != nil {
			return fail(err)
		}
	case peer.ObjectStat:
		stamp, digest, err := r.Stat(ctx, request.Epoch, request.OID)
		if err != nil {
			return fail(err)
		}
		if request.Flags&peer.ObjectFlagDigest != 0 {
			// Only when asked: a herd before digests takes any STAT
			// body but 16 bytes or none for a protocol error.
			return peer.ObjectResponse{Epoch: epoch, ObjectEpoch: stamp}, peer.AppendObjectDigest(nil, digest)
		}
		return peer.ObjectResponse{Epoch: epoch, ObjectEpoch: stamp}, nil
	case peer.ObjectList:
		if err := r.Check(ctx, request.Epoch); err != nil {
			return fail(err)
		}
		var entries []peer.ObjectListEntry
		err := r.List(func(oid, stamp uint64) error {
			if oid >= request.OID {
				entries = append(entries, peer.ObjectListEntry{OID: oid, Epoch: stamp})
			}
			return nil
		})
		if err != nil {
			return fail(err)
		}
		sort.Slice(entries, func(i, j int) bool { return entries[i].OID < entries[j].OID })
		if skip := int(request.Offset); skip < len(entries) {
			entries = entries[skip:]
		} else {
			entries = nil
		}
		entries = entries[:min(len(entries), int(request.Length))]
		body := make([]byte, 0, len(entries)*peer.ObjectListEntrySize)
		for _, e := range entries {
			body = peer.AppendObjectListEntry(body, e)
		}
		return peer.ObjectResponse{Epoch: epoch}, body
	case peer.ObjectRecover:
		if err := r.Recover(ctx, request.Epoch, request.OID); err != nil {
			return fail(err)
		}
	case peer.ObjectPing:
	default:
		return fail(fmt.Errorf("%w: opcode %v", peer.ErrUnknownObjectOpcode, request.Opcode))
	}
	return peer.ObjectResponse{Epoch: epoch}, nil
}
