package nbd

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"runtime/debug"
	"sync"
	"sync/atomic"

	"github.com/herd-storage/herd/internal/bufpool"
	"github.com/herd-storage/herd/internal/nbd/wire"
)

// This file is the transmission phase (spec, "Transmission"): one goroutine
// reads and validates requests, each valid request is served by one of the
// connection's workers, and replies are written by the workers, many in one
// write when they are ready together (replies.go).
//
// Workers, not a goroutine per request: a goroutine started per request
// grows its stack to what the data path needs (copied each time) and is
// torn down after one reply; measured at QD1, starting, growing and ending
// them was a tenth of the gateway's CPU. A connection starts a worker when
// it has more requests in flight than workers, so it keeps as many as its
// deepest moment needed (at most its request slots), parked between
// requests, and they end with the connection.

// decodeRequestHeader decodes C: magic, 16 bits flags, 16 bits type, 64 bits
// cookie, 64 bits offset, 32 bits length (spec, "Request message"). A bad
// magic number means the stream cannot be resynchronised: hard disconnect.
func decodeRequestHeader(header []byte) (wire.RequestHeader, error) {
	request, err := wire.ParseRequestHeader(header)
	if err != nil {
		return wire.RequestHeader{}, fmt.Errorf("%w: %w", ErrProtocol, err)
	}
	return request, nil
}

// transmission is the state of a connection in the transmission phase.
type transmission struct {
	connection        *connection
	export            Export
	info              ExportInfo
	flags             uint16
	exportName        string
	structuredReplies bool
	// contexts are the metadata contexts selected for this export, in the
	// order their chunks are sent; none: BLOCK_STATUS is refused.
	contexts []metaContext

	// ctx is passed to every Export call; cancel is called on a hard
	// disconnect so that the calls in flight give up.
	ctx    context.Context
	cancel context.CancelFunc

	// slots holds one token per request in flight; budget the payload
	// bytes they hold, and memory (the Server's, shared by every
	// connection) the same bytes again. A request takes its slot, then
	// its bytes of budget, then of memory, and gives them back in the
	// reverse order once its reply is written.
	slots    chan struct{}
	budget   *bufpool.Budget
	client   *bufpool.Budget // the client's share of memory (all its connections)
	memory   *bufpool.Budget
	inFlight sync.WaitGroup

	// work carries requests to the workers; workers counts them (both
	// only touched by the reading goroutine, which closes work at the end).
	work    chan job
	workers int

	// cut is set once a reply could not be written: the connection is
	// gone, so requests still buffered are not served.
	cut atomic.Bool

	// replies are the replies not yet written (replies.go); serving
	// counts the requests whose reply is not yet queued there.
	replies replyQueue
	serving atomic.Int64

	// wrote is set once a request that changes the export (WRITE, TRIM,
	// WRITE_ZEROES) is served: a graceful server shutdown flushes the
	// export before it closes the connection (shutdownFlush).
	wrote atomic.Bool
}

func (c *connection) newTransmission(export Export, info ExportInfo, flags uint16, name string) *transmission {
	return &transmission{
		connection:        c,
		export:            export,
		info:              info,
		flags:             flags,
		exportName:        name,
		structuredReplies: c.negotiation.structuredReplies,
		contexts:          c.selectedContexts(export, name),
		slots:             make(chan struct{}, c.server.maxRequestsInFlight()),
		work:              make(chan job, c.server.maxRequestsInFlight()),
		budget:            bufpool.NewBudget(c.server.maxBufferedBytes()),
		client:            c.server.clientMemory(c.clientKey),
		memory:            c.server.memoryBudgetShared(),
	}
}

// selectedContexts returns the metadata contexts BLOCK_STATUS answers for
// on export, opened as name: those the last NBD_OPT_SET_META_CONTEXT
// selected, if it named this export ("A client MUST NOT send
// NBD_CMD_BLOCK_STATUS unless ... the final time it was sent, it
// referred to the same export name"), and if the export still serves
// every one of them. Otherwise none: a client that sends BLOCK_STATUS
// anyway gets NBD_EINVAL, as when it selected none (spec, "Metadata
// querying"), rather than chunks missing for some of its context ids.
func (c *connection) selectedContexts(export Export, name string) []metaContext {
	contexts := c.negotiation.contexts
	if len(contexts) == 0 || c.negotiation.metaContextExport != name {
		return nil
	}
	statuser, _ := export.(MetaStatuser)
	for _, context := range contexts {
		if context.name == wire.BaseAllocation {
			continue
		}
		if statuser == nil || !statuser.HasMetaContext(context.name) {
			c.logger.Info("nbd: a selected metadata context is not served by the export opened; BLOCK_STATUS will be refused",
				"export", name, "context", context.name)
			return nil
		}
	}
	return contexts
}

// serve runs the transmission phase to its end: it returns once every request
// has been answered (or abandoned, on a hard disconnect) and the export has
// been closed.
func (t *transmission) serve(ctx context.Context) error {
	t.ctx, t.cancel = context.WithCancel(ctx)
	defer t.cancel()
	defer t.connection.server.releaseClientMemory(t.connection.clientKey)
	err := t.readRequests()
	close(t.work) // every request read is queued: the workers end once idle
	// A soft disconnect (NBD_CMD_DISC), a graceful server shutdown and a
	// client that closed its end between requests let the requests in
	// flight finish (spec, "NBD_CMD_DISC": "The server MUST handle all
	// outstanding requests"). Anything else is a hard disconnect: the
	// requests in flight are cancelled, and their replies are lost.
	graceful := err == nil || errors.Is(err, io.EOF) || t.connection.wasInterrupted()
	if !graceful {
		t.cancel()
		t.connection.hardClose()
	}
	t.inFlight.Wait()
	if graceful && t.connection.wasInterrupted() {
		t.shutdownFlush()
	}
	t.cancel()
	if err := t.export.Close(); err != nil {
		t.connection.logger.Warn("nbd: closing export", "export", t.exportName, "error", err)
	}
	if used := t.budget.InUse(); used != 0 {
		panic(fmt.Sprintf("nbd: %d budget bytes still held after the last request", used))
	}
	return err
}

// shutdownFlush makes the writes this connection acknowledged durable
// before a graceful server shutdown closes it: every request read was
// answered, but a client that wrote without FUA had no chance to send
// the FLUSH it may have meant to send next, and after the close it may
// reconnect to another server, or to this one restarted, and find its
// acknowledged writes there only if they were flushed. The client never
// learns the outcome (its connection is ending); a failure is logged. It
// runs under the connection's context, which a Shutdown whose deadline
// passes cancels.
func (t *transmission) shutdownFlush() {
	if !t.wrote.Load() || t.flags&wire.FlagSendFlush == 0 {
		return
	}
	if err := t.export.Flush(t.ctx); err != nil {
		t.connection.logger.Warn("nbd: flushing the export at shutdown failed: writes acknowledged without FUA may not be durable",
			"export", t.exportName, "error", err)
	}
}

// readRequests reads requests until NBD_CMD_DISC (nil) or an error.
func (t *transmission) readRequests() error {
	reader := t.connection.reader
	var header [wire.RequestHeaderLength]byte
	for {
		if t.cut.Load() {
			return errRepliesCut
		}
		if t.connection.revoked.Load() {
			return errRevoked
		}
		if _, err := io.ReadFull(reader, header[:]); err != nil {
			return err
		}
		request, err := decodeRequestHeader(header[:])
		if err != nil {
			return err
		}
		if request.Type == wire.CmdDisc {
			// "A client MUST NOT send anything to the server after
			// sending an NBD_CMD_DISC command", so stop reading.
			return nil
		}
		if request.Type == wire.CmdWrite && request.Length > wire.MaximumPayloadLength {
			// The payload must be consumed to stay in sync, and a
			// payload this large is deemed a denial of service (spec,
			// "Size constraints"): hard disconnect.
			return fmt.Errorf("%w: write of %d bytes exceeds the %d-byte limit", ErrProtocol, request.Length, wire.MaximumPayloadLength)
		}
		if code, message := t.validate(request); code != wire.NoError {
			if request.Type == wire.CmdWrite {
				if _, err := io.CopyN(io.Discard, reader, int64(request.Length)); err != nil {
					return err
				}
			}
			// The refusal holds a slot until it is written, as any
			// reply does: a client that sends refused requests and
			// does not read the answers is bounded like any other.
			t.slots <- struct{}{}
			t.inFlight.Add(1)
			t.serving.Add(1)
			a := answer{rep: newReply()}
			a.rep.slot = true
			t.replyError(&a, request, code, message)
			continue
		}

		var budgetBytes int64
		if request.Type == wire.CmdRead || request.Type == wire.CmdWrite {
			budgetBytes = int64(request.Length)
		}
		t.slots <- struct{}{}
		// Acquire fails only on a closed budget; these are never closed
		// (a hard disconnect wakes no reader blocked here, but the
		// requests holding the budget finish and release it, each within
		// the reply timeout).
		t.budget.Acquire(budgetBytes)
		t.acquireClientMemory(budgetBytes)
		t.acquireMemory(budgetBytes)
		var payload *bufpool.Buffer
		if request.Type == wire.CmdWrite {
			payload = t.getBuffer(int(request.Length))
			if _, err := io.ReadFull(reader, payload.Bytes); err != nil {
				t.putBuffer(payload)
				t.memory.Release(budgetBytes)
				t.client.Release(budgetBytes)
				t.budget.Release(budgetBytes)
				<-t.slots
				return err
			}
		}
		t.inFlight.Add(1)
		t.dispatch(job{request: request, payload: payload, budgetBytes: budgetBytes})
	}
}

// job is a valid request for a worker, with what it holds (see handle).
type job struct {
	request     wire.RequestHeader
	payload     *bufpool.Buffer
	budgetBytes int64
}

// dispatch queues j for a worker, starting one if the requests in flight
// (each holds a slot until its reply is written) outnumber the workers.
// A queued job never waits for a worker that is not finishing a request:
// there are at least as many workers as requests in flight. work holds
// as many jobs as there are slots, so the send never blocks.
func (t *transmission) dispatch(j job) {
	if t.workers < len(t.slots) {
		t.workers++
		go t.worker()
	}
	t.serving.Add(1)
	t.work <- j
}

// worker serves requests until the connection's last one is read.
func (t *transmission) worker() {
	for j := range t.work {
		t.handle(j)
	}
}

// errRepliesCut ends a transmission whose replies can no longer be written.
var errRepliesCut = errors.New("nbd: replies can no longer be written; connection cut")

// errRevoked ends a transmission whose client may no longer use its
// export (Server.Revalidate).
var errRevoked = errors.New("nbd: the client may no longer use its export; connection cut")

// acquireClientMemory takes n bytes of the client's share of the memory
// budget: one client's connections that do not read their replies hold
// at most that share, and other clients are served from the rest.
func (t *transmission) acquireClientMemory(n int64) {
	if n == 0 || t.client.TryAcquire(n) {
		return
	}
	server := t.connection.server
	t.connection.logLimited(slog.LevelInfo,
		"nbd: the client's share of the memory budget exhausted; connection stops reading requests until its replies free memory",
		"client_memory", server.memoryPerClient())
	t.client.Acquire(n)
}

// acquireMemory takes n bytes of the Server's memory budget, waiting for
// room (and so not reading further requests) if every connection together
// holds the whole budget. Waiting is normal under load, but says that the
// budget limits the node: logged, once a second at most.
func (t *transmission) acquireMemory(n int64) {
	if n == 0 || t.memory.TryAcquire(n) {
		return
	}
	server := t.connection.server
	t.connection.logLimited(slog.LevelInfo,
		"nbd: node memory budget exhausted; connection stops reading requests until replies free memory",
		"memory_budget", server.memoryBudget())
	t.memory.Acquire(n)
}

// validate checks a request against the spec and the negotiated features. It
// returns wire.NoError for a request to serve, else the error to reply with.
func (t *transmission) validate(r wire.RequestHeader) (wire.Errno, string) {
	var allowedFlags uint16
	switch r.Type {
	case wire.CmdRead:
		if t.structuredReplies {
			allowedFlags = wire.CmdFlagDF
		}
	case wire.CmdWrite, wire.CmdFlush, wire.CmdTrim, wire.CmdCache:
	case wire.CmdWriteZeroes:
		allowedFlags = wire.CmdFlagNoHole
		if t.flags&wire.FlagSendFastZero != 0 {
			allowedFlags |= wire.CmdFlagFastZero
		}
	case wire.CmdBlockStatus:
		allowedFlags = wire.CmdFlagReqOne
	default:
		// "The server SHOULD return NBD_EINVAL if it receives an
		// unknown command."
		return wire.EINVAL, fmt.Sprintf("nbd: unknown command %d", r.Type)
	}
	// FUA is "valid for all commands, provided NBD_FLAG_SEND_FUA has been
	// negotiated" (spec, "Command flags").
	if t.flags&wire.FlagSendFUA != 0 {
		allowedFlags |= wire.CmdFlagFUA
	}
	if extra := r.Flags &^ allowedFlags; extra != 0 {
		// "The server SHOULD return NBD_EINVAL if it receives an unknown
		// command flag" or one not applicable to the request.
		return wire.EINVAL, fmt.Sprintf("nbd: command flags %#x are not valid for command %d", extra, r.Type)
	}

	length := uint64(r.Length)
	inRange := r.Offset <= t.info.Size && length <= t.info.Size-r.Offset
	switch r.Type {
	case wire.CmdRead:
		if r.Length > t.info.PayloadSizeMaximum {
			if t.structuredReplies {
				// "the server is also permitted to reject large read
				// requests up front with NBD_EOVERFLOW".
				return wire.EOVERFLOW, fmt.Sprintf("nbd: read of %d bytes exceeds the maximum payload of %d", r.Length, t.info.PayloadSizeMaximum)
			}
			return wire.EINVAL, fmt.Sprintf("nbd: read of %d bytes exceeds the maximum payload of %d", r.Length, t.info.PayloadSizeMaximum)
		}
		if !inRange {
			return wire.EINVAL, "nbd: read beyond the end of the export"
		}
	case wire.CmdWrite:
		if t.info.ReadOnly {
			return wire.EPERM, "nbd: export is read-only"
		}
		if r.Length > t.info.PayloadSizeMaximum {
			return wire.EINVAL, fmt.Sprintf("nbd: write of %d bytes exceeds the maximum payload of %d", r.Length, t.info.PayloadSizeMaximum)
		}
		if !inRange {
			// "The server SHOULD return NBD_ENOSPC if it receives a
			// write request including one or more sectors beyond the
			// size of the device."
			return wire.ENOSPC, "nbd: write beyond the end of the export"
		}
	case wire.CmdFlush:
		if t.flags&wire.FlagSendFlush == 0 {
			return wire.EINVAL, "nbd: flush was not negotiated"
		}
		if r.Offset != 0 || r.Length != 0 {
			return wire.EINVAL, "nbd: flush offset and length must be zero"
		}
		return wire.NoError, ""
	case wire.CmdTrim:
		if t.info.ReadOnly {
			return wire.EPERM, "nbd: export is read-only"
		}
		if t.flags&wire.FlagSendTrim == 0 {
			return wire.EINVAL, "nbd: trim was not negotiated"
		}
		if !inRange {
			return wire.EINVAL, "nbd: trim beyond the end of the export"
		}
	case wire.CmdCache:
		if !inRange {
			return wire.EINVAL, "nbd: cache beyond the end of the export"
		}
	case wire.CmdWriteZeroes:
		if t.info.ReadOnly {
			return wire.EPERM, "nbd: export is read-only"
		}
		if t.flags&wire.FlagSendWriteZeroes == 0 {
			return wire.EINVAL, "nbd: write zeroes was not negotiated"
		}
		if !inRange {
			return wire.ENOSPC, "nbd: write zeroes beyond the end of the export"
		}
	case wire.CmdBlockStatus:
		if len(t.contexts) == 0 {
			// "Servers SHOULD reply with NBD_EINVAL to clients sending
			// NBD_CMD_BLOCK_STATUS without selecting at least one
			// metadata context."
			return wire.EINVAL, "nbd: no metadata context was selected for this export"
		}
		if r.Length == 0 {
			return wire.EINVAL, "nbd: block status of zero bytes"
		}
		if !inRange {
			return wire.EINVAL, "nbd: block status beyond the end of the export"
		}
	}
	// Offsets and lengths must be multiples of the minimum block size; the
	// end of an export whose size is not a multiple is still reachable
	// (spec, "Size constraints").
	minimum := uint64(t.info.BlockSizeMinimum)
	if r.Offset%minimum != 0 || (length%minimum != 0 && r.Offset+length != t.info.Size) {
		return wire.EINVAL, fmt.Sprintf("nbd: request not aligned to the minimum block size of %d", minimum)
	}
	return wire.NoError, ""
}

// handle serves one valid request (on a worker).
func (t *transmission) handle(j job) {
	r, payload := j.request, j.payload
	rep := newReply()
	rep.slot, rep.payload, rep.budgetBytes = true, payload, j.budgetBytes
	a := answer{rep: rep}
	defer func() {
		// A panic in the Backend is a bug, but one connection's bug must
		// not take down the node and every other client: log it loudly
		// and drop this connection.
		if recovered := recover(); recovered != nil {
			t.connection.logger.Error("nbd: panic while serving a request",
				"command", r.Type, "panic", recovered, "stack", string(debug.Stack()))
			t.cancel()
			t.connection.hardClose()
		}
		if !a.sent {
			t.serving.Add(-1)
			t.finish(rep)
		}
	}()

	if t.connection.revoked.Load() {
		// Read before the client was refused, served after: refused.
		t.replyStatus(&a, r, fmt.Errorf("%w: %v", ErrPermission, errRevoked))
		return
	}
	fua := r.Flags&wire.CmdFlagFUA != 0
	length := uint64(r.Length)
	switch r.Type {
	case wire.CmdRead:
		t.read(&a, r)
	case wire.CmdWrite:
		var err error
		if length > 0 {
			t.wrote.Store(true)
			err = t.export.WriteAt(t.ctx, payload.Bytes, r.Offset, fua)
		}
		t.replyStatus(&a, r, err)
	case wire.CmdFlush:
		t.replyStatus(&a, r, t.export.Flush(t.ctx))
	case wire.CmdTrim:
		var err error
		if length > 0 {
			t.wrote.Store(true)
			err = t.export.Trim(t.ctx, r.Offset, length, fua)
		}
		t.replyStatus(&a, r, err)
	case wire.CmdCache:
		var err error
		if cacher, ok := t.export.(Cacher); ok && length > 0 {
			err = cacher.Cache(t.ctx, r.Offset, length)
		}
		t.replyStatus(&a, r, err)
	case wire.CmdWriteZeroes:
		if r.Flags&wire.CmdFlagFastZero != 0 && !t.info.CanFastZero {
			// Unreachable while FAST_ZERO is only advertised with
			// CanFastZero, kept so that a change there stays safe.
			t.replyError(&a, r, wire.ENOTSUP, "nbd: fast zero is not supported")
			return
		}
		var err error
		if length > 0 {
			t.wrote.Store(true)
			err = t.export.WriteZeroes(t.ctx, r.Offset, length, r.Flags&wire.CmdFlagNoHole != 0, fua)
		}
		t.replyStatus(&a, r, err)
	case wire.CmdBlockStatus:
		t.blockStatusReply(&a, r)
	default:
		panic(fmt.Sprintf("nbd: command %d passed validation", r.Type))
	}
}

func (t *transmission) read(a *answer, r wire.RequestHeader) {
	data := t.getBuffer(int(r.Length))
	a.rep.data = data // given back once the reply is written
	if r.Length > 0 {
		if err := t.export.ReadAt(t.ctx, data.Bytes, r.Offset); err != nil {
			t.replyError(a, r, errnoFor(err), messageFor(err))
			return
		}
	}
	head := a.rep.head[:0]
	if !t.structuredReplies {
		// Spec, "Simple reply message": header, then length bytes.
		t.send(a, simpleReplyHeader(head, r.Cookie, wire.NoError), data.Bytes)
		return
	}
	if r.Length == 0 {
		// A data chunk must describe at least one byte.
		t.send(a, chunkHeader(head, r.Cookie, wire.ReplyFlagDone, wire.ReplyTypeNone, 0))
		return
	}
	// One NBD_REPLY_TYPE_OFFSET_DATA chunk, final because the data is
	// complete before it is sent (spec, "Structured replies" under
	// NBD_CMD_READ). A single chunk also satisfies NBD_CMD_FLAG_DF.
	header := chunkHeader(head, r.Cookie, wire.ReplyFlagDone, wire.ReplyTypeOffsetData, 8+r.Length)
	header = binary.BigEndian.AppendUint64(header, r.Offset)
	t.send(a, header, data.Bytes)
}

func (t *transmission) blockStatusReply(a *answer, r wire.RequestHeader) {
	// One NBD_REPLY_TYPE_BLOCK_STATUS chunk per selected context, the last
	// one final (spec, "NBD_CMD_BLOCK_STATUS"). Every answer is computed
	// before any chunk is sent, so that a failure is one error chunk.
	// The contexts share the spec's cap of 2^20 descriptors, so that a
	// reply never holds more than one context's worth did before.
	requestOne := r.Flags&wire.CmdFlagReqOne != 0
	limit := wire.MaximumBlockStatusDescriptors / len(t.contexts)
	parts := make([][]byte, 0, 2*len(t.contexts))
	for i, context := range t.contexts {
		var descriptors []byte
		if context.name == wire.BaseAllocation {
			extents, err := t.export.BlockStatus(t.ctx, r.Offset, uint64(r.Length))
			if err != nil {
				t.replyError(a, r, errnoFor(err), messageFor(err))
				return
			}
			descriptors = encodeDescriptors(len(extents), func(i int) (uint64, uint32) {
				return extents[i].Length, allocationFlags(extents[i])
			}, r.Length, requestOne, limit)
		} else {
			// selectedContexts checked that the export serves it.
			extents, err := t.export.(MetaStatuser).MetaStatus(t.ctx, context.name, r.Offset, uint64(r.Length))
			if err != nil {
				t.replyError(a, r, errnoFor(err), messageFor(err))
				return
			}
			descriptors = encodeDescriptors(len(extents), func(i int) (uint64, uint32) {
				return extents[i].Length, extents[i].Flags
			}, r.Length, requestOne, limit)
		}
		flags := uint16(0)
		if i == len(t.contexts)-1 {
			flags = wire.ReplyFlagDone
		}
		header := chunkHeader(nil, r.Cookie, flags, wire.ReplyTypeBlockStatus, uint32(4+len(descriptors)))
		header = binary.BigEndian.AppendUint32(header, context.id)
		parts = append(parts, header, descriptors)
	}
	t.send(a, parts...)
}

// allocationFlags are an Extent's base:allocation status flags.
func allocationFlags(extent Extent) uint32 {
	flags := uint32(0)
	if extent.Hole {
		flags |= wire.StateHole
	}
	if extent.Zero {
		flags |= wire.StateZero
	}
	return flags
}

// encodeExtents turns a Backend's base:allocation extents into
// descriptors (see encodeDescriptors) with the spec's cap of 2^20.
func encodeExtents(extents []Extent, length uint32, requestOne bool) []byte {
	return encodeDescriptors(len(extents), func(i int) (uint64, uint32) {
		return extents[i].Length, allocationFlags(extents[i])
	}, length, requestOne, wire.MaximumBlockStatusDescriptors)
}

// encodeDescriptors turns n extents (extent(i) is the i-th's length and
// status flags) into NBD_REPLY_TYPE_BLOCK_STATUS descriptors (32 bits
// length, 32 bits flags) for a request of length bytes. It enforces the
// spec's rules whatever the Backend returned: no empty descriptor, at
// least one descriptor, lengths summing to at most the request (the spec
// lets the last one go further, but the range beyond may be past the end
// of the export), one descriptor under REQ_ONE, at most limit
// descriptors; consecutive extents with equal flags are merged ("The
// server SHOULD use different status values between consecutive
// descriptors").
func encodeDescriptors(n int, extent func(i int) (uint64, uint32), length uint32, requestOne bool, limit int) []byte {
	var descriptors []byte
	var count int
	var previousFlags uint32
	remaining := length
	for i := 0; i < n && remaining > 0; i++ {
		extentLength, flags := extent(i)
		if extentLength == 0 {
			continue
		}
		piece := uint32(min(extentLength, uint64(remaining)))
		if count > 0 && flags == previousFlags {
			remaining -= piece
			last := descriptors[len(descriptors)-8:]
			binary.BigEndian.PutUint32(last, binary.BigEndian.Uint32(last)+piece)
			continue
		}
		if count >= limit || (requestOne && count == 1) {
			break
		}
		remaining -= piece
		descriptors = binary.BigEndian.AppendUint32(descriptors, piece)
		descriptors = binary.BigEndian.AppendUint32(descriptors, flags)
		previousFlags = flags
		count++
	}
	if count == 0 {
		// "The status flags are intentionally defined so that a server
		// MAY always safely report a status of 0 for any block".
		descriptors = binary.BigEndian.AppendUint32(descriptors, length)
		descriptors = binary.BigEndian.AppendUint32(descriptors, 0)
	}
	return descriptors
}

// replyStatus answers a request without payload.
func (t *transmission) replyStatus(a *answer, r wire.RequestHeader, err error) {
	if err != nil {
		t.replyError(a, r, errnoFor(err), messageFor(err))
		return
	}
	// A simple reply is allowed for everything but READ even when
	// structured replies were negotiated (spec, "Simple reply message").
	t.send(a, simpleReplyHeader(a.rep.head[:0], r.Cookie, wire.NoError))
}

// replyError answers r with an error: a simple reply without payload, or,
// with structured replies, an NBD_REPLY_TYPE_ERROR chunk carrying the message
// ("The server SHOULD prefer sending errors via a structured reply").
func (t *transmission) replyError(a *answer, r wire.RequestHeader, code wire.Errno, message string) {
	if code == wire.NoError {
		panic("nbd: error reply without an error")
	}
	if r.Type != wire.CmdRead && r.Type != wire.CmdBlockStatus {
		t.connection.logger.Debug("nbd: request failed", "command", r.Type, "errno", code, "message", message)
	}
	head := a.rep.head[:0]
	if !t.structuredReplies {
		t.send(a, simpleReplyHeader(head, r.Cookie, code))
		return
	}
	message = cleanString(message)
	header := chunkHeader(head, r.Cookie, wire.ReplyFlagDone, wire.ReplyTypeError, uint32(6+len(message)))
	header = binary.BigEndian.AppendUint32(header, uint32(code))
	header = binary.BigEndian.AppendUint16(header, uint16(len(message)))
	t.send(a, header, []byte(message))
}

// simpleReplyHeader appends S: magic, 32 bits error, 64 bits cookie to b.
func simpleReplyHeader(b []byte, cookie uint64, code wire.Errno) []byte {
	return wire.SimpleReplyHeader{Error: code, Cookie: cookie}.Append(b)
}

// chunkHeader appends S: magic, 16 bits flags, 16 bits type, 64 bits
// cookie, 32 bits payload length to b (nil: a new slice with room for a
// short fixed payload prefix).
func chunkHeader(b []byte, cookie uint64, flags, chunkType uint16, length uint32) []byte {
	if b == nil {
		b = make([]byte, 0, wire.StructuredReplyHeaderLength+8)
	}
	header := wire.StructuredReplyHeader{Flags: flags, Type: chunkType, Cookie: cookie, Length: length}
	return header.Append(b)
}

// answer is a request's reply on its way: sent once it was handed to
// deliver, after which the reply and what it holds are deliver's.
type answer struct {
	rep  *outgoing
	sent bool
}

// send queues one reply, its parts written together in order.
func (t *transmission) send(a *answer, parts ...[]byte) {
	if a.sent {
		panic("nbd: a request answered twice")
	}
	a.rep.parts = append(a.rep.parts, parts...)
	a.sent = true
	t.deliver(a.rep)
}

// getBuffer returns a pooled buffer of n bytes; n was validated against
// the export's maximum payload.
func (t *transmission) getBuffer(n int) *bufpool.Buffer {
	server := t.connection.server
	server.buffersOutstanding.Add(1)
	bytes := server.bufferBytesOutstanding.Add(int64(n))
	for {
		peak := server.bufferBytesPeak.Load()
		if bytes <= peak || server.bufferBytesPeak.CompareAndSwap(peak, bytes) {
			break
		}
	}
	return bufpool.Get(n)
}

func (t *transmission) putBuffer(b *bufpool.Buffer) {
	if b == nil {
		return
	}
	server := t.connection.server
	server.buffersOutstanding.Add(-1)
	server.bufferBytesOutstanding.Add(-int64(len(b.Bytes)))
	b.Release()
}

// Every payload this server accepts fits in a pooled buffer (a negative
// difference does not compile).
const _ uint = bufpool.MaximumLength - wire.MaximumPayloadLength
