package replica

import (
	"context"
	"fmt"
	"sort"

	"github.com/herd-storage/herd/internal/object"
	"github.com/herd-storage/herd/internal/objproto"
)

// ServeObject implements objproto.ObjectHandler: other nodes' gateways reach
// this node's copies through it, RECOVER included.
func (s Served) ServeObject(ctx context.Context, request *objproto.ObjectRequest, payload []byte) (objproto.ObjectResponse, []byte) {
	if request.Opcode != objproto.ObjectRecover {
		return s.Replica.ServeObject(ctx, request, payload)
	}
	if err := s.Recover(ctx, request.Epoch, request.OID); err != nil {
		return objproto.ObjectErrorResponse(object.Epoch(s.cluster.Epoch()), err)
	}
	return objproto.ObjectResponse{Epoch: object.Epoch(s.cluster.Epoch())}, nil
}

// ServeObject implements objproto.ObjectHandler for everything but RECOVER
// (Served's).
func (r *Replica) ServeObject(ctx context.Context, request *objproto.ObjectRequest, payload []byte) (objproto.ObjectResponse, []byte) {
	epoch := object.Epoch(r.cluster.Epoch())
	fail := func(err error) (objproto.ObjectResponse, []byte) { return objproto.ObjectErrorResponse(epoch, err) }
	// The change flags only (the protocol's validation left no others
	// on a change).
	flags := request.Flags & object.ChangeFlags
	switch request.Opcode {
	case objproto.ObjectRead:
		buffer := objproto.GetObjectBuffer(int(request.Length))
		read := r.Read
		if request.Flags&object.FlagAnyStamp != 0 {
			read = r.readAny
		}
		stamp, err := read(ctx, request.Epoch, request.OID, buffer.Bytes, request.Offset)
		if err != nil {
			buffer.Release()
			return fail(err)
		}
		return objproto.ObjectResponse{Epoch: epoch, ObjectEpoch: stamp, Release: buffer}, buffer.Bytes
	case objproto.ObjectWrite:
		if err := r.Write(ctx, request.Epoch, request.OID, payload, request.Offset, flags); err != nil {
			return fail(err)
		}
	case objproto.ObjectWriteZeroes:
		flags |= object.FlagNoHole
		if err := r.Zero(ctx, request.Epoch, request.OID, request.Offset, request.Length, flags); err != nil {
			return fail(err)
		}
	case objproto.ObjectTrim:
		flags &^= object.FlagNoHole
		if err := r.Zero(ctx, request.Epoch, request.OID, request.Offset, request.Length, flags); err != nil {
			return fail(err)
		}
	case objproto.ObjectRemove:
		if err := r.Remove(ctx, request.Epoch, request.OID); err != nil {
			return fail(err)
		}
	case objproto.ObjectFlush:
		if err := r.Flush(ctx, request.Epoch); err != nil {
			return fail(err)
		}
	case objproto.ObjectStat:
		stamp, digest, err := r.Stat(ctx, request.Epoch, request.OID)
		if err != nil {
			return fail(err)
		}
		if request.Flags&object.FlagDigest != 0 {
			// Only when asked: a herd before digests takes any STAT
			// body but 16 bytes or none for a protocol error.
			return objproto.ObjectResponse{Epoch: epoch, ObjectEpoch: stamp}, objproto.AppendObjectDigest(nil, digest)
		}
		return objproto.ObjectResponse{Epoch: epoch, ObjectEpoch: stamp}, nil
	case objproto.ObjectList:
		if err := r.Check(ctx, request.Epoch); err != nil {
			return fail(err)
		}
		var entries []objproto.ObjectListEntry
		err := r.List(func(oid object.OID, stamp object.Epoch) error {
			if oid >= request.OID {
				entries = append(entries, objproto.ObjectListEntry{OID: oid, Epoch: stamp})
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
		body := make([]byte, 0, len(entries)*objproto.ObjectListEntrySize)
		for _, e := range entries {
			body = objproto.AppendObjectListEntry(body, e)
		}
		return objproto.ObjectResponse{Epoch: epoch}, body
	case objproto.ObjectRecover:
		// Served's, with the node's recovery.
		return fail(fmt.Errorf("%w: this node's replica side serves no RECOVER without its recovery", object.ErrUnavailable))
	case objproto.ObjectPing:
	default:
		return fail(fmt.Errorf("%w: opcode %v", objproto.ErrUnknownObjectOpcode, request.Opcode))
	}
	return objproto.ObjectResponse{Epoch: epoch}, nil
}
