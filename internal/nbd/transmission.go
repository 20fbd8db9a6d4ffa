package nbd

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime/debug"
	"sync"
)

// This file is the transmission phase (spec, "Transmission"): one goroutine
// reads and validates requests, each valid request is served on its own
// goroutine, and replies are written under writeMutex.

// request is a decoded request header (spec, "Request message").
type request struct {
	flags   uint16
	command uint16
	cookie  uint64
	offset  uint64
	length  uint32
}

// decodeRequestHeader decodes C: magic, 16 bits flags, 16 bits type, 64 bits
// cookie, 64 bits offset, 32 bits length.
func decodeRequestHeader(header []byte) (request, error) {
	if len(header) != requestHeaderLength {
		return request{}, fmt.Errorf("%w: request header of %d bytes", ErrProtocol, len(header))
	}
	if magic := binary.BigEndian.Uint32(header[0:]); magic != magicRequest {
		// The stream cannot be resynchronised: hard disconnect.
		return request{}, fmt.Errorf("%w: request magic %#x", ErrProtocol, magic)
	}
	return request{
		flags:   binary.BigEndian.Uint16(header[4:]),
		command: binary.BigEndian.Uint16(header[6:]),
		cookie:  binary.BigEndian.Uint64(header[8:]),
		offset:  binary.BigEndian.Uint64(header[16:]),
		length:  binary.BigEndian.Uint32(header[24:]),
	}, nil
}

// transmission is the state of a connection in the transmission phase.
type transmission struct {
	connection        *connection
	export            Export
	info              ExportInfo
	flags             uint16
	exportName        string
	structuredReplies bool
	// blockStatus: base:allocation was selected for this export.
	blockStatus bool

	// ctx is passed to every Export call; cancel is called on a hard
	// disconnect so that the calls in flight give up.
	ctx    context.Context
	cancel context.CancelFunc

	// slots holds one token per request in flight; budget the payload
	// bytes they hold.
	slots    chan struct{}
	budget   *byteBudget
	inFlight sync.WaitGroup

	// writeMutex serialises replies; writeError (guarded by it) is the
	// first write failure, after which nothing more is written.
	writeMutex sync.Mutex
	writeError error
}

func (c *connection) newTransmission(export Export, info ExportInfo, flags uint16, name string) *transmission {
	return &transmission{
		connection:        c,
		export:            export,
		info:              info,
		flags:             flags,
		exportName:        name,
		structuredReplies: c.negotiation.structuredReplies,
		blockStatus:       c.negotiation.allocationSelected && c.negotiation.metaContextExport == name,
		slots:             make(chan struct{}, c.server.maxRequestsInFlight()),
		budget:            newByteBudget(c.server.maxBufferedBytes()),
	}
}

// serve runs the transmission phase to its end: it returns once every request
// has been answered (or abandoned, on a hard disconnect) and the export has
// been closed.
func (t *transmission) serve(ctx context.Context) error {
	t.ctx, t.cancel = context.WithCancel(ctx)
	defer t.cancel()
	err := t.readRequests()
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
	t.cancel()
	if err := t.export.Close(); err != nil {
		t.connection.logger.Warn("nbd: closing export", "export", t.exportName, "error", err)
	}
	if used := t.budget.inUse(); used != 0 {
		panic(fmt.Sprintf("nbd: %d budget bytes still held after the last request", used))
	}
	return err
}

// readRequests reads requests until NBD_CMD_DISC (nil) or an error.
func (t *transmission) readRequests() error {
	reader := t.connection.reader
	var header [requestHeaderLength]byte
	for {
		if _, err := io.ReadFull(reader, header[:]); err != nil {
			return err
		}
		request, err := decodeRequestHeader(header[:])
		if err != nil {
			return err
		}
		if request.command == commandDisconnect {
			// "A client MUST NOT send anything to the server after
			// sending an NBD_CMD_DISC command", so stop reading.
			return nil
		}
		if request.command == commandWrite && request.length > maximumPayloadLength {
			// The payload must be consumed to stay in sync, and a
			// payload this large is deemed a denial of service (spec,
			// "Size constraints"): hard disconnect.
			return fmt.Errorf("%w: write of %d bytes exceeds the %d-byte limit", ErrProtocol, request.length, maximumPayloadLength)
		}
		if code, message := t.validate(request); code != errnoNone {
			if request.command == commandWrite {
				if _, err := io.CopyN(io.Discard, reader, int64(request.length)); err != nil {
					return err
				}
			}
			t.replyError(request, code, message)
			continue
		}

		var budgetBytes int64
		if request.command == commandRead || request.command == commandWrite {
			budgetBytes = int64(request.length)
		}
		t.slots <- struct{}{}
		t.budget.acquire(budgetBytes)
		var payload *buffer
		if request.command == commandWrite {
			payload = t.getBuffer(int(request.length))
			if _, err := io.ReadFull(reader, payload.bytes); err != nil {
				t.putBuffer(payload)
				t.budget.release(budgetBytes)
				<-t.slots
				return err
			}
		}
		t.inFlight.Add(1)
		go t.handle(request, payload, budgetBytes)
	}
}

// validate checks a request against the spec and the negotiated features. It
// returns errnoNone for a request to serve, else the error to reply with.
func (t *transmission) validate(r request) (errno, string) {
	var allowedFlags uint16
	switch r.command {
	case commandRead:
		if t.structuredReplies {
			allowedFlags = commandFlagDontFragment
		}
	case commandWrite, commandFlush, commandTrim, commandCache:
	case commandWriteZeroes:
		allowedFlags = commandFlagNoHole
		if t.flags&transmissionFlagSendFastZero != 0 {
			allowedFlags |= commandFlagFastZero
		}
	case commandBlockStatus:
		allowedFlags = commandFlagRequestOne
	default:
		// "The server SHOULD return NBD_EINVAL if it receives an
		// unknown command."
		return errnoInvalid, fmt.Sprintf("nbd: unknown command %d", r.command)
	}
	// FUA is "valid for all commands, provided NBD_FLAG_SEND_FUA has been
	// negotiated" (spec, "Command flags").
	if t.flags&transmissionFlagSendFUA != 0 {
		allowedFlags |= commandFlagFUA
	}
	if extra := r.flags &^ allowedFlags; extra != 0 {
		// "The server SHOULD return NBD_EINVAL if it receives an unknown
		// command flag" or one not applicable to the request.
		return errnoInvalid, fmt.Sprintf("nbd: command flags %#x are not valid for command %d", extra, r.command)
	}

	length := uint64(r.length)
	inRange := r.offset <= t.info.Size && length <= t.info.Size-r.offset
	switch r.command {
	case commandRead:
		if r.length > t.info.PayloadSizeMaximum {
			if t.structuredReplies {
				// "the server is also permitted to reject large read
				// requests up front with NBD_EOVERFLOW".
				return errnoOverflow, fmt.Sprintf("nbd: read of %d bytes exceeds the maximum payload of %d", r.length, t.info.PayloadSizeMaximum)
			}
			return errnoInvalid, fmt.Sprintf("nbd: read of %d bytes exceeds the maximum payload of %d", r.length, t.info.PayloadSizeMaximum)
		}
		if !inRange {
			return errnoInvalid, "nbd: read beyond the end of the export"
		}
	case commandWrite:
		if t.info.ReadOnly {
			return errnoPermission, "nbd: export is read-only"
		}
		if r.length > t.info.PayloadSizeMaximum {
			return errnoInvalid, fmt.Sprintf("nbd: write of %d bytes exceeds the maximum payload of %d", r.length, t.info.PayloadSizeMaximum)
		}
		if !inRange {
			// "The server SHOULD return NBD_ENOSPC if it receives a
			// write request including one or more sectors beyond the
			// size of the device."
			return errnoNoSpace, "nbd: write beyond the end of the export"
		}
	case commandFlush:
		if t.flags&transmissionFlagSendFlush == 0 {
			return errnoInvalid, "nbd: flush was not negotiated"
		}
		if r.offset != 0 || r.length != 0 {
			return errnoInvalid, "nbd: flush offset and length must be zero"
		}
		return errnoNone, ""
	case commandTrim:
		if t.info.ReadOnly {
			return errnoPermission, "nbd: export is read-only"
		}
		if t.flags&transmissionFlagSendTrim == 0 {
			return errnoInvalid, "nbd: trim was not negotiated"
		}
		if !inRange {
			return errnoInvalid, "nbd: trim beyond the end of the export"
		}
	case commandCache:
		if !inRange {
			return errnoInvalid, "nbd: cache beyond the end of the export"
		}
	case commandWriteZeroes:
		if t.info.ReadOnly {
			return errnoPermission, "nbd: export is read-only"
		}
		if t.flags&transmissionFlagSendWriteZeroes == 0 {
			return errnoInvalid, "nbd: write zeroes was not negotiated"
		}
		if !inRange {
			return errnoNoSpace, "nbd: write zeroes beyond the end of the export"
		}
	case commandBlockStatus:
		if !t.blockStatus {
			// "Servers SHOULD reply with NBD_EINVAL to clients sending
			// NBD_CMD_BLOCK_STATUS without selecting at least one
			// metadata context."
			return errnoInvalid, "nbd: no metadata context was selected for this export"
		}
		if r.length == 0 {
			return errnoInvalid, "nbd: block status of zero bytes"
		}
		if !inRange {
			return errnoInvalid, "nbd: block status beyond the end of the export"
		}
	}
	// Offsets and lengths must be multiples of the minimum block size; the
	// end of an export whose size is not a multiple is still reachable
	// (spec, "Size constraints").
	minimum := uint64(t.info.BlockSizeMinimum)
	if r.offset%minimum != 0 || (length%minimum != 0 && r.offset+length != t.info.Size) {
		return errnoInvalid, fmt.Sprintf("nbd: request not aligned to the minimum block size of %d", minimum)
	}
	return errnoNone, ""
}

// handle serves one valid request on its own goroutine.
func (t *transmission) handle(r request, payload *buffer, budgetBytes int64) {
	defer t.inFlight.Done()
	defer func() { <-t.slots }()
	defer t.budget.release(budgetBytes)
	defer t.putBuffer(payload)
	defer func() {
		// A panic in the Backend is a bug, but one connection's bug must
		// not take down the node and every other client: log it loudly
		// and drop this connection.
		if recovered := recover(); recovered != nil {
			t.connection.logger.Error("nbd: panic while serving a request",
				"command", r.command, "panic", recovered, "stack", string(debug.Stack()))
			t.cancel()
			t.connection.hardClose()
		}
	}()

	fua := r.flags&commandFlagFUA != 0
	length := uint64(r.length)
	switch r.command {
	case commandRead:
		t.read(r)
	case commandWrite:
		var err error
		if length > 0 {
			err = t.export.WriteAt(t.ctx, payload.bytes, r.offset, fua)
		}
		t.replyStatus(r, err)
	case commandFlush:
		t.replyStatus(r, t.export.Flush(t.ctx))
	case commandTrim:
		var err error
		if length > 0 {
			err = t.export.Trim(t.ctx, r.offset, length, fua)
		}
		t.replyStatus(r, err)
	case commandCache:
		var err error
		if cacher, ok := t.export.(Cacher); ok && length > 0 {
			err = cacher.Cache(t.ctx, r.offset, length)
		}
		t.replyStatus(r, err)
	case commandWriteZeroes:
		if r.flags&commandFlagFastZero != 0 && !t.info.CanFastZero {
			// Unreachable while FAST_ZERO is only advertised with
			// CanFastZero, kept so that a change there stays safe.
			t.replyError(r, errnoNotSupported, "nbd: fast zero is not supported")
			return
		}
		var err error
		if length > 0 {
			err = t.export.WriteZeroes(t.ctx, r.offset, length, r.flags&commandFlagNoHole != 0, fua)
		}
		t.replyStatus(r, err)
	case commandBlockStatus:
		t.blockStatusReply(r)
	default:
		panic(fmt.Sprintf("nbd: command %d passed validation", r.command))
	}
}

func (t *transmission) read(r request) {
	data := t.getBuffer(int(r.length))
	defer t.putBuffer(data)
	if r.length > 0 {
		if err := t.export.ReadAt(t.ctx, data.bytes, r.offset); err != nil {
			t.replyError(r, errnoFor(err), messageFor(err))
			return
		}
	}
	if !t.structuredReplies {
		// Spec, "Simple reply message": header, then length bytes.
		t.send(simpleReplyHeader(r.cookie, errnoNone), data.bytes)
		return
	}
	if r.length == 0 {
		// A data chunk must describe at least one byte.
		t.send(chunkHeader(r.cookie, replyFlagDone, chunkNone, 0))
		return
	}
	// One NBD_REPLY_TYPE_OFFSET_DATA chunk, final because the data is
	// complete before it is sent (spec, "Structured replies" under
	// NBD_CMD_READ). A single chunk also satisfies NBD_CMD_FLAG_DF.
	header := chunkHeader(r.cookie, replyFlagDone, chunkOffsetData, 8+r.length)
	header = binary.BigEndian.AppendUint64(header, r.offset)
	t.send(header, data.bytes)
}

func (t *transmission) blockStatusReply(r request) {
	extents, err := t.export.BlockStatus(t.ctx, r.offset, uint64(r.length))
	if err != nil {
		t.replyError(r, errnoFor(err), messageFor(err))
		return
	}
	descriptors := encodeExtents(extents, r.length, r.flags&commandFlagRequestOne != 0)
	header := chunkHeader(r.cookie, replyFlagDone, chunkBlockStatus, uint32(4+len(descriptors)))
	header = binary.BigEndian.AppendUint32(header, allocationContextID)
	t.send(header, descriptors)
}

// encodeExtents turns a Backend's extents into NBD_REPLY_TYPE_BLOCK_STATUS
// descriptors (32 bits length, 32 bits flags) for a request of length bytes.
// It enforces the spec's rules whatever the Backend returned: no empty
// descriptor, at least one descriptor, lengths summing to at most the
// request (the spec lets the last one go further, but the range beyond may be
// past the end of the export), one descriptor under REQ_ONE, at most 2^20
// descriptors; consecutive extents with equal flags are merged ("The server
// SHOULD use different status values between consecutive descriptors").
func encodeExtents(extents []Extent, length uint32, requestOne bool) []byte {
	var descriptors []byte
	var count int
	var previousFlags uint32
	remaining := length
	for _, extent := range extents {
		if remaining == 0 || extent.Length == 0 {
			if remaining == 0 {
				break
			}
			continue
		}
		flags := uint32(0)
		if extent.Hole {
			flags |= stateHole
		}
		if extent.Zero {
			flags |= stateZero
		}
		piece := uint32(min(extent.Length, uint64(remaining)))
		remaining -= piece
		if count > 0 && flags == previousFlags {
			last := descriptors[len(descriptors)-8:]
			binary.BigEndian.PutUint32(last, binary.BigEndian.Uint32(last)+piece)
			continue
		}
		if count == maximumExtentsPerReply || (requestOne && count == 1) {
			break
		}
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
func (t *transmission) replyStatus(r request, err error) {
	if err != nil {
		t.replyError(r, errnoFor(err), messageFor(err))
		return
	}
	// A simple reply is allowed for everything but READ even when
	// structured replies were negotiated (spec, "Simple reply message").
	t.send(simpleReplyHeader(r.cookie, errnoNone))
}

// replyError answers r with an error: a simple reply without payload, or,
// with structured replies, an NBD_REPLY_TYPE_ERROR chunk carrying the message
// ("The server SHOULD prefer sending errors via a structured reply").
func (t *transmission) replyError(r request, code errno, message string) {
	if code == errnoNone {
		panic("nbd: error reply without an error")
	}
	if r.command != commandRead && r.command != commandBlockStatus {
		t.connection.logger.Debug("nbd: request failed", "command", r.command, "errno", code, "message", message)
	}
	if !t.structuredReplies {
		t.send(simpleReplyHeader(r.cookie, code))
		return
	}
	message = cleanString(message)
	header := chunkHeader(r.cookie, replyFlagDone, chunkError, uint32(6+len(message)))
	header = binary.BigEndian.AppendUint32(header, uint32(code))
	header = binary.BigEndian.AppendUint16(header, uint16(len(message)))
	t.send(header, []byte(message))
}

// simpleReplyHeader: S: magic, 32 bits error, 64 bits cookie.
func simpleReplyHeader(cookie uint64, code errno) []byte {
	header := make([]byte, simpleReplyLength, simpleReplyLength+8)
	binary.BigEndian.PutUint32(header[0:], magicSimpleReply)
	binary.BigEndian.PutUint32(header[4:], uint32(code))
	binary.BigEndian.PutUint64(header[8:], cookie)
	return header
}

// chunkHeader: S: magic, 16 bits flags, 16 bits type, 64 bits cookie, 32 bits
// payload length. The capacity leaves room for a short fixed payload prefix.
func chunkHeader(cookie uint64, flags, chunkType uint16, length uint32) []byte {
	header := make([]byte, chunkHeaderLength, chunkHeaderLength+8)
	binary.BigEndian.PutUint32(header[0:], magicStructuredReply)
	binary.BigEndian.PutUint16(header[4:], flags)
	binary.BigEndian.PutUint16(header[6:], chunkType)
	binary.BigEndian.PutUint64(header[8:], cookie)
	binary.BigEndian.PutUint32(header[16:], length)
	return header
}

// send writes one reply (its parts in one vectored write). After a failed
// write the connection is closed and nothing more is sent: a reply cut
// short leaves the stream unparseable.
func (t *transmission) send(parts ...[]byte) {
	buffers := net.Buffers(parts)
	t.writeMutex.Lock()
	defer t.writeMutex.Unlock()
	if t.writeError != nil {
		return
	}
	if _, err := buffers.WriteTo(t.connection.writer); err != nil {
		t.writeError = err
		t.connection.hardClose()
	}
}

func (t *transmission) getBuffer(n int) *buffer {
	t.connection.server.buffersOutstanding.Add(1)
	return getBuffer(n)
}

func (t *transmission) putBuffer(b *buffer) {
	if b == nil {
		return
	}
	t.connection.server.buffersOutstanding.Add(-1)
	putBuffer(b)
}
