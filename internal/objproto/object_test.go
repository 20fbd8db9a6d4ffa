package objproto

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"github.com/herd-storage/herd/internal/peer"
	"github.com/herd-storage/herd/internal/peer/peertest"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/bufpool"
	"github.com/herd-storage/herd/internal/object"
)

const testEpoch = 7

// TestObjectRoundTripEveryOpcode drives every opcode through real loopback
// TCP, an authenticated peer port, the server and the client, against the
// in-memory store.
func TestObjectRoundTripEveryOpcode(t *testing.T) {
	checkObjectLeaks(t)
	store := newMemoryObjectStore(testEpoch)
	node := startObjectNode(t, store, nil)
	client := newTestObjectClient(t, node)
	ctx := t.Context()
	do := func(request ObjectRequest, payload, into []byte) (ObjectResponse, []byte, error) {
		request.Epoch = testEpoch
		return client.Do(ctx, node.address, &request, payload, into)
	}

	// PING answers with the node's epoch, whatever the request's.
	response, _, err := client.Do(ctx, node.address, &ObjectRequest{Opcode: ObjectPing, Epoch: 1}, nil, nil)
	if err != nil || response.Epoch != testEpoch {
		t.Fatalf("PING: %+v, %v; want epoch %d", response, err, testEpoch)
	}

	// WRITE without CREATE to a missing object.
	data := pattern(42, 4096, 8192)
	if _, _, err := do(ObjectRequest{Opcode: ObjectWrite, OID: 42, Offset: 4096}, data, nil); !errors.Is(err, ErrObjectNotFound) {
		t.Fatalf("WRITE without CREATE: %v, want ErrObjectNotFound", err)
	}
	response, body, err := do(ObjectRequest{Opcode: ObjectWrite, Flags: object.FlagCreate | object.FlagSync, OID: 42, Offset: 4096}, data, nil)
	if err != nil || response.Status != ObjectStatusOK || response.ObjectEpoch != testEpoch || body != nil {
		t.Fatalf("WRITE: %+v, %d bytes, %v", response, len(body), err)
	}

	// READ into a caller's buffer: the body is that buffer.
	into := make([]byte, 0, 16384)
	response, body, err = do(ObjectRequest{Opcode: ObjectRead, OID: 42, Offset: 0, Length: 12288}, nil, into)
	if err != nil {
		t.Fatalf("READ: %v", err)
	}
	want := append(make([]byte, 4096), data...)
	if !bytes.Equal(body, want) || &body[0] != &into[:1][0] || response.ObjectEpoch != testEpoch {
		t.Fatalf("READ returned %d bytes (in the caller's buffer: %v), epoch %d", len(body), &body[0] == &into[:1][0], response.ObjectEpoch)
	}
	// READ without a buffer allocates one.
	if _, body, err = do(ObjectRequest{Opcode: ObjectRead, OID: 42, Offset: 8192, Length: 4096}, nil, nil); err != nil || !bytes.Equal(body, data[4096:]) {
		t.Fatalf("READ without buffer: %v", err)
	}
	if _, _, err = do(ObjectRequest{Opcode: ObjectRead, OID: 43, Length: 1}, nil, nil); !errors.Is(err, ErrObjectNotFound) || !strings.Contains(err.Error(), node.address) {
		t.Fatalf("READ of a missing object: %v, want ErrObjectNotFound naming %s", err, node.address)
	}

	// WRITE_ZEROES and TRIM: the ranges read as zeroes.
	if _, _, err = do(ObjectRequest{Opcode: ObjectWriteZeroes, Flags: object.FlagNoHole, OID: 42, Offset: 4096, Length: 100}, nil, nil); err != nil {
		t.Fatalf("WRITE_ZEROES: %v", err)
	}
	if _, _, err = do(ObjectRequest{Opcode: ObjectTrim, OID: 42, Offset: 8192, Length: 4096}, nil, nil); err != nil {
		t.Fatalf("TRIM: %v", err)
	}
	want = make([]byte, 12288)
	copy(want[4196:8192], data[100:4096])
	if _, body, err = do(ObjectRequest{Opcode: ObjectRead, OID: 42, Length: 12288}, nil, nil); err != nil || !bytes.Equal(body, want) {
		t.Fatalf("READ after WRITE_ZEROES and TRIM: %v, equal %v", err, bytes.Equal(body, want))
	}

	// STAT.
	response, body, err = do(ObjectRequest{Opcode: ObjectStat, OID: 42}, nil, nil)
	if err != nil {
		t.Fatalf("STAT: %v", err)
	}
	stat, err := DecodeObjectStat(body)
	if err != nil || stat.Size != 12288 || response.ObjectEpoch != testEpoch {
		t.Fatalf("STAT: %+v, epoch %d, %v", stat, response.ObjectEpoch, err)
	}

	// FLUSH.
	if _, _, err = do(ObjectRequest{Opcode: ObjectFlush}, nil, nil); err != nil {
		t.Fatalf("FLUSH: %v", err)
	}
	store.mu.Lock()
	flushes := store.flushes
	store.mu.Unlock()
	if flushes != 1 {
		t.Fatalf("the store saw %d flushes, want 1", flushes)
	}

	// LIST, paged by OID and by cursor index.
	for _, id := range []object.OID{7, 3, 100, 55} {
		if _, _, err = do(ObjectRequest{Opcode: ObjectWrite, Flags: object.FlagCreate, OID: id}, []byte{1}, nil); err != nil {
			t.Fatal(err)
		}
	}
	var listed []ObjectListEntry
	for next := object.OID(0); ; {
		_, body, err = do(ObjectRequest{Opcode: ObjectList, OID: next, Length: 2}, nil, nil)
		if err != nil {
			t.Fatalf("LIST: %v", err)
		}
		page, err := DecodeObjectList(nil, body)
		if err != nil {
			t.Fatal(err)
		}
		listed = append(listed, page...)
		if len(page) < 2 {
			break
		}
		next = page[len(page)-1].OID + 1
	}
	if fmt.Sprint(listed) != "[{3 7} {7 7} {42 7} {55 7} {100 7}]" {
		t.Fatalf("LIST by OID: %v", listed)
	}
	_, body, err = do(ObjectRequest{Opcode: ObjectList, Offset: 3, Length: 10}, nil, nil)
	if page, _ := DecodeObjectList(nil, body); err != nil || fmt.Sprint(page) != "[{55 7} {100 7}]" {
		t.Fatalf("LIST from cursor 3: %v, %v", page, err)
	}

	// REMOVE.
	if _, _, err = do(ObjectRequest{Opcode: ObjectRemove, OID: 42}, nil, nil); err != nil {
		t.Fatalf("REMOVE: %v", err)
	}
	if _, _, err = do(ObjectRequest{Opcode: ObjectStat, OID: 42}, nil, nil); !errors.Is(err, ErrObjectNotFound) {
		t.Fatalf("STAT after REMOVE: %v", err)
	}
	if _, _, err = do(ObjectRequest{Opcode: ObjectRemove, OID: 42}, nil, nil); !errors.Is(err, ErrObjectNotFound) {
		t.Fatalf("second REMOVE: %v", err)
	}

	// A maximal READ and WRITE.
	big := pattern(9, 0, MaxPayload)
	if _, _, err = do(ObjectRequest{Opcode: ObjectWrite, Flags: object.FlagCreate, OID: 9, Offset: MaxObjectSize - MaxPayload}, big, nil); err != nil {
		t.Fatalf("WRITE of MaxPayload at the end of the object: %v", err)
	}
	buffer := GetObjectBuffer(MaxPayload)
	defer buffer.Release()
	if _, body, err = do(ObjectRequest{Opcode: ObjectRead, OID: 9, Offset: MaxObjectSize - MaxPayload, Length: MaxPayload}, nil, buffer.Bytes); err != nil || !bytes.Equal(body, big) {
		t.Fatalf("READ of MaxPayload: %v", err)
	}
}

// TestObjectClientValidatesLocally: requests the server would refuse are
// refused without a round trip, with the same errors.
func TestObjectClientValidatesLocally(t *testing.T) {
	checkObjectLeaks(t)
	client := NewObjectClient(peertest.Credentials(t, "unused"))
	defer client.Close()
	// No node listens at this address: reaching it would fail differently.
	const nowhere = "127.0.0.1:1"
	for _, test := range []struct {
		request ObjectRequest
		payload []byte
		want    error
	}{
		{ObjectRequest{Opcode: 99}, nil, ErrUnknownObjectOpcode},
		{ObjectRequest{Opcode: ObjectRead, Length: MaxPayload + 1}, nil, ErrObjectTooLarge},
		{ObjectRequest{Opcode: ObjectRead, Offset: MaxObjectSize - 1, Length: 2}, nil, ErrObjectInvalid},
		{ObjectRequest{Opcode: ObjectRead, Length: 0}, nil, ErrObjectInvalid},
		{ObjectRequest{Opcode: ObjectRead, Length: 1, Flags: object.FlagCreate}, nil, ErrObjectInvalid},
		{ObjectRequest{Opcode: ObjectWrite}, make([]byte, MaxPayload+1), ErrObjectTooLarge},
		{ObjectRequest{Opcode: ObjectWrite, Flags: object.FlagNoHole}, []byte{1}, ErrObjectInvalid},
		{ObjectRequest{Opcode: ObjectStat, Length: 1}, nil, ErrObjectInvalid},
		{ObjectRequest{Opcode: ObjectFlush, OID: 1}, nil, ErrObjectInvalid},
		{ObjectRequest{Opcode: ObjectList}, nil, ErrObjectInvalid},
		{ObjectRequest{Opcode: ObjectPing}, []byte{1}, ErrObjectInvalid},
	} {
		if _, _, err := client.Do(t.Context(), nowhere, &test.request, test.payload, nil); !errors.Is(err, test.want) {
			t.Errorf("%s %+v: %v, want %v", test.request.Opcode, test.request, err, test.want)
		}
	}
}

// outOfOrderHandler holds requests until count of them are in flight at
// once, then lets them finish in the reverse order of their arrival.
type outOfOrderHandler struct {
	count int

	mu       sync.Mutex
	arrivals []chan struct{}
}

func (h *outOfOrderHandler) ServeObject(ctx context.Context, request *ObjectRequest, payload []byte) (ObjectResponse, []byte) {
	release := make(chan struct{})
	h.mu.Lock()
	h.arrivals = append(h.arrivals, release)
	if len(h.arrivals) == h.count {
		arrivals := h.arrivals
		h.arrivals = nil
		go func() {
			for i := len(arrivals) - 1; i >= 0; i-- {
				close(arrivals[i])
				time.Sleep(50 * time.Microsecond) // spread completions so the order shows
			}
		}()
	}
	h.mu.Unlock()
	select {
	case <-release:
	case <-ctx.Done():
		return ObjectErrorResponse(0, ctx.Err())
	}
	switch request.Opcode {
	case ObjectRead:
		return ObjectResponse{Status: ObjectStatusOK, Epoch: request.Epoch, ObjectEpoch: object.Epoch(request.OID)}, pattern(request.OID, request.Offset, int(request.Length))
	case ObjectWrite:
		if !bytes.Equal(payload, pattern(request.OID, request.Offset, len(payload))) {
			return ObjectErrorResponse(request.Epoch, fmt.Errorf("%w: payload of object %d is not its pattern", ErrCorrupt, request.OID))
		}
		return ObjectResponse{Status: ObjectStatusOK, Epoch: request.Epoch, ObjectEpoch: object.Epoch(request.OID)}, nil
	}
	return ObjectErrorResponse(request.Epoch, ErrObjectInvalid)
}

// TestObjectPipelining: hundreds of calls on one connection are all in the
// handler at once (nothing serialises them), finish in reverse order, and
// each gets its own answer.
func TestObjectPipelining(t *testing.T) {
	checkObjectLeaks(t)
	const calls = 300
	handler := &outOfOrderHandler{count: calls}
	node := startObjectNode(t, handler, func(s *ObjectServer) { s.MaxInFlight = calls })
	client := newTestObjectClient(t, node, WithConnectionsPerAddress(1))

	var wait sync.WaitGroup
	errs := make(chan error, calls)
	for i := range calls {
		wait.Add(1)
		go func() {
			defer wait.Done()
			oid := uint64(1000 + i)
			offset := uint32(i * 512)
			length := 512 + i*97
			var response ObjectResponse
			var err error
			if i%2 == 0 {
				var body []byte
				response, body, err = client.Do(t.Context(), node.address, &ObjectRequest{Opcode: ObjectRead, OID: object.OID(oid), Offset: offset, Length: uint32(length)}, nil, make([]byte, 0, length))
				if err == nil && !bytes.Equal(body, pattern(object.OID(oid), offset, length)) {
					err = fmt.Errorf("READ of object %d got another call's data", oid)
				}
			} else {
				response, _, err = client.Do(t.Context(), node.address, &ObjectRequest{Opcode: ObjectWrite, OID: object.OID(oid), Offset: offset}, pattern(object.OID(oid), offset, length), nil)
			}
			if err == nil && uint64(response.ObjectEpoch) != oid {
				err = fmt.Errorf("call for object %d got the answer for %d", oid, response.ObjectEpoch)
			}
			errs <- err
		}()
	}
	wait.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	if n := node.listener.acceptedCount(); n != 1 {
		t.Errorf("%d connections, want 1", n)
	}
}

// TestObjectConnectionsRoundRobin: calls spread over the configured number
// of connections.
func TestObjectConnectionsRoundRobin(t *testing.T) {
	checkObjectLeaks(t)
	node := startObjectNode(t, newMemoryObjectStore(testEpoch), nil)
	client := newTestObjectClient(t, node, WithConnectionsPerAddress(3))
	for range 9 {
		if _, _, err := client.Do(t.Context(), node.address, &ObjectRequest{Opcode: ObjectPing}, nil, nil); err != nil {
			t.Fatal(err)
		}
	}
	if n := node.listener.acceptedCount(); n != 3 {
		t.Fatalf("%d connections, want 3", n)
	}
}

// TestObjectStaleEpoch: a request from another epoch is refused with the
// responder's epoch.
func TestObjectStaleEpoch(t *testing.T) {
	checkObjectLeaks(t)
	store := newMemoryObjectStore(testEpoch)
	node := startObjectNode(t, store, nil)
	client := newTestObjectClient(t, node)
	response, _, err := client.Do(t.Context(), node.address, &ObjectRequest{Opcode: ObjectWrite, Flags: object.FlagCreate, Epoch: testEpoch - 1, OID: 1}, []byte("old"), nil)
	var stale *StaleEpochError
	if !errors.Is(err, ErrStaleEpoch) || !errors.As(err, &stale) || stale.Current != testEpoch || response.Epoch != testEpoch || stale.Address != node.address {
		t.Fatalf("WRITE from epoch %d: %+v, %v; want a StaleEpochError at %d", testEpoch-1, response, err, testEpoch)
	}
	if !strings.Contains(err.Error(), "request from another epoch") {
		t.Errorf("the handler's message is lost: %v", err)
	}
	store.setEpoch(testEpoch + 1)
	if _, _, err = client.Do(t.Context(), node.address, &ObjectRequest{Opcode: ObjectStat, Epoch: testEpoch, OID: 1}, nil, nil); !errors.As(err, &stale) || stale.Current != testEpoch+1 {
		t.Fatalf("STAT after the epoch moved on: %v", err)
	}
}

// TestObjectPayloadChecksumMismatch: a WRITE whose payload does not match
// its CRC is answered INVALID and not applied; the connection goes on.
func TestObjectPayloadChecksumMismatch(t *testing.T) {
	checkObjectLeaks(t)
	store := newMemoryObjectStore(testEpoch)
	node := startObjectNode(t, store, nil)
	conn := rawObjectConnection(t, node)
	payload := []byte("data that will be damaged")
	request := ObjectRequest{Opcode: ObjectWrite, Flags: object.FlagCreate, Epoch: testEpoch, ID: 1, OID: 5, Length: uint32(len(payload)), Checksum: ObjectChecksum(payload)}
	damaged := bytes.Clone(payload)
	damaged[3] ^= 0x10
	writeRawRequest(t, conn, request, damaged)
	response, message, err := readRawResponse(conn)
	if err != nil || response.Status != ObjectStatusInvalid || response.ID != 1 || !strings.Contains(string(message), "CRC") {
		t.Fatalf("damaged WRITE: %+v %q %v; want INVALID", response, message, err)
	}
	writeRawRequest(t, conn, ObjectRequest{Opcode: ObjectStat, Epoch: testEpoch, ID: 2, OID: 5}, nil)
	if response, _, err = readRawResponse(conn); err != nil || response.Status != ObjectStatusNotFound || response.ID != 2 {
		t.Fatalf("STAT after a damaged WRITE: %+v %v; want NOT_FOUND (nothing applied)", response, err)
	}
}

// TestObjectServerGarbage: what no herd node sends is handled without a
// crash or a leak: framing errors close the connection with a logged
// reason, other errors are answered and the connection goes on.
func TestObjectServerGarbage(t *testing.T) {
	checkObjectLeaks(t)
	node := startObjectNode(t, newMemoryObjectStore(testEpoch), func(s *ObjectServer) { s.Epoch = func() uint64 { return testEpoch } })

	header := func(r ObjectRequest) []byte {
		var h [ObjectRequestHeaderSize]byte
		EncodeObjectRequest(&h, &r)
		return h[:]
	}
	closedWith := func(name string, stream []byte, logged string) {
		t.Helper()
		conn := rawObjectConnection(t, node)
		conn.Write(stream)
		conn.(interface{ CloseWrite() error }).CloseWrite() // a TLS close_notify: the server reads EOF
		if response, _, err := readRawResponse(conn); err == nil {
			t.Errorf("%s: answered %+v, want the connection closed", name, response)
		}
		peertest.WaitFor(t, 5*time.Second, name+" to be logged", func() bool { return strings.Contains(node.logs.String(), logged) })
	}
	badMagic := header(ObjectRequest{Opcode: ObjectPing})
	badMagic[0] = 'G'
	closedWith("bad magic", badMagic, "bad request magic")
	badVersion := header(ObjectRequest{Opcode: ObjectPing})
	badVersion[2] = 2
	resealRequestHeader(badVersion)
	closedWith("bad version", badVersion, "request version 2")
	badCRC := header(ObjectRequest{Opcode: ObjectPing, ID: 1})
	badCRC[20] ^= 1
	closedWith("bad header CRC", badCRC, "request header CRC")
	closedWith("HTTP", []byte("GET / HTTP/1.1\r\nHost: herd\r\n\r\n                   "), "bad request magic")
	closedWith("truncated header", header(ObjectRequest{Opcode: ObjectPing})[:20], "reading a request header: unexpected EOF")
	closedWith("truncated payload", append(header(ObjectRequest{Opcode: ObjectWrite, Flags: object.FlagCreate, Epoch: testEpoch, OID: 1, Length: 1000}), make([]byte, 500)...), "reading the payload")

	// Answered, and the connection stays usable.
	conn := rawObjectConnection(t, node)
	answered := func(name string, r ObjectRequest, payload []byte, want ObjectStatus) {
		t.Helper()
		r.ID = uint64(len(name))
		conn.Write(append(header(r), payload...))
		response, message, err := readRawResponse(conn)
		if err != nil || response.Status != want || response.ID != r.ID || response.Epoch != testEpoch {
			t.Errorf("%s: %+v %q %v; want %s with epoch %d", name, response, message, err, want, testEpoch)
		}
		r = ObjectRequest{Opcode: ObjectPing, ID: 1 << 40}
		conn.Write(header(r))
		if response, _, err := readRawResponse(conn); err != nil || response.Status != ObjectStatusOK || response.ID != r.ID {
			t.Fatalf("PING after %s: %+v %v", name, response, err)
		}
	}
	answered("unknown opcode", ObjectRequest{Opcode: 200}, nil, ObjectStatusUnknownOpcode)
	answered("zero opcode", ObjectRequest{Opcode: 0}, nil, ObjectStatusUnknownOpcode)
	answered("huge READ", ObjectRequest{Opcode: ObjectRead, Epoch: testEpoch, Length: 0xFFFFFFFF}, nil, ObjectStatusTooLarge)
	answered("READ past the object", ObjectRequest{Opcode: ObjectRead, Epoch: testEpoch, Offset: 0xFFFFFFFF, Length: 1}, nil, ObjectStatusInvalid)
	answered("WRITE past the object", ObjectRequest{Opcode: ObjectWrite, Epoch: testEpoch, Offset: MaxObjectSize, Length: 2, Checksum: ObjectChecksum([]byte{1, 2})}, []byte{1, 2}, ObjectStatusInvalid)
	oversized := make([]byte, MaxPayload+1)
	answered("WRITE over MaxPayload", ObjectRequest{Opcode: ObjectWrite, Epoch: testEpoch, Length: MaxPayload + 1}, oversized, ObjectStatusTooLarge)
	answered("unknown flag", ObjectRequest{Opcode: ObjectTrim, Flags: 0x8000, Epoch: testEpoch, Length: 1}, nil, ObjectStatusInvalid)
	answered("checksum without payload", ObjectRequest{Opcode: ObjectStat, Epoch: testEpoch, OID: 1, Checksum: 1}, nil, ObjectStatusInvalid)
	answered("reserved field", ObjectRequest{Opcode: ObjectPing, reserved: 1}, nil, ObjectStatusInvalid)
	answered("LIST of zero entries", ObjectRequest{Opcode: ObjectList, Epoch: testEpoch}, nil, ObjectStatusInvalid)
	answered("LIST of too many entries", ObjectRequest{Opcode: ObjectList, Epoch: testEpoch, Length: MaxObjectListEntries + 1}, nil, ObjectStatusInvalid)

	conn.Close()
	peertest.WaitFor(t, 5*time.Second, "every request to be released", func() bool { return node.server.inFlight.Load() == 0 })
}

// resealRequestHeader recomputes the header CRC of an encoded request whose
// bytes a test changed.
func resealRequestHeader(header []byte) {
	var fixed [ObjectRequestHeaderSize]byte
	copy(fixed[:], header)
	sum := ObjectChecksum(fixed[:44])
	header[44], header[45], header[46], header[47] = byte(sum>>24), byte(sum>>16), byte(sum>>8), byte(sum)
}

// blockingHandler holds READs of object 1 until released (or the
// connection dies) and serves everything else from a memory store.
type blockingHandler struct {
	store   *memoryObjectStore
	release chan struct{}
	waiting atomic.Int64
}

func (h *blockingHandler) ServeObject(ctx context.Context, request *ObjectRequest, payload []byte) (ObjectResponse, []byte) {
	if request.Opcode == ObjectRead && request.OID == 1 {
		h.waiting.Add(1)
		defer h.waiting.Add(-1)
		select {
		case <-h.release:
		case <-ctx.Done():
			return ObjectErrorResponse(testEpoch, ctx.Err())
		}
	}
	return h.store.ServeObject(ctx, request, payload)
}

func newBlockingHandler() *blockingHandler {
	store := newMemoryObjectStore(testEpoch)
	store.put(1, bytes.Repeat([]byte{0x55}, 4096))
	return &blockingHandler{store: store, release: make(chan struct{})}
}

// TestObjectConnectionKilledMidFlight: when the connection dies with calls
// pending, every one fails with ErrPeerUnavailable naming the node, and the
// next call redials.
func TestObjectConnectionKilledMidFlight(t *testing.T) {
	checkObjectLeaks(t)
	handler := newBlockingHandler()
	node := startObjectNode(t, handler, nil)
	client := newTestObjectClient(t, node, WithConnectionsPerAddress(1))

	const calls = 20
	errs := make(chan error, calls)
	for range calls {
		go func() {
			_, _, err := client.Do(t.Context(), node.address, &ObjectRequest{Opcode: ObjectRead, Epoch: testEpoch, OID: 1, Length: 4096}, nil, nil)
			errs <- err
		}()
	}
	peertest.WaitFor(t, 5*time.Second, "every call to reach the handler", func() bool { return handler.waiting.Load() == calls })
	node.listener.killConnections()
	for range calls {
		if err := <-errs; !errors.Is(err, ErrPeerUnavailable) || !strings.Contains(err.Error(), node.address) {
			t.Fatalf("pending call after the connection died: %v; want ErrPeerUnavailable naming %s", err, node.address)
		}
	}
	// The server released the requests of the dead connection.
	peertest.WaitFor(t, 5*time.Second, "the server to release the dead connection's requests", func() bool { return node.server.inFlight.Load() == 0 })

	if _, _, err := client.Do(t.Context(), node.address, &ObjectRequest{Opcode: ObjectPing}, nil, nil); err != nil {
		t.Fatalf("call after the connection died: %v", err)
	}
	if n := node.listener.acceptedCount(); n != 2 {
		t.Fatalf("%d connections accepted, want 2 (one redial)", n)
	}
}

// TestObjectContextCancel: a cancelled call returns at once, the connection
// stays up, and the late response is discarded without touching the
// caller's buffer.
func TestObjectContextCancel(t *testing.T) {
	checkObjectLeaks(t)
	handler := newBlockingHandler()
	node := startObjectNode(t, handler, nil)
	client := newTestObjectClient(t, node, WithConnectionsPerAddress(1))

	into := bytes.Repeat([]byte{0xAA}, 4096)
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	_, _, err := client.Do(ctx, node.address, &ObjectRequest{Opcode: ObjectRead, Epoch: testEpoch, OID: 1, Length: 4096}, nil, into)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("cancelled call: %v, want DeadlineExceeded", err)
	}
	// The same connection serves others while the abandoned one waits.
	if _, _, err := client.Do(t.Context(), node.address, &ObjectRequest{Opcode: ObjectPing}, nil, nil); err != nil {
		t.Fatalf("PING beside an abandoned call: %v", err)
	}
	close(handler.release)
	// Once the late response is written, a PING sent afterwards is answered
	// after it on the same stream: the client has discarded it by then.
	peertest.WaitFor(t, 5*time.Second, "the late response to be written", func() bool { return node.server.inFlight.Load() == 0 })
	if _, _, err := client.Do(t.Context(), node.address, &ObjectRequest{Opcode: ObjectPing}, nil, nil); err != nil {
		t.Fatalf("PING after the late response: %v", err)
	}
	if !bytes.Equal(into, bytes.Repeat([]byte{0xAA}, 4096)) {
		t.Fatal("the late response was written into the abandoned call's buffer")
	}
	if n := node.listener.acceptedCount(); n != 1 {
		t.Fatalf("%d connections, want 1: cancelling must not break the connection", n)
	}
	// A context already done never sends.
	if _, _, err := client.Do(ctx, node.address, &ObjectRequest{Opcode: ObjectPing}, nil, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("call with a done context: %v", err)
	}
}

// TestObjectCancelManyWrites cancels writes at random points of their
// journey (queued, being written, answered) under the race detector: the
// payload must never be read after Do returns.
func TestObjectCancelManyWrites(t *testing.T) {
	checkObjectLeaks(t)
	node := startObjectNode(t, newMemoryObjectStore(testEpoch), nil)
	client := newTestObjectClient(t, node, WithConnectionsPerAddress(1))
	var wait sync.WaitGroup
	for worker := range 16 {
		wait.Add(1)
		go func() {
			defer wait.Done()
			// Small payloads are copied into the batch (the race detector
			// sees that copy); large ones go to writev, where the server's
			// CRC check would see a payload changed under the writer.
			payload := make([]byte, 512+worker%2*(64<<10))
			for i := range 40 {
				ctx, cancel := context.WithTimeout(t.Context(), time.Duration(i%8)*50*time.Microsecond)
				_, _, err := client.Do(ctx, node.address, &ObjectRequest{Opcode: ObjectWrite, Flags: object.FlagCreate, Epoch: testEpoch, OID: object.OID(worker)}, payload, nil)
				cancel()
				if err != nil && !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("write: %v", err)
					return
				}
				// Reusing the buffer at once is what a caller does.
				payload[i] ^= 0xFF
			}
		}()
	}
	wait.Wait()
	if _, _, err := client.Do(t.Context(), node.address, &ObjectRequest{Opcode: ObjectPing}, nil, nil); err != nil {
		t.Fatalf("PING after cancelled writes: %v", err)
	}
}

// TestObjectDialFailures: an unreachable node and a node of another cluster
// are reported as unavailable, naming the address and the cause.
func TestObjectDialFailures(t *testing.T) {
	checkObjectLeaks(t)
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	nowhere := listener.Addr().String()
	listener.Close()
	client := NewObjectClient(peertest.Credentials(t, "client"))
	defer client.Close()
	if _, _, err := client.Do(t.Context(), nowhere, &ObjectRequest{Opcode: ObjectPing}, nil, nil); !errors.Is(err, ErrPeerUnavailable) || !strings.Contains(err.Error(), nowhere) {
		t.Fatalf("call to a closed port: %v", err)
	}

	node := startObjectNode(t, newMemoryObjectStore(testEpoch), nil)
	stranger := NewObjectClient(peertest.CredentialsFrom(t, peertest.OtherCluster(t), "stranger"))
	defer stranger.Close()
	if _, _, err := stranger.Do(t.Context(), node.address, &ObjectRequest{Opcode: ObjectPing}, nil, nil); !errors.Is(err, ErrPeerUnavailable) || !errors.Is(err, peer.ErrWrongCluster) {
		t.Fatalf("call with another cluster's certificate: %v", err)
	}
}

// TestObjectClientClose: Close fails the pending calls and later ones.
func TestObjectClientClose(t *testing.T) {
	checkObjectLeaks(t)
	handler := newBlockingHandler()
	node := startObjectNode(t, handler, nil)
	client := NewObjectClient(node.creds)
	errs := make(chan error, 1)
	go func() {
		_, _, err := client.Do(t.Context(), node.address, &ObjectRequest{Opcode: ObjectRead, Epoch: testEpoch, OID: 1, Length: 10}, nil, nil)
		errs <- err
	}()
	peertest.WaitFor(t, 5*time.Second, "the call to reach the handler", func() bool { return handler.waiting.Load() == 1 })
	client.Close()
	if err := <-errs; !errors.Is(err, ErrPeerUnavailable) || !errors.Is(err, ErrObjectClientClosed) {
		t.Fatalf("pending call at Close: %v", err)
	}
	if _, _, err := client.Do(t.Context(), node.address, &ObjectRequest{Opcode: ObjectPing}, nil, nil); !errors.Is(err, ErrObjectClientClosed) {
		t.Fatalf("call after Close: %v", err)
	}
}

// TestObjectServerBoundsSlowClient: a client that sends READs and never
// reads the answers makes the server stop reading at its bounds, not buffer
// without end; its departure releases everything.
func TestObjectServerBoundsSlowClient(t *testing.T) {
	checkObjectLeaks(t)
	const maxInFlight = 16
	const maxBuffered = 4 << 20
	store := newMemoryObjectStore(testEpoch)
	store.put(1, make([]byte, 1<<20))
	node := startObjectNode(t, store, func(s *ObjectServer) {
		s.MaxInFlight = maxInFlight
		s.MaxBufferedBytes = maxBuffered
	})
	buffersBefore := bufpool.Outstanding()
	conn := rawObjectConnection(t, node)
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		var header [ObjectRequestHeaderSize]byte
		for i := range 100000 {
			EncodeObjectRequest(&header, &ObjectRequest{Opcode: ObjectRead, Epoch: testEpoch, ID: uint64(i), OID: 1, Length: 1 << 20})
			if _, err := conn.Write(header[:]); err != nil {
				return // the test closed the connection
			}
		}
	}()
	// 100000 MiB of answers cannot fit anywhere: the server must stop.
	var peakBuffers int64
	for range 50 {
		time.Sleep(10 * time.Millisecond)
		peakBuffers = max(peakBuffers, bufpool.Outstanding()-buffersBefore)
		if inFlight := node.server.inFlight.Load(); inFlight > maxInFlight {
			t.Fatalf("%d requests in flight, bound %d", inFlight, maxInFlight)
		}
	}
	if peakBuffers > maxBuffered>>20+1 {
		t.Fatalf("%d 1-MiB READ buffers held at once, bound %d", peakBuffers, maxBuffered>>20+1)
	}
	conn.Close()
	<-sent
	peertest.WaitFor(t, 10*time.Second, "the slow connection's requests to be released", func() bool { return node.server.inFlight.Load() == 0 })
}

// TestObjectServerShutdown: Shutdown answers new requests SHUTTING_DOWN and
// lets the ones in flight finish.
func TestObjectServerShutdown(t *testing.T) {
	checkObjectLeaks(t)
	handler := newBlockingHandler()
	node := startObjectNode(t, handler, nil)
	client := newTestObjectClient(t, node, WithConnectionsPerAddress(1))
	inFlight := make(chan error, 1)
	go func() {
		_, body, err := client.Do(t.Context(), node.address, &ObjectRequest{Opcode: ObjectRead, Epoch: testEpoch, OID: 1, Length: 4096}, nil, nil)
		if err == nil && !bytes.Equal(body, bytes.Repeat([]byte{0x55}, 4096)) {
			err = errors.New("wrong data")
		}
		inFlight <- err
	}()
	peertest.WaitFor(t, 5*time.Second, "the READ to reach the handler", func() bool { return handler.waiting.Load() == 1 })
	shutdown := make(chan error, 1)
	go func() { shutdown <- node.server.Shutdown(t.Context()) }()
	peertest.WaitFor(t, 5*time.Second, "shutdown to begin", func() bool { return node.server.shuttingDown.Load() })
	if _, _, err := client.Do(t.Context(), node.address, &ObjectRequest{Opcode: ObjectPing}, nil, nil); !errors.Is(err, ErrShuttingDown) {
		t.Fatalf("PING during shutdown: %v, want ErrShuttingDown", err)
	}
	close(handler.release)
	if err := <-inFlight; err != nil {
		t.Fatalf("READ in flight at shutdown: %v", err)
	}
	if err := <-shutdown; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
}

// brokenHandler breaks the handler contract; the server must answer IO,
// never a malformed response.
type brokenHandler struct{ released atomic.Int64 }

func (h *brokenHandler) ServeObject(ctx context.Context, request *ObjectRequest, payload []byte) (ObjectResponse, []byte) {
	release := ReleaseFunc(func() { h.released.Add(1) })
	switch request.Opcode {
	case ObjectRead:
		return ObjectResponse{Status: ObjectStatusOK, Release: release}, make([]byte, request.Length+1)
	case ObjectPing:
		return ObjectResponse{Status: 999}, nil
	case ObjectStat:
		if request.OID == 1 {
			return ObjectResponse{Status: ObjectStatusOK, ObjectEpoch: 5}, nil // allowed: the stamp alone
		}
		return ObjectResponse{Status: ObjectStatusOK, Release: release}, []byte("short")
	default:
		return ObjectResponse{Status: ObjectStatusOK, Release: release}, []byte("unexpected")
	}
}

func TestObjectHandlerContractViolations(t *testing.T) {
	checkObjectLeaks(t)
	handler := &brokenHandler{}
	node := startObjectNode(t, handler, nil)
	client := newTestObjectClient(t, node)
	for _, request := range []ObjectRequest{
		{Opcode: ObjectRead, Length: 10},
		{Opcode: ObjectPing},
		{Opcode: ObjectFlush},
		{Opcode: ObjectStat, OID: 2},
	} {
		if _, _, err := client.Do(t.Context(), node.address, &request, nil, nil); !errors.Is(err, ErrObjectIO) {
			t.Errorf("%s from a broken handler: %v, want ErrObjectIO", request.Opcode, err)
		}
	}
	if n := handler.released.Load(); n != 3 {
		t.Errorf("%d bodies released, want 3", n)
	}
	response, body, err := client.Do(t.Context(), node.address, &ObjectRequest{Opcode: ObjectStat, OID: 1}, nil, nil)
	if err != nil || response.ObjectEpoch != 5 || len(body) != 0 {
		t.Errorf("STAT answered with the stamp alone: %+v, %d bytes, %v", response, len(body), err)
	}
	if !strings.Contains(node.logs.String(), "broke its contract") {
		t.Error("the handler's bug was not logged")
	}
}

// TestObjectStartWait has one goroutine put writes in flight to two nodes
// at once (Start), then wait for both. Both sets of writes must land
// whole and in order, and a write from another epoch must still be
// refused.
func TestObjectStartWait(t *testing.T) {
	checkObjectLeaks(t)
	nodes := []*objectTestNode{
		startObjectNode(t, newMemoryObjectStore(testEpoch), nil),
		startObjectNode(t, newMemoryObjectStore(testEpoch), nil),
	}
	client := NewObjectClient(nodes[0].creds, WithConnectionsPerAddress(1))
	t.Cleanup(func() { client.Close() })
	const writes = 64
	for i := range writes {
		payload := bytes.Repeat([]byte{byte(i + 1)}, 4096)
		var pending []ObjectPending
		for _, node := range nodes {
			p, err := client.Start(t.Context(), node.address, &ObjectRequest{Opcode: ObjectWrite, Flags: object.FlagCreate, Epoch: testEpoch, OID: 9, Offset: uint32(i%8) * 4096}, payload, nil)
			if err != nil {
				t.Fatalf("Start write %d to %s: %v", i, node.address, err)
			}
			pending = append(pending, p)
		}
		for j, p := range pending {
			if _, _, err := p.Wait(t.Context()); err != nil {
				t.Fatalf("write %d to node %d: %v", i, j, err)
			}
		}
	}
	for j, node := range nodes {
		got := make([]byte, 8*4096)
		if _, _, err := client.Do(t.Context(), node.address, &ObjectRequest{Opcode: ObjectRead, Epoch: testEpoch, OID: 9, Length: uint32(len(got))}, nil, got); err != nil {
			t.Fatalf("read back from node %d: %v", j, err)
		}
		for block := range 8 {
			want := byte(writes - 8 + block + 1) // the last write to each block
			if b := got[block*4096 : (block+1)*4096]; !bytes.Equal(b, bytes.Repeat([]byte{want}, 4096)) {
				t.Fatalf("node %d block %d holds %d..., want %d", j, block, b[0], want)
			}
		}
	}
	_, _, err := client.Do(t.Context(), nodes[0].address, &ObjectRequest{Opcode: ObjectWrite, Epoch: testEpoch - 1, OID: 9}, make([]byte, 4096), nil)
	var stale *StaleEpochError
	if !errors.As(err, &stale) || stale.Current != testEpoch {
		t.Fatalf("write from another epoch: %v, want STALE_EPOCH (current %d)", err, testEpoch)
	}
}

// TestObjectDirectWrite: a small request registered alone is written by its
// caller (no writer runs on this connection), one registered while another
// is pending is left to the writer, and the count of pending calls per
// address returns to zero when the connection fails.
func TestObjectDirectWrite(t *testing.T) {
	near, far := net.Pipe()
	t.Cleanup(func() { near.Close(); far.Close() })
	var addressPending atomic.Int32
	c := newObjectClientConnection("pipe", near, &addressPending)
	newCall := func(oid object.OID) *objectCall {
		call := &objectCall{payload: pattern(oid, 0, 4096), opcode: ObjectWrite, length: 4096, done: make(chan struct{}), written: make(chan struct{})}
		id, _, err := c.register(call)
		if err != nil {
			t.Fatal(err)
		}
		EncodeObjectRequest(&call.header, &ObjectRequest{Opcode: ObjectWrite, Epoch: testEpoch, ID: id, OID: oid, Length: 4096, Checksum: ObjectChecksum(call.payload)})
		return call
	}

	first := newCall(1)
	if n := addressPending.Load(); n != 1 {
		t.Fatalf("%d calls pending to the address, want 1", n)
	}
	received := make(chan []byte, 1)
	go func() {
		message := make([]byte, ObjectRequestHeaderSize+4096)
		if _, err := io.ReadFull(far, message); err != nil {
			message = nil
		}
		received <- message
	}()
	if !c.writeDirect(first) {
		t.Fatal("writeDirect refused a lone request on an idle connection")
	}
	select {
	case <-first.written:
	default:
		t.Fatal("writeDirect returned without closing written")
	}
	message := <-received
	if message == nil {
		t.Fatal("the request did not arrive")
	}
	request, err := DecodeObjectRequest((*[ObjectRequestHeaderSize]byte)(message[:ObjectRequestHeaderSize]))
	if err != nil || request.ID != first.id || request.OID != 1 || !bytes.Equal(message[ObjectRequestHeaderSize:], first.payload) {
		t.Fatalf("received request %+v (err %v), payload equal %v; want id %d of object 1", request, err, bytes.Equal(message[ObjectRequestHeaderSize:], first.payload), first.id)
	}

	// A second call while the first is pending is not alone.
	second := &objectCall{opcode: ObjectStat, done: make(chan struct{})}
	if _, alone, err := c.register(second); err != nil || alone {
		t.Fatalf("second register: alone %v, err %v; want not alone", alone, err)
	}
	// Whoever holds the connection's writing, or a queue with something in
	// it, makes writeDirect refuse (nothing is written: the pipe would block).
	third := newCall(3)
	c.writeMu.Lock()
	if c.writeDirect(third) {
		t.Fatal("writeDirect wrote while the writer held the connection")
	}
	c.writeMu.Unlock()
	c.queue <- second
	if c.writeDirect(third) {
		t.Fatal("writeDirect wrote past a queued request")
	}

	c.fail(errors.New("test over"))
	if n := addressPending.Load(); n != 0 {
		t.Fatalf("%d calls counted pending after the connection failed, want 0", n)
	}
	for _, call := range []*objectCall{first, second, third} {
		select {
		case <-call.done:
		default:
			t.Fatalf("call %d not completed by the failure", call.id)
		}
	}
}
