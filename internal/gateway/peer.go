package gateway

import (
	"context"
	"errors"
	"fmt"
	"sort"

	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/peer"
	"github.com/herd-storage/herd/internal/store"
)

// PeerReplicas reaches replicas: this node's through the local Replica
// (no network), every other node's through the peer object protocol.
type PeerReplicas struct {
	Self   string
	Local  *Replica
	Client *peer.ObjectClient
}

var _ Replicas = (*PeerReplicas)(nil)

func (p *PeerReplicas) do(ctx context.Context, node cluster.Node, request peer.ObjectRequest, payload, into []byte) (peer.ObjectResponse, []byte, error) {
	response, body, err := p.Client.Do(ctx, node.PeerAddr, &request, payload, into)
	return response, body, fromPeer(err)
}

// fromPeer translates the peer protocol's errors to the gateway's.
func fromPeer(err error) error {
	var stale *peer.StaleEpochError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &stale):
		return &StaleEpochError{Current: stale.Current}
	case errors.Is(err, peer.ErrObjectNotFound):
		return fmt.Errorf("%w: %v", ErrNotFound, err)
	case errors.Is(err, peer.ErrPeerUnavailable), errors.Is(err, peer.ErrShuttingDown), errors.Is(err, peer.ErrObjectClientClosed):
		return fmt.Errorf("%w: %v", ErrUnavailable, err)
	case errors.Is(err, peer.ErrNoSpace):
		return fmt.Errorf("%w: %v", ErrNoSpace, err)
	case errors.Is(err, peer.ErrNotRecovered):
		return fmt.Errorf("%w: %v", ErrNotRecovered, err)
	case errors.Is(err, peer.ErrNoCopy):
		return fmt.Errorf("%w: %v", ErrNoCopy, err)
	}
	return err
}

func writeFlags(flags WriteFlags) peer.ObjectFlags {
	var f peer.ObjectFlags
	if flags.Create {
		f |= peer.ObjectFlagCreate
	}
	if flags.Sync {
		f |= peer.ObjectFlagForceUnitAccess
	}
	if flags.NoHole {
		f |= peer.ObjectFlagNoHole
	}
	return f
}

// Read implements Replicas.
func (p *PeerReplicas) Read(ctx context.Context, node cluster.Node, epoch, oid uint64, buffer []byte, offset uint32) (uint64, error) {
	if node.ID == p.Self {
		return p.Local.Read(ctx, epoch, oid, buffer, offset)
	}
	return p.read(ctx, node, peer.ObjectRequest{Opcode: peer.ObjectRead, Epoch: epoch, OID: oid, Offset: offset, Length: uint32(len(buffer))}, buffer)
}

// read sends a READ to another node and checks the length of its answer.
func (p *PeerReplicas) read(ctx context.Context, node cluster.Node, request peer.ObjectRequest, buffer []byte) (uint64, error) {
	response, body, err := p.do(ctx, node, request, nil, buffer)
	if err != nil {
		return 0, err
	}
	if len(body) != len(buffer) {
		return 0, fmt.Errorf("%w: node %s returned %d bytes for a %d-byte read", ErrUnavailable, node.ID, len(body), len(buffer))
	}
	if &body[0] != &buffer[0] {
		copy(buffer, body)
	}
	return response.ObjectEpoch, nil
}

// Write implements Replicas.
func (p *PeerReplicas) Write(ctx context.Context, node cluster.Node, epoch, oid uint64, data []byte, offset uint32, flags WriteFlags) error {
	if node.ID == p.Self {
		return p.Local.Write(ctx, epoch, oid, data, offset, flags)
	}
	_, _, err := p.do(ctx, node, peer.ObjectRequest{Opcode: peer.ObjectWrite, Flags: writeFlags(flags), Epoch: epoch, OID: oid, Offset: offset, Length: uint32(len(data))}, data, nil)
	return err
}

// Zero implements Replicas.
func (p *PeerReplicas) Zero(ctx context.Context, node cluster.Node, epoch, oid uint64, offset, length uint32, flags WriteFlags) error {
	if node.ID == p.Self {
		return p.Local.Zero(ctx, epoch, oid, offset, length, flags)
	}
	opcode := peer.ObjectTrim
	if flags.NoHole {
		opcode = peer.ObjectWriteZeroes
	}
	f := writeFlags(flags) &^ peer.ObjectFlagCreate
	if opcode == peer.ObjectTrim {
		f &^= peer.ObjectFlagNoHole
	}
	_, _, err := p.do(ctx, node, peer.ObjectRequest{Opcode: opcode, Flags: f, Epoch: epoch, OID: oid, Offset: offset, Length: length}, nil, nil)
	return err
}

// Remove implements Replicas.
func (p *PeerReplicas) Remove(ctx context.Context, node cluster.Node, epoch, oid uint64) error {
	if node.ID == p.Self {
		return p.Local.Remove(ctx, epoch, oid)
	}
	_, _, err := p.do(ctx, node, peer.ObjectRequest{Opcode: peer.ObjectRemove, Epoch: epoch, OID: oid}, nil, nil)
	return err
}

// Flush implements Replicas.
func (p *PeerReplicas) Flush(ctx context.Context, node cluster.Node, epoch uint64) error {
	if node.ID == p.Self {
		return p.Local.Flush(ctx, epoch)
	}
	_, _, err := p.do(ctx, node, peer.ObjectRequest{Opcode: peer.ObjectFlush, Epoch: epoch}, nil, nil)
	return err
}

// Stat implements Replicas.
func (p *PeerReplicas) Stat(ctx context.Context, node cluster.Node, epoch, oid uint64) (uint64, error) {
	if node.ID == p.Self {
		return p.Local.Stat(ctx, epoch, oid)
	}
	response, _, err := p.do(ctx, node, peer.ObjectRequest{Opcode: peer.ObjectStat, Epoch: epoch, OID: oid}, nil, nil)
	return response.ObjectEpoch, err
}

// Fetch implements Replicas.
func (p *PeerReplicas) Fetch(ctx context.Context, node cluster.Node, epoch, oid uint64, buffer []byte) (uint64, error) {
	if node.ID == p.Self {
		return p.Local.Fetch(ctx, epoch, oid, buffer)
	}
	return p.read(ctx, node, peer.ObjectRequest{Opcode: peer.ObjectRead, Flags: peer.ObjectFlagAnyStamp, Epoch: epoch, OID: oid, Length: uint32(len(buffer))}, buffer)
}

// Recover implements Replicas.
func (p *PeerReplicas) Recover(ctx context.Context, node cluster.Node, epoch, oid uint64) error {
	if node.ID == p.Self {
		return p.Local.Recover(ctx, epoch, oid)
	}
	_, _, err := p.do(ctx, node, peer.ObjectRequest{Opcode: peer.ObjectRecover, Epoch: epoch, OID: oid}, nil, nil)
	return err
}

// List returns every object copy a node holds, with its epoch stamp.
func (p *PeerReplicas) List(ctx context.Context, node cluster.Node, epoch uint64) (map[uint64]uint64, error) {
	out := map[uint64]uint64{}
	if node.ID == p.Self {
		if err := p.Local.Check(ctx, epoch); err != nil {
			return nil, err
		}
		err := p.Local.List(func(oid, stamp uint64) error { out[oid] = stamp; return nil })
		return out, err
	}
	const page = 1 << 16
	for from := uint64(0); ; {
		_, body, err := p.do(ctx, node, peer.ObjectRequest{Opcode: peer.ObjectList, Epoch: epoch, OID: from, Length: page}, nil, nil)
		if err != nil {
			return nil, err
		}
		entries, err := peer.DecodeObjectList(nil, body)
		if err != nil {
			return nil, err
		}
		for _, e := range entries {
			out[e.OID] = e.Epoch
		}
		if len(entries) < page || entries[len(entries)-1].OID == ^uint64(0) {
			return out, nil
		}
		from = entries[len(entries)-1].OID + 1
	}
}

// ServeObject implements peer.ObjectHandler: other nodes' gateways reach
// this node's copies through it.
func (r *Replica) ServeObject(ctx context.Context, request *peer.ObjectRequest, payload []byte) (peer.ObjectResponse, []byte) {
	epoch := r.cluster.Epoch()
	fail := func(err error) (peer.ObjectResponse, []byte) { return peer.ObjectErrorResponse(epoch, toPeer(err)) }
	flags := WriteFlags{
		Create: request.Flags&peer.ObjectFlagCreate != 0,
		Sync:   request.Flags&peer.ObjectFlagForceUnitAccess != 0,
		NoHole: request.Flags&peer.ObjectFlagNoHole != 0,
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
		stamp, err := r.Stat(ctx, request.Epoch, request.OID)
		if err != nil {
			return fail(err)
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

// toPeer translates the replica side's errors to the protocol's.
func toPeer(err error) error {
	var stale *StaleEpochError
	switch {
	case errors.As(err, &stale):
		return &peer.StaleEpochError{Current: stale.Current}
	case errors.Is(err, ErrNotFound):
		return fmt.Errorf("%w: %v", peer.ErrObjectNotFound, err)
	case errors.Is(err, ErrUnavailable):
		return fmt.Errorf("%w: %v", peer.ErrShuttingDown, err)
	case errors.Is(err, ErrNoSpace):
		return fmt.Errorf("%w: %v", peer.ErrNoSpace, err)
	case errors.Is(err, ErrNotRecovered):
		return fmt.Errorf("%w: %v", peer.ErrNotRecovered, err)
	case errors.Is(err, store.ErrCorrupt):
		return fmt.Errorf("%w: %v", peer.ErrCorrupt, err)
	case errors.Is(err, ErrNoCopy):
		return fmt.Errorf("%w: %v", peer.ErrNoCopy, err)
	}
	return err
}
