package replica

import (
	"bytes"
	"context"
	"testing"

	"github.com/herd-storage/herd/internal/object"
	"github.com/herd-storage/herd/internal/objproto"
)

// TestStatDigestOnlyWhenAsked: STAT answers the copy's content digest
// only to a request with the DIGEST flag; a plain STAT, the only kind a
// herd before digests sends, gets the body it always got (none), since
// such a herd takes any other body for a protocol error.
func TestStatDigestOnlyWhenAsked(t *testing.T) {
	c := newEpochs(5)
	r, s := newTestReplica(t, c)
	ctx := context.Background()
	const oid = 0x0000000100000007
	if err := r.Write(ctx, 5, oid, bytes.Repeat([]byte{0x5a}, 8192), 0, object.FlagCreate); err != nil {
		t.Fatal(err)
	}
	info, err := s.Stat(oid)
	if err != nil || info.Digest == 0 {
		t.Fatalf("store Stat: %+v, %v; want a digest", info, err)
	}
	if stamp, digest, err := r.Stat(ctx, 5, oid); err != nil || stamp != 5 || digest != info.Digest {
		t.Fatalf("Replica.Stat: stamp %d digest %016x, %v; want 5 and %016x", stamp, digest, err, info.Digest)
	}

	response, body := r.ServeObject(ctx, &objproto.ObjectRequest{Opcode: objproto.ObjectStat, Epoch: 5, OID: oid}, nil)
	if response.Status != objproto.ObjectStatusOK || response.ObjectEpoch != 5 || len(body) != 0 {
		t.Fatalf("plain STAT: %+v, %d-byte body; want OK, stamp 5, no body", response, len(body))
	}
	request := &objproto.ObjectRequest{Opcode: objproto.ObjectStat, Flags: object.FlagDigest, Epoch: 5, OID: oid}
	if status, message := objproto.ValidateObjectRequest(request); status != objproto.ObjectStatusOK {
		t.Fatalf("STAT with DIGEST refused: %s %s", status, message)
	}
	response, body = r.ServeObject(ctx, request, nil)
	digest, err := objproto.DecodeObjectDigest(body)
	if response.Status != objproto.ObjectStatusOK || response.ObjectEpoch != 5 || err != nil || digest != info.Digest {
		t.Fatalf("STAT with DIGEST: %+v, digest %016x (%v); want OK, stamp 5, %016x", response, digest, err, info.Digest)
	}
}
