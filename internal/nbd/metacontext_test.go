package nbd

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/herd-storage/herd/internal/nbd/wire"
)

// Metadata contexts other than base:allocation, served by a MetaContexter
// Backend (memoryBackend: each disk's meta).

const (
	contextDepth = "qemu:allocation-depth"
	contextS1    = "qemu:dirty-bitmap:s1"
	contextS2    = "qemu:dirty-bitmap:s2"
	contextO1    = "qemu:dirty-bitmap:o1"
)

var _ MetaContexter = (*memoryBackend)(nil)
var _ MetaStatuser = (*memoryExport)(nil)

// metaDisks are "disk" with three qemu: contexts and "other" with one.
func metaDisks() (*memoryDisk, *memoryDisk) {
	disk := newMemoryDisk("disk", 1<<20)
	disk.setMeta(contextDepth, []MetaExtent{{Length: 8192, Flags: 1}, {Length: 1<<20 - 8192, Flags: 2}})
	disk.setMeta(contextS1, []MetaExtent{{Length: 4096, Flags: 0}, {Length: 12288, Flags: 1}, {Length: 1<<20 - 16384, Flags: 0}})
	disk.setMeta(contextS2, []MetaExtent{{Length: 1 << 20, Flags: 1}})
	other := newMemoryDisk("other", 1<<20)
	other.setMeta(contextO1, []MetaExtent{{Length: 1 << 20, Flags: 1}})
	return disk, other
}

// contextReplies turns the replies of a LIST or SET into "id:name", and
// fails unless they end with an ACK.
func contextReplies(t *testing.T, replies []optionReply) []string {
	t.Helper()
	if final(replies) != wire.RepAck {
		t.Fatalf("final reply %#x %q", final(replies), replies[len(replies)-1].data)
	}
	var names []string
	for _, reply := range replies[:len(replies)-1] {
		if reply.replyType != wire.RepMetaContext {
			t.Fatalf("reply %#x", reply.replyType)
		}
		names = append(names, fmt.Sprintf("%d:%s", binary.BigEndian.Uint32(reply.data), reply.data[4:]))
	}
	return names
}

func structuredClient(t *testing.T, address string) *testClient {
	t.Helper()
	c := dial(t, address)
	c.greet(wire.FlagCFixedNewstyle | wire.FlagCNoZeroes)
	if got := final(c.option(wire.OptStructuredReply, nil)); got != wire.RepAck {
		t.Fatalf("NBD_OPT_STRUCTURED_REPLY: %#x", got)
	}
	return c
}

func TestMetaContextListAndSet(t *testing.T) {
	disk, other := metaDisks()
	server := startServer(t, newMemoryBackend(disk, other))
	c := structuredClient(t, server.address)
	for _, test := range []struct {
		option  uint32
		export  string
		queries []string
		want    string
	}{
		// No query: everything the export has, ids zero.
		{wire.OptListMetaContext, "disk", nil, "[0:base:allocation 0:qemu:allocation-depth 0:qemu:dirty-bitmap:s1 0:qemu:dirty-bitmap:s2]"},
		// Namespace and leaf prefixes are wildcards for LIST.
		{wire.OptListMetaContext, "disk", []string{"qemu:"}, "[0:qemu:allocation-depth 0:qemu:dirty-bitmap:s1 0:qemu:dirty-bitmap:s2]"},
		{wire.OptListMetaContext, "disk", []string{"qemu:dirty-bitmap:"}, "[0:qemu:dirty-bitmap:s1 0:qemu:dirty-bitmap:s2]"},
		{wire.OptListMetaContext, "disk", []string{"base:", contextS2}, "[0:base:allocation 0:qemu:dirty-bitmap:s2]"},
		// Which contexts exist depends on the export named.
		{wire.OptListMetaContext, "disk", []string{contextO1}, "[]"},
		{wire.OptListMetaContext, "other", nil, "[0:base:allocation 0:qemu:dirty-bitmap:o1]"},
		{wire.OptListMetaContext, "ro/disk", []string{"qemu:dirty-bitmap:"}, "[0:qemu:dirty-bitmap:s1 0:qemu:dirty-bitmap:s2]"},
		// Unknown namespaces and names are ignored; an unknown export
		// has only base:allocation, as before.
		{wire.OptListMetaContext, "disk", []string{"x-unknown:a", "nocolon", "qemu:nothing"}, "[]"},
		{wire.OptListMetaContext, "missing", nil, "[0:base:allocation]"},
		{wire.OptListMetaContext, "missing", []string{"qemu:"}, "[]"},
		// SET: exact names only, each with its id; wildcards and unknown
		// names select nothing.
		{wire.OptSetMetaContext, "disk", []string{wire.BaseAllocation, contextDepth, "qemu:", "qemu:dirty-bitmap:", contextS1, "qemu:dirty-bitmap:zz", contextS1},
			"[1:base:allocation 2:qemu:allocation-depth 3:qemu:dirty-bitmap:s1]"},
		// Ids are stable for the connection: s1 keeps 3, s2 gets the next.
		{wire.OptSetMetaContext, "disk", []string{contextS2, contextS1}, "[4:qemu:dirty-bitmap:s2 3:qemu:dirty-bitmap:s1]"},
		{wire.OptSetMetaContext, "disk", []string{contextO1}, "[]"},
		{wire.OptSetMetaContext, "other", []string{contextO1, contextDepth}, "[5:qemu:dirty-bitmap:o1]"},
		{wire.OptSetMetaContext, "missing", []string{contextS1, wire.BaseAllocation}, "[1:base:allocation]"},
		{wire.OptSetMetaContext, "disk", nil, "[]"},
	} {
		got := fmt.Sprint(contextReplies(t, c.option(test.option, metaContextData(test.export, test.queries...))))
		if got != test.want {
			t.Errorf("option %d on %q %q: %s, want %s", test.option, test.export, test.queries, got, test.want)
		}
	}
	c.option(wire.OptAbort, nil)
}

func TestMetaContextSetTooMany(t *testing.T) {
	disk := newMemoryDisk("disk", 1<<20)
	var queries []string
	for i := range maximumSelectedContexts + 1 {
		name := fmt.Sprintf("qemu:dirty-bitmap:t%d", i)
		disk.setMeta(name, []MetaExtent{{Length: 1 << 20}})
		queries = append(queries, name)
	}
	server := startServer(t, newMemoryBackend(disk))
	c := structuredClient(t, server.address)
	if got := final(c.option(wire.OptSetMetaContext, metaContextData("disk", queries...))); got != wire.RepErrTooBig {
		t.Fatalf("selecting %d contexts: reply %#x, want NBD_REP_ERR_TOO_BIG", len(queries), got)
	}
	// The failed SET selected nothing.
	if got := final(c.option(wire.OptGo, exportRequestData("disk"))); got != wire.RepAck {
		t.Fatalf("NBD_OPT_GO: %#x", got)
	}
	if r := c.roundTrip(0, wire.CmdBlockStatus, 0, 4096, nil); r.errno != wire.EINVAL {
		t.Fatalf("block status after a failed SET: %v", r)
	}
	c.disconnect()
	// The limit itself is fine.
	c = structuredClient(t, server.address)
	if got := contextReplies(t, c.option(wire.OptSetMetaContext, metaContextData("disk", queries[:maximumSelectedContexts]...))); len(got) != maximumSelectedContexts {
		t.Fatalf("%d contexts selected", len(got))
	}
	c.option(wire.OptAbort, nil)
}

// blockStatusChunks reads the chunks of one BLOCK_STATUS reply: context id
// -> descriptors, and the ids in the order received. Only the last chunk
// may be final.
func (c *testClient) blockStatusChunks(flags uint16, offset uint64, length uint32) (map[uint32][][2]uint32, []uint32, reply) {
	c.t.Helper()
	const cookie = 0xb5
	c.sendRequest(flags, wire.CmdBlockStatus, cookie, offset, length, nil)
	chunks := map[uint32][][2]uint32{}
	var order []uint32
	for {
		r := c.readReply()
		if r.cookie != cookie {
			c.t.Fatalf("reply cookie %#x", r.cookie)
		}
		if !r.structured || r.chunkType != wire.ReplyTypeBlockStatus {
			if len(order) > 0 {
				c.t.Fatalf("a %v after block status chunks", r)
			}
			return nil, nil, r
		}
		id := binary.BigEndian.Uint32(r.payload)
		if _, twice := chunks[id]; twice {
			c.t.Fatalf("two chunks for context %d", id)
		}
		order = append(order, id)
		var descriptors [][2]uint32
		for rest := r.payload[4:]; len(rest) > 0; rest = rest[8:] {
			descriptors = append(descriptors, [2]uint32{binary.BigEndian.Uint32(rest), binary.BigEndian.Uint32(rest[4:])})
		}
		chunks[id] = descriptors
		if r.flags&wire.ReplyFlagDone != 0 {
			return chunks, order, r
		}
	}
}

func TestBlockStatusThreeContexts(t *testing.T) {
	disk, other := metaDisks()
	var failMeta atomic.Bool
	disk.gate = func(_ context.Context, operation string) error {
		if operation == "meta-status" && failMeta.Load() {
			return fmt.Errorf("%w: the map is unreadable", ErrIO)
		}
		return nil
	}
	server := startServer(t, newMemoryBackend(disk, other))
	c := structuredClient(t, server.address)
	selected := contextReplies(t, c.option(wire.OptSetMetaContext, metaContextData("disk", contextS1, wire.BaseAllocation, contextDepth)))
	if got := fmt.Sprint(selected); got != "[1:base:allocation 2:qemu:dirty-bitmap:s1 3:qemu:allocation-depth]" {
		t.Fatalf("selected %s", got)
	}
	ids := map[string]uint32{}
	for _, s := range selected {
		id, name, _ := strings.Cut(s, ":")
		var n uint32
		fmt.Sscan(id, &n)
		ids[name] = n
	}
	if len(ids) != 3 || ids[wire.BaseAllocation] != allocationContextID || ids[contextDepth] == ids[contextS1] {
		t.Fatalf("ids %v", ids)
	}
	if got := final(c.option(wire.OptGo, exportRequestData("disk"))); got != wire.RepAck {
		t.Fatalf("NBD_OPT_GO: %#x", got)
	}
	if r := c.roundTrip(0, wire.CmdWrite, 4096, 4096, pattern(1, 4096)); r.errno != wire.NoError {
		t.Fatalf("write: %v", r)
	}
	hole := wire.StateHole | wire.StateZero

	chunks, order, last := c.blockStatusChunks(0, 0, 1<<20)
	if len(order) != 3 || last.flags != wire.ReplyFlagDone {
		t.Fatalf("%d chunks (%v), last flags %#x", len(order), order, last.flags)
	}
	for context, want := range map[string][][2]uint32{
		wire.BaseAllocation: {{4096, hole}, {4096, 0}, {1<<20 - 8192, hole}},
		contextDepth:        {{8192, 1}, {1<<20 - 8192, 2}},
		contextS1:           {{4096, 0}, {12288, 1}, {1<<20 - 16384, 0}},
	} {
		if got := chunks[ids[context]]; fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s: %v, want %v", context, got, want)
		}
	}

	// From an offset inside extents, and cut at the request's end.
	chunks, _, _ = c.blockStatusChunks(0, 6000, 10000)
	for context, want := range map[string][][2]uint32{
		wire.BaseAllocation: {{2192, 0}, {7808, hole}},
		contextDepth:        {{2192, 1}, {7808, 2}},
		contextS1:           {{10000, 1}},
	} {
		if got := chunks[ids[context]]; fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("range: %s: %v, want %v", context, got, want)
		}
	}

	// REQ_ONE: exactly one descriptor per context, none longer than the
	// request.
	chunks, order, _ = c.blockStatusChunks(wire.CmdFlagReqOne, 2048, 20000)
	if len(order) != 3 {
		t.Fatalf("REQ_ONE: %d chunks", len(order))
	}
	for context, want := range map[string][][2]uint32{
		wire.BaseAllocation: {{2048, hole}},
		contextDepth:        {{6144, 1}},
		contextS1:           {{2048, 0}},
	} {
		if got := chunks[ids[context]]; fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("REQ_ONE: %s: %v, want %v", context, got, want)
		}
	}
	chunks, _, _ = c.blockStatusChunks(wire.CmdFlagReqOne, 4096, 100)
	for context, want := range map[string][][2]uint32{
		wire.BaseAllocation: {{100, 0}},
		contextDepth:        {{100, 1}},
		contextS1:           {{100, 1}},
	} {
		if got := chunks[ids[context]]; fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("REQ_ONE short: %s: %v, want %v", context, got, want)
		}
	}

	// A context that fails makes the reply one error chunk, no status.
	failMeta.Store(true)
	chunks, order, r := c.blockStatusChunks(0, 0, 4096)
	if len(order) != 0 || chunks != nil || r.errno != wire.EIO || r.chunkType != wire.ReplyTypeError || r.flags != wire.ReplyFlagDone {
		t.Fatalf("failing context: %v (%d status chunks)", r, len(order))
	}
	c.disconnect()
}

// TestMetaContextsForAnotherExport: the contexts count only for the export
// the SET named (spec: "A client MUST NOT send NBD_CMD_BLOCK_STATUS unless
// ... it referred to the same export name"; the server "SHOULD" answer
// NBD_EINVAL), and only while the export opened still serves them all.
func TestMetaContextsForAnotherExport(t *testing.T) {
	for _, test := range []struct {
		name       string
		setExport  string
		goExport   string
		queries    []string
		beforeGo   func(disk *memoryDisk)
		wantStatus bool
	}{
		{"same export", "disk", "disk", []string{contextS1}, nil, true},
		{"other export", "other", "disk", []string{contextO1}, nil, false},
		{"other export, base too", "other", "disk", []string{wire.BaseAllocation, contextO1}, nil, false},
		{"snapshot name", "disk@snap", "disk", []string{contextS1}, nil, false},
		{"snapshot name both times", "disk@snap", "disk@snap", []string{contextS1, wire.BaseAllocation}, nil, true},
		{"context gone before GO", "disk", "disk", []string{wire.BaseAllocation, contextS1}, func(disk *memoryDisk) { disk.setMeta(contextS1, nil) }, false},
	} {
		t.Run(test.name, func(t *testing.T) {
			disk, other := metaDisks()
			server := startServer(t, newMemoryBackend(disk, other))
			c := structuredClient(t, server.address)
			if got := contextReplies(t, c.option(wire.OptSetMetaContext, metaContextData(test.setExport, test.queries...))); len(got) != len(test.queries) {
				t.Fatalf("selected %v", got)
			}
			if test.beforeGo != nil {
				test.beforeGo(disk)
			}
			if got := final(c.option(wire.OptGo, exportRequestData(test.goExport))); got != wire.RepAck {
				t.Fatalf("NBD_OPT_GO: %#x", got)
			}
			chunks, order, r := c.blockStatusChunks(0, 0, 65536)
			if test.wantStatus {
				if len(order) != len(test.queries) || len(chunks) != len(test.queries) {
					t.Fatalf("block status: %v, %d chunks, want %d", r, len(order), len(test.queries))
				}
			} else if r.errno != wire.EINVAL || len(order) != 0 {
				t.Fatalf("block status: %v, want EINVAL", r)
			}
			c.disconnect()
		})
	}
}

// TestMetaContextBackendError: a Backend refusing the query (a revoked
// client) refuses the option, and a failed SET selects nothing.
func TestMetaContextBackendError(t *testing.T) {
	disk, other := metaDisks()
	backend := newMemoryBackend(disk, other)
	backend.metaError = fmt.Errorf("%w: certificate revoked", ErrPermission)
	server := startServer(t, backend)
	c := structuredClient(t, server.address)
	for _, option := range []uint32{wire.OptListMetaContext, wire.OptSetMetaContext} {
		replies := c.option(option, metaContextData("disk", wire.BaseAllocation, contextS1))
		if got := final(replies); got != wire.RepErrPolicy || !strings.Contains(string(replies[len(replies)-1].data), "revoked") {
			t.Fatalf("option %d: %#x %q", option, got, replies[len(replies)-1].data)
		}
	}
	// Only base: queries do not ask the Backend.
	if got := fmt.Sprint(contextReplies(t, c.option(wire.OptSetMetaContext, metaContextData("disk", wire.BaseAllocation)))); got != "[1:base:allocation]" {
		t.Fatalf("base only: %s", got)
	}
	if !errors.Is(backend.metaError, ErrPermission) {
		t.Fatal("test bug")
	}
	c.option(wire.OptAbort, nil)
}
