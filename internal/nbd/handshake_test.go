package nbd

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"testing"
)

func newTestBackend() *memoryBackend {
	return newMemoryBackend(newMemoryDisk("disk", 1<<20))
}

func TestGreetingOffersFixedNewstyleAndNoZeroes(t *testing.T) {
	server := startServer(t, newTestBackend())
	c := dial(t, server.address)
	flags := c.greet(clientFlagFixedNewstyle)
	if flags != handshakeFlagFixedNewstyle|handshakeFlagNoZeroes {
		t.Fatalf("handshake flags %#x", flags)
	}
	if got := final(c.option(optionAbort, nil)); got != replyAck {
		t.Fatalf("NBD_OPT_ABORT: reply %#x", got)
	}
	c.expectClosed()
}

func TestUnknownClientFlagsCloseTheConnection(t *testing.T) {
	server := startServer(t, newTestBackend())
	c := dial(t, server.address)
	c.greet(clientFlagFixedNewstyle | 1<<7)
	c.expectClosed()
}

func TestExportNameWithAndWithoutZeroes(t *testing.T) {
	server := startServer(t, newTestBackend())
	for _, noZeroes := range []bool{false, true} {
		t.Run(fmt.Sprintf("no_zeroes=%v", noZeroes), func(t *testing.T) {
			c := dial(t, server.address)
			clientFlags := clientFlagFixedNewstyle
			if noZeroes {
				clientFlags |= clientFlagNoZeroes
			}
			c.greet(clientFlags)
			c.sendOption(optionExportName, []byte("disk"))
			reply := c.readFull(10)
			if size := binary.BigEndian.Uint64(reply); size != 1<<20 {
				t.Fatalf("size %d", size)
			}
			flags := binary.BigEndian.Uint16(reply[8:])
			if flags&transmissionFlagHasFlags == 0 || flags&transmissionFlagSendDontFragment != 0 {
				t.Fatalf("transmission flags %#x", flags)
			}
			if !noZeroes {
				if zeroes := c.readFull(exportNameZeroPadding); !bytes.Equal(zeroes, make([]byte, exportNameZeroPadding)) {
					t.Fatalf("padding is not zero")
				}
			}
			// The very next bytes must be a reply to our request.
			r := c.roundTrip(0, commandRead, 0, 512, nil)
			if r.errno != errnoNone || len(r.data) != 512 {
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
	c.sendOption(optionExportName, []byte("disk"))
	c.readFull(10 + exportNameZeroPadding)
	c.disconnect()
}

func TestExportNameOfUnknownExportTerminates(t *testing.T) {
	server := startServer(t, newTestBackend())
	c := dial(t, server.address)
	c.greet(clientFlagFixedNewstyle)
	c.sendOption(optionExportName, []byte("missing"))
	c.expectClosed()
}

func TestOptionGoAndInfo(t *testing.T) {
	disk := newMemoryDisk("disk", 1<<20)
	disk.info.BlockSizeMinimum = 512
	server := startServer(t, newMemoryBackend(disk))
	c := dial(t, server.address)
	c.greet(clientFlagFixedNewstyle | clientFlagNoZeroes)

	replies := c.option(optionInfo, exportRequestData("disk", infoName, infoDescription, infoBlockSize, 77))
	if final(replies) != replyAck {
		t.Fatalf("NBD_OPT_INFO: %v", replies)
	}
	size, flags := exportInformation(t, replies)
	want := transmissionFlagHasFlags | transmissionFlagSendFlush | transmissionFlagSendFUA |
		transmissionFlagSendTrim | transmissionFlagSendWriteZeroes | transmissionFlagCanMultiConn | transmissionFlagSendCache
	if size != 1<<20 || flags != want {
		t.Fatalf("size %d flags %#x, want %d %#x", size, flags, 1<<20, want)
	}
	seen := map[uint16][]byte{}
	for _, reply := range replies[:len(replies)-1] {
		if reply.replyType != replyInfo {
			t.Fatalf("unexpected reply %#x", reply.replyType)
		}
		seen[binary.BigEndian.Uint16(reply.data)] = reply.data[2:]
	}
	if string(seen[infoName]) != "disk" || string(seen[infoDescription]) != "test disk disk" {
		t.Fatalf("name %q description %q", seen[infoName], seen[infoDescription])
	}
	blockSize := seen[infoBlockSize]
	if len(blockSize) != 12 || binary.BigEndian.Uint32(blockSize) != 512 ||
		binary.BigEndian.Uint32(blockSize[4:]) != 4096 || binary.BigEndian.Uint32(blockSize[8:]) != 32<<20 {
		t.Fatalf("block size %x", blockSize)
	}
	if disk.opens.Load() != 1 || disk.closes.Load() != 1 {
		t.Fatalf("NBD_OPT_INFO must open and close the export: %d opens %d closes", disk.opens.Load(), disk.closes.Load())
	}

	// Unknown export: NBD_REP_ERR_UNKNOWN with a message, and the
	// negotiation goes on.
	replies = c.option(optionGo, exportRequestData("missing"))
	if len(replies) != 1 || final(replies) != replyErrorUnknown || !strings.Contains(string(replies[0].data), "missing") {
		t.Fatalf("NBD_OPT_GO of a missing export: %#x %q", final(replies), replies[0].data)
	}

	// Structured replies make the server offer DF.
	c.option(optionStructuredReply, nil)
	replies = c.option(optionGo, exportRequestData("disk"))
	if final(replies) != replyAck {
		t.Fatalf("NBD_OPT_GO: %v", replies)
	}
	if _, flags := exportInformation(t, replies); flags&transmissionFlagSendDontFragment == 0 {
		t.Fatalf("flags %#x without NBD_FLAG_SEND_DF", flags)
	}
	r := c.roundTrip(0, commandRead, 512, 512, nil)
	if r.errno != errnoNone || r.chunkType != chunkOffsetData || len(r.data) != 512 {
		t.Fatalf("read: %v", r)
	}
	c.disconnect()
}

func TestOptionGoMalformed(t *testing.T) {
	server := startServer(t, newTestBackend())
	c := dial(t, server.address)
	c.greet(clientFlagFixedNewstyle)
	valid := exportRequestData("disk", infoName)
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
		if got := final(c.option(optionGo, data)); got != replyErrorInvalid {
			t.Errorf("%s: reply %#x, want NBD_REP_ERR_INVALID", name, got)
		}
	}
	// The connection is still usable.
	if got := final(c.option(optionGo, valid)); got != replyAck {
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
	c.greet(clientFlagFixedNewstyle)
	for _, test := range []struct {
		name      string
		replyType uint32
		message   string
	}{
		{"locked", replyErrorPolicy, "held by connection"},
		{"sleepy", replyErrorUnknown, "no quorum"},
		{"denied", replyErrorPolicy, "permission denied"},
		{"broken", replyErrorUnknown, "something unexpected"},
	} {
		replies := c.option(optionGo, exportRequestData(test.name))
		if final(replies) != test.replyType || !strings.Contains(string(replies[0].data), test.message) {
			t.Errorf("%s: reply %#x %q, want %#x containing %q", test.name, final(replies), replies[0].data, test.replyType, test.message)
		}
	}
	// A snapshot of a locked VDI is read-only and may be opened.
	replies := c.option(optionGo, exportRequestData("locked@snap"))
	if final(replies) != replyAck {
		t.Fatalf("read-only open of a locked export: %#x", final(replies))
	}
	if _, flags := exportInformation(t, replies); flags&transmissionFlagReadOnly == 0 {
		t.Fatalf("snapshot export without NBD_FLAG_READ_ONLY: %#x", flags)
	}
	holder.disconnect()
	c.disconnect()
}

func TestOptionList(t *testing.T) {
	server := startServer(t, newMemoryBackend(newMemoryDisk("a", 4096), newMemoryDisk("b", 4096)))
	c := dial(t, server.address)
	c.greet(clientFlagFixedNewstyle)
	replies := c.option(optionList, nil)
	if len(replies) != 3 || final(replies) != replyAck {
		t.Fatalf("NBD_OPT_LIST: %v", replies)
	}
	for i, name := range []string{"a", "b"} {
		data := replies[i].data
		if replies[i].replyType != replyServer || binary.BigEndian.Uint32(data) != 1 ||
			string(data[4:5]) != name || string(data[5:]) != "test disk "+name {
			t.Errorf("entry %d: %#x %q", i, replies[i].replyType, data)
		}
	}
	if got := final(c.option(optionList, []byte{1})); got != replyErrorInvalid {
		t.Fatalf("NBD_OPT_LIST with data: %#x", got)
	}
	c.option(optionAbort, nil)
	c.expectClosed()
}

func TestUnsupportedOptionsAndTLS(t *testing.T) {
	server := startServer(t, newTestBackend())
	c := dial(t, server.address)
	c.greet(clientFlagFixedNewstyle)
	for _, option := range []uint32{0, optionPeekExport, optionExtendedHeaders, 12, 0xffffffff} {
		if got := final(c.option(option, []byte("ignored"))); got != replyErrorUnsupported {
			t.Errorf("option %d: reply %#x, want NBD_REP_ERR_UNSUP", option, got)
		}
	}
	if got := final(c.option(optionStartTLS, nil)); got != replyErrorPolicy {
		t.Errorf("NBD_OPT_STARTTLS: %#x", got)
	}
	if got := final(c.option(optionStartTLS, []byte{0})); got != replyErrorInvalid {
		t.Errorf("NBD_OPT_STARTTLS with data: %#x", got)
	}
	if got := final(c.option(optionStructuredReply, []byte{0})); got != replyErrorInvalid {
		t.Errorf("NBD_OPT_STRUCTURED_REPLY with data: %#x", got)
	}
	// An option too long to buffer is skipped, refused, and the next one
	// is parsed normally.
	if got := final(c.option(optionGo, make([]byte, maximumOptionLength+1))); got != replyErrorTooBig {
		t.Errorf("oversized option: %#x", got)
	}
	if got := final(c.option(optionGo, exportRequestData("disk"))); got != replyAck {
		t.Fatalf("NBD_OPT_GO: %#x", got)
	}
	c.disconnect()
}

func TestBadOptionMagicCloses(t *testing.T) {
	server := startServer(t, newTestBackend())
	c := dial(t, server.address)
	c.greet(clientFlagFixedNewstyle)
	c.write(bytes.Repeat([]byte{0x42}, 16))
	c.expectClosed()
}

func TestOversizedExportNameCloses(t *testing.T) {
	server := startServer(t, newTestBackend())
	c := dial(t, server.address)
	c.greet(clientFlagFixedNewstyle)
	header := binary.BigEndian.AppendUint64(nil, magicOption)
	header = binary.BigEndian.AppendUint32(header, optionExportName)
	header = binary.BigEndian.AppendUint32(header, 1<<31)
	c.write(header)
	c.expectClosed()
}

func TestMetaContextNegotiation(t *testing.T) {
	server := startServer(t, newTestBackend())
	c := dial(t, server.address)
	c.greet(clientFlagFixedNewstyle)

	// Before structured replies: NBD_REP_ERR_INVALID.
	for _, option := range []uint32{optionListMetaContext, optionSetMetaContext} {
		if got := final(c.option(option, metaContextData("disk", metaContextAllocation))); got != replyErrorInvalid {
			t.Fatalf("option %d before structured replies: %#x", option, got)
		}
	}
	c.option(optionStructuredReply, nil)

	contexts := func(replies []optionReply) []string {
		t.Helper()
		if final(replies) != replyAck {
			t.Fatalf("final reply %#x %q", final(replies), replies[len(replies)-1].data)
		}
		var names []string
		for _, reply := range replies[:len(replies)-1] {
			if reply.replyType != replyMetaContext {
				t.Fatalf("reply %#x", reply.replyType)
			}
			names = append(names, fmt.Sprintf("%d:%s", binary.BigEndian.Uint32(reply.data), reply.data[4:]))
		}
		return names
	}
	for _, test := range []struct {
		option  uint32
		queries []string
		want    string
	}{
		{optionListMetaContext, nil, "[0:base:allocation]"},
		{optionListMetaContext, []string{"base:"}, "[0:base:allocation]"},
		{optionListMetaContext, []string{"qemu:dirty-bitmap:x", "base:allocation"}, "[0:base:allocation]"},
		{optionListMetaContext, []string{"x-unknown:thing"}, "[]"},
		{optionSetMetaContext, nil, "[]"},
		{optionSetMetaContext, []string{"base:"}, "[]"},
		{optionSetMetaContext, []string{"base:unknown", "nocolon"}, "[]"},
		{optionSetMetaContext, []string{metaContextAllocation, metaContextAllocation}, "[1:base:allocation]"},
	} {
		got := fmt.Sprint(contexts(c.option(test.option, metaContextData("disk", test.queries...))))
		if got != test.want {
			t.Errorf("option %d %q: %s, want %s", test.option, test.queries, got, test.want)
		}
	}
	// Syntactically invalid requests.
	valid := metaContextData("disk", metaContextAllocation)
	for name, data := range map[string][]byte{
		"empty":          nil,
		"truncated":      valid[:len(valid)-1],
		"trailing":       append(append([]byte(nil), valid...), 0),
		"huge count":     append(metaContextData("disk")[:8], 0xff, 0xff, 0xff, 0xff),
		"name too long":  binary.BigEndian.AppendUint32(nil, 1000),
		"invalid string": metaContextData("disk", "base:\x00"),
	} {
		if got := final(c.option(optionSetMetaContext, data)); got != replyErrorInvalid {
			t.Errorf("%s: reply %#x, want NBD_REP_ERR_INVALID", name, got)
		}
	}
	c.option(optionAbort, nil)
}

func TestBlockStatusNeedsContextForTheSameExport(t *testing.T) {
	server := startServer(t, newMemoryBackend(newMemoryDisk("disk", 1<<20), newMemoryDisk("other", 1<<20)))
	c := dial(t, server.address)
	c.greet(clientFlagFixedNewstyle | clientFlagNoZeroes)
	c.option(optionStructuredReply, nil)
	c.option(optionSetMetaContext, metaContextData("other", metaContextAllocation))
	if got := final(c.option(optionGo, exportRequestData("disk"))); got != replyAck {
		t.Fatalf("NBD_OPT_GO: %#x", got)
	}
	if r := c.roundTrip(0, commandBlockStatus, 0, 4096, nil); r.errno != errnoInvalid {
		t.Fatalf("block status with a context selected for another export: %v", r)
	}
	c.disconnect()
}

func TestShutdownRefusesOptions(t *testing.T) {
	server := startServer(t, newTestBackend())
	c := dial(t, server.address)
	c.greet(clientFlagFixedNewstyle)
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
	c.greet(clientFlagFixedNewstyle)
	if got := final(c.option(optionGo, exportRequestData("disk"))); got != replyErrorUnknown {
		t.Fatalf("NBD_OPT_GO with invalid block sizes: %#x", got)
	}
	c.option(optionAbort, nil)
}
