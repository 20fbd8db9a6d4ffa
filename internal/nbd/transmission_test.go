package nbd

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/nbd/wire"
)

func pattern(seed byte, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*7)
	}
	return b
}

func TestCommands(t *testing.T) {
	for _, structured := range []bool{false, true} {
		t.Run(fmt.Sprintf("structured=%v", structured), func(t *testing.T) {
			disk := newMemoryDisk("disk", 1<<20)
			server := startServer(t, newMemoryBackend(disk))
			c, size, flags := connect(t, server.address, "disk", connectOptions{structured: structured, blockStatus: structured})
			if size != 1<<20 {
				t.Fatalf("size %d", size)
			}
			if flags&wire.FlagReadOnly != 0 {
				t.Fatalf("flags %#x", flags)
			}
			ok := func(what string, r reply) reply {
				t.Helper()
				if r.errno != wire.NoError {
					t.Fatalf("%s: %v", what, r)
				}
				return r
			}

			data := pattern(1, 10000)
			ok("write", c.roundTrip(0, wire.CmdWrite, 4097, uint32(len(data)), data))
			ok("write FUA", c.roundTrip(wire.CmdFlagFUA, wire.CmdWrite, 100000, 3, []byte{1, 2, 3}))
			if got := ok("read", c.roundTrip(0, wire.CmdRead, 4097, uint32(len(data)), nil)).data; !bytes.Equal(got, data) {
				t.Fatalf("read back differs")
			}
			ok("flush", c.roundTrip(0, wire.CmdFlush, 0, 0, nil))
			ok("flush FUA", c.roundTrip(wire.CmdFlagFUA, wire.CmdFlush, 0, 0, nil))
			ok("cache", c.roundTrip(0, wire.CmdCache, 0, 4096, nil))
			ok("zero-length write", c.roundTrip(0, wire.CmdWrite, 0, 0, nil))
			r := ok("zero-length read", c.roundTrip(0, wire.CmdRead, 0, 0, nil))
			if structured && r.chunkType != wire.ReplyTypeNone {
				t.Fatalf("zero-length structured read: %v", r)
			}

			// Zeroes, with and without NO_HOLE.
			ok("write zeroes", c.roundTrip(0, wire.CmdWriteZeroes, 4097, 100, nil))
			data = append(append(make([]byte, 0, 10000), make([]byte, 100)...), data[100:]...)
			ok("write zeroes no hole", c.roundTrip(wire.CmdFlagNoHole, wire.CmdWriteZeroes, 200000, 8192, nil))
			if got := ok("read", c.roundTrip(0, wire.CmdRead, 4097, 10000, nil)).data; !bytes.Equal(got, data) {
				t.Fatalf("read after write zeroes differs")
			}
			ok("trim", c.roundTrip(wire.CmdFlagFUA, wire.CmdTrim, 0, 1<<20, nil))
			if disk.allocatedBlocks() != 0 {
				t.Fatalf("%d blocks allocated after trimming everything", disk.allocatedBlocks())
			}
			c.disconnect()
		})
	}
}

func TestStructuredReadIsOneDataChunk(t *testing.T) {
	disk := newMemoryDisk("disk", 1<<20)
	server := startServer(t, newMemoryBackend(disk))
	c, _, _ := connect(t, server.address, "disk", connectOptions{structured: true})
	data := pattern(9, 65536)
	c.roundTrip(0, wire.CmdWrite, 12345, uint32(len(data)), data)
	r := c.roundTrip(wire.CmdFlagDF, wire.CmdRead, 12345, uint32(len(data)), nil)
	if r.chunkType != wire.ReplyTypeOffsetData || binary.BigEndian.Uint64(r.payload) != 12345 || !bytes.Equal(r.data, data) {
		t.Fatalf("read: %v", r)
	}
	c.disconnect()
}

func TestBlockStatus(t *testing.T) {
	disk := newMemoryDisk("disk", 1<<20)
	server := startServer(t, newMemoryBackend(disk))
	c, _, _ := connect(t, server.address, "disk", connectOptions{structured: true, blockStatus: true})
	c.roundTrip(0, wire.CmdWrite, 8192, 4096, pattern(3, 4096))
	c.roundTrip(0, wire.CmdWrite, 65536, 100, pattern(3, 100))

	descriptors := func(r reply) [][2]uint32 {
		t.Helper()
		if r.errno != wire.NoError || r.chunkType != wire.ReplyTypeBlockStatus {
			t.Fatalf("block status: %v", r)
		}
		if id := binary.BigEndian.Uint32(r.payload); id != allocationContextID {
			t.Fatalf("context id %d", id)
		}
		var out [][2]uint32
		for rest := r.payload[4:]; len(rest) > 0; rest = rest[8:] {
			out = append(out, [2]uint32{binary.BigEndian.Uint32(rest), binary.BigEndian.Uint32(rest[4:])})
		}
		return out
	}
	hole := wire.StateHole | wire.StateZero
	got := fmt.Sprint(descriptors(c.roundTrip(0, wire.CmdBlockStatus, 0, 1<<20, nil)))
	want := fmt.Sprint([][2]uint32{{8192, hole}, {4096, 0}, {65536 - 12288, hole}, {4096, 0}, {1<<20 - 65536 - 4096, hole}})
	if got != want {
		t.Fatalf("extents %s, want %s", got, want)
	}
	got = fmt.Sprint(descriptors(c.roundTrip(wire.CmdFlagReqOne, wire.CmdBlockStatus, 100, 1<<20-100, nil)))
	if want := fmt.Sprint([][2]uint32{{8092, hole}}); got != want {
		t.Fatalf("REQ_ONE extents %s, want %s", got, want)
	}
	got = fmt.Sprint(descriptors(c.roundTrip(0, wire.CmdBlockStatus, 8192, 10, nil)))
	if want := fmt.Sprint([][2]uint32{{10, 0}}); got != want {
		t.Fatalf("short request extents %s, want %s", got, want)
	}
	for name, r := range map[string]reply{
		"zero length":  c.roundTrip(0, wire.CmdBlockStatus, 0, 0, nil),
		"past the end": c.roundTrip(0, wire.CmdBlockStatus, 1<<20-10, 11, nil),
		"DF flag":      c.roundTrip(wire.CmdFlagDF, wire.CmdBlockStatus, 0, 10, nil),
	} {
		if r.errno != wire.EINVAL || r.chunkType != wire.ReplyTypeError || r.message == "" {
			t.Errorf("%s: %v", name, r)
		}
	}
	c.disconnect()
}

func TestEncodeExtents(t *testing.T) {
	decode := func(b []byte) [][2]uint32 {
		var out [][2]uint32
		for ; len(b) > 0; b = b[8:] {
			out = append(out, [2]uint32{binary.BigEndian.Uint32(b), binary.BigEndian.Uint32(b[4:])})
		}
		return out
	}
	hole := Extent{Hole: true, Zero: true}
	data := Extent{}
	with := func(e Extent, length uint64) Extent { e.Length = length; return e }
	for _, test := range []struct {
		name       string
		extents    []Extent
		length     uint32
		requestOne bool
		want       [][2]uint32
	}{
		{"nothing", nil, 100, false, [][2]uint32{{100, 0}}},
		{"only empty", []Extent{with(hole, 0)}, 100, false, [][2]uint32{{100, 0}}},
		{"clipped", []Extent{with(hole, 1<<40)}, 100, false, [][2]uint32{{100, 3}}},
		{"merged", []Extent{with(data, 10), with(data, 10), with(hole, 0), with(data, 5)}, 100, false, [][2]uint32{{25, 0}}},
		{"short", []Extent{with(data, 10), with(hole, 10)}, 100, false, [][2]uint32{{10, 0}, {10, 3}}},
		{"request one", []Extent{with(data, 10), with(hole, 10)}, 100, true, [][2]uint32{{10, 0}}},
		{"request one merged", []Extent{with(data, 10), with(data, 200)}, 100, true, [][2]uint32{{100, 0}}},
		{"stop at length", []Extent{with(data, 60), with(hole, 60), with(data, 60)}, 100, false, [][2]uint32{{60, 0}, {40, 3}}},
		{"zero only", []Extent{{Length: 8, Zero: true}}, 8, false, [][2]uint32{{8, 2}}},
	} {
		got := decode(encodeExtents(test.extents, test.length, test.requestOne))
		if fmt.Sprint(got) != fmt.Sprint(test.want) {
			t.Errorf("%s: %v, want %v", test.name, got, test.want)
		}
	}
	// Alternating extents are capped at the spec's 2^20 descriptors.
	many := make([]Extent, wire.MaximumBlockStatusDescriptors+10)
	for i := range many {
		many[i] = Extent{Length: 1, Hole: i%2 == 0}
	}
	if got := len(encodeExtents(many, 1<<30, false)) / 8; got != wire.MaximumBlockStatusDescriptors {
		t.Errorf("%d descriptors, want %d", got, wire.MaximumBlockStatusDescriptors)
	}
}

func TestInvalidRequests(t *testing.T) {
	for _, structured := range []bool{false, true} {
		t.Run(fmt.Sprintf("structured=%v", structured), func(t *testing.T) {
			disk := newMemoryDisk("disk", 1<<20)
			disk.info.BlockSizeMinimum = 512
			disk.info.PayloadSizeMaximum = 1 << 20
			disk.info.CanFUA = false
			server := startServer(t, newMemoryBackend(disk))
			c, _, flags := connect(t, server.address, "disk", connectOptions{structured: structured})
			if flags&wire.FlagSendFUA != 0 {
				t.Fatalf("flags %#x advertise FUA", flags)
			}
			for _, test := range []struct {
				name    string
				flags   uint16
				command uint16
				offset  uint64
				length  uint32
				payload []byte
				want    wire.Errno
			}{
				{"unknown command", 0, 9, 0, 0, nil, wire.EINVAL},
				{"unknown command 8", 0, 8, 0, 0, nil, wire.EINVAL},
				{"unknown flag", 1 << 9, wire.CmdRead, 0, 512, nil, wire.EINVAL},
				{"FUA not negotiated", wire.CmdFlagFUA, wire.CmdWrite, 0, 512, make([]byte, 512), wire.EINVAL},
				{"NO_HOLE on write", wire.CmdFlagNoHole, wire.CmdWrite, 0, 512, make([]byte, 512), wire.EINVAL},
				{"REQ_ONE on read", wire.CmdFlagReqOne, wire.CmdRead, 0, 512, nil, wire.EINVAL},
				{"FAST_ZERO not advertised", wire.CmdFlagFastZero, wire.CmdWriteZeroes, 0, 512, nil, wire.EINVAL},
				{"read past the end", 0, wire.CmdRead, 1<<20 - 512, 1024, nil, wire.EINVAL},
				{"read offset past the end", 0, wire.CmdRead, 1 << 40, 512, nil, wire.EINVAL},
				{"read offset overflow", 0, wire.CmdRead, 1<<64 - 512, 1024, nil, wire.EINVAL},
				{"write past the end", 0, wire.CmdWrite, 1<<20 - 512, 1024, make([]byte, 1024), wire.ENOSPC},
				{"zeroes past the end", 0, wire.CmdWriteZeroes, 1 << 20, 512, nil, wire.ENOSPC},
				{"trim past the end", 0, wire.CmdTrim, 1 << 20, 512, nil, wire.EINVAL},
				{"cache past the end", 0, wire.CmdCache, 1 << 20, 512, nil, wire.EINVAL},
				{"unaligned read", 0, wire.CmdRead, 1, 512, nil, wire.EINVAL},
				{"unaligned write", 0, wire.CmdWrite, 0, 100, make([]byte, 100), wire.EINVAL},
				{"flush with length", 0, wire.CmdFlush, 0, 512, nil, wire.EINVAL},
				{"block status without context", 0, wire.CmdBlockStatus, 0, 512, nil, wire.EINVAL},
				{"write over the maximum payload", 0, wire.CmdWrite, 0, 1<<20 + 512, make([]byte, 1<<20+512), wire.EINVAL},
			} {
				r := c.roundTrip(test.flags, test.command, test.offset, test.length, test.payload)
				if r.errno != test.want {
					t.Errorf("%s: %v, want errno %d", test.name, r, test.want)
				}
				if structured && (r.chunkType != wire.ReplyTypeError || r.message == "") {
					t.Errorf("%s: want an error chunk with a message, got %v", test.name, r)
				}
			}
			// Reads over the maximum payload: EINVAL with simple
			// replies, EOVERFLOW (retry smaller) with structured ones.
			want := wire.EINVAL
			if structured {
				want = wire.EOVERFLOW
			}
			if r := c.roundTrip(0, wire.CmdRead, 0, 1<<20+512, nil); r.errno != want {
				t.Errorf("oversized read: %v, want %d", r, want)
			}
			// The connection still works, and nothing was written.
			if r := c.roundTrip(0, wire.CmdRead, 0, 512, nil); r.errno != wire.NoError || !bytes.Equal(r.data, make([]byte, 512)) {
				t.Fatalf("read after the invalid requests: %v", r)
			}
			if disk.allocatedBlocks() != 0 {
				t.Fatalf("invalid requests allocated %d blocks", disk.allocatedBlocks())
			}
			c.disconnect()
		})
	}
}

func TestReadOnlyExport(t *testing.T) {
	disk := newMemoryDisk("disk", 1<<20)
	server := startServer(t, newMemoryBackend(disk))
	c, _, flags := connect(t, server.address, "disk@snapshot", connectOptions{structured: true})
	if flags&wire.FlagReadOnly == 0 || flags&(wire.FlagSendTrim|wire.FlagSendWriteZeroes) != 0 {
		t.Fatalf("read-only flags %#x", flags)
	}
	for name, r := range map[string]reply{
		"write":        c.roundTrip(0, wire.CmdWrite, 0, 4, []byte{1, 2, 3, 4}),
		"trim":         c.roundTrip(0, wire.CmdTrim, 0, 4096, nil),
		"write zeroes": c.roundTrip(0, wire.CmdWriteZeroes, 0, 4096, nil),
	} {
		if r.errno != wire.EPERM {
			t.Errorf("%s on a read-only export: %v, want EPERM", name, r)
		}
	}
	if r := c.roundTrip(0, wire.CmdRead, 0, 4, nil); r.errno != wire.NoError {
		t.Fatalf("read: %v", r)
	}
	if disk.allocatedBlocks() != 0 {
		t.Fatalf("a read-only export was written")
	}
	c.disconnect()
}

func TestFastZero(t *testing.T) {
	disk := newMemoryDisk("disk", 1<<20)
	disk.info.CanFastZero = true
	server := startServer(t, newMemoryBackend(disk))
	c, _, flags := connect(t, server.address, "disk", connectOptions{})
	if flags&wire.FlagSendFastZero == 0 {
		t.Fatalf("flags %#x without NBD_FLAG_SEND_FAST_ZERO", flags)
	}
	if r := c.roundTrip(wire.CmdFlagFastZero, wire.CmdWriteZeroes, 0, 1<<20, nil); r.errno != wire.NoError {
		t.Fatalf("fast zero: %v", r)
	}
	c.disconnect()
}

func TestBackendErrorsMapToErrno(t *testing.T) {
	disk := newMemoryDisk("disk", 1<<20)
	var injected atomic.Pointer[error]
	disk.gate = func(ctx context.Context, operation string) error {
		if err := injected.Load(); err != nil {
			return *err
		}
		return nil
	}
	server := startServer(t, newMemoryBackend(disk))
	c, _, _ := connect(t, server.address, "disk", connectOptions{structured: true})
	for _, test := range []struct {
		err  error
		want wire.Errno
	}{
		{fmt.Errorf("gateway: replica down: %w", ErrIO), wire.EIO},
		{fmt.Errorf("gateway: %w", ErrNoSpace), wire.ENOSPC},
		{syscall.EDQUOT, wire.ENOSPC},
		{ErrReadOnly, wire.EPERM},
		{ErrInvalid, wire.EINVAL},
		{ErrShutdown, wire.ESHUTDOWN},
		{errors.New("something else"), wire.EIO},
	} {
		injected.Store(&test.err)
		r := c.roundTrip(0, wire.CmdWrite, 0, 4, []byte{1, 2, 3, 4})
		if r.errno != test.want || r.message != test.err.Error() {
			t.Errorf("%v: %v, want errno %d", test.err, r, test.want)
		}
		r = c.roundTrip(0, wire.CmdRead, 0, 4, nil)
		if r.errno != test.want || r.chunkType != wire.ReplyTypeError {
			t.Errorf("read with %v: %v, want errno %d", test.err, r, test.want)
		}
	}
	c.disconnect()
}

func TestErrnoFor(t *testing.T) {
	for _, test := range []struct {
		err  error
		want wire.Errno
	}{
		{nil, wire.NoError},
		{ErrPermission, wire.EPERM},
		{syscall.EROFS, wire.EPERM},
		{ErrIO, wire.EIO},
		{ErrNoSpace, wire.ENOSPC},
		{syscall.EFBIG, wire.ENOSPC},
		{ErrInvalid, wire.EINVAL},
		{ErrOverflow, wire.EOVERFLOW},
		{ErrNotSupported, wire.ENOTSUP},
		{context.Canceled, wire.ESHUTDOWN},
		{context.DeadlineExceeded, wire.EIO},
		{fmt.Errorf("wrapped twice: %w", fmt.Errorf("once: %w", ErrNoSpace)), wire.ENOSPC},
		{io.ErrUnexpectedEOF, wire.EIO},
	} {
		if got := errnoFor(test.err); got != test.want {
			t.Errorf("errnoFor(%v) = %d, want %d", test.err, got, test.want)
		}
	}
}

// TestRequestsAreServedConcurrently sends requests that each wait for all
// the others to have started: they complete only if the server does not
// serialise them.
func TestRequestsAreServedConcurrently(t *testing.T) {
	const requests = 16
	disk := newMemoryDisk("disk", 1<<20)
	var started sync.WaitGroup
	started.Add(requests)
	disk.gate = func(ctx context.Context, operation string) error {
		started.Done()
		started.Wait()
		return nil
	}
	server := startServer(t, newMemoryBackend(disk))
	c, _, _ := connect(t, server.address, "disk", connectOptions{structured: true})
	for i := range requests {
		if i%2 == 0 {
			c.sendRequest(0, wire.CmdRead, uint64(i), uint64(i)*4096, 4096, nil)
		} else {
			c.sendRequest(0, wire.CmdWrite, uint64(i), uint64(i)*4096, 4096, pattern(byte(i), 4096))
		}
	}
	seen := map[uint64]bool{}
	for range requests {
		r := c.readReply()
		if r.errno != wire.NoError || seen[r.cookie] {
			t.Fatalf("reply %v (duplicate: %v)", r, seen[r.cookie])
		}
		seen[r.cookie] = true
	}
	c.disconnect()
}

// TestInFlightLimits checks both bounds: requests in flight and buffered
// bytes.
func TestInFlightLimits(t *testing.T) {
	for _, test := range []struct {
		name         string
		maxRequests  int
		maxBytes     int64
		length       uint32
		wantInFlight int64
	}{
		{"requests", 4, 0, 4096, 4},
		{"bytes", 64, 32 << 20, 8 << 20, 4},
	} {
		t.Run(test.name, func(t *testing.T) {
			disk := newMemoryDisk("disk", 64<<20)
			var inFlight, peak atomic.Int64
			release := make(chan struct{})
			disk.gate = func(ctx context.Context, operation string) error {
				n := inFlight.Add(1)
				for {
					old := peak.Load()
					if n <= old || peak.CompareAndSwap(old, n) {
						break
					}
				}
				<-release
				inFlight.Add(-1)
				return nil
			}
			server := startServer(t, newMemoryBackend(disk), func(s *Server) {
				s.MaxRequestsInFlight = test.maxRequests
				s.MaxBufferedBytes = test.maxBytes
			})
			c, _, _ := connect(t, server.address, "disk", connectOptions{})
			const requests = 8
			go func() {
				for i := range requests {
					c.sendRequest(0, wire.CmdRead, uint64(i), uint64(i)*uint64(test.length), test.length, nil)
				}
			}()
			waitFor(t, "requests to reach the limit", func() bool { return inFlight.Load() == test.wantInFlight })
			// The bound holds for a while: nothing more is dispatched.
			deadline := time.Now().Add(100 * time.Millisecond)
			for time.Now().Before(deadline) {
				if n := inFlight.Load(); n > test.wantInFlight {
					t.Fatalf("%d requests in flight, limit %d", n, test.wantInFlight)
				}
				time.Sleep(time.Millisecond)
			}
			close(release)
			for range requests {
				if r := c.readReply(); r.errno != wire.NoError {
					t.Fatalf("reply %v", r)
				}
			}
			if peak.Load() != test.wantInFlight {
				t.Fatalf("peak %d in flight, want %d", peak.Load(), test.wantInFlight)
			}
			c.disconnect()
		})
	}
}

func TestDisconnectWaitsForRequestsInFlight(t *testing.T) {
	disk := newMemoryDisk("disk", 1<<20)
	entered := make(chan struct{}, 1)
	release := make(chan struct{})
	disk.gate = func(ctx context.Context, operation string) error {
		entered <- struct{}{}
		<-release
		return nil
	}
	server := startServer(t, newMemoryBackend(disk))
	c, _, _ := connect(t, server.address, "disk", connectOptions{})
	c.sendRequest(0, wire.CmdWrite, 7, 0, 4, []byte{9, 9, 9, 9})
	c.sendRequest(0, wire.CmdDisc, 8, 0, 0, nil)
	<-entered
	if disk.closes.Load() != 0 {
		t.Fatalf("export closed with a request in flight")
	}
	close(release)
	if r := c.readReply(); r.cookie != 7 || r.errno != wire.NoError {
		t.Fatalf("reply %v", r)
	}
	c.expectClosed()
	waitFor(t, "the export to be closed", func() bool { return disk.closes.Load() == 1 })
	if got := disk.contents()[:4]; !bytes.Equal(got, []byte{9, 9, 9, 9}) {
		t.Fatalf("write lost: %v", got)
	}
}

func TestClientVanishingMidRequest(t *testing.T) {
	disk := newMemoryDisk("disk", 64<<20)
	server := startServer(t, newMemoryBackend(disk))
	for name, send := range map[string]func(c *testClient){
		"half a header": func(c *testClient) { c.write([]byte{0x25, 0x60, 0x95}) },
		"half a payload": func(c *testClient) {
			header := make([]byte, wire.RequestHeaderLength)
			binary.BigEndian.PutUint32(header, wire.RequestMagic)
			binary.BigEndian.PutUint16(header[6:], wire.CmdWrite)
			binary.BigEndian.PutUint32(header[24:], 8<<20)
			c.write(append(header, make([]byte, 1<<20)...))
		},
		"requests in flight": func(c *testClient) {
			for i := range 32 {
				c.sendRequest(0, wire.CmdRead, uint64(i), 0, 4<<20, nil)
			}
		},
	} {
		t.Run(name, func(t *testing.T) {
			opens := disk.opens.Load()
			c, _, _ := connect(t, server.address, "disk", connectOptions{})
			send(c)
			c.conn.Close()
			waitFor(t, "the export to be closed", func() bool { return disk.closes.Load() == opens+1 })
			waitFor(t, "buffers to be returned", func() bool { return server.buffersOutstanding.Load() == 0 })
		})
	}
	// The server still serves others.
	c, _, _ := connect(t, server.address, "disk", connectOptions{})
	if r := c.roundTrip(0, wire.CmdRead, 0, 512, nil); r.errno != wire.NoError {
		t.Fatalf("read: %v", r)
	}
	c.disconnect()
}

func TestGarbageAfterHandshake(t *testing.T) {
	disk := newMemoryDisk("disk", 1<<20)
	server := startServer(t, newMemoryBackend(disk))
	random := rand.New(rand.NewPCG(1, 2))
	for i := range 20 {
		c, _, _ := connect(t, server.address, "disk", connectOptions{structured: i%2 == 0})
		garbage := make([]byte, wire.RequestHeaderLength+random.IntN(4096))
		for j := range garbage {
			garbage[j] = byte(random.Uint32())
		}
		c.write(garbage)
		// The magic check fails: the server hangs up.
		c.expectClosed()
	}
	// Garbage instead of a handshake.
	for range 5 {
		c := dial(t, server.address)
		c.readFull(18)
		c.write(bytes.Repeat([]byte{0xff}, 64))
		c.expectClosed()
	}
	waitFor(t, "exports to be closed", func() bool { return disk.closes.Load() == disk.opens.Load() })
	c, _, _ := connect(t, server.address, "disk", connectOptions{})
	c.disconnect()
}

func TestOversizedWriteDisconnects(t *testing.T) {
	disk := newMemoryDisk("disk", 1<<30)
	server := startServer(t, newMemoryBackend(disk))
	c, _, _ := connect(t, server.address, "disk", connectOptions{})
	c.sendRequest(0, wire.CmdWrite, 1, 0, wire.MaximumPayloadLength+1, nil)
	c.expectClosed()
}

func TestBackendPanicDropsOnlyThatConnection(t *testing.T) {
	disk := newMemoryDisk("disk", 1<<20)
	disk.gate = func(ctx context.Context, operation string) error {
		if operation == "trim" {
			panic("backend bug")
		}
		return nil
	}
	server := startServer(t, newMemoryBackend(disk))
	c, _, _ := connect(t, server.address, "disk", connectOptions{})
	c.sendRequest(0, wire.CmdTrim, 1, 0, 4096, nil)
	c.expectClosed()
	other, _, _ := connect(t, server.address, "disk", connectOptions{})
	if r := other.roundTrip(0, wire.CmdRead, 0, 512, nil); r.errno != wire.NoError {
		t.Fatalf("read: %v", r)
	}
	other.disconnect()
}

func TestShutdownIsGraceful(t *testing.T) {
	disk := newMemoryDisk("disk", 1<<20)
	entered := make(chan struct{}, 1)
	release := make(chan struct{})
	disk.gate = func(ctx context.Context, operation string) error {
		if operation == "write" {
			entered <- struct{}{}
			<-release
		}
		return nil
	}
	server := startServer(t, newMemoryBackend(disk))
	c, _, _ := connect(t, server.address, "disk", connectOptions{})
	c.sendRequest(0, wire.CmdWrite, 5, 0, 4, []byte{1, 2, 3, 4})
	<-entered
	closed := make(chan error, 1)
	go func() { closed <- server.Close() }()
	// New connections are refused while the request is in flight.
	waitFor(t, "the listener to close", func() bool {
		conn, err := net.DialTimeout("tcp", server.address, time.Second)
		if err == nil {
			conn.Close()
		}
		return err != nil
	})
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) with a request in flight", err)
	default:
	}
	close(release)
	if r := c.readReply(); r.cookie != 5 || r.errno != wire.NoError {
		t.Fatalf("reply %v", r)
	}
	c.expectClosed()
	if err := <-closed; err != nil {
		t.Fatalf("Close: %v", err)
	}
}

// A graceful shutdown answers the requests it read, flushes the export
// the connection wrote to, then closes the sending side: the client reads
// every reply and then the end of the stream (not a reset, which a close
// with the client's unread requests in the socket would send, losing
// replies not yet sent). A request sent after the shutdown began is never
// read: not served, not answered (a reconnecting client sends it again).
func TestShutdownAnswersFlushesAndClosesCleanly(t *testing.T) {
	disk := newMemoryDisk("disk", 1<<20)
	entered := make(chan struct{}, 1)
	release := make(chan struct{})
	var mu sync.Mutex
	var operations []string
	disk.gate = func(ctx context.Context, operation string) error {
		mu.Lock()
		operations = append(operations, operation)
		first := len(operations) == 1
		mu.Unlock()
		if first {
			entered <- struct{}{}
			<-release
		}
		return nil
	}
	server := startServer(t, newMemoryBackend(disk))
	c, _, _ := connect(t, server.address, "disk", connectOptions{structured: true})
	c.sendRequest(0, wire.CmdWrite, 5, 0, 4, []byte{1, 2, 3, 4})
	<-entered
	closed := make(chan error, 1)
	go func() { closed <- server.Close() }()
	// Once the server is shutting down, its connections read no more.
	waitFor(t, "the shutdown to begin", server.isShuttingDown)
	c.sendRequest(0, wire.CmdWrite, 6, 4096, 4, []byte{5, 6, 7, 8})
	close(release)
	if r := c.readReply(); r.cookie != 5 || r.errno != wire.NoError {
		t.Fatalf("reply to the write in flight: %v", r)
	}
	if n, err := c.reader.Read(make([]byte, 1)); n != 0 || !errors.Is(err, io.EOF) {
		t.Fatalf("after the last reply: read %d bytes, %v; want the end of the stream", n, err)
	}
	c.conn.Close()
	if err := <-closed; err != nil {
		t.Fatalf("Close: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(operations, []string{"write", "flush"}) {
		t.Fatalf("the export saw %v; want the write in flight, then a flush, and not the request sent after the shutdown began", operations)
	}
}

func TestShutdownDeadlineCancelsRequests(t *testing.T) {
	disk := newMemoryDisk("disk", 1<<20)
	entered := make(chan struct{}, 1)
	disk.gate = func(ctx context.Context, operation string) error {
		entered <- struct{}{}
		<-ctx.Done()
		return ctx.Err()
	}
	server := startServer(t, newMemoryBackend(disk))
	c, _, _ := connect(t, server.address, "disk", connectOptions{})
	c.sendRequest(0, wire.CmdFlush, 5, 0, 0, nil)
	<-entered
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := server.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Shutdown: %v", err)
	}
	c.expectClosed()
}

func TestServeContextCancellation(t *testing.T) {
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	backend := newTestBackend()
	server := &Server{Backend: backend, Logger: testLogger()}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- server.Serve(ctx, listener) }()
	c, _, _ := connect(t, listener.Addr().String(), "disk", connectOptions{})
	if r := c.roundTrip(0, wire.CmdRead, 0, 512, nil); r.errno != wire.NoError {
		t.Fatalf("read: %v", r)
	}
	cancel()
	c.expectClosed()
	select {
	case err := <-served:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Serve: %v", err)
		}
	case <-time.After(testTimeout):
		t.Fatal("Serve did not return")
	}
	if err := server.Serve(context.Background(), listener); !errors.Is(err, ErrServerClosed) {
		t.Fatalf("Serve after shutdown: %v", err)
	}
}

func TestHandshakeTimeout(t *testing.T) {
	server := startServer(t, newTestBackend(), func(s *Server) { s.HandshakeTimeout = 100 * time.Millisecond })
	c := dial(t, server.address)
	c.greet(wire.FlagCFixedNewstyle)
	c.expectClosed()
}

// TestRepliesAreCombined checks that replies ready together go out in
// fewer writes than there are replies (replies.go), each still intact,
// and that a lone request's reply is written at once by its worker.
func TestRepliesAreCombined(t *testing.T) {
	const requests = 32
	disk := newMemoryDisk("disk", 1<<20)
	var started sync.WaitGroup
	started.Add(requests)
	var gated atomic.Bool
	gated.Store(true)
	disk.gate = func(ctx context.Context, operation string) error {
		if gated.Load() {
			started.Done()
			started.Wait() // every request answers at once
		}
		return nil
	}
	server := startServer(t, newMemoryBackend(disk))
	c, _, _ := connect(t, server.address, "disk", connectOptions{structured: true})
	before := server.replyWrites.Load()
	for i := range requests {
		if i%2 == 0 {
			c.sendRequest(0, wire.CmdWrite, uint64(i), uint64(i)*4096, 4096, pattern(byte(i), 4096))
		} else {
			c.sendRequest(0, wire.CmdRead, uint64(i), uint64(i)*4096, 4096, nil)
		}
	}
	seen := map[uint64]bool{}
	for range requests {
		r := c.readReply()
		if r.errno != wire.NoError || seen[r.cookie] {
			t.Fatalf("reply %v (duplicate: %v)", r, seen[r.cookie])
		}
		if r.cookie%2 == 1 && len(r.data) != 4096 {
			t.Fatalf("READ %d answered with %d bytes", r.cookie, len(r.data))
		}
		seen[r.cookie] = true
	}
	writes := server.replyWrites.Load() - before
	t.Logf("%d replies in %d writes", requests, writes)
	if writes >= requests {
		t.Errorf("%d replies ready together took %d writes; want them combined", requests, writes)
	}

	// One at a time: every reply is written by its own request's worker,
	// and arrives without another request to push it out.
	gated.Store(false)
	before = server.replyWrites.Load()
	for i := range 4 {
		want := pattern(byte(100+i), 4096)
		if r := c.roundTrip(0, wire.CmdWrite, 0, 4096, want); r.errno != wire.NoError {
			t.Fatalf("write: %v", r)
		}
		r := c.roundTrip(0, wire.CmdRead, 0, 4096, nil)
		if r.errno != wire.NoError || !bytes.Equal(r.data, want) {
			t.Fatalf("read back: %v", r)
		}
	}
	if writes := server.replyWrites.Load() - before; writes != 8 {
		t.Errorf("8 lone replies took %d writes", writes)
	}
	c.disconnect()
}
