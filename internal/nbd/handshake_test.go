package nbd

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/herd-storage/herd/internal/nbd/wire"
)

func newTestBackend() *memoryBackend {
	return newMemoryBackend(newMemoryDisk("disk", 1<<20))
}

func TestGreetingOffersFixedNewstyleAndNoZeroes(t *testing.T) {
	server := startServer(t, newTestBackend())
	c := dial(t, server.address)
	flags := c.greet(wire.FlagCFixedNewstyle)
	if flags != wire.FlagFixedNewstyle|wire.FlagNoZeroes {
		t.Fatalf("handshake flags %#x", flags)
	}
	if got := final(c.option(wire.OptAbort, nil)); got != wire.RepAck {
		t.Fatalf("NBD_OPT_ABORT: reply %#x", got)
	}
	c.expectClosed()
}

func TestUnknownClientFlagsCloseTheConnection(t *testing.T) {
	server := startServer(t, newTestBackend())
	c := dial(t, server.address)
	c.greet(wire.FlagCFixedNewstyle | 1<<7)
	c.expectClosed()
}

func TestExportNameWithAndWithoutZeroes(t *testing.T) {
	server := startServer(t, newTestBackend())
	for _, noZeroes := range []bool{false, true} {
		t.Run(fmt.Sprintf("no_zeroes=%v", noZeroes), func(t *testing.T) {
			c := dial(t, server.address)
			clientFlags := wire.FlagCFixedNewstyle
			if noZeroes {
				clientFlags |= wire.FlagCNoZeroes
			}
			c.greet(clientFlags)
			c.sendOption(wire.OptExportName, []byte("disk"))
			reply := c.readFull(10)
			if size := binary.BigEndian.Uint64(reply); size != 1<<20 {
				t.Fatalf("size %d", size)
			}
			flags := binary.BigEndian.Uint16(reply[8:])
			if flags&wire.FlagHasFlags == 0 || flags&wire.FlagSendDF != 0 {
				t.Fatalf("transmission flags %#x", flags)
			}
			if !noZeroes {
				if zeroes := c.readFull(wire.ExportNameZeroPadding); !bytes.Equal(zeroes, make([]byte, wire.ExportNameZeroPadding)) {
					t.Fatalf("padding is not zero")
				}
			}
			// The very next bytes must be a reply to our request.
			r := c.roundTrip(0, wire.CmdRead, 0, 512, nil)
			if r.errno != wire.NoError || len(r.data) != 512 {
				t.Fatalf("read after NBD_OPT_EXPORT_NAME: %v", r)
			}
			c.disconnect()
		})
	}
}

func TestNonFixedNewstyleClient(t *testing.T) {
	server := startServer(t, newTestBackend())
	c := dial(t, server.address)
	c.greet(0)
	c.sendOption(wire.OptExportName, []byte("disk"))
	c.readFull(10 + wire.ExportNameZeroPadding)
	c.disconnect()
}

func TestExportNameOfUnknownExportTerminates(t *testing.T) {
	server := startServer(t, newTestBackend())
	c := dial(t, server.address)
	c.greet(wire.FlagCFixedNewstyle)
	c.sendOption(wire.OptExportName, []byte("missing"))
	c.expectClosed()
}

func TestOptionGoAndInfo(t *testing.T) {
	disk := newMemoryDisk("disk", 1<<20)
	disk.info.BlockSizeMinimum = 512
	server := startServer(t, newMemoryBackend(disk))
	c := dial(t, server.address)
	c.greet(wire.FlagCFixedNewstyle | wire.FlagCNoZeroes)

	replies := c.option(wire.OptInfo, exportRequestData("disk", wire.InfoName, wire.InfoDescription, wire.InfoBlockSize, 77))
	if final(replies) != wire.RepAck {
		t.Fatalf("NBD_OPT_INFO: %v", replies)
	}
	size, flags := exportInformation(t, replies)
	want := wire.FlagHasFlags | wire.FlagSendFlush | wire.FlagSendFUA |
		wire.FlagSendTrim | wire.FlagSendWriteZeroes | wire.FlagCanMultiConn | wire.FlagSendCache
	if size != 1<<20 || flags != want {
		t.Fatalf("size %d flags %#x, want %d %#x", size, flags, 1<<20, want)
	}
	seen := map[uint16][]byte{}
	for _, reply := range replies[:len(replies)-1] {
		if reply.replyType != wire.RepInfo {
			t.Fatalf("unexpected reply %#x", reply.replyType)
		}
		seen[binary.BigEndian.Uint16(reply.data)] = reply.data[2:]
	}
	if string(seen[wire.InfoName]) != "disk" || string(seen[wire.InfoDescription]) != "test disk disk" {
		t.Fatalf("name %q description %q", seen[wire.InfoName], seen[wire.InfoDescription])
	}
	blockSize := seen[wire.InfoBlockSize]
	if len(blockSize) != 12 || binary.BigEndian.Uint32(blockSize) != 512 ||
		binary.BigEndian.Uint32(blockSize[4:]) != 4096 || binary.BigEndian.Uint32(blockSize[8:]) != 32<<20 {
		t.Fatalf("block size %x", blockSize)
	}
	if disk.opens.Load() != 1 || disk.closes.Load() != 1 {
		t.Fatalf("NBD_OPT_INFO must open and close the export: %d opens %d closes", disk.opens.Load(), disk.closes.Load())
	}

	// Unknown export: NBD_REP_ERR_UNKNOWN with a message, and the
	// negotiation goes on.
	replies = c.option(wire.OptGo, exportRequestData("missing"))
	if len(replies) != 1 || final(replies) != wire.RepErrUnknown || !strings.Contains(string(replies[0].data), "missing") {
		t.Fatalf("NBD_OPT_GO of a missing export: %#x %q", final(replies), replies[0].data)
	}

	// Structured replies make the server offer DF.
	c.option(wire.OptStructuredReply, nil)
	replies = c.option(wire.OptGo, exportRequestData("disk"))
	if final(replies) != wire.RepAck {
		t.Fatalf("NBD_OPT_GO: %v", replies)
	}
	if _, flags := exportInformation(t, replies); flags&wire.FlagSendDF == 0 {
		t.Fatalf("flags %#x without NBD_FLAG_SEND_DF", flags)
	}
	r := c.roundTrip(0, wire.CmdRead, 512, 512, nil)
	if r.errno != wire.NoError || r.chunkType != wire.ReplyTypeOffsetData || len(r.data) != 512 {
		t.Fatalf("read: %v", r)
	}
	c.disconnect()
}

func TestOptionGoMalformed(t *testing.T) {
	server := startServer(t, newTestBackend())
	c := dial(t, server.address)
	c.greet(wire.FlagCFixedNewstyle)
	valid := exportRequestData("disk", wire.InfoName)
	for name, data := range map[string][]byte{
		"empty":             nil,
		"name too long":     append(binary.BigEndian.AppendUint32(nil, 100), valid[4:]...),
		"trailing byte":     append(append([]byte(nil), valid...), 0),
		"missing request":   valid[:len(valid)-1],
		"NUL in name":       exportRequestData("di\x00sk"),
		"invalid UTF-8":     exportRequestData("\xff\xfe"),
		"name over 4096":    exportRequestData(strings.Repeat("n", 4097)),
		"count beyond data": append(exportRequestData("disk")[:8], 0, 9),
	} {
		if got := final(c.option(wire.OptGo, data)); got != wire.RepErrInvalid {
			t.Errorf("%s: reply %#x, want NBD_REP_ERR_INVALID", name, got)
		}
	}
	// The connection is still usable.
	if got := final(c.option(wire.OptGo, valid)); got != wire.RepAck {
		t.Fatalf("NBD_OPT_GO after malformed ones: %#x", got)
	}
	c.disconnect()
}

func TestOpenErrorsMapToOptionReplies(t *testing.T) {
	locked := newMemoryDisk("locked", 1<<20)
	locked.exclusive = true
	notReady := newMemoryDisk("sleepy", 1<<20)
	notReady.openError = fmt.Errorf("gateway: %w: cluster has no quorum", ErrNotReady)
	denied := newMemoryDisk("denied", 1<<20)
	denied.openError = fmt.Errorf("gateway: %w", ErrPermission)
	broken := newMemoryDisk("broken", 1<<20)
	broken.openError = errors.New("gateway: something unexpected")
	server := startServer(t, newMemoryBackend(locked, notReady, denied, broken))

	holder, _, _ := connect(t, server.address, "locked", connectOptions{})
	c := dial(t, server.address)
	c.greet(wire.FlagCFixedNewstyle)
	for _, test := range []struct {
		name      string
		replyType uint32
		message   string
	}{
		{"locked", wire.RepErrPolicy, "held by connection"},
		// Not NBD_REP_ERR_UNKNOWN: the export exists.
		{"sleepy", wire.RepErrPolicy, "no quorum"},
		{"denied", wire.RepErrPolicy, "permission denied"},
		{"broken", wire.RepErrUnknown, "something unexpected"},
	} {
		replies := c.option(wire.OptGo, exportRequestData(test.name))
		if final(replies) != test.replyType || !strings.Contains(string(replies[0].data), test.message) {
			t.Errorf("%s: reply %#x %q, want %#x containing %q", test.name, final(replies), replies[0].data, test.replyType, test.message)
		}
	}
	// A snapshot of a locked VDI is read-only and may be opened.
	replies := c.option(wire.OptGo, exportRequestData("locked@snap"))
	if final(replies) != wire.RepAck {
		t.Fatalf("read-only open of a locked export: %#x", final(replies))
	}
	if _, flags := exportInformation(t, replies); flags&wire.FlagReadOnly == 0 {
		t.Fatalf("snapshot export without NBD_FLAG_READ_ONLY: %#x", flags)
	}
	holder.disconnect()
	c.disconnect()
}

func TestOptionList(t *testing.T) {
	server := startServer(t, newMemoryBackend(newMemoryDisk("a", 4096), newMemoryDisk("b", 4096)))
	c := dial(t, server.address)
	c.greet(wire.FlagCFixedNewstyle)
	replies := c.option(wire.OptList, nil)
	if len(replies) != 3 || final(replies) != wire.RepAck {
		t.Fatalf("NBD_OPT_LIST: %v", replies)
	}
	for i, name := range []string{"a", "b"} {
		data := replies[i].data
		if replies[i].replyType != wire.RepServer || binary.BigEndian.Uint32(data) != 1 ||
			string(data[4:5]) != name || string(data[5:]) != "test disk "+name {
			t.Errorf("entry %d: %#x %q", i, replies[i].replyType, data)
		}
	}
	if got := final(c.option(wire.OptList, []byte{1})); got != wire.RepErrInvalid {
		t.Fatalf("NBD_OPT_LIST with data: %#x", got)
	}
	c.option(wire.OptAbort, nil)
	c.expectClosed()
}

func TestUnsupportedOptionsAndTLS(t *testing.T) {
	server := startServer(t, newTestBackend())
	c := dial(t, server.address)
	c.greet(wire.FlagCFixedNewstyle)
	for _, option := range []uint32{0, wire.OptPeekExport, wire.OptExtendedHeaders, 12, 0xffffffff} {
		if got := final(c.option(option, []byte("ignored"))); got != wire.RepErrUnsup {
			t.Errorf("option %d: reply %#x, want NBD_REP_ERR_UNSUP", option, got)
		}
	}
	if got := final(c.option(wire.OptStartTLS, nil)); got != wire.RepErrPolicy {
		t.Errorf("NBD_OPT_STARTTLS: %#x", got)
	}
	if got := final(c.option(wire.OptStartTLS, []byte{0})); got != wire.RepErrInvalid {
		t.Errorf("NBD_OPT_STARTTLS with data: %#x", got)
	}
	if got := final(c.option(wire.OptStructuredReply, []byte{0})); got != wire.RepErrInvalid {
		t.Errorf("NBD_OPT_STRUCTURED_REPLY with data: %#x", got)
	}
	// An option too long to buffer is skipped, refused, and the next one
	// is parsed normally.
	if got := final(c.option(wire.OptGo, make([]byte, maximumOptionLength+1))); got != wire.RepErrTooBig {
		t.Errorf("oversized option: %#x", got)
	}
	if got := final(c.option(wire.OptGo, exportRequestData("disk"))); got != wire.RepAck {
		t.Fatalf("NBD_OPT_GO: %#x", got)
	}
	c.disconnect()
}

func TestBadOptionMagicCloses(t *testing.T) {
	server := startServer(t, newTestBackend())
	c := dial(t, server.address)
	c.greet(wire.FlagCFixedNewstyle)
	c.write(bytes.Repeat([]byte{0x42}, 16))
	c.expectClosed()
}

func TestOversizedExportNameCloses(t *testing.T) {
	server := startServer(t, newTestBackend())
	c := dial(t, server.address)
	c.greet(wire.FlagCFixedNewstyle)
	header := binary.BigEndian.AppendUint64(nil, wire.IHaveOptMagic)
	header = binary.BigEndian.AppendUint32(header, wire.OptExportName)
	header = binary.BigEndian.AppendUint32(header, 1<<31)
	c.write(header)
	c.expectClosed()
}

func TestMetaContextNegotiation(t *testing.T) {
	server := startServer(t, newTestBackend())
	c := dial(t, server.address)
	c.greet(wire.FlagCFixedNewstyle)

	// Before structured replies: NBD_REP_ERR_INVALID.
	for _, option := range []uint32{wire.OptListMetaContext, wire.OptSetMetaContext} {
		if got := final(c.option(option, metaContextData("disk", wire.BaseAllocation))); got != wire.RepErrInvalid {
			t.Fatalf("option %d before structured replies: %#x", option, got)
		}
	}
	c.option(wire.OptStructuredReply, nil)

	for _, test := range []struct {
		option  uint32
		queries []string
		want    string
	}{
		{wire.OptListMetaContext, nil, "[0:base:allocation]"},
		{wire.OptListMetaContext, []string{"base:"}, "[0:base:allocation]"},
		{wire.OptListMetaContext, []string{"qemu:dirty-bitmap:x", "base:allocation"}, "[0:base:allocation]"},
		{wire.OptListMetaContext, []string{"x-unknown:thing"}, "[]"},
		{wire.OptSetMetaContext, nil, "[]"},
		{wire.OptSetMetaContext, []string{"base:"}, "[]"},
		{wire.OptSetMetaContext, []string{"base:unknown", "nocolon"}, "[]"},
		{wire.OptSetMetaContext, []string{wire.BaseAllocation, wire.BaseAllocation}, "[1:base:allocation]"},
	} {
		got := fmt.Sprint(contextReplies(t, c.option(test.option, metaContextData("disk", test.queries...))))
		if got != test.want {
			t.Errorf("option %d %q: %s, want %s", test.option, test.queries, got, test.want)
		}
	}
	// Syntactically invalid requests.
	valid := metaContextData("disk", wire.BaseAllocation)
	for name, data := range map[string][]byte{
		"empty":          nil,
		"truncated":      valid[:len(valid)-1],
		"trailing":       append(append([]byte(nil), valid...), 0),
		"huge count":     append(metaContextData("disk")[:8], 0xff, 0xff, 0xff, 0xff),
		"name too long":  binary.BigEndian.AppendUint32(nil, 1000),
		"invalid string": metaContextData("disk", "base:\x00"),
	} {
		if got := final(c.option(wire.OptSetMetaContext, data)); got != wire.RepErrInvalid {
			t.Errorf("%s: reply %#x, want NBD_REP_ERR_INVALID", name, got)
		}
	}
	c.option(wire.OptAbort, nil)
}

func TestBlockStatusNeedsContextForTheSameExport(t *testing.T) {
	server := startServer(t, newMemoryBackend(newMemoryDisk("disk", 1<<20), newMemoryDisk("other", 1<<20)))
	c := dial(t, server.address)
	c.greet(wire.FlagCFixedNewstyle | wire.FlagCNoZeroes)
	c.option(wire.OptStructuredReply, nil)
	c.option(wire.OptSetMetaContext, metaContextData("other", wire.BaseAllocation))
	if got := final(c.option(wire.OptGo, exportRequestData("disk"))); got != wire.RepAck {
		t.Fatalf("NBD_OPT_GO: %#x", got)
	}
	if r := c.roundTrip(0, wire.CmdBlockStatus, 0, 4096, nil); r.errno != wire.EINVAL {
		t.Fatalf("block status with a context selected for another export: %v", r)
	}
	c.disconnect()
}

func TestShutdownRefusesOptions(t *testing.T) {
	server := startServer(t, newTestBackend())
	c := dial(t, server.address)
	c.greet(wire.FlagCFixedNewstyle)
	if err := server.Close(); err != nil {
		t.Fatal(err)
	}
	c.expectClosed()
}

func TestNormaliseExportInfo(t *testing.T) {
	info, err := normaliseExportInfo(ExportInfo{Size: 1})
	if err != nil || info.BlockSizeMinimum != 1 || info.BlockSizePreferred != 4096 || info.PayloadSizeMaximum != 32<<20 {
		t.Fatalf("defaults: %+v %v", info, err)
	}
	info, err = normaliseExportInfo(ExportInfo{BlockSizeMinimum: 8192, PayloadSizeMaximum: 1 << 30})
	if err != nil || info.BlockSizePreferred != 8192 || info.PayloadSizeMaximum != 32<<20 {
		t.Fatalf("large minimum: %+v %v", info, err)
	}
	for _, bad := range []ExportInfo{
		{BlockSizeMinimum: 3},
		{BlockSizeMinimum: 128 << 10},
		{BlockSizePreferred: 256},
		{BlockSizePreferred: 3000},
		{BlockSizeMinimum: 4096, BlockSizePreferred: 1024},
		{BlockSizePreferred: 65536, PayloadSizeMaximum: 4096},
		{BlockSizeMinimum: 4096, PayloadSizeMaximum: 6000},
	} {
		if _, err := normaliseExportInfo(bad); !errors.Is(err, errInvalidExportInfo) {
			t.Errorf("%+v: %v, want errInvalidExportInfo", bad, err)
		}
	}
}

func TestInvalidExportInfoRefusesGo(t *testing.T) {
	disk := newMemoryDisk("disk", 1<<20)
	disk.info.BlockSizeMinimum = 3
	server := startServer(t, newMemoryBackend(disk))
	c := dial(t, server.address)
	c.greet(wire.FlagCFixedNewstyle)
	if got := final(c.option(wire.OptGo, exportRequestData("disk"))); got != wire.RepErrUnknown {
		t.Fatalf("NBD_OPT_GO with invalid block sizes: %#x", got)
	}
	c.option(wire.OptAbort, nil)
}
