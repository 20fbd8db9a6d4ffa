package objproto

import (
	"bytes"
	"encoding/hex"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"strings"
	"testing"

	"github.com/herd-storage/herd/internal/object"
)

// TestObjectWireLayout pins the byte layout documented at the top of
// object.go: if this test changes, so must the table there.
func TestObjectWireLayout(t *testing.T) {
	var request [ObjectRequestHeaderSize]byte
	EncodeObjectRequest(&request, &ObjectRequest{
		Opcode: ObjectWrite, Flags: object.FlagCreate | object.FlagSync,
		Epoch: 0x0102030405060708, ID: 0x1112131415161718, OID: 0x2122232425262728,
		Offset: 0x31323334, Length: 0x41424344, Checksum: 0x51525354,
	})
	want := "4852" + "01" + "02" + "0003" + "0000" + "0102030405060708" + "1112131415161718" + "2122232425262728" + "31323334" + "41424344" + "51525354"
	if got := hex.EncodeToString(request[:44]); got != want {
		t.Errorf("request header\n got %s\nwant %s", got, want)
	}
	var response [ObjectResponseHeaderSize]byte
	EncodeObjectResponse(&response, &ObjectResponse{
		Status: ObjectStatusStaleEpoch, ID: 0x1112131415161718, Epoch: 0x0102030405060708,
		ObjectEpoch: 0x2122232425262728, Length: 0x41424344, Checksum: 0x51525354,
	})
	want = "4841" + "0002" + "00000000" + "1112131415161718" + "0102030405060708" + "2122232425262728" + "41424344" + "51525354"
	if got := hex.EncodeToString(response[:40]); got != want {
		t.Errorf("response header\n got %s\nwant %s", got, want)
	}
	// CRC32C check value (RFC 3720, B.4): 32 bytes of zeroes.
	if sum := ObjectChecksum(make([]byte, 32)); sum != 0x8a9136aa {
		t.Errorf("CRC32C of 32 zero bytes is 0x%08x, want 0x8a9136aa", sum)
	}
}

func randomObjectRequest(random *rand.Rand) ObjectRequest {
	return ObjectRequest{
		Opcode: ObjectOpcode(random.Uint32()), Flags: object.Flags(random.Uint32()), Epoch: object.Epoch(random.Uint64()),
		ID: random.Uint64(), OID: object.OID(random.Uint64()), Offset: random.Uint32(), Length: random.Uint32(),
		Checksum: random.Uint32(), reserved: uint16(random.Uint32()),
	}
}

func TestObjectHeadersRoundTrip(t *testing.T) {
	random := rand.New(rand.NewPCG(1, 2))
	for range 10000 {
		request := randomObjectRequest(random)
		var header [ObjectRequestHeaderSize]byte
		EncodeObjectRequest(&header, &request)
		decoded, err := DecodeObjectRequest(&header)
		if err != nil || decoded != request {
			t.Fatalf("request %+v decoded as %+v, %v", request, decoded, err)
		}

		response := ObjectResponse{
			Status: ObjectStatus(random.UintN(objectStatusCount + 3)), ID: random.Uint64(), Epoch: object.Epoch(random.Uint64()),
			ObjectEpoch: object.Epoch(random.Uint64()), Length: random.Uint32N(MaxObjectErrorMessage + 1), Checksum: random.Uint32(),
		}
		var responseHeader [ObjectResponseHeaderSize]byte
		EncodeObjectResponse(&responseHeader, &response)
		decodedResponse, err := DecodeObjectResponse(&responseHeader)
		if err != nil || decodedResponse != response {
			t.Fatalf("response %+v decoded as %+v, %v", response, decodedResponse, err)
		}
	}
}

func TestObjectDecodeRefusesUntrustedHeaders(t *testing.T) {
	var request [ObjectRequestHeaderSize]byte
	EncodeObjectRequest(&request, &ObjectRequest{Opcode: ObjectPing})
	for i := range ObjectRequestHeaderSize * 8 {
		damaged := request
		damaged[i/8] ^= 1 << (i % 8)
		if _, err := DecodeObjectRequest(&damaged); !errors.Is(err, ErrObjectProtocol) {
			t.Fatalf("request with bit %d flipped: %v, want ErrObjectProtocol", i, err)
		}
	}
	wrongVersion := request
	wrongVersion[2] = 9
	resealRequestHeader(wrongVersion[:])
	if _, err := DecodeObjectRequest(&wrongVersion); !errors.Is(err, ErrObjectProtocol) || !strings.Contains(err.Error(), "version 9") {
		t.Fatalf("request of version 9: %v", err)
	}
	var response [ObjectResponseHeaderSize]byte
	encodeResponse := func(r ObjectResponse) [ObjectResponseHeaderSize]byte {
		var h [ObjectResponseHeaderSize]byte
		EncodeObjectResponse(&h, &r)
		return h
	}
	response = encodeResponse(ObjectResponse{Status: ObjectStatusOK})
	for i := range ObjectResponseHeaderSize * 8 {
		damaged := response
		damaged[i/8] ^= 1 << (i % 8)
		if _, err := DecodeObjectResponse(&damaged); !errors.Is(err, ErrObjectProtocol) {
			t.Fatalf("response with bit %d flipped: %v, want ErrObjectProtocol", i, err)
		}
	}
	for _, test := range []struct {
		name     string
		response ObjectResponse
	}{
		{"payload over MaxPayload", ObjectResponse{Status: ObjectStatusOK, Length: MaxPayload + 1}},
		{"long error message", ObjectResponse{Status: ObjectStatusIO, Length: MaxObjectErrorMessage + 1}},
		{"reserved field", ObjectResponse{Status: ObjectStatusOK, reserved: 1}},
	} {
		header := encodeResponse(test.response)
		if _, err := DecodeObjectResponse(&header); !errors.Is(err, ErrObjectProtocol) {
			t.Errorf("%s: %v, want ErrObjectProtocol", test.name, err)
		}
	}
}

func TestObjectValidateRequest(t *testing.T) {
	for _, test := range []struct {
		request ObjectRequest
		want    ObjectStatus
	}{
		{ObjectRequest{Opcode: ObjectRead, Offset: MaxObjectSize - 1, Length: 1}, ObjectStatusOK},
		{ObjectRequest{Opcode: ObjectRead, Offset: MaxObjectSize - MaxPayload, Length: MaxPayload}, ObjectStatusOK},
		{ObjectRequest{Opcode: ObjectRead, Offset: MaxObjectSize, Length: 1}, ObjectStatusInvalid},
		{ObjectRequest{Opcode: ObjectRead, Offset: 0xFFFFFFFF, Length: 0xFFFFFFFF}, ObjectStatusTooLarge},
		{ObjectRequest{Opcode: ObjectRead, Length: MaxPayload + 1}, ObjectStatusTooLarge},
		{ObjectRequest{Opcode: ObjectWrite, Flags: object.FlagCreate | object.FlagSync, Length: 1, Checksum: 5}, ObjectStatusOK},
		{ObjectRequest{Opcode: ObjectWrite, Length: 0}, ObjectStatusInvalid},
		{ObjectRequest{Opcode: ObjectWriteZeroes, Flags: object.FlagNoHole | object.FlagCreate | object.FlagSync, Length: MaxObjectSize}, ObjectStatusOK},
		{ObjectRequest{Opcode: ObjectWriteZeroes, Offset: 1, Length: MaxObjectSize}, ObjectStatusInvalid},
		{ObjectRequest{Opcode: ObjectWriteZeroes, Length: 1, Checksum: 1}, ObjectStatusInvalid},
		{ObjectRequest{Opcode: ObjectTrim, Flags: object.FlagSync, Length: MaxObjectSize}, ObjectStatusOK},
		{ObjectRequest{Opcode: ObjectTrim, Flags: object.FlagNoHole, Length: 1}, ObjectStatusInvalid},
		{ObjectRequest{Opcode: ObjectRemove, Flags: object.FlagSync, OID: 1}, ObjectStatusOK},
		{ObjectRequest{Opcode: ObjectRemove, Offset: 1}, ObjectStatusInvalid},
		{ObjectRequest{Opcode: ObjectFlush}, ObjectStatusOK},
		{ObjectRequest{Opcode: ObjectFlush, Flags: object.FlagSync}, ObjectStatusInvalid},
		{ObjectRequest{Opcode: ObjectStat, OID: 3}, ObjectStatusOK},
		{ObjectRequest{Opcode: ObjectStat, Flags: object.FlagDigest, OID: 3}, ObjectStatusOK},
		{ObjectRequest{Opcode: ObjectStat, Flags: object.FlagAnyStamp, OID: 3}, ObjectStatusInvalid},
		{ObjectRequest{Opcode: ObjectRead, Flags: object.FlagDigest, Length: 1}, ObjectStatusInvalid},
		{ObjectRequest{Opcode: ObjectList, OID: 3, Offset: 0xFFFFFFFF, Length: MaxObjectListEntries}, ObjectStatusOK},
		{ObjectRequest{Opcode: ObjectPing, Epoch: 99}, ObjectStatusOK},
		{ObjectRequest{Opcode: ObjectPing, Length: 1}, ObjectStatusInvalid},
		{ObjectRequest{Opcode: ObjectRecover + 1}, ObjectStatusUnknownOpcode},
		{ObjectRequest{Opcode: 255}, ObjectStatusUnknownOpcode},
	} {
		status, message := ValidateObjectRequest(&test.request)
		if status != test.want || (status == ObjectStatusOK) != (message == "") {
			t.Errorf("%s %+v: %s %q, want %s", test.request.Opcode, test.request, status, message, test.want)
		}
	}
}

func TestObjectStatusErrors(t *testing.T) {
	for status := ObjectStatus(1); status < objectStatusCount; status++ {
		err := objectResponseError(&ObjectResponse{Status: status, Epoch: 12}, "node:7000", []byte("why"))
		if got := ObjectStatusOf(err); got != status {
			t.Errorf("%s -> %v -> %s", status, err, got)
		}
		if !strings.HasPrefix(err.Error(), "peer: ") || !strings.Contains(err.Error(), "why") || !strings.Contains(err.Error(), "node:7000") {
			t.Errorf("%s: message %q lacks prefix, address or reason", status, err)
		}
		response, body := ObjectErrorResponse(3, err)
		if response.Status != status || !strings.Contains(string(body), "why") {
			t.Errorf("ObjectErrorResponse(%v) = %+v %q", err, response, body)
		}
	}
	stale := objectResponseError(&ObjectResponse{Status: ObjectStatusStaleEpoch, Epoch: 12}, "node:7000", nil)
	var staleError *StaleEpochError
	if !errors.Is(stale, ErrStaleEpoch) || !errors.As(stale, &staleError) || staleError.Current != 12 {
		t.Errorf("STALE_EPOCH: %v", stale)
	}
	if response, _ := ObjectErrorResponse(3, &StaleEpochError{Current: 12}); response.Epoch != 12 || response.Status != ObjectStatusStaleEpoch {
		t.Errorf("ObjectErrorResponse of a StaleEpochError: %+v", response)
	}
	if err := objectResponseError(&ObjectResponse{Status: 500}, "node:7000", nil); !errors.Is(err, ErrObjectIO) {
		t.Errorf("unknown status: %v, want ErrObjectIO", err)
	}
	if status := ObjectStatusOf(errors.New("disk on fire")); status != ObjectStatusIO {
		t.Errorf("unknown error -> %s, want IO", status)
	}
	if long := objectErrorMessage(strings.Repeat("é", MaxObjectErrorMessage)); len(long) > MaxObjectErrorMessage || !strings.HasSuffix(long, "é") {
		t.Errorf("a long message is cut to %d bytes, or inside a rune", len(long))
	}
}

func TestObjectBodies(t *testing.T) {
	stat := ObjectStatEntry{Size: 1 << 40, Allocated: 12345}
	if decoded, err := DecodeObjectStat(AppendObjectStat(nil, stat)); err != nil || decoded != stat {
		t.Errorf("STAT body: %+v, %v", decoded, err)
	}
	if _, err := DecodeObjectStat(make([]byte, 15)); !errors.Is(err, ErrObjectProtocol) {
		t.Errorf("short STAT body: %v", err)
	}
	if digest, err := DecodeObjectDigest(AppendObjectDigest(nil, 0xfeedface12345678)); err != nil || digest != 0xfeedface12345678 {
		t.Errorf("STAT DIGEST body: %016x, %v", digest, err)
	}
	if digest, err := DecodeObjectDigest(nil); err != nil || digest != 0 {
		t.Errorf("empty STAT DIGEST body: %016x, %v; want 0 (unknown)", digest, err)
	}
	if _, err := DecodeObjectDigest(make([]byte, ObjectStatSize)); !errors.Is(err, ErrObjectProtocol) {
		t.Errorf("STAT DIGEST body of %d bytes: %v", ObjectStatSize, err)
	}
	// The body a STAT may have depends on its DIGEST flag, on both sides:
	// a plain STAT (all a herd before digests sends or accepts) is never
	// answered with a digest.
	for _, c := range []struct {
		flags object.Flags
		n     int
		ok    bool
	}{
		{0, 0, true}, {0, ObjectStatSize, true}, {0, ObjectDigestSize, false},
		{object.FlagDigest, 0, true}, {object.FlagDigest, ObjectDigestSize, true}, {object.FlagDigest, ObjectStatSize, false},
	} {
		request := ObjectRequest{Opcode: ObjectStat, Flags: c.flags, OID: 3}
		server := objectBodyProblem(&request, &ObjectResponse{}, make([]byte, c.n)) == ""
		client := objectResponseLengthProblem(&objectCall{opcode: ObjectStat, flags: c.flags}, c.n) == ""
		if server != c.ok || client != c.ok {
			t.Errorf("STAT (flags %s) answered with %d bytes: server accepts %v, client %v; want %v", c.flags, c.n, server, client, c.ok)
		}
	}
	entries := []ObjectListEntry{{1, 2}, {1 << 63, 4}}
	var body []byte
	for _, e := range entries {
		body = AppendObjectListEntry(body, e)
	}
	if decoded, err := DecodeObjectList(nil, body); err != nil || len(decoded) != 2 || decoded[1] != entries[1] {
		t.Errorf("LIST body: %+v, %v", decoded, err)
	}
	if _, err := DecodeObjectList(nil, body[:17]); !errors.Is(err, ErrObjectProtocol) {
		t.Errorf("ragged LIST body: %v", err)
	}
}

// TestGetObjectBufferLimit: buffers come from internal/bufpool (tested
// there) up to the protocol's MaxPayload, and no further.
func TestGetObjectBufferLimit(t *testing.T) {
	b := GetObjectBuffer(MaxPayload)
	if len(b.Bytes) != MaxPayload {
		t.Errorf("GetObjectBuffer(MaxPayload): len %d", len(b.Bytes))
	}
	b.Release()
	func() {
		defer func() {
			if recover() == nil {
				t.Error("a buffer over MaxPayload did not panic")
			}
		}()
		GetObjectBuffer(MaxPayload + 1)
	}()
}

// TestObjectVectors: a batch's bytes are the messages in order, small
// pieces copied into runs (also when the scratch buffer grows mid-batch),
// large payloads referenced in place.
func TestObjectVectors(t *testing.T) {
	random := rand.New(rand.NewPCG(3, 4))
	var v objectVectors
	for round := range 20 {
		v.reset()
		var want bytes.Buffer
		large := 0
		for range 1 + random.IntN(100) {
			header := make([]byte, 44)
			for i := range header {
				header[i] = byte(random.Uint32())
			}
			payload := make([]byte, []int{0, 10, objectCopyThreshold - 1, objectCopyThreshold, 5000}[random.IntN(5)])
			base := byte(random.Uint32())
			for i := range payload {
				payload[i] = base + byte(i)
			}
			if len(payload) >= objectCopyThreshold {
				large++
			}
			want.Write(header)
			want.Write(payload)
			v.add(header, payload)
		}
		v.endRun()
		got := bytes.Join(v.vectors, nil)
		if !bytes.Equal(got, want.Bytes()) || v.bytes != want.Len() {
			t.Fatalf("round %d: the batch's bytes differ from its messages", round)
		}
		if len(v.vectors) > 2*large+1 {
			t.Fatalf("round %d: %d vectors for %d large payloads: small pieces are not coalesced", round, len(v.vectors), large)
		}
	}
	// writeTo through a real (pipe) connection.
	v.reset()
	v.add([]byte("header"), bytes.Repeat([]byte("p"), 2000))
	v.add([]byte("next"), nil)
	client, server := net.Pipe()
	defer client.Close()
	defer server.Close()
	done := make(chan []byte)
	go func() {
		buffer := make([]byte, 2010)
		n, _ := io.ReadFull(server, buffer)
		done <- buffer[:n]
	}()
	if err := v.writeTo(client, objectWriteTimeout); err != nil {
		t.Fatal(err)
	}
	if got := <-done; string(got) != "header"+strings.Repeat("p", 2000)+"next" {
		t.Fatalf("wrote %q", got)
	}
}

// TestObjectFlagsGolden pins the wire encoding of each request flag: the
// headers below are the bytes a node wrote when the flags were still a
// type of this package (objproto.ObjectFlags), converted from the data
// path's object.Flags (then a struct of bools). Nodes of both kinds talk to
// each other during a rolling upgrade: these bytes never change.
func TestObjectFlagsGolden(t *testing.T) {
	for _, c := range []struct {
		name   string
		opcode ObjectOpcode
		flags  object.Flags
		want   string
	}{
		{"Sync", ObjectWrite, object.FlagSync, "4852010200010000010203040506070811121314151617182122232425262728000010000000200000000000f2bf86bb"},
		{"Create", ObjectWrite, object.FlagCreate, "485201020002000001020304050607081112131415161718212223242526272800001000000020000000000093bd8539"},
		{"NoHole", ObjectWrite, object.FlagNoHole, "485201020004000001020304050607081112131415161718212223242526272800001000000020000000000051b9823d"},
		{"Fresh", ObjectWrite, object.FlagFresh, "4852010200100000010203040506070811121314151617182122232425262728000010000000200000000000d6797dc7"},
		{"Repair", ObjectWrite, object.FlagRepair, "4852010200200000010203040506070811121314151617182122232425262728000010000000200000000000da3073c1"},
		{"all changes", ObjectWrite, object.ChangeFlags, "48520102003700000102030405060708111213141516171821222324252627280000100000002000000000003cf28fb9"},
		{"AnyStamp", ObjectRead, object.FlagAnyStamp, "48520101000800000102030405060708111213141516171821222324252627280000100000002000000000001f8ba225"},
		{"Digest", ObjectStat, object.FlagDigest, "48520107004000000102030405060708111213141516171821222324252627280000100000002000000000009734f01f"},
		{"none", ObjectWrite, 0, "4852010200000000010203040506070811121314151617182122232425262728000010000000200000000000d24187c5"},
	} {
		var header [ObjectRequestHeaderSize]byte
		request := ObjectRequest{Opcode: c.opcode, Flags: c.flags, Epoch: 0x0102030405060708, ID: 0x1112131415161718, OID: 0x2122232425262728, Offset: 0x1000, Length: 0x2000}
		EncodeObjectRequest(&header, &request)
		if got := hex.EncodeToString(header[:]); got != c.want {
			t.Errorf("%s: request header\n got %s\nwant %s", c.name, got, c.want)
		}
		decoded, err := DecodeObjectRequest(&header)
		if err != nil || decoded.Flags != c.flags {
			t.Errorf("%s: decoded flags %s (%v), want %s", c.name, decoded.Flags, err, c.flags)
		}
	}
}
