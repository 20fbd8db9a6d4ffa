package nbdclient

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/nbd/wire"
)

// fuzzConn is a net.Conn whose peer sends fixed bytes and swallows
// everything written.
type fuzzConn struct {
	reader *bytes.Reader
}

func (c *fuzzConn) Read(p []byte) (int, error)         { return c.reader.Read(p) }
func (c *fuzzConn) Write(p []byte) (int, error)        { return len(p), nil }
func (c *fuzzConn) Close() error                       { return nil }
func (c *fuzzConn) LocalAddr() net.Addr                { return &net.TCPAddr{} }
func (c *fuzzConn) RemoteAddr() net.Addr               { return &net.TCPAddr{} }
func (c *fuzzConn) SetDeadline(t time.Time) error      { return nil }
func (c *fuzzConn) SetReadDeadline(t time.Time) error  { return nil }
func (c *fuzzConn) SetWriteDeadline(t time.Time) error { return nil }

// fuzzCalls are the requests in flight while the fuzzed replies are read.
// Their handles are 1 to 5, so that the fuzzer can hit them.
func fuzzCalls() []*call {
	return []*call{
		{command: wire.CmdRead, offset: 4096, length: 4096, buffer: make([]byte, 4096)},
		{command: wire.CmdBlockStatus, offset: 0, length: 1 << 20, want: 7},
		{command: wire.CmdWrite, offset: 512, length: 100},
		{command: wire.CmdFlush},
		{command: wire.CmdRead, offset: 1<<20 - 100, length: 100, buffer: make([]byte, 100)},
	}
}

// FuzzReplies feeds arbitrary bytes to the reply reader of a connection with
// five requests in flight: it must end with an error (never panic or spin),
// finish every request, and only ever report success for replies that
// describe the whole request. Minimising this target's new inputs is slow:
// run it with -fuzzminimizetime=2s or so, else it seems to stall.
func FuzzReplies(f *testing.F) {
	for _, seed := range replySeeds() {
		f.Add(false, seed)
	}
	f.Add(true, simple(0, 1, make([]byte, 4096)))
	f.Add(true, append(simple(5, 3, nil), simple(0, 4, nil)...))
	f.Fuzz(func(t *testing.T, simpleReplies bool, data []byte) {
		state := negotiated{exportName: "vm1", size: 1 << 20, flags: wire.FlagHasFlags | wire.FlagSendFlush,
			structuredReplies: !simpleReplies, blockStatus: !simpleReplies, allocationID: 7,
			blockSizeMinimum: 1, blockSizePreferred: 4096, payloadMaximum: 32 << 20}
		netConn := &fuzzConn{reader: bytes.NewReader(data)}
		c := newConnState(netConn, netConn, state)
		calls := fuzzCalls()
		for _, call := range calls {
			if err := c.register(call); err != nil {
				t.Fatal(err)
			}
		}
		err := c.readReplies()
		if err == nil {
			t.Fatal("readReplies returned nil")
		}
		c.fail(err)
		close(c.readerDone) // as readLoop does; lets a disconnect started by ESHUTDOWN end
		for _, call := range calls {
			select {
			case <-call.done:
			default:
				t.Fatalf("call %d was not finished", call.handle)
			}
			if call.err != nil {
				continue
			}
			switch call.command {
			case wire.CmdRead:
				if call.coveredBytes != uint64(call.length) {
					t.Fatalf("read reported success with %d of %d bytes", call.coveredBytes, call.length)
				}
			case wire.CmdBlockStatus:
				var total uint64
				for _, extent := range call.extents {
					if extent.Length == 0 {
						t.Fatal("empty extent")
					}
					total += extent.Length
				}
				if total == 0 || total > uint64(call.length) {
					t.Fatalf("block status covers %d of %d bytes", total, call.length)
				}
			}
		}
	})
}

// replySeeds are valid and nearly valid reply streams for fuzzCalls.
func replySeeds() [][]byte {
	join := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	return [][]byte{
		join(
			chunk(0, wire.ReplyTypeOffsetData, 1, be64(4096), make([]byte, 2048)),
			chunk(wire.ReplyFlagDone, wire.ReplyTypeOffsetHole, 1, be64(6144), be32(2048)),
			chunk(wire.ReplyFlagDone, wire.ReplyTypeBlockStatus, 2, be32(7), be32(4096), be32(3), be32(8192), be32(0)),
			simple(0, 3, nil),
			chunk(wire.ReplyFlagDone, wire.ReplyTypeNone, 4),
			chunk(wire.ReplyFlagDone, wire.ReplyTypeOffsetData, 5, be64(1<<20-100), make([]byte, 100)),
		),
		join(
			chunk(wire.ReplyFlagDone, wire.ReplyTypeError, 1, be32(5), be16(4), []byte("oops")),
			chunk(wire.ReplyFlagDone, wire.ReplyTypeErrorOffset, 2, be32(22), be16(0), be64(10)),
			chunk(wire.ReplyFlagDone, wire.ReplyTypeErrorBit+50, 3, be32(28), be16(1), []byte("x")),
			simple(108, 4, nil),
		),
		chunk(wire.ReplyFlagDone, wire.ReplyTypeOffsetData, 1, be64(4096), make([]byte, 4097)),
		chunk(0, wire.ReplyTypeOffsetHole, 5, be64(1<<20-100), be32(50)),
	}
}

// FuzzHandshake feeds arbitrary server bytes to the handshake; a connection
// that comes out of it must then close cleanly.
func FuzzHandshake(f *testing.F) {
	s := defaultScript()
	f.Add(s.bytes())
	s.goUnsup = true
	f.Add(s.bytes())
	s = defaultScript()
	s.noStructure = true
	f.Add(s.bytes())
	f.Add(append(defaultScript().bytes(), chunk(wire.ReplyFlagDone, wire.ReplyTypeNone, 1)...))
	f.Fuzz(func(t *testing.T, data []byte) {
		netConn := &fuzzConn{reader: bytes.NewReader(data)}
		d := Dialer{HandshakeTimeout: time.Second}
		c, err := d.Handshake(context.Background(), netConn, "vm1")
		if err != nil {
			return
		}
		if c.payloadMaximum == 0 || c.payloadMaximum%c.blockSizeMinimum != 0 {
			t.Fatalf("payload maximum %d with minimum %d", c.payloadMaximum, c.blockSizeMinimum)
		}
		// Whatever follows the handshake goes to the reply reader, which
		// stops at the end of the bytes; Close must not hang.
		if err := c.Close(); err != nil && !errors.Is(err, ErrProtocol) {
			t.Fatalf("close: %v", err)
		}
		if err := c.Flush(context.Background()); c.CanFlush() && !errors.Is(err, ErrClosed) {
			t.Fatalf("flush after close: %v", err)
		}
	})
}

var _ io.Reader = (*fuzzConn)(nil)
