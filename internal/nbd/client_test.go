package nbd

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/nbd/wire"
)

// testTimeout bounds every wait in these tests; generous because the machine
// is shared.
const testTimeout = 20 * time.Second

func testLogger() *slog.Logger {
	if os.Getenv("NBD_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// testServer is a Server listening on 127.0.0.1 with a random free port.
type testServer struct {
	*Server
	address string
	backend *memoryBackend
	served  chan error
}

// startServer serves backend until the test ends, then closes the server and
// checks that every goroutine it started has ended, every buffer was
// returned, and every export was closed exactly once.
func startServer(t testing.TB, backend *memoryBackend, configure ...func(*Server)) *testServer {
	t.Helper()
	goroutinesBefore := runtime.NumGoroutine()
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	server := &Server{Backend: backend, Logger: testLogger()}
	for _, apply := range configure {
		apply(server)
	}
	served := make(chan error, 1)
	go func() { served <- server.Serve(context.Background(), listener) }()
	ts := &testServer{Server: server, address: listener.Addr().String(), backend: backend, served: served}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
		defer cancel()
		if err := server.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		select {
		case err := <-served:
			if !errors.Is(err, ErrServerClosed) {
				t.Errorf("Serve returned %v, want ErrServerClosed", err)
			}
		case <-time.After(testTimeout):
			t.Errorf("Serve did not return after Shutdown")
		}
		if n := server.buffersOutstanding.Load(); n != 0 {
			t.Errorf("%d payload buffers were not returned", n)
		}
		backend.mu.Lock()
		for _, disk := range backend.disks {
			if n := disk.misuses.Load(); n != 0 {
				t.Errorf("export %s was used after Close or closed twice (%d times)", disk.name, n)
			}
			if opens, closes := disk.opens.Load(), disk.closes.Load(); opens != closes {
				t.Errorf("export %s opened %d times, closed %d times", disk.name, opens, closes)
			}
		}
		backend.mu.Unlock()
		waitFor(t, "server goroutines to end", func() bool { return runtime.NumGoroutine() <= goroutinesBefore })
	})
	return ts
}

// waitFor polls condition until it holds or testTimeout passes.
func waitFor(t testing.TB, what string, condition func() bool) {
	t.Helper()
	deadline := time.Now().Add(testTimeout)
	for !condition() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond) // polling interval, bounded by the deadline above
	}
}

// testClient speaks NBD to the server under test, one step at a time, so
// tests can also send what a correct client never would.
type testClient struct {
	t      testing.TB
	conn   net.Conn
	reader *bufio.Reader
	// reads maps the cookies of READ requests in flight to their length,
	// to know whether a simple reply carries data.
	readsMutex sync.Mutex
	reads      map[uint64]uint32
}

func dial(t testing.TB, address string) *testClient {
	t.Helper()
	conn, err := net.DialTimeout("tcp", address, testTimeout)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	conn.SetDeadline(time.Now().Add(testTimeout))
	t.Cleanup(func() { conn.Close() })
	return &testClient{t: t, conn: conn, reader: bufio.NewReader(conn), reads: make(map[uint64]uint32)}
}

func (c *testClient) write(b []byte) {
	c.t.Helper()
	if _, err := c.conn.Write(b); err != nil {
		c.t.Fatalf("client write: %v", err)
	}
}

func (c *testClient) readFull(n int) []byte {
	c.t.Helper()
	b := make([]byte, n)
	if _, err := io.ReadFull(c.reader, b); err != nil {
		c.t.Fatalf("client read of %d bytes: %v", n, err)
	}
	return b
}

// expectClosed checks that the server closes the connection without sending
// anything more.
func (c *testClient) expectClosed() {
	c.t.Helper()
	b := make([]byte, 1)
	n, err := c.reader.Read(b)
	if err == nil || n != 0 {
		c.t.Fatalf("expected the server to close the connection, read %d bytes (%v)", n, err)
	}
	var netError net.Error
	if errors.As(err, &netError) && netError.Timeout() {
		c.t.Fatalf("expected the server to close the connection, timed out instead")
	}
}

// greet reads the server's greeting and sends the client flags.
func (c *testClient) greet(clientFlags uint32) uint16 {
	c.t.Helper()
	greeting := c.readFull(18)
	if got := binary.BigEndian.Uint64(greeting[0:]); got != wire.NBDMagic {
		c.t.Fatalf("greeting magic %#x", got)
	}
	if got := binary.BigEndian.Uint64(greeting[8:]); got != wire.IHaveOptMagic {
		c.t.Fatalf("greeting option magic %#x", got)
	}
	c.write(binary.BigEndian.AppendUint32(nil, clientFlags))
	return binary.BigEndian.Uint16(greeting[16:])
}

func (c *testClient) sendOption(option uint32, data []byte) {
	c.t.Helper()
	message := binary.BigEndian.AppendUint64(nil, wire.IHaveOptMagic)
	message = binary.BigEndian.AppendUint32(message, option)
	message = binary.BigEndian.AppendUint32(message, uint32(len(data)))
	c.write(append(message, data...))
}

type optionReply struct {
	option    uint32
	replyType uint32
	data      []byte
}

func (c *testClient) readOptionReply() optionReply {
	c.t.Helper()
	header := c.readFull(wire.OptionReplyHeaderLength)
	if got := binary.BigEndian.Uint64(header[0:]); got != wire.OptionReplyMagic {
		c.t.Fatalf("option reply magic %#x", got)
	}
	reply := optionReply{
		option:    binary.BigEndian.Uint32(header[8:]),
		replyType: binary.BigEndian.Uint32(header[12:]),
	}
	reply.data = c.readFull(int(binary.BigEndian.Uint32(header[16:])))
	return reply
}

// option sends an option and reads its replies up to the final one (an ACK
// or an error).
func (c *testClient) option(option uint32, data []byte) []optionReply {
	c.t.Helper()
	c.sendOption(option, data)
	var replies []optionReply
	for {
		reply := c.readOptionReply()
		if reply.option != option {
			c.t.Fatalf("reply for option %d, want %d", reply.option, option)
		}
		replies = append(replies, reply)
		if reply.replyType == wire.RepAck || reply.replyType&wire.RepFlagError != 0 {
			return replies
		}
	}
}

// final returns the type of the last reply.
func final(replies []optionReply) uint32 {
	return replies[len(replies)-1].replyType
}

func exportRequestData(name string, information ...uint16) []byte {
	data := binary.BigEndian.AppendUint32(nil, uint32(len(name)))
	data = append(data, name...)
	data = binary.BigEndian.AppendUint16(data, uint16(len(information)))
	for _, kind := range information {
		data = binary.BigEndian.AppendUint16(data, kind)
	}
	return data
}

func metaContextData(name string, queries ...string) []byte {
	data := binary.BigEndian.AppendUint32(nil, uint32(len(name)))
	data = append(data, name...)
	data = binary.BigEndian.AppendUint32(data, uint32(len(queries)))
	for _, query := range queries {
		data = binary.BigEndian.AppendUint32(data, uint32(len(query)))
		data = append(data, query...)
	}
	return data
}

// exportInformation decodes the NBD_INFO_EXPORT reply among replies.
func exportInformation(t testing.TB, replies []optionReply) (size uint64, flags uint16) {
	t.Helper()
	for _, reply := range replies {
		if reply.replyType == wire.RepInfo && binary.BigEndian.Uint16(reply.data) == wire.InfoExport {
			if len(reply.data) != 12 {
				t.Fatalf("NBD_INFO_EXPORT of %d bytes", len(reply.data))
			}
			return binary.BigEndian.Uint64(reply.data[2:]), binary.BigEndian.Uint16(reply.data[10:])
		}
	}
	t.Fatalf("no NBD_INFO_EXPORT in %v", replies)
	return 0, 0
}

// connectOptions selects what connect negotiates.
type connectOptions struct {
	structured  bool
	blockStatus bool
}

// connect negotiates (structured replies, base:allocation) and enters the
// transmission phase with NBD_OPT_GO.
func connect(t testing.TB, address, name string, options connectOptions) (*testClient, uint64, uint16) {
	t.Helper()
	c := dial(t, address)
	c.greet(wire.FlagCFixedNewstyle | wire.FlagCNoZeroes)
	if options.structured {
		if got := final(c.option(wire.OptStructuredReply, nil)); got != wire.RepAck {
			t.Fatalf("NBD_OPT_STRUCTURED_REPLY: reply %#x", got)
		}
	}
	if options.blockStatus {
		replies := c.option(wire.OptSetMetaContext, metaContextData(name, wire.BaseAllocation))
		if final(replies) != wire.RepAck || len(replies) != 2 {
			t.Fatalf("NBD_OPT_SET_META_CONTEXT: %v", replies)
		}
	}
	replies := c.option(wire.OptGo, exportRequestData(name, wire.InfoBlockSize))
	if got := final(replies); got != wire.RepAck {
		t.Fatalf("NBD_OPT_GO %q: reply %#x %q", name, got, replies[len(replies)-1].data)
	}
	size, flags := exportInformation(t, replies)
	return c, size, flags
}

func (c *testClient) sendRequest(flags, command uint16, cookie, offset uint64, length uint32, payload []byte) {
	c.t.Helper()
	header := make([]byte, wire.RequestHeaderLength)
	binary.BigEndian.PutUint32(header[0:], wire.RequestMagic)
	binary.BigEndian.PutUint16(header[4:], flags)
	binary.BigEndian.PutUint16(header[6:], command)
	binary.BigEndian.PutUint64(header[8:], cookie)
	binary.BigEndian.PutUint64(header[16:], offset)
	binary.BigEndian.PutUint32(header[24:], length)
	if command == wire.CmdRead {
		c.readsMutex.Lock()
		c.reads[cookie] = length
		c.readsMutex.Unlock()
	}
	c.write(append(header, payload...))
}

// reply is one reply message: a simple reply or one structured chunk.
type reply struct {
	cookie     uint64
	structured bool
	errno      wire.Errno // simple replies, and error chunks
	data       []byte
	// structured chunks only:
	flags     uint16
	chunkType uint16
	payload   []byte
	message   string // error chunks
}

func (c *testClient) readReply() reply {
	c.t.Helper()
	magic := binary.BigEndian.Uint32(c.readFull(4))
	switch magic {
	case wire.SimpleReplyMagic:
		rest := c.readFull(12)
		r := reply{errno: wire.Errno(binary.BigEndian.Uint32(rest[0:])), cookie: binary.BigEndian.Uint64(rest[4:])}
		c.readsMutex.Lock()
		length, isRead := c.reads[r.cookie]
		delete(c.reads, r.cookie)
		c.readsMutex.Unlock()
		if isRead && r.errno == wire.NoError {
			r.data = c.readFull(int(length))
		}
		return r
	case wire.StructuredReplyMagic:
		rest := c.readFull(16)
		r := reply{
			structured: true,
			flags:      binary.BigEndian.Uint16(rest[0:]),
			chunkType:  binary.BigEndian.Uint16(rest[2:]),
			cookie:     binary.BigEndian.Uint64(rest[4:]),
		}
		r.payload = c.readFull(int(binary.BigEndian.Uint32(rest[12:])))
		if r.chunkType&(1<<15) != 0 {
			if len(r.payload) < 6 {
				c.t.Fatalf("error chunk of %d bytes", len(r.payload))
			}
			r.errno = wire.Errno(binary.BigEndian.Uint32(r.payload))
			messageLength := int(binary.BigEndian.Uint16(r.payload[4:]))
			if messageLength > len(r.payload)-6 {
				c.t.Fatalf("error chunk message of %d bytes in %d", messageLength, len(r.payload))
			}
			r.message = string(r.payload[6 : 6+messageLength])
		}
		if r.chunkType == wire.ReplyTypeOffsetData {
			r.data = r.payload[8:]
		}
		if r.flags&wire.ReplyFlagDone != 0 {
			c.readsMutex.Lock()
			delete(c.reads, r.cookie)
			c.readsMutex.Unlock()
		}
		return r
	default:
		c.t.Fatalf("reply magic %#x", magic)
		return reply{}
	}
}

// roundTrip sends one request and reads its (single-message) reply.
func (c *testClient) roundTrip(flags, command uint16, offset uint64, length uint32, payload []byte) reply {
	c.t.Helper()
	const cookie = 0xc0c0
	c.sendRequest(flags, command, cookie, offset, length, payload)
	r := c.readReply()
	if r.cookie != cookie {
		c.t.Fatalf("reply cookie %#x, want %#x", r.cookie, cookie)
	}
	if r.structured && r.flags&wire.ReplyFlagDone == 0 {
		c.t.Fatalf("reply chunk without NBD_REPLY_FLAG_DONE; this server sends one chunk per reply")
	}
	return r
}

func (c *testClient) disconnect() {
	c.t.Helper()
	c.sendRequest(0, wire.CmdDisc, 0, 0, 0, nil)
	c.expectClosed()
}

func (r reply) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "cookie=%#x errno=%d", r.cookie, r.errno)
	if r.structured {
		fmt.Fprintf(&b, " chunk=%d flags=%d message=%q", r.chunkType, r.flags, r.message)
	}
	return b.String()
}
