package objproto

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/bufpool"
	"github.com/herd-storage/herd/internal/object"
)

// The fuzz targets feed bytes from outside (what another process sends) to
// the object protocol's decoders and to a whole server connection. They check
// that nothing panics or hangs, that every decoded header re-encodes to the
// same bytes, that what validation accepts is within the protocol's limits,
// and that a connection, whatever it is fed, returns every buffer and answers
// with a well-formed stream of responses. Inputs are also tried "resealed"
// (header CRCs recomputed), or the CRC would stop nearly every mutation at
// the door.
//
// Seeds live in testdata/fuzz/<target>/; regenerate them with
//
//	HERD_WRITE_OBJECT_SEEDS=1 go test -run TestWriteObjectSeedCorpus ./internal/peer/

func FuzzObjectRequestDecode(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		var header [ObjectRequestHeaderSize]byte
		copy(header[:], data)
		checkObjectRequestHeader(t, &header)
		resealRequestHeader(header[:])
		checkObjectRequestHeader(t, &header)
	})
}

func checkObjectRequestHeader(t *testing.T, header *[ObjectRequestHeaderSize]byte) {
	request, err := DecodeObjectRequest(header)
	if err != nil {
		return
	}
	var again [ObjectRequestHeaderSize]byte
	EncodeObjectRequest(&again, &request)
	if again != *header {
		t.Fatalf("request %+v re-encodes differently:\n%x\n%x", request, header[:], again[:])
	}
	status, message := ValidateObjectRequest(&request)
	if status >= objectStatusCount || (status == ObjectStatusOK) != (message == "") {
		t.Fatalf("validation of %+v: %s %q", request, status, message)
	}
	if status != ObjectStatusOK {
		return
	}
	if request.requestPayloadLength() > MaxPayload || objectBufferedBytes(&request) > MaxPayload {
		t.Fatalf("accepted %+v holds more than MaxPayload", request)
	}
	switch request.Opcode {
	case ObjectRead, ObjectWrite, ObjectWriteZeroes, ObjectTrim:
		if request.Length == 0 || uint64(request.Offset)+uint64(request.Length) > MaxObjectSize {
			t.Fatalf("accepted %+v reaches outside an object", request)
		}
	}
}

func FuzzObjectResponseDecode(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		var header [ObjectResponseHeaderSize]byte
		copy(header[:], data)
		checkObjectResponseHeader(t, &header)
		binary.BigEndian.PutUint32(header[40:], ObjectChecksum(header[:40]))
		checkObjectResponseHeader(t, &header)
	})
}

func checkObjectResponseHeader(t *testing.T, header *[ObjectResponseHeaderSize]byte) {
	response, err := DecodeObjectResponse(header)
	if err != nil {
		return
	}
	var again [ObjectResponseHeaderSize]byte
	EncodeObjectResponse(&again, &response)
	if again != *header {
		t.Fatalf("response %+v re-encodes differently", response)
	}
	if response.Length > MaxPayload || (response.Status != ObjectStatusOK && response.Length > MaxObjectErrorMessage) {
		t.Fatalf("accepted %+v announces too much", response)
	}
	if response.Status != ObjectStatusOK {
		if err := objectResponseError(&response, "node", make([]byte, response.Length)); err == nil || ObjectStatusOf(err) == ObjectStatusOK {
			t.Fatalf("%s maps to %v", response.Status, err)
		}
	}
}

// FuzzObjectServerConnection feeds a byte stream, as a client would send it,
// to one server connection serving an in-memory store.
func FuzzObjectServerConnection(f *testing.F) {
	f.Fuzz(func(t *testing.T, stream []byte, reseal bool) {
		if reseal {
			stream = resealRequestStream(stream)
		}
		runObjectServerOn(t, stream, 8)
	})
}

// resealRequestStream returns a copy of stream in which every request
// header's CRC, and every complete WRITE payload's CRC, is correct.
func resealRequestStream(stream []byte) []byte {
	stream = bytes.Clone(stream)
	for at := 0; at+ObjectRequestHeaderSize <= len(stream); {
		header := stream[at : at+ObjectRequestHeaderSize]
		length := 0
		if ObjectOpcode(header[3]) == ObjectWrite {
			length = int(binary.BigEndian.Uint32(header[36:]))
			if end := at + ObjectRequestHeaderSize + length; end >= at && end <= len(stream) {
				binary.BigEndian.PutUint32(header[40:], ObjectChecksum(stream[at+ObjectRequestHeaderSize:end]))
			}
		}
		resealRequestHeader(header)
		if length > len(stream) {
			break
		}
		at += ObjectRequestHeaderSize + length
	}
	return stream
}

// runObjectServerOn serves stream on one connection, checks what the fuzz
// target checks, and returns the status of each response by request id.
// The fuzz target uses several requests in flight, to exercise concurrency.
func runObjectServerOn(t *testing.T, stream []byte, maxInFlight int) map[uint64]ObjectStatus {
	buffersBefore := bufpool.Outstanding()
	server := &ObjectServer{
		Handler:          newMemoryObjectStore(0),
		Logger:           slog.New(slog.NewTextHandler(io.Discard, nil)),
		MaxInFlight:      maxInFlight,
		MaxBufferedBytes: 1 << 20,
	}
	conn := newScriptedObjectConn(stream)
	c := newObjectServerConnection(server, conn)
	done := make(chan struct{})
	go func() {
		c.serve()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("the connection did not end after its input did")
	}
	if n := c.budget.InUse(); n != 0 {
		t.Fatalf("%d budget bytes still held", n)
	}
	if n := server.inFlight.Load(); n != 0 {
		t.Fatalf("%d requests still in flight", n)
	}
	if n := bufpool.Outstanding() - buffersBefore; n != 0 {
		t.Fatalf("%d buffers not released", n)
	}
	if len(c.slots) != 0 {
		t.Fatalf("%d in-flight slots still held", len(c.slots))
	}
	// What the server wrote is a well-formed sequence of responses.
	output := conn.written()
	statuses := make(map[uint64]ObjectStatus)
	for len(output) > 0 {
		if len(output) < ObjectResponseHeaderSize {
			t.Fatalf("%d bytes of a truncated response header", len(output))
		}
		response, err := DecodeObjectResponse((*[ObjectResponseHeaderSize]byte)(output))
		if err != nil {
			t.Fatalf("the server wrote a bad response header: %v", err)
		}
		if response.Status >= objectStatusCount {
			t.Fatalf("the server wrote status %d", response.Status)
		}
		output = output[ObjectResponseHeaderSize:]
		if int(response.Length) > len(output) {
			t.Fatalf("response of %d bytes with %d written", response.Length, len(output))
		}
		if sum := ObjectChecksum(output[:response.Length]); sum != response.Checksum {
			t.Fatalf("response payload CRC 0x%08x, header says 0x%08x", sum, response.Checksum)
		}
		output = output[response.Length:]
		statuses[response.ID] = response.Status
	}
	return statuses
}

// scriptedObjectConn is a net.Conn that reads a fixed client stream and
// records what the server writes.
type scriptedObjectConn struct {
	input *bytes.Reader

	mu     sync.Mutex // guards output and closed
	output bytes.Buffer
	closed bool
}

func newScriptedObjectConn(input []byte) *scriptedObjectConn {
	return &scriptedObjectConn{input: bytes.NewReader(input)}
}

func (c *scriptedObjectConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return 0, net.ErrClosed
	}
	return c.input.Read(p)
}

func (c *scriptedObjectConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, net.ErrClosed
	}
	return c.output.Write(p)
}

func (c *scriptedObjectConn) written() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return bytes.Clone(c.output.Bytes())
}

func (c *scriptedObjectConn) Close() error {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	return nil
}

func (c *scriptedObjectConn) LocalAddr() net.Addr {
	return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 7000}
}
func (c *scriptedObjectConn) RemoteAddr() net.Addr {
	return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2), Port: 40000}
}
func (c *scriptedObjectConn) SetDeadline(time.Time) error      { return nil }
func (c *scriptedObjectConn) SetReadDeadline(time.Time) error  { return nil }
func (c *scriptedObjectConn) SetWriteDeadline(time.Time) error { return nil }

// objectSeedStream encodes requests (with correct CRCs) into a client stream.
func objectSeedStream(requests ...any) []byte {
	var stream []byte
	for i := 0; i < len(requests); i++ {
		request := requests[i].(ObjectRequest)
		var payload []byte
		if i+1 < len(requests) {
			if p, ok := requests[i+1].([]byte); ok {
				payload = p
				i++
				request.Length = uint32(len(p))
				request.Checksum = ObjectChecksum(p)
			}
		}
		var header [ObjectRequestHeaderSize]byte
		EncodeObjectRequest(&header, &request)
		stream = append(append(stream, header[:]...), payload...)
	}
	return stream
}

// objectSeeds returns the seed corpus of each target.
func objectSeeds() map[string][][]any {
	everyOpcode := objectSeedStream(
		ObjectRequest{Opcode: ObjectPing, ID: 1},
		ObjectRequest{Opcode: ObjectWrite, Flags: object.FlagCreate, ID: 2, OID: 9, Offset: 100}, []byte("hello, object"),
		ObjectRequest{Opcode: ObjectRead, ID: 3, OID: 9, Offset: 96, Length: 32},
		ObjectRequest{Opcode: ObjectWriteZeroes, Flags: object.FlagNoHole, ID: 4, OID: 9, Offset: 0, Length: 4096},
		ObjectRequest{Opcode: ObjectTrim, ID: 5, OID: 9, Offset: 0, Length: 65536},
		ObjectRequest{Opcode: ObjectStat, ID: 6, OID: 9},
		ObjectRequest{Opcode: ObjectList, ID: 7, Length: 10},
		ObjectRequest{Opcode: ObjectFlush, ID: 8},
		ObjectRequest{Opcode: ObjectRemove, Flags: object.FlagSync, ID: 9, OID: 9},
		ObjectRequest{Opcode: ObjectRead, ID: 10, OID: 9, Length: 1},
	)
	refused := objectSeedStream(
		ObjectRequest{Opcode: 77, ID: 1},
		ObjectRequest{Opcode: ObjectRead, ID: 2, Length: 0xFFFFFFFF},
		ObjectRequest{Opcode: ObjectRead, ID: 3, Offset: MaxObjectSize, Length: 1},
		ObjectRequest{Opcode: ObjectStat, ID: 4, Epoch: 5, OID: 1},
		ObjectRequest{Opcode: ObjectWrite, ID: 5, OID: 1}, []byte("no create"),
	)
	damagedPayload := objectSeedStream(ObjectRequest{Opcode: ObjectWrite, Flags: object.FlagCreate, ID: 1, OID: 2}, []byte("payload"))
	damagedPayload[len(damagedPayload)-1] ^= 1
	hugeWrite := objectSeedStream(ObjectRequest{Opcode: ObjectWrite, ID: 1, Length: 0xFFFFFFF0})
	truncated := everyOpcode[:ObjectRequestHeaderSize+5]

	var requestHeaders, responseHeaders [][]any
	for opcode := ObjectOpcode(0); opcode <= ObjectPing+1; opcode++ {
		var header [ObjectRequestHeaderSize]byte
		EncodeObjectRequest(&header, &ObjectRequest{Opcode: opcode, Flags: object.FlagCreate, Epoch: 3, ID: 4, OID: 5, Offset: 4096, Length: 4096})
		requestHeaders = append(requestHeaders, []any{header[:]})
	}
	requestHeaders = append(requestHeaders, []any{[]byte("GET / HTTP/1.1\r\n")})
	for status := ObjectStatus(0); status <= objectStatusCount; status++ {
		var header [ObjectResponseHeaderSize]byte
		EncodeObjectResponse(&header, &ObjectResponse{Status: status, ID: 4, Epoch: 3, ObjectEpoch: 2, Length: 100})
		responseHeaders = append(responseHeaders, []any{header[:]})
	}
	return map[string][][]any{
		"FuzzObjectRequestDecode":  requestHeaders,
		"FuzzObjectResponseDecode": responseHeaders,
		"FuzzObjectServerConnection": {
			{everyOpcode, false},
			{everyOpcode, true},
			{refused, false},
			{damagedPayload, false},
			{hugeWrite, true},
			{truncated, false},
			{[]byte("GET / HTTP/1.1\r\nHost: herd\r\n\r\n"), false},
			{[]byte{}, false},
		},
	}
}

// TestWriteObjectSeedCorpus writes objectSeeds to testdata/fuzz, in the
// format of the go command's corpus files.
func TestWriteObjectSeedCorpus(t *testing.T) {
	if os.Getenv("HERD_WRITE_OBJECT_SEEDS") == "" {
		// Not a missing prerequisite: a generator that runs on request.
		t.Skip("set HERD_WRITE_OBJECT_SEEDS=1 to regenerate the seed corpus")
	}
	for target, seeds := range objectSeeds() {
		directory := filepath.Join("testdata", "fuzz", target)
		if err := os.MkdirAll(directory, 0o755); err != nil {
			t.Fatal(err)
		}
		for i, values := range seeds {
			var text bytes.Buffer
			text.WriteString("go test fuzz v1\n")
			for _, value := range values {
				switch v := value.(type) {
				case []byte:
					fmt.Fprintf(&text, "[]byte(%s)\n", strconv.Quote(string(v)))
				case bool:
					fmt.Fprintf(&text, "bool(%t)\n", v)
				}
			}
			if err := os.WriteFile(filepath.Join(directory, fmt.Sprintf("seed-%02d", i)), text.Bytes(), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestObjectSeedsServed runs the connection seeds through the same checks
// as the fuzz target, and checks the answers of the well-formed one.
func TestObjectSeedsServed(t *testing.T) {
	seeds := objectSeeds()["FuzzObjectServerConnection"]
	for _, seed := range seeds {
		stream := seed[0].([]byte)
		if seed[1].(bool) {
			stream = resealRequestStream(stream)
		}
		runObjectServerOn(t, stream, 8)
	}
	// One request in flight at a time, so that they run in order:
	// requests in flight together have no order between them.
	statuses := runObjectServerOn(t, seeds[0][0].([]byte), 1)
	want := "map[1:OK 2:OK 3:OK 4:OK 5:OK 6:OK 7:OK 8:OK 9:OK 10:NOT_FOUND]"
	if got := fmt.Sprint(statuses); got != want {
		t.Errorf("every-opcode seed answered %s, want %s", got, want)
	}
	statuses = runObjectServerOn(t, seeds[2][0].([]byte), 1)
	want = "map[1:UNKNOWN_OPCODE 2:TOO_LARGE 3:INVALID 4:STALE_EPOCH 5:NOT_FOUND]"
	if got := fmt.Sprint(statuses); got != want {
		t.Errorf("refused seed answered %s, want %s", got, want)
	}
}
