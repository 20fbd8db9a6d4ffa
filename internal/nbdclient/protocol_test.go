package nbdclient

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/nbd/wire"
)

// This file tests the client against scripted servers that send exactly the
// bytes a test wants, valid or not.

// script describes a server's side of the handshake with a default Dialer.
type script struct {
	size        uint64
	flags       uint16 // transmission flags
	noStructure bool   // refuse NBD_OPT_STRUCTURED_REPLY
	contextName string // the meta context the server selects; "" for none
	contextID   uint32
	// extra are more contexts the server selects, after contextName.
	extra     []selectedContext
	goUnsup   bool // refuse NBD_OPT_GO: the client falls back to EXPORT_NAME
	blockSize []uint32
	// noExportInfo leaves out the mandatory NBD_INFO_EXPORT.
	noExportInfo bool
}

type selectedContext struct {
	name string
	id   uint32
}

func defaultScript() script {
	return script{size: 1 << 20, flags: wire.FlagHasFlags | wire.FlagSendFlush | wire.FlagSendFUA | wire.FlagSendTrim | wire.FlagSendWriteZeroes,
		contextName: wire.BaseAllocation, contextID: 7, blockSize: []uint32{1, 4096, 1 << 20}}
}

func optionReply(option, replyType uint32, data ...[]byte) []byte {
	payload := bytes.Join(data, nil)
	out := binary.BigEndian.AppendUint64(nil, wire.OptionReplyMagic)
	out = binary.BigEndian.AppendUint32(out, option)
	out = binary.BigEndian.AppendUint32(out, replyType)
	out = binary.BigEndian.AppendUint32(out, uint32(len(payload)))
	return append(out, payload...)
}

func be16(v uint16) []byte { return binary.BigEndian.AppendUint16(nil, v) }
func be32(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }
func be64(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }

// bytes is the server's whole handshake output, in the order the client
// asks: greeting, STRUCTURED_REPLY, SET_META_CONTEXT, GO.
func (s script) bytes() []byte {
	out := be64(wire.NBDMagic)
	out = append(out, be64(wire.IHaveOptMagic)...)
	out = append(out, be16(wire.FlagFixedNewstyle|wire.FlagNoZeroes)...)
	if s.noStructure {
		out = append(out, optionReply(wire.OptStructuredReply, wire.RepErrUnsup)...)
	} else {
		out = append(out, optionReply(wire.OptStructuredReply, wire.RepAck)...)
		if s.contextName != "" {
			out = append(out, optionReply(wire.OptSetMetaContext, wire.RepMetaContext, be32(s.contextID), []byte(s.contextName))...)
		}
		for _, extra := range s.extra {
			out = append(out, optionReply(wire.OptSetMetaContext, wire.RepMetaContext, be32(extra.id), []byte(extra.name))...)
		}
		out = append(out, optionReply(wire.OptSetMetaContext, wire.RepAck)...)
	}
	if s.goUnsup {
		out = append(out, optionReply(wire.OptGo, wire.RepErrUnsup)...)
		out = append(out, be64(s.size)...)
		return append(out, be16(s.flags)...)
	}
	if !s.noExportInfo {
		out = append(out, optionReply(wire.OptGo, wire.RepInfo, be16(wire.InfoExport), be64(s.size), be16(s.flags))...)
	}
	if s.blockSize != nil {
		out = append(out, optionReply(wire.OptGo, wire.RepInfo, be16(wire.InfoBlockSize), be32(s.blockSize[0]), be32(s.blockSize[1]), be32(s.blockSize[2]))...)
	}
	return append(out, optionReply(wire.OptGo, wire.RepAck)...)
}

// request is what the scripted server read.
type request struct {
	flags, command uint16
	handle, offset uint64
	length         uint32
}

// scriptedServer serves one connection: it sends handshake, reads the
// client's options up to GO or EXPORT_NAME, then calls answer for every
// request with a writer for the reply; answer returns false to hang up. A
// nil answer ends the stream right after handshake.
func scriptedServer(t *testing.T, handshake []byte, answer func(request, io.Writer) bool) string {
	t.Helper()
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { listener.Close(); <-done })
	go func() {
		defer close(done)
		conn, err := listener.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(testTimeout))
		if _, err := conn.Write(handshake); err != nil {
			return
		}
		if answer == nil {
			// Only the handshake bytes: end of stream after them, then
			// wait for the client to hang up.
			conn.(*net.TCPConn).CloseWrite()
			io.Copy(io.Discard, conn)
			return
		}
		var flags [4]byte
		if _, err := io.ReadFull(conn, flags[:]); err != nil {
			return
		}
		for {
			var header [wire.OptionHeaderLength]byte
			if _, err := io.ReadFull(conn, header[:]); err != nil {
				return
			}
			option := binary.BigEndian.Uint32(header[8:])
			if _, err := io.CopyN(io.Discard, conn, int64(binary.BigEndian.Uint32(header[12:]))); err != nil {
				return
			}
			if option == wire.OptExportName || (option == wire.OptGo && !bytes.Contains(handshake, optionReply(wire.OptGo, wire.RepErrUnsup))) {
				break
			}
		}
		for {
			var header [wire.RequestHeaderLength]byte
			if _, err := io.ReadFull(conn, header[:]); err != nil {
				return
			}
			r := request{
				flags: binary.BigEndian.Uint16(header[4:]), command: binary.BigEndian.Uint16(header[6:]),
				handle: binary.BigEndian.Uint64(header[8:]), offset: binary.BigEndian.Uint64(header[16:]),
				length: binary.BigEndian.Uint32(header[24:]),
			}
			if r.command == wire.CmdWrite {
				io.CopyN(io.Discard, conn, int64(r.length))
			}
			if r.command == wire.CmdDisc || !answer(r, conn) {
				return
			}
		}
	}()
	return listener.Addr().String()
}

func simple(errno uint32, handle uint64, data []byte) []byte {
	out := be32(wire.SimpleReplyMagic)
	out = append(out, be32(errno)...)
	out = append(out, be64(handle)...)
	return append(out, data...)
}

func chunk(flags, chunkType uint16, handle uint64, payload ...[]byte) []byte {
	data := bytes.Join(payload, nil)
	out := be32(wire.StructuredReplyMagic)
	out = append(out, be16(flags)...)
	out = append(out, be16(chunkType)...)
	out = append(out, be64(handle)...)
	out = append(out, be32(uint32(len(data)))...)
	return append(out, data...)
}

func TestStructuredRead(t *testing.T) {
	data := bytes.Repeat([]byte{0xab}, 4096)
	address := scriptedServer(t, defaultScript().bytes(), func(r request, w io.Writer) bool {
		// The hole first, then the data, then an empty final chunk.
		w.Write(chunk(0, wire.ReplyTypeOffsetHole, r.handle, be64(r.offset+4096), be32(4096)))
		w.Write(chunk(0, wire.ReplyTypeOffsetData, r.handle, be64(r.offset), data))
		w.Write(chunk(wire.ReplyFlagDone, wire.ReplyTypeNone, r.handle))
		return true
	})
	c := dial(t, nil, address, "vm1")
	if !c.CanBlockStatus() || c.allocationID != 7 {
		t.Errorf("meta context not recorded: %+v", c.negotiated)
	}
	got := bytes.Repeat([]byte{0xff}, 8192)
	if err := c.ReadAt(testContext(t), got, 4096); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got[:4096], data) || !bytes.Equal(got[4096:], make([]byte, 4096)) {
		t.Error("data and hole chunks not assembled")
	}
}

func TestErrorChunks(t *testing.T) {
	address := scriptedServer(t, defaultScript().bytes(), func(r request, w io.Writer) bool {
		switch r.command {
		case wire.CmdRead:
			// Part of the data, then an error at an offset inside it.
			w.Write(chunk(0, wire.ReplyTypeOffsetData, r.handle, be64(r.offset), make([]byte, 10)))
			w.Write(chunk(wire.ReplyFlagDone, wire.ReplyTypeErrorOffset, r.handle, be32(5), be16(12), []byte("sector died"+"!"), be64(r.offset+3)))
		case wire.CmdWrite:
			// An error type this client does not know: still an error.
			w.Write(chunk(wire.ReplyFlagDone, wire.ReplyTypeErrorBit+99, r.handle, be32(28), be16(4), []byte("full"), []byte("extra")))
		case wire.CmdFlush:
			w.Write(simple(0, r.handle, nil))
		}
		return true
	})
	c := dial(t, nil, address, "vm1")
	ctx := testContext(t)
	err := c.ReadAt(ctx, make([]byte, 100), 0)
	var commandError *Error
	if !errors.As(err, &commandError) || commandError.Errno != 5 || commandError.Message != "sector died!" ||
		!commandError.HasErrorOffset || commandError.ErrorOffset != 3 {
		t.Errorf("read: %v (%+v)", err, commandError)
	}
	if err := c.WriteAt(ctx, []byte{1}, 0, 0); !errors.As(err, &commandError) || commandError.Errno != 28 || commandError.Message != "full" {
		t.Errorf("write: %v", err)
	}
	if err := c.Flush(ctx); err != nil {
		t.Errorf("flush after errors: %v", err)
	}
}

// TestProtocolViolations: every broken reply fails the request with
// ErrProtocol and closes the connection, without a panic or a hang.
func TestProtocolViolations(t *testing.T) {
	cases := map[string]func(r request) []byte{
		"bad magic": func(r request) []byte { return []byte("HTTP/1.1 400 Bad Request\r\n\r\n") },
		"unknown handle": func(r request) []byte {
			return chunk(wire.ReplyFlagDone, wire.ReplyTypeOffsetData, r.handle+1, be64(r.offset), make([]byte, r.length))
		},
		"simple reply to a structured read": func(r request) []byte { return simple(0, r.handle, make([]byte, r.length)) },
		"data before the request": func(r request) []byte {
			return chunk(wire.ReplyFlagDone, wire.ReplyTypeOffsetData, r.handle, be64(r.offset-1), make([]byte, r.length))
		},
		"data past the request": func(r request) []byte {
			return chunk(wire.ReplyFlagDone, wire.ReplyTypeOffsetData, r.handle, be64(r.offset+1), make([]byte, r.length))
		},
		"data longer than the request": func(r request) []byte {
			return chunk(wire.ReplyFlagDone, wire.ReplyTypeOffsetData, r.handle, be64(r.offset), make([]byte, r.length+1))
		},
		"offset overflow": func(r request) []byte {
			return chunk(wire.ReplyFlagDone, wire.ReplyTypeOffsetHole, r.handle, be64(1<<64-10), be32(100))
		},
		"overlapping chunks": func(r request) []byte {
			return append(chunk(0, wire.ReplyTypeOffsetHole, r.handle, be64(r.offset), be32(r.length)),
				chunk(wire.ReplyFlagDone, wire.ReplyTypeOffsetData, r.handle, be64(r.offset+10), make([]byte, 1))...)
		},
		"incomplete read": func(r request) []byte {
			return append(chunk(0, wire.ReplyTypeOffsetHole, r.handle, be64(r.offset), be32(r.length-1)),
				chunk(wire.ReplyFlagDone, wire.ReplyTypeNone, r.handle)...)
		},
		"empty hole": func(r request) []byte {
			return chunk(wire.ReplyFlagDone, wire.ReplyTypeOffsetHole, r.handle, be64(r.offset), be32(0))
		},
		"short hole chunk": func(r request) []byte {
			return chunk(wire.ReplyFlagDone, wire.ReplyTypeOffsetHole, r.handle, be64(r.offset))
		},
		"none without done": func(r request) []byte {
			return chunk(0, wire.ReplyTypeNone, r.handle)
		},
		"none with data": func(r request) []byte { return chunk(wire.ReplyFlagDone, wire.ReplyTypeNone, r.handle, []byte{0}) },
		"unknown chunk type": func(r request) []byte {
			return chunk(wire.ReplyFlagDone, 77, r.handle, []byte{1, 2, 3})
		},
		"block status in a read reply": func(r request) []byte {
			return chunk(wire.ReplyFlagDone, wire.ReplyTypeBlockStatus, r.handle, be32(7), be32(r.length), be32(0))
		},
		"error message longer than the chunk": func(r request) []byte {
			return chunk(wire.ReplyFlagDone, wire.ReplyTypeError, r.handle, be32(5), be16(100), []byte("short"))
		},
		"error value zero": func(r request) []byte {
			return chunk(wire.ReplyFlagDone, wire.ReplyTypeError, r.handle, be32(0), be16(0))
		},
		"error offset outside": func(r request) []byte {
			return chunk(wire.ReplyFlagDone, wire.ReplyTypeErrorOffset, r.handle, be32(5), be16(0), be64(r.offset+uint64(r.length)))
		},
		"truncated reply": func(r request) []byte {
			return chunk(wire.ReplyFlagDone, wire.ReplyTypeOffsetData, r.handle, be64(r.offset), make([]byte, r.length))[:30]
		},
	}
	for name, reply := range cases {
		t.Run(name, func(t *testing.T) {
			address := scriptedServer(t, defaultScript().bytes(), func(r request, w io.Writer) bool {
				w.Write(reply(r))
				return name != "truncated reply"
			})
			c, err := Dial(testContext(t), address, "vm1")
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			err = c.ReadAt(testContext(t), make([]byte, 512), 4096)
			want := ErrProtocol
			if name == "truncated reply" {
				want = ErrClosed
			}
			if !errors.Is(err, want) {
				t.Fatalf("read: %v, want %v", err, want)
			}
			if err := c.ReadAt(testContext(t), make([]byte, 1), 0); !errors.Is(err, ErrClosed) {
				t.Errorf("read after a violation: %v", err)
			}
		})
	}
}

func TestBlockStatusViolations(t *testing.T) {
	cases := map[string]func(r request) []byte{
		"wrong context": func(r request) []byte {
			return chunk(wire.ReplyFlagDone, wire.ReplyTypeBlockStatus, r.handle, be32(8), be32(r.length), be32(0))
		},
		"empty descriptor": func(r request) []byte {
			return chunk(wire.ReplyFlagDone, wire.ReplyTypeBlockStatus, r.handle, be32(7), be32(0), be32(0))
		},
		"no descriptor": func(r request) []byte { return chunk(wire.ReplyFlagDone, wire.ReplyTypeBlockStatus, r.handle, be32(7)) },
		"descriptors past the end": func(r request) []byte {
			return chunk(wire.ReplyFlagDone, wire.ReplyTypeBlockStatus, r.handle, be32(7), be32(r.length), be32(0), be32(1), be32(0))
		},
		"two chunks": func(r request) []byte {
			return append(chunk(0, wire.ReplyTypeBlockStatus, r.handle, be32(7), be32(1), be32(0)),
				chunk(wire.ReplyFlagDone, wire.ReplyTypeBlockStatus, r.handle, be32(7), be32(1), be32(0))...)
		},
		"no status chunk": func(r request) []byte { return chunk(wire.ReplyFlagDone, wire.ReplyTypeNone, r.handle) },
		"simple success":  func(r request) []byte { return simple(0, r.handle, nil) },
		"ragged length": func(r request) []byte {
			return chunk(wire.ReplyFlagDone, wire.ReplyTypeBlockStatus, r.handle, be32(7), be32(1), be32(0), []byte{0})
		},
		"data for a block": func(r request) []byte {
			return chunk(wire.ReplyFlagDone, wire.ReplyTypeOffsetData, r.handle, be64(r.offset), []byte{0})
		},
	}
	for name, reply := range cases {
		t.Run(name, func(t *testing.T) {
			address := scriptedServer(t, defaultScript().bytes(), func(r request, w io.Writer) bool {
				w.Write(reply(r))
				return true
			})
			c, err := Dial(testContext(t), address, "vm1")
			if err != nil {
				t.Fatal(err)
			}
			if _, err := c.BlockStatus(testContext(t), 0, 65536); !errors.Is(err, ErrProtocol) {
				t.Fatalf("block status: %v", err)
			}
			if err := c.Close(); !errors.Is(err, ErrProtocol) {
				t.Errorf("close after a violation: %v", err)
			}
		})
	}
}

// TestBlockStatusShortAnswers: a server may describe less than asked, and
// its last descriptor may reach past the request; BlockStatus asks again
// and cuts.
func TestBlockStatusShortAnswers(t *testing.T) {
	address := scriptedServer(t, defaultScript().bytes(), func(r request, w io.Writer) bool {
		// Describe 1000 bytes per answer, the last one reaching past.
		length := min(uint32(1000), r.length)
		if r.length < 1000 {
			length = r.length + 5000
		}
		w.Write(chunk(wire.ReplyFlagDone, wire.ReplyTypeBlockStatus, r.handle, be32(7), be32(length), be32(wire.StateHole|wire.StateZero|1<<20)))
		return true
	})
	c := dial(t, nil, address, "vm1")
	extents, err := c.BlockStatus(testContext(t), 100, 4500)
	if err != nil {
		t.Fatal(err)
	}
	if len(extents) != 1 || extents[0] != (Extent{Length: 4500, Hole: true, Zero: true}) {
		t.Errorf("extents %v", extents)
	}
}

func TestHandshakeVariants(t *testing.T) {
	t.Run("export name fallback", func(t *testing.T) {
		s := defaultScript()
		s.goUnsup = true
		s.size = 12345
		c := dial(t, nil, scriptedServer(t, s.bytes(), func(request, io.Writer) bool { return true }), "vm1")
		if c.Size() != 12345 || !c.CanTrim() {
			t.Errorf("after EXPORT_NAME: %+v", c.negotiated)
		}
	})
	t.Run("no structured replies", func(t *testing.T) {
		s := defaultScript()
		s.noStructure = true
		address := scriptedServer(t, s.bytes(), func(r request, w io.Writer) bool {
			w.Write(simple(0, r.handle, bytes.Repeat([]byte{9}, int(r.length))))
			return true
		})
		c := dial(t, nil, address, "vm1")
		got := make([]byte, 100)
		if err := c.ReadAt(testContext(t), got, 0); err != nil || !bytes.Equal(got, bytes.Repeat([]byte{9}, 100)) {
			t.Errorf("simple read: %v", err)
		}
	})
	bad := map[string]struct {
		build func(s *script) []byte
		want  string
	}{
		"not nbd": {func(s *script) []byte { return []byte("SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n") }, "is this an NBD server?"},
		"oldstyle": {func(s *script) []byte {
			return append(append(be64(wire.NBDMagic), be64(wire.CliservMagic)...), be64(1<<20)...)
		}, "oldstyle"},
		"not fixed newstyle":  {func(s *script) []byte { return append(s.bytes()[:16], 0, 0) }, "fixed newstyle"},
		"bad block sizes":     {func(s *script) []byte { s.blockSize = []uint32{3, 4096, 1 << 20}; return s.bytes() }, "minimum block size 3"},
		"maximum below min":   {func(s *script) []byte { s.blockSize = []uint32{4096, 4096, 512}; return s.bytes() }, "maximum block size 512"},
		"unrequested context": {func(s *script) []byte { s.contextName = "qemu:dirty-bitmap:x"; return s.bytes() }, "was not requested"},
		"no has-flags":        {func(s *script) []byte { s.flags = wire.FlagSendFlush; return s.bytes() }, "NBD_FLAG_HAS_FLAGS"},
		"truncated":           {func(s *script) []byte { return s.bytes()[:60] }, "closed the connection during the handshake"},
		"oversized reply": {func(s *script) []byte {
			return append(s.bytes()[:18], optionReply(wire.OptStructuredReply, wire.RepAck, make([]byte, 100<<10))...)
		}, "option reply of 102400 bytes"},
		"wrong option echoed": {func(s *script) []byte {
			return append(s.bytes()[:18], optionReply(wire.OptGo, wire.RepAck)...)
		}, "reply to option 7 while option 8 was sent"},
		"go without export info": {func(s *script) []byte { s.noExportInfo = true; return s.bytes() }, "without NBD_INFO_EXPORT"},
	}
	for name, c := range bad {
		t.Run(name, func(t *testing.T) {
			s := defaultScript()
			address := scriptedServer(t, c.build(&s), nil)
			conn, err := Dial(testContext(t), address, "vm1")
			if err == nil {
				conn.Close()
				t.Fatal("handshake succeeded")
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %q does not say %q", err, c.want)
			}
		})
	}
}

// TestSilentServer: a server that accepts and says nothing cannot hold Dial,
// and one that stops answering cannot hold a request, past the context.
func TestSilentServer(t *testing.T) {
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer listener.Close()
	go func() {
		for {
			conn, err := listener.Accept()
			if err != nil {
				return
			}
			defer conn.Close()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	started := time.Now()
	if _, err := Dial(ctx, listener.Addr().String(), "vm1"); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("dial a silent server: %v", err)
	}
	if elapsed := time.Since(started); elapsed > 5*time.Second {
		t.Errorf("dial took %v", elapsed)
	}

	address := scriptedServer(t, defaultScript().bytes(), func(request, io.Writer) bool { return true })
	c := dial(t, nil, address, "vm1")
	ctx, cancel = context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := c.ReadAt(ctx, make([]byte, 10), 0); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("read from a silent server: %v", err)
	}
}

// TestShutdownReply: after ESHUTDOWN the client refuses new requests and
// disconnects.
func TestShutdownReply(t *testing.T) {
	address := scriptedServer(t, defaultScript().bytes(), func(r request, w io.Writer) bool {
		w.Write(chunk(wire.ReplyFlagDone, wire.ReplyTypeError, r.handle, be32(uint32(wire.ESHUTDOWN)), be16(8), []byte("stopping")))
		return true
	})
	c := dial(t, nil, address, "vm1")
	if err := c.Flush(testContext(t)); !errors.Is(err, syscall.ESHUTDOWN) {
		t.Fatalf("flush: %v", err)
	}
	err := c.Flush(testContext(t))
	if !errors.Is(err, ErrClosed) || !strings.Contains(err.Error(), "shutting down") {
		t.Errorf("request after ESHUTDOWN: %v", err)
	}
}
