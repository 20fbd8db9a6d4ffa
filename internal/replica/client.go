package replica

import (
	"context"
	"fmt"
	"time"

	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/metrics"
	"github.com/herd-storage/herd/internal/object"
	"github.com/herd-storage/herd/internal/objproto"
)

// Client reaches replicas: this node's through the local Replica
// (no network), every other node's through the peer object protocol.
type Client struct {
	Self  string
	Local *Replica
	Peer  *objproto.ObjectClient
	// Metrics, if set, times every request to another node.
	Metrics *metrics.Node
	// Digests, if set, says whether Stat may ask other nodes for their
	// copies' content digests: once the cluster's feature level is
	// cluster.LevelCopyDigests, at which no member runs a herd that
	// refuses STAT's DIGEST flag (object.FlagDigest). Without it, or
	// below that level, Stat reports another node's digest as 0
	// (unknown).
	Digests func() bool
	// LocalRecover, if set, recovers this node's own copies (Served's
	// Recover, with the node's recovery). Recovery's own client has
	// none: it is made before recovery, and never asks for RECOVER.
	LocalRecover func(ctx context.Context, epoch object.Epoch, oid object.OID) error
}

func (p *Client) do(ctx context.Context, node cluster.Node, request objproto.ObjectRequest, payload, into []byte) (objproto.ObjectResponse, []byte, error) {
	if p.Metrics != nil {
		started := time.Now()
		response, body, err := p.Peer.Do(ctx, node.PeerAddr, &request, payload, into)
		p.Metrics.Peer(node.ID, request.Opcode.String(), started, err)
		return response, body, err
	}
	// The protocol's errors are the data path's (internal/object): no
	// translation.
	return p.Peer.Do(ctx, node.PeerAddr, &request, payload, into)
}

// Read reads a piece of node's copy, proven current in epoch.
func (p *Client) Read(ctx context.Context, node cluster.Node, epoch object.Epoch, oid object.OID, buffer []byte, offset uint32) (object.Epoch, error) {
	if node.ID == p.Self {
		return p.Local.Read(ctx, epoch, oid, buffer, offset)
	}
	return p.read(ctx, node, objproto.ObjectRequest{Opcode: objproto.ObjectRead, Epoch: epoch, OID: oid, Offset: offset, Length: uint32(len(buffer))}, buffer)
}

// read sends a READ to another node and checks the length of its answer.
func (p *Client) read(ctx context.Context, node cluster.Node, request objproto.ObjectRequest, buffer []byte) (object.Epoch, error) {
	response, body, err := p.do(ctx, node, request, nil, buffer)
	if err != nil {
		return 0, err
	}
	if len(body) != len(buffer) {
		return 0, fmt.Errorf("%w: node %s returned %d bytes for a %d-byte read", object.ErrUnavailable, node.ID, len(body), len(buffer))
	}
	if &body[0] != &buffer[0] {
		copy(buffer, body)
	}
	return response.ObjectEpoch, nil
}

// Write on node's copy (see Replica).
func (p *Client) Write(ctx context.Context, node cluster.Node, epoch object.Epoch, oid object.OID, data []byte, offset uint32, flags object.Flags) error {
	if node.ID == p.Self {
		return p.Local.Write(ctx, epoch, oid, data, offset, flags)
	}
	_, _, err := p.do(ctx, node, objproto.ObjectRequest{Opcode: objproto.ObjectWrite, Flags: flags, Epoch: epoch, OID: oid, Offset: offset, Length: uint32(len(data))}, data, nil)
	return err
}

// StartWrite sends a write to another node's copy and returns what waits
// for its answer (Write's error), so that the caller can have one
// goroutine write to several replicas at once. For this node's own copy it
// returns nil: the caller writes that with Write. data must not change
// until the returned function has returned.
func (p *Client) StartWrite(ctx context.Context, node cluster.Node, epoch object.Epoch, oid object.OID, data *object.Payload, offset uint32, flags object.Flags) func() error {
	if node.ID == p.Self {
		return nil
	}
	request := objproto.ObjectRequest{Opcode: objproto.ObjectWrite, Flags: flags, Epoch: epoch, OID: oid, Offset: offset, Length: uint32(len(data.Data))}
	return p.start(ctx, node, &request, data.Data, data.Checksum())
}

// StartFlush sends a flush to another node and returns what waits for its
// answer (Flush's error); for this node it returns nil, as StartWrite does.
func (p *Client) StartFlush(ctx context.Context, node cluster.Node, epoch object.Epoch) func() error {
	if node.ID == p.Self {
		return nil
	}
	return p.start(ctx, node, &objproto.ObjectRequest{Opcode: objproto.ObjectFlush, Epoch: epoch}, nil, 0)
}

// start sends request (with payload and its checksum, for a WRITE) to node
// and returns what waits for the answer and records its latency.
func (p *Client) start(ctx context.Context, node cluster.Node, request *objproto.ObjectRequest, payload []byte, checksum uint32) func() error {
	var started time.Time
	if p.Metrics != nil {
		started = time.Now()
	}
	pending, err := p.Peer.StartChecksummed(ctx, node.PeerAddr, request, payload, checksum, nil)
	return func() error {
		if err == nil {
			_, _, err = pending.Wait(ctx)
		}
		if p.Metrics != nil {
			// Timed to the answer's arrival, not to this call, which
			// may come after the caller's own write.
			ended := time.Now()
			if err == nil && !pending.Answered().IsZero() {
				ended = pending.Answered()
			}
			p.Metrics.PeerDuration(node.ID, request.Opcode.String(), ended.Sub(started), err)
		}
		return err
	}
}

// Zero on node's copy (see Replica).
func (p *Client) Zero(ctx context.Context, node cluster.Node, epoch object.Epoch, oid object.OID, offset, length uint32, flags object.Flags) error {
	if node.ID == p.Self {
		return p.Local.Zero(ctx, epoch, oid, offset, length, flags)
	}
	opcode := objproto.ObjectTrim
	if flags.Has(object.FlagNoHole) {
		opcode = objproto.ObjectWriteZeroes
	}
	f := flags &^ (object.FlagCreate | object.FlagFresh)
	if opcode == objproto.ObjectTrim {
		f &^= object.FlagNoHole
	}
	_, _, err := p.do(ctx, node, objproto.ObjectRequest{Opcode: opcode, Flags: f, Epoch: epoch, OID: oid, Offset: offset, Length: length}, nil, nil)
	return err
}

// Remove on node's copy (see Replica).
func (p *Client) Remove(ctx context.Context, node cluster.Node, epoch object.Epoch, oid object.OID) error {
	if node.ID == p.Self {
		return p.Local.Remove(ctx, epoch, oid)
	}
	_, _, err := p.do(ctx, node, objproto.ObjectRequest{Opcode: objproto.ObjectRemove, Epoch: epoch, OID: oid}, nil, nil)
	return err
}

// Flush on node's copy (see Replica).
func (p *Client) Flush(ctx context.Context, node cluster.Node, epoch object.Epoch) error {
	if node.ID == p.Self {
		return p.Local.Flush(ctx, epoch)
	}
	_, _, err := p.do(ctx, node, objproto.ObjectRequest{Opcode: objproto.ObjectFlush, Epoch: epoch}, nil, nil)
	return err
}

// Stat on node's copy (see Replica): its stamp and, when Digests allows
// asking for it, its content digest (0: unknown).
func (p *Client) Stat(ctx context.Context, node cluster.Node, epoch object.Epoch, oid object.OID) (stamp object.Epoch, digest uint64, err error) {
	if node.ID == p.Self {
		return p.Local.Stat(ctx, epoch, oid)
	}
	request := objproto.ObjectRequest{Opcode: objproto.ObjectStat, Epoch: epoch, OID: oid}
	if p.Digests != nil && p.Digests() {
		request.Flags |= object.FlagDigest
	}
	response, body, err := p.do(ctx, node, request, nil, nil)
	if err != nil {
		return 0, 0, err
	}
	if request.Flags&object.FlagDigest != 0 {
		if digest, err = objproto.DecodeObjectDigest(body); err != nil {
			return 0, 0, err
		}
	}
	return response.ObjectEpoch, digest, nil
}

// Fetch on node's copy (see Replica).
func (p *Client) Fetch(ctx context.Context, node cluster.Node, epoch object.Epoch, oid object.OID, buffer []byte) (object.Epoch, error) {
	if node.ID == p.Self {
		return p.Local.Fetch(ctx, epoch, oid, buffer)
	}
	return p.read(ctx, node, objproto.ObjectRequest{Opcode: objproto.ObjectRead, Flags: object.FlagAnyStamp, Epoch: epoch, OID: oid, Length: uint32(len(buffer))}, buffer)
}

// FetchAt reads part of node's copy whatever its stamp (as Fetch does the
// whole), each block checked against its checksum there.
func (p *Client) FetchAt(ctx context.Context, node cluster.Node, epoch object.Epoch, oid object.OID, buffer []byte, offset uint32) (object.Epoch, error) {
	if node.ID == p.Self {
		return p.Local.FetchAt(ctx, epoch, oid, buffer, offset)
	}
	return p.read(ctx, node, objproto.ObjectRequest{Opcode: objproto.ObjectRead, Flags: object.FlagAnyStamp, Epoch: epoch, OID: oid, Offset: offset, Length: uint32(len(buffer))}, buffer)
}

// Recover on node's copy (see Served).
func (p *Client) Recover(ctx context.Context, node cluster.Node, epoch object.Epoch, oid object.OID) error {
	if node.ID == p.Self {
		if p.LocalRecover == nil {
			return fmt.Errorf("%w: this client does not recover this node's own copies", object.ErrUnavailable)
		}
		return p.LocalRecover(ctx, epoch, oid)
	}
	_, _, err := p.do(ctx, node, objproto.ObjectRequest{Opcode: objproto.ObjectRecover, Epoch: epoch, OID: oid}, nil, nil)
	return err
}

// List returns every object copy a node holds, with its epoch stamp.
func (p *Client) List(ctx context.Context, node cluster.Node, epoch object.Epoch) (map[object.OID]object.Epoch, error) {
	out := map[object.OID]object.Epoch{}
	if node.ID == p.Self {
		if err := p.Local.Check(ctx, epoch); err != nil {
			return nil, err
		}
		err := p.Local.List(func(oid object.OID, stamp object.Epoch) error { out[oid] = stamp; return nil })
		return out, err
	}
	const page = 1 << 16
	for from := object.OID(0); ; {
		_, body, err := p.do(ctx, node, objproto.ObjectRequest{Opcode: objproto.ObjectList, Epoch: epoch, OID: from, Length: page}, nil, nil)
		if err != nil {
			return nil, err
		}
		entries, err := objproto.DecodeObjectList(nil, body)
		if err != nil {
			return nil, err
		}
		for _, e := range entries {
			out[e.OID] = e.Epoch
		}
		if len(entries) < page || entries[len(entries)-1].OID == ^object.OID(0) {
			return out, nil
		}
		from = entries[len(entries)-1].OID + 1
	}
}
