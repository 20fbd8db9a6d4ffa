package nbd

import (
	"bytes"
	"context"
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

	"github.com/herd-storage/herd/internal/nbd/wire"
)

// The fuzz targets feed bytes from outside (what a client sends) to the
// server's decoders: the whole option haggling, the whole transmission
// phase, and the pure option decoders. They check that the server neither
// panics nor hangs, returns every buffer, closes every export once, and, when
// structured replies make the server's output context-free, that the output
// is a well-formed sequence of replies.
//
// Seeds live in testdata/fuzz/<target>/; regenerate them with
//
//	NBD_WRITE_SEED_CORPUS=1 go test -run TestWriteSeedCorpus ./internal/nbd/

// scriptedConn is a net.Conn that reads a fixed client stream and records
// what the server writes.
type scriptedConn struct {
	input *bytes.Reader

	mu     sync.Mutex // guards output and closed
	output bytes.Buffer
	closed bool
}

func newScriptedConn(input []byte) *scriptedConn {
	return &scriptedConn{input: bytes.NewReader(input)}
}

func (c *scriptedConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return 0, net.ErrClosed
	}
	return c.input.Read(p)
}

func (c *scriptedConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, net.ErrClosed
	}
	return c.output.Write(p)
}

func (c *scriptedConn) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	return nil
}

func (c *scriptedConn) written() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return bytes.Clone(c.output.Bytes())
}

type scriptedAddress struct{}

func (scriptedAddress) Network() string { return "scripted" }
func (scriptedAddress) String() string  { return "scripted" }

func (c *scriptedConn) LocalAddr() net.Addr                { return scriptedAddress{} }
func (c *scriptedConn) RemoteAddr() net.Addr               { return scriptedAddress{} }
func (c *scriptedConn) SetDeadline(t time.Time) error      { return nil }
func (c *scriptedConn) SetReadDeadline(t time.Time) error  { return nil }
func (c *scriptedConn) SetWriteDeadline(t time.Time) error { return nil }

// serveScript runs one connection over the scripted client stream and
// checks the server's bookkeeping afterwards. It returns what the server
// wrote.
func serveScript(t *testing.T, input []byte) []byte {
	disk := newMemoryDisk("disk", 1<<20)
	aligned := newMemoryDisk("min512", 1<<20)
	aligned.info.BlockSizeMinimum = 512
	aligned.info.PayloadSizeMaximum = 64 << 10
	aligned.info.CanFastZero = true
	aligned.info.CanFUA = false
	disk.setMeta(contextDepth, []MetaExtent{{Length: 4096, Flags: 1}, {Length: 1<<20 - 4096, Flags: 2}})
	disk.setMeta(contextS1, []MetaExtent{{Length: 1000, Flags: 0}, {Length: 5000, Flags: 1}, {Length: 1<<20 - 6000, Flags: 0}})
	backend := newMemoryBackend(disk, aligned)
	server := &Server{Backend: backend, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	conn := newScriptedConn(input)
	done := make(chan struct{})
	go func() {
		defer close(done)
		newConnection(server, conn).serve(context.Background())
	}()
	select {
	case <-done:
	case <-time.After(testTimeout):
		t.Fatalf("the connection did not end on input %q", input)
	}
	if n := server.buffersOutstanding.Load(); n != 0 {
		t.Fatalf("%d buffers not returned", n)
	}
	for _, d := range []*memoryDisk{disk, aligned} {
		if d.opens.Load() != d.closes.Load() || d.misuses.Load() != 0 {
			t.Fatalf("export %s: %d opens, %d closes, %d misuses", d.name, d.opens.Load(), d.closes.Load(), d.misuses.Load())
		}
	}
	return conn.written()
}

// Client stream builders shared by the seeds and the tests.

func clientOption(option uint32, data []byte) []byte {
	message := binary.BigEndian.AppendUint64(nil, wire.IHaveOptMagic)
	message = binary.BigEndian.AppendUint32(message, option)
	message = binary.BigEndian.AppendUint32(message, uint32(len(data)))
	return append(message, data...)
}

func clientRequest(flags, command uint16, cookie, offset uint64, length uint32, payload []byte) []byte {
	header := make([]byte, wire.RequestHeaderLength)
	binary.BigEndian.PutUint32(header[0:], wire.RequestMagic)
	binary.BigEndian.PutUint16(header[4:], flags)
	binary.BigEndian.PutUint16(header[6:], command)
	binary.BigEndian.PutUint64(header[8:], cookie)
	binary.BigEndian.PutUint64(header[16:], offset)
	binary.BigEndian.PutUint32(header[24:], length)
	return append(header, payload...)
}

func concat(parts ...[]byte) []byte {
	return bytes.Join(parts, nil)
}

var clientFlagsBytes = binary.BigEndian.AppendUint32(nil, wire.FlagCFixedNewstyle|wire.FlagCNoZeroes)

func handshakeSeeds() [][]byte {
	return [][]byte{
		concat(clientFlagsBytes, clientOption(wire.OptGo, exportRequestData("disk", wire.InfoBlockSize)), clientRequest(0, wire.CmdDisc, 0, 0, 0, nil)),
		concat(binary.BigEndian.AppendUint32(nil, 0), clientOption(wire.OptExportName, []byte("disk")), clientRequest(0, wire.CmdRead, 1, 0, 512, nil)),
		concat(clientFlagsBytes, clientOption(wire.OptList, nil), clientOption(wire.OptInfo, exportRequestData("disk", wire.InfoName, wire.InfoDescription)), clientOption(wire.OptAbort, nil)),
		concat(clientFlagsBytes, clientOption(wire.OptStructuredReply, nil),
			clientOption(wire.OptListMetaContext, metaContextData("disk")),
			clientOption(wire.OptSetMetaContext, metaContextData("disk", wire.BaseAllocation)),
			clientOption(wire.OptGo, exportRequestData("disk")),
			clientRequest(wire.CmdFlagReqOne, wire.CmdBlockStatus, 2, 0, 4096, nil)),
		concat(clientFlagsBytes, clientOption(wire.OptStartTLS, nil), clientOption(77, []byte("x")), clientOption(wire.OptGo, exportRequestData("missing"))),
		concat(clientFlagsBytes, clientOption(wire.OptGo, []byte{0, 0, 0, 9, 'd'})),
		concat(clientFlagsBytes, clientOption(wire.OptSetMetaContext, []byte{0, 0, 0, 4, 'd', 'i', 's', 'k', 0xff, 0xff, 0xff, 0xff})),
		concat(clientFlagsBytes, binary.BigEndian.AppendUint64(nil, wire.IHaveOptMagic), []byte{0, 0, 0, 7, 0x7f, 0xff, 0xff, 0xff}),
		concat(clientFlagsBytes, []byte("IHAVEOPU")),
		{0xff, 0xff, 0xff, 0xff},
		concat(clientFlagsBytes, clientOption(wire.OptStructuredReply, nil),
			clientOption(wire.OptListMetaContext, metaContextData("disk", "qemu:")),
			clientOption(wire.OptListMetaContext, metaContextData("disk@s2", "qemu:dirty-bitmap:", "base:")),
			clientOption(wire.OptSetMetaContext, metaContextData("disk", wire.BaseAllocation, contextDepth, contextS1, "qemu:dirty-bitmap:nope")),
			clientOption(wire.OptGo, exportRequestData("disk")),
			clientRequest(wire.CmdFlagReqOne, wire.CmdBlockStatus, 2, 0, 4096, nil),
			clientRequest(0, wire.CmdBlockStatus, 3, 100, 1<<20-100, nil)),
		concat(clientFlagsBytes, clientOption(wire.OptStructuredReply, nil),
			clientOption(wire.OptSetMetaContext, metaContextData("min512", contextS1)),
			clientOption(wire.OptGo, exportRequestData("disk")),
			clientRequest(0, wire.CmdBlockStatus, 2, 0, 4096, nil)),
	}
}

// requestSeeds are request streams; the first byte selects the handshake
// (see transmissionPrefix).
func requestSeeds() [][]byte {
	data := pattern(5, 1000)
	return [][]byte{
		concat([]byte{1},
			clientRequest(0, wire.CmdWrite, 1, 100, uint32(len(data)), data),
			clientRequest(wire.CmdFlagDF, wire.CmdRead, 2, 100, 1000, nil),
			clientRequest(wire.CmdFlagFUA, wire.CmdFlush, 3, 0, 0, nil),
			clientRequest(wire.CmdFlagFUA, wire.CmdTrim, 4, 0, 8192, nil),
			clientRequest(wire.CmdFlagNoHole, wire.CmdWriteZeroes, 5, 4096, 4096, nil),
			clientRequest(0, wire.CmdBlockStatus, 6, 0, 1<<20, nil),
			clientRequest(0, wire.CmdCache, 7, 0, 4096, nil),
			clientRequest(0, wire.CmdDisc, 8, 0, 0, nil)),
		concat([]byte{0},
			clientRequest(0, wire.CmdWrite, 1, 0, 4, []byte{1, 2, 3, 4}),
			clientRequest(0, wire.CmdRead, 2, 0, 4, nil),
			clientRequest(0, wire.CmdRead, 3, 1<<20, 4, nil)),
		concat([]byte{3},
			clientRequest(wire.CmdFlagFastZero, wire.CmdWriteZeroes, 1, 0, 512, nil),
			clientRequest(0, wire.CmdRead, 2, 1, 512, nil),
			clientRequest(0, wire.CmdWrite, 3, 0, 128<<10, make([]byte, 128<<10)),
			clientRequest(0, wire.CmdRead, 4, 0, 128<<10, nil),
			clientRequest(0, 42, 5, 0, 0, nil)),
		concat([]byte{1},
			clientRequest(0xffff, wire.CmdRead, 1, 0, 512, nil),
			clientRequest(0, wire.CmdWrite, 2, 1<<64-1, 2, []byte{1, 2}),
			clientRequest(0, wire.CmdBlockStatus, 3, 0, 0, nil)),
		concat([]byte{0}, clientRequest(0, wire.CmdWrite, 1, 0, 1<<20, []byte("short"))),
		concat([]byte{1}, []byte("garbage that is not a request at all")),
		concat([]byte{5},
			clientRequest(0, wire.CmdWrite, 1, 0, 4, []byte{1, 2, 3, 4}),
			clientRequest(0, wire.CmdBlockStatus, 2, 0, 1<<20, nil),
			clientRequest(wire.CmdFlagReqOne, wire.CmdBlockStatus, 3, 2000, 100, nil),
			clientRequest(wire.CmdFlagReqOne, wire.CmdBlockStatus, 4, 1<<20-1, 1, nil)),
	}
}

// transmissionPrefix negotiates according to mode: bit 0 structured
// replies and base:allocation, bit 1 the "min512" export (minimum block size
// 512, 64 KiB payloads, fast zero, no FUA), bit 2 (with bit 0) the
// metadata contexts qemu:allocation-depth and qemu:dirty-bitmap:s1 too
// (which "disk" serves and "min512" does not).
func transmissionPrefix(mode byte) []byte {
	name := "disk"
	if mode&2 != 0 {
		name = "min512"
	}
	prefix := concat(clientFlagsBytes)
	if mode&1 != 0 {
		queries := []string{wire.BaseAllocation}
		if mode&4 != 0 {
			queries = append(queries, contextDepth, contextS1)
		}
		prefix = concat(prefix,
			clientOption(wire.OptStructuredReply, nil),
			clientOption(wire.OptSetMetaContext, metaContextData(name, queries...)))
	}
	return concat(prefix, clientOption(wire.OptGo, exportRequestData(name)))
}

func FuzzOptionHaggling(f *testing.F) {
	for _, seed := range handshakeSeeds() {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, input []byte) {
		output := serveScript(t, input)
		// The greeting always comes first, whatever the client sends.
		if len(output) < 18 || binary.BigEndian.Uint64(output) != wire.NBDMagic {
			t.Fatalf("no greeting in %q", output)
		}
	})
}

func FuzzRequests(f *testing.F) {
	for _, seed := range requestSeeds() {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, input []byte) {
		if len(input) == 0 {
			return
		}
		mode := input[0]
		prefix := transmissionPrefix(mode)
		output := serveScript(t, concat(prefix, input[1:]))
		if mode&1 == 0 {
			return
		}
		// With structured replies every reply is self-describing: the
		// output after the handshake must parse exactly.
		handshake := serveScript(t, prefix)
		if !bytes.HasPrefix(output, handshake) {
			t.Fatalf("handshake output differs")
		}
		if err := checkStructuredStream(output[len(handshake):]); err != nil {
			t.Fatalf("%v in %q", err, output[len(handshake):])
		}
	})
}

// checkStructuredStream parses server output made of simple replies without
// payload and structured reply chunks.
// Every chunk is final but block status chunks, which may be followed by
// more for the same request (one per metadata context).
func checkStructuredStream(stream []byte) error {
	open := map[uint64]bool{} // cookies of replies not yet final
	for len(stream) > 0 {
		if len(stream) < 4 {
			return fmt.Errorf("truncated reply")
		}
		switch binary.BigEndian.Uint32(stream) {
		case wire.SimpleReplyMagic:
			if len(stream) < wire.SimpleReplyHeaderLength {
				return fmt.Errorf("truncated simple reply")
			}
			stream = stream[wire.SimpleReplyHeaderLength:]
		case wire.StructuredReplyMagic:
			if len(stream) < wire.StructuredReplyHeaderLength {
				return fmt.Errorf("truncated chunk header")
			}
			flags := binary.BigEndian.Uint16(stream[4:])
			chunkType := binary.BigEndian.Uint16(stream[6:])
			cookie := binary.BigEndian.Uint64(stream[8:])
			length := int(binary.BigEndian.Uint32(stream[16:]))
			if len(stream) < wire.StructuredReplyHeaderLength+length {
				return fmt.Errorf("truncated chunk payload")
			}
			payload := stream[wire.StructuredReplyHeaderLength : wire.StructuredReplyHeaderLength+length]
			if flags != wire.ReplyFlagDone && (flags != 0 || chunkType != wire.ReplyTypeBlockStatus) {
				return fmt.Errorf("chunk flags %#x", flags)
			}
			if flags == 0 {
				open[cookie] = true
			} else {
				delete(open, cookie)
			}
			switch chunkType {
			case wire.ReplyTypeNone:
				if length != 0 {
					return fmt.Errorf("NBD_REPLY_TYPE_NONE with payload")
				}
			case wire.ReplyTypeOffsetData:
				if length < 9 {
					return fmt.Errorf("data chunk of %d bytes", length)
				}
			case wire.ReplyTypeBlockStatus:
				if length < 12 || (length-4)%8 != 0 {
					return fmt.Errorf("block status chunk of %d bytes", length)
				}
				for rest := payload[4:]; len(rest) > 0; rest = rest[8:] {
					if binary.BigEndian.Uint32(rest) == 0 {
						return fmt.Errorf("empty extent")
					}
				}
			case wire.ReplyTypeError:
				if length < 6 || int(binary.BigEndian.Uint16(payload[4:])) != length-6 || binary.BigEndian.Uint32(payload) == 0 {
					return fmt.Errorf("malformed error chunk")
				}
			default:
				return fmt.Errorf("chunk type %d", chunkType)
			}
			stream = stream[wire.StructuredReplyHeaderLength+length:]
		default:
			return fmt.Errorf("reply magic %#x", binary.BigEndian.Uint32(stream))
		}
	}
	if len(open) != 0 {
		return fmt.Errorf("replies without a final chunk: %v", open)
	}
	return nil
}

// FuzzOptionDecoders checks the pure option decoders: no panic, and a
// decoded option re-encodes to the same bytes.
func FuzzOptionDecoders(f *testing.F) {
	f.Add(exportRequestData("disk", wire.InfoName, wire.InfoBlockSize))
	f.Add(exportRequestData(""))
	f.Add(metaContextData("disk", "base:allocation", "qemu:x"))
	f.Add(metaContextData(""))
	f.Add([]byte{0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, data []byte) {
		if request, err := parseExportRequest(data); err == nil {
			if again := exportRequestData(request.name, request.information...); !bytes.Equal(again, data) {
				t.Fatalf("export request %q re-encodes to %q", data, again)
			}
		}
		if request, err := parseMetaContextRequest(data); err == nil {
			if again := metaContextData(request.exportName, request.queries...); !bytes.Equal(again, data) {
				t.Fatalf("meta context request %q re-encodes to %q", data, again)
			}
		}
		if len(data) >= wire.OptionHeaderLength {
			decodeOptionHeader(data[:wire.OptionHeaderLength])
		}
		if len(data) >= wire.RequestHeaderLength {
			if r, err := decodeRequestHeader(data[:wire.RequestHeaderLength]); err == nil {
				if again := clientRequest(r.Flags, r.Type, r.Cookie, r.Offset, r.Length, nil); !bytes.Equal(again, data[:wire.RequestHeaderLength]) {
					t.Fatalf("request %q re-encodes to %q", data[:wire.RequestHeaderLength], again)
				}
			}
		}
	})
}

// TestScriptedSeeds runs every seed as a normal test too, so they are
// checked on every `go test`, not only when fuzzing.
func TestScriptedSeeds(t *testing.T) {
	for i, seed := range handshakeSeeds() {
		t.Run(fmt.Sprintf("handshake-%d", i), func(t *testing.T) { serveScript(t, seed) })
	}
	for i, seed := range requestSeeds() {
		t.Run(fmt.Sprintf("requests-%d", i), func(t *testing.T) {
			output := serveScript(t, concat(transmissionPrefix(seed[0]), seed[1:]))
			if seed[0]&1 != 0 {
				handshake := serveScript(t, transmissionPrefix(seed[0]))
				if err := checkStructuredStream(output[len(handshake):]); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// TestWriteSeedCorpus writes the seeds to testdata/fuzz in the format of
// `go test -fuzz`, when NBD_WRITE_SEED_CORPUS is set.
func TestWriteSeedCorpus(t *testing.T) {
	if os.Getenv("NBD_WRITE_SEED_CORPUS") == "" {
		// Not a missing prerequisite: a generator that runs on request.
		t.Skip("set NBD_WRITE_SEED_CORPUS=1 to rewrite testdata/fuzz")
	}
	write := func(target string, seeds [][]byte) {
		directory := filepath.Join("testdata", "fuzz", target)
		if err := os.MkdirAll(directory, 0o755); err != nil {
			t.Fatal(err)
		}
		for i, seed := range seeds {
			contents := "go test fuzz v1\n[]byte(" + strconv.Quote(string(seed)) + ")\n"
			if err := os.WriteFile(filepath.Join(directory, fmt.Sprintf("seed-%02d", i)), []byte(contents), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	write("FuzzOptionHaggling", handshakeSeeds())
	write("FuzzRequests", requestSeeds())
	write("FuzzOptionDecoders", [][]byte{
		exportRequestData("disk", wire.InfoName, wire.InfoBlockSize),
		metaContextData("disk", "base:allocation", "qemu:x"),
		clientRequest(wire.CmdFlagFUA, wire.CmdWrite, 1, 2, 3, nil),
	})
}
