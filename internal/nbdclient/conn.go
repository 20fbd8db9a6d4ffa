package nbdclient

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/herd-storage/herd/internal/nbd/wire"
	"github.com/herd-storage/herd/internal/tlsbatch"
)

// closeTimeout bounds how long Close waits for the requests in flight before
// it disconnects anyway.
const closeTimeout = 30 * time.Second

// Flag selects optional behaviour of a command (spec, "Command flags").
type Flag uint16

const (
	// FUA (force unit access): the reply comes only once the data is on
	// stable storage. Valid for WriteAt, Zero and Trim; needs CanFUA.
	FUA = Flag(wire.CmdFlagFUA)
	// NoHole: Zero must leave the range allocated (no hole punched).
	NoHole = Flag(wire.CmdFlagNoHole)
	// FastZero: Zero fails quickly with ENOTSUP instead of writing zeroes
	// slowly. Needs CanFastZero.
	FastZero = Flag(wire.CmdFlagFastZero)
)

// Extent is one run of a base:allocation block status answer (spec,
// "base:allocation").
type Extent struct {
	Length uint64
	// Hole: the range is not allocated (NBD_STATE_HOLE).
	Hole bool
	// Zero: the range reads as zeroes (NBD_STATE_ZERO). A hole without
	// Zero has undefined contents.
	Zero bool
}

// MetaExtent is one run of a block status answer for a metadata context
// other than base:allocation (Conn.MetaStatus): Flags are that context's
// status flags (for qemu:dirty-bitmap:TAG, 1 is dirty; for
// qemu:allocation-depth, the depth).
type MetaExtent struct {
	Length uint64
	Flags  uint32
}

// Conn is a connection to one export in the transmission phase. It is safe
// for concurrent use: every method may be called from many goroutines, and
// their requests are in flight together. Context cancellation abandons a
// request: the method returns ctx.Err() at once and the reply, when it
// comes, is discarded; if READ data for it was arriving at that moment, the
// connection is closed instead (the data cannot be dropped halfway), and the
// method returns once nothing more is written to its buffer.
type Conn struct {
	negotiated
	netConn net.Conn
	reader  io.Reader

	// writeSlot holds one token: whoever holds it writes one whole request,
	// so that requests are not interleaved on the wire.
	writeSlot chan struct{}
	// readerDone is closed when the reply reader has returned; from then
	// on nothing is written to any caller's buffer.
	readerDone chan struct{}

	// mu guards the fields below, and the receiving, abandoned, finished
	// and result fields of every pending call.
	mu         sync.Mutex
	pending    map[uint64]*call
	nextHandle uint64
	// failure is why the connection is unusable (nil while usable).
	failure error
	// closing: no new requests (Close was called, or the server is shutting
	// down); closeReason is what new requests get. idle is closed when
	// closing and nothing is pending.
	closing     bool
	closeReason error
	idle        chan struct{}
	idleClosed  bool
}

func newConn(netConn net.Conn, reader io.Reader, state negotiated) *Conn {
	c := newConnState(netConn, reader, state)
	go c.readLoop()
	return c
}

// newConnState builds a Conn without starting its reader (the fuzz tests
// drive the reader themselves).
func newConnState(netConn net.Conn, reader io.Reader, state negotiated) *Conn {
	return &Conn{
		negotiated: state,
		netConn:    netConn,
		reader:     reader,
		writeSlot:  make(chan struct{}, 1),
		readerDone: make(chan struct{}),
		pending:    make(map[uint64]*call),
		idle:       make(chan struct{}),
	}
}

// Size is the export's size in bytes.
func (c *Conn) Size() uint64 { return c.size }

// ExportName is the name the connection was opened with.
func (c *Conn) ExportName() string { return c.exportName }

// ReadOnly: the server refuses writes (NBD_FLAG_READ_ONLY).
func (c *Conn) ReadOnly() bool { return c.flags&wire.FlagReadOnly != 0 }

// CanFlush: the server has a write cache that Flush empties
// (NBD_FLAG_SEND_FLUSH).
func (c *Conn) CanFlush() bool { return c.flags&wire.FlagSendFlush != 0 }

// CanFUA: the FUA flag is honoured (NBD_FLAG_SEND_FUA).
func (c *Conn) CanFUA() bool { return c.flags&wire.FlagSendFUA != 0 }

// CanTrim: Trim is available (NBD_FLAG_SEND_TRIM).
func (c *Conn) CanTrim() bool { return c.flags&wire.FlagSendTrim != 0 && !c.ReadOnly() }

// CanZero: Zero is available (NBD_FLAG_SEND_WRITE_ZEROES).
func (c *Conn) CanZero() bool { return c.flags&wire.FlagSendWriteZeroes != 0 && !c.ReadOnly() }

// CanFastZero: the FastZero flag is available (NBD_FLAG_SEND_FAST_ZERO).
func (c *Conn) CanFastZero() bool { return c.flags&wire.FlagSendFastZero != 0 && c.CanZero() }

// CanMultiConn: flushes and FUA writes on one connection to this export
// cover the writes completed on every other connection to it
// (NBD_FLAG_CAN_MULTI_CONN), so parallel connections need one Flush.
func (c *Conn) CanMultiConn() bool { return c.flags&wire.FlagCanMultiConn != 0 }

// Rotational: the server says the storage has seek costs
// (NBD_FLAG_ROTATIONAL).
func (c *Conn) Rotational() bool { return c.flags&wire.FlagRotational != 0 }

// StructuredReplies: structured replies were negotiated, so errors carry the
// server's messages.
func (c *Conn) StructuredReplies() bool { return c.structuredReplies }

// CanBlockStatus: BlockStatus is available (base:allocation was selected).
func (c *Conn) CanBlockStatus() bool { return c.blockStatus }

// MetaContexts returns the contexts of Dialer.MetaContexts that the
// server selected, sorted: those MetaStatus reads.
func (c *Conn) MetaContexts() []string {
	names := make([]string, 0, len(c.metaIDs))
	for name := range c.metaIDs {
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}

// CanMetaStatus: MetaStatus can read the named context (the server
// selected it).
func (c *Conn) CanMetaStatus(name string) bool {
	_, ok := c.metaIDs[name]
	return ok
}

// selectedContexts is the number of contexts every BLOCK_STATUS reply
// answers for.
func (c *Conn) selectedContexts() int {
	n := len(c.metaIDs)
	if c.blockStatus {
		n++
	}
	return n
}

// BlockSizes returns the server's minimum block size (every offset and
// length must be a multiple, except a length reaching the end of the
// export), its preferred block size, and the largest READ or WRITE payload
// this client sends (larger calls are split).
func (c *Conn) BlockSizes() (minimum, preferred, payloadMaximum uint32) {
	return c.blockSizeMinimum, c.blockSizePreferred, c.payloadMaximum
}

// call is one request in flight.
type call struct {
	handle  uint64
	command uint16
	offset  uint64
	length  uint32
	buffer  []byte // READ: the caller's buffer, len(buffer) == length
	done    chan struct{}

	// Touched by the reply reader only, until it finishes the call.
	covered      []interval // READ: parts received, sorted, merged
	coveredBytes uint64
	want         uint32   // BLOCK_STATUS: the context id whose extents are kept
	seen         []uint32 // BLOCK_STATUS: the context ids answered so far
	building     []Extent
	buildingMeta []MetaExtent
	chunkError   error // first error chunk

	// Guarded by Conn.mu.
	receiving bool // the reader is writing into buffer
	abandoned bool // the caller stopped waiting
	finished  bool
	err       error
	extents   []Extent
	meta      []MetaExtent
}

// interval is a half-open byte range [start, end) relative to the request.
type interval struct{ start, end uint64 }

func (call *call) describe() string {
	return fmt.Sprintf("%s of %d bytes at offset %d", commandNames[call.command], call.length, call.offset)
}

func (call *call) commandError(errno uint32, message string) *Error {
	return &Error{Command: commandNames[call.command], Offset: call.offset, Length: uint64(call.length), Errno: errno, Message: message}
}

// register gives call a handle and makes it pending.
func (c *Conn) register(call *call) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	// A connection closing says why first: after an ESHUTDOWN the server
	// closing its side is expected, and "shutting down" is what the
	// caller must hear, whether or not the reader has met the EOF yet.
	if c.closing {
		return c.closeReason
	}
	if c.failure != nil {
		return c.failure
	}
	c.nextHandle++
	call.handle = c.nextHandle
	call.done = make(chan struct{})
	c.pending[call.handle] = call
	return nil
}

// finish completes call with err (and, for BLOCK_STATUS, extents). Only the
// first completion counts.
func (c *Conn) finish(call *call, err error, extents []Extent) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.finishLocked(call, err, extents)
}

func (c *Conn) finishLocked(call *call, err error, extents []Extent) {
	if call.finished {
		return
	}
	call.finished = true
	call.err = err
	call.extents = extents
	if err == nil {
		call.meta = call.buildingMeta
	}
	if c.pending[call.handle] == call {
		delete(c.pending, call.handle)
	}
	close(call.done)
	c.checkIdleLocked()
}

// checkIdleLocked closes idle once the connection is closing and no caller
// waits for a reply any more (abandoned requests are not waited for).
func (c *Conn) checkIdleLocked() {
	if !c.closing || c.idleClosed {
		return
	}
	for _, call := range c.pending {
		if !call.abandoned {
			return
		}
	}
	c.idleClosed = true
	close(c.idle)
}

// fail makes the connection unusable: every pending call fails with cause,
// and the socket is closed (a hard disconnect, spec "Terminating the
// transmission phase").
func (c *Conn) fail(cause error) {
	c.mu.Lock()
	if c.failure == nil {
		if errors.Is(cause, ErrClosed) {
			c.failure = cause
		} else {
			c.failure = fmt.Errorf("%w: %w", ErrClosed, cause)
		}
	}
	for _, call := range c.pending {
		c.finishLocked(call, c.failure, nil)
	}
	c.mu.Unlock()
	c.netConn.Close()
}

// send registers call and writes its request; payload is the WRITE data.
// When send returns, payload is no longer used.
func (c *Conn) send(ctx context.Context, call *call, flags uint16, payload []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := c.register(call); err != nil {
		return err
	}
	select {
	case c.writeSlot <- struct{}{}:
	case <-ctx.Done():
		c.finish(call, ctx.Err(), nil) // never sent: no reply will come
		return ctx.Err()
	case <-c.readerDone:
		c.finish(call, c.connectionFailure(), nil)
		return c.connectionFailure()
	}
	defer func() { <-c.writeSlot }()

	// C: magic, 16 bits flags, 16 bits type, 64 bits handle, 64 bits
	// offset, 32 bits length, payload (spec, "Request message").
	request := wire.RequestHeader{Flags: flags, Type: call.command, Cookie: call.handle, Offset: call.offset, Length: call.length}
	header := request.Append(make([]byte, 0, wire.RequestHeaderLength))
	if err := c.write(ctx, header, payload); err != nil {
		// A request may have been cut halfway: the stream is lost.
		c.fail(fmt.Errorf("sending %s: %w", call.describe(), err))
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return c.connectionFailure()
	}
	return nil
}

// writeBuffers is one vectored write (over TLS: as few records and
// system calls as tlsbatch manages).
func (c *Conn) writeBuffers(buffers net.Buffers) error {
	var err error
	if t, ok := c.netConn.(*tls.Conn); ok {
		_, err = tlsbatch.Write(t, buffers)
	} else {
		_, err = buffers.WriteTo(c.netConn)
	}
	return err
}

// write writes header and payload as one vectored write; cancelling ctx
// interrupts it.
func (c *Conn) write(ctx context.Context, header, payload []byte) error {
	buffers := net.Buffers{header}
	if len(payload) > 0 {
		buffers = append(buffers, payload)
	}
	if ctx.Done() == nil {
		return c.writeBuffers(buffers)
	}
	var mu sync.Mutex // orders the interruption with the end of the write
	finished, interrupted := false, false
	stop := context.AfterFunc(ctx, func() {
		mu.Lock()
		defer mu.Unlock()
		if !finished {
			interrupted = true
			c.netConn.SetWriteDeadline(time.Unix(1, 0))
		}
	})
	err := c.writeBuffers(buffers)
	stop()
	mu.Lock()
	finished = true
	if interrupted && err == nil {
		c.netConn.SetWriteDeadline(time.Time{})
	}
	mu.Unlock()
	return err
}

func (c *Conn) connectionFailure() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.failure != nil {
		return c.failure
	}
	return ErrClosed
}

// wait waits for call's reply.
func (c *Conn) wait(ctx context.Context, call *call) error {
	select {
	case <-call.done:
		return call.err
	case <-ctx.Done():
	}
	c.mu.Lock()
	if call.finished {
		c.mu.Unlock()
		return call.err
	}
	if call.receiving {
		// The reader is copying this call's data into the caller's
		// buffer. The data cannot be dropped halfway without losing the
		// stream: disconnect, and return only once the reader has stopped.
		c.mu.Unlock()
		c.fail(fmt.Errorf("%s abandoned while its data was arriving: %w", call.describe(), ctx.Err()))
		<-c.readerDone
		return ctx.Err()
	}
	call.abandoned = true
	c.checkIdleLocked()
	c.mu.Unlock()
	return ctx.Err()
}

// waitAll waits for every call and returns the first error.
func (c *Conn) waitAll(ctx context.Context, calls []*call) error {
	var first error
	for _, call := range calls {
		if err := c.wait(ctx, call); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// checkRange validates a request against the export (spec, "Block size
// constraints"): inside it, aligned to the minimum block size except for a
// length reaching the end.
func (c *Conn) checkRange(offset, length uint64) error {
	if offset > c.size || length > c.size-offset {
		return fmt.Errorf("%w: %d bytes at offset %d reach past the end of the export (%d bytes)", ErrInvalid, length, offset, c.size)
	}
	minimum := uint64(c.blockSizeMinimum)
	if offset%minimum != 0 || (length%minimum != 0 && offset+length != c.size) {
		return fmt.Errorf("%w: %d bytes at offset %d are not aligned to the server's minimum block size of %d", ErrInvalid, length, offset, minimum)
	}
	return nil
}

func (c *Conn) checkFlags(flags, allowed Flag, what string) error {
	if extra := flags &^ allowed; extra != 0 {
		return fmt.Errorf("%w: flags %#x are not valid for %s", ErrInvalid, uint16(extra), what)
	}
	if flags&FUA != 0 && !c.CanFUA() {
		return fmt.Errorf("%w: FUA", ErrUnsupported)
	}
	if flags&FastZero != 0 && !c.CanFastZero() {
		return fmt.Errorf("%w: fast zero", ErrUnsupported)
	}
	return nil
}

// ReadAt fills p with the export's bytes at offset. Reads larger than the
// maximum payload are split into requests sent together.
func (c *Conn) ReadAt(ctx context.Context, p []byte, offset uint64) error {
	if err := c.checkRange(offset, uint64(len(p))); err != nil {
		return err
	}
	var calls []*call
	var err error
	for done := 0; done < len(p); {
		n := min(len(p)-done, int(c.payloadMaximum))
		call := &call{command: wire.CmdRead, offset: offset + uint64(done), length: uint32(n), buffer: p[done : done+n]}
		if err = c.send(ctx, call, 0, nil); err != nil {
			break
		}
		calls = append(calls, call)
		done += n
	}
	if waitErr := c.waitAll(ctx, calls); err == nil {
		err = waitErr
	}
	return err
}

// WriteAt writes p at offset; flags may be FUA. Writes larger than the
// maximum payload are split into requests sent together.
func (c *Conn) WriteAt(ctx context.Context, p []byte, offset uint64, flags Flag) error {
	if c.ReadOnly() {
		return ErrReadOnly
	}
	if err := c.checkFlags(flags, FUA, "WRITE"); err != nil {
		return err
	}
	if err := c.checkRange(offset, uint64(len(p))); err != nil {
		return err
	}
	var calls []*call
	var err error
	for done := 0; done < len(p); {
		n := min(len(p)-done, int(c.payloadMaximum))
		call := &call{command: wire.CmdWrite, offset: offset + uint64(done), length: uint32(n)}
		if err = c.send(ctx, call, uint16(flags), p[done:done+n]); err != nil {
			break
		}
		calls = append(calls, call)
		done += n
	}
	if waitErr := c.waitAll(ctx, calls); err == nil {
		err = waitErr
	}
	return err
}

// Flush returns once every write completed before it was called is on
// stable storage (spec, "NBD_CMD_FLUSH"). With several connections to an
// export, call it after the writes of every connection have completed;
// unless CanMultiConn, flush every connection. It does nothing when the
// server did not offer NBD_FLAG_SEND_FLUSH: such a server has no volatile
// cache to empty.
func (c *Conn) Flush(ctx context.Context) error {
	if !c.CanFlush() {
		return nil
	}
	call := &call{command: wire.CmdFlush}
	if err := c.send(ctx, call, 0, nil); err != nil {
		return err
	}
	return c.wait(ctx, call)
}

// Trim tells the server the range is no longer needed; its contents are
// undefined afterwards (spec, "NBD_CMD_TRIM"). flags may be FUA.
func (c *Conn) Trim(ctx context.Context, offset, length uint64, flags Flag) error {
	if c.ReadOnly() {
		return ErrReadOnly
	}
	if !c.CanTrim() {
		return fmt.Errorf("%w: TRIM", ErrUnsupported)
	}
	if err := c.checkFlags(flags, FUA, "TRIM"); err != nil {
		return err
	}
	return c.ranged(ctx, wire.CmdTrim, offset, length, flags)
}

// Zero makes the range read as zeroes (NBD_CMD_WRITE_ZEROES); flags may be
// FUA, NoHole, FastZero.
func (c *Conn) Zero(ctx context.Context, offset, length uint64, flags Flag) error {
	if c.ReadOnly() {
		return ErrReadOnly
	}
	if !c.CanZero() {
		return fmt.Errorf("%w: WRITE_ZEROES", ErrUnsupported)
	}
	if err := c.checkFlags(flags, FUA|NoHole|FastZero, "WRITE_ZEROES"); err != nil {
		return err
	}
	return c.ranged(ctx, wire.CmdWriteZeroes, offset, length, flags)
}

// ranged sends a command without payload over [offset, offset+length), split
// into requests of at most maximumRequestLength.
func (c *Conn) ranged(ctx context.Context, command uint16, offset, length uint64, flags Flag) error {
	if err := c.checkRange(offset, length); err != nil {
		return err
	}
	var calls []*call
	var err error
	for done := uint64(0); done < length; {
		n := min(length-done, maximumRequestLength)
		call := &call{command: command, offset: offset + done, length: uint32(n)}
		if err = c.send(ctx, call, uint16(flags), nil); err != nil {
			break
		}
		calls = append(calls, call)
		done += n
	}
	if waitErr := c.waitAll(ctx, calls); err == nil {
		err = waitErr
	}
	return err
}

// BlockStatus describes the allocation of [offset, offset+length) as
// consecutive extents covering exactly that range (spec,
// "NBD_CMD_BLOCK_STATUS", "base:allocation"); it asks again where the
// server answered for less than the range. Needs CanBlockStatus.
func (c *Conn) BlockStatus(ctx context.Context, offset, length uint64) ([]Extent, error) {
	if !c.blockStatus {
		return nil, fmt.Errorf("%w: BLOCK_STATUS (base:allocation)", ErrUnsupported)
	}
	var extents []Extent
	err := c.blockStatus64(ctx, c.allocationID, offset, length, func(call *call) (done uint64) {
		for _, extent := range call.extents {
			done += extent.Length
			extents = appendExtent(extents, extent)
		}
		return done
	})
	return extents, err
}

// MetaStatus describes [offset, offset+length) in the metadata context
// name, one of Dialer.MetaContexts that the server selected
// (CanMetaStatus), as consecutive extents covering exactly that range,
// equal neighbours merged; it asks again where the server answered for
// less. The server answers every BLOCK_STATUS for every selected context;
// the other contexts' answers are checked and dropped.
func (c *Conn) MetaStatus(ctx context.Context, name string, offset, length uint64) ([]MetaExtent, error) {
	id, ok := c.metaIDs[name]
	if !ok {
		return nil, fmt.Errorf("%w: metadata context %q was not selected", ErrUnsupported, name)
	}
	var extents []MetaExtent
	err := c.blockStatus64(ctx, id, offset, length, func(call *call) (done uint64) {
		for _, extent := range call.meta {
			done += extent.Length
			extents = appendMetaExtent(extents, extent)
		}
		return done
	})
	return extents, err
}

// blockStatus64 sends BLOCK_STATUS requests keeping context id's answer
// until collect, given each finished call, has accounted for length
// bytes.
func (c *Conn) blockStatus64(ctx context.Context, id uint32, offset, length uint64, collect func(*call) uint64) error {
	if err := c.checkRange(offset, length); err != nil {
		return err
	}
	for done := uint64(0); done < length; {
		call := &call{command: wire.CmdBlockStatus, offset: offset + done, length: uint32(min(length-done, maximumRequestLength)), want: id}
		if err := c.send(ctx, call, 0, nil); err != nil {
			return err
		}
		if err := c.wait(ctx, call); err != nil {
			return err
		}
		// The reader guarantees a non-empty answer within the request,
		// so every round makes progress.
		done += collect(call)
	}
	return nil
}

func appendMetaExtent(extents []MetaExtent, extent MetaExtent) []MetaExtent {
	if last := len(extents) - 1; last >= 0 && extents[last].Flags == extent.Flags {
		extents[last].Length += extent.Length
		return extents
	}
	return append(extents, extent)
}

func appendExtent(extents []Extent, extent Extent) []Extent {
	if last := len(extents) - 1; last >= 0 && extents[last].Hole == extent.Hole && extents[last].Zero == extent.Zero {
		extents[last].Length += extent.Length
		return extents
	}
	return append(extents, extent)
}

// Close ends the session: it stops new requests, waits (up to 30 s) for
// those in flight, sends NBD_CMD_DISC (spec, "Terminating the transmission
// phase": the client "SHOULD wait until there are no inflight requests
// first") and closes the connection. It returns an error only if the server
// broke the protocol earlier.
func (c *Conn) Close() error {
	c.mu.Lock()
	earlier := c.failure
	if !c.closing {
		c.closing = true
		c.closeReason = ErrClosed
		c.checkIdleLocked()
	}
	c.mu.Unlock()
	c.disconnect(closeTimeout)
	if earlier != nil && errors.Is(earlier, ErrProtocol) {
		return earlier
	}
	return nil
}

// disconnect waits for the pending requests, sends NBD_CMD_DISC and closes.
func (c *Conn) disconnect(timeout time.Duration) {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-c.idle:
		c.sendDisconnect()
	case <-c.readerDone:
	case <-timer.C:
	}
	c.mu.Lock()
	reason := c.closeReason
	c.mu.Unlock()
	c.fail(reason)
	<-c.readerDone
}

func (c *Conn) sendDisconnect() {
	select {
	case c.writeSlot <- struct{}{}:
	case <-c.readerDone:
		return
	}
	defer func() { <-c.writeSlot }()
	header := wire.RequestHeader{Type: wire.CmdDisc}.Append(make([]byte, 0, wire.RequestHeaderLength))
	c.netConn.SetWriteDeadline(time.Now().Add(5 * time.Second))
	c.netConn.Write(header)
}

// serverShuttingDown handles an ESHUTDOWN reply: "If the client receives an
// ESHUTDOWN error it MUST initiate a soft disconnect" (spec, "Terminating the
// transmission phase"). New requests are refused; once the pending ones are
// answered, NBD_CMD_DISC is sent.
func (c *Conn) serverShuttingDown() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closing {
		return
	}
	c.closing = true
	c.closeReason = fmt.Errorf("%w: the server is shutting down", ErrClosed)
	c.checkIdleLocked()
	go c.disconnect(closeTimeout)
}

// readLoop reads replies until the connection ends.
func (c *Conn) readLoop() {
	defer close(c.readerDone)
	err := c.readReplies()
	c.fail(err)
}

// readError describes a failed read of the reply stream.
func (c *Conn) readError(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return errors.New("the server closed the connection")
	}
	return fmt.Errorf("reading replies: %w", err)
}

func (c *Conn) readFull(p []byte) error {
	if _, err := io.ReadFull(c.reader, p); err != nil {
		return c.readError(err)
	}
	return nil
}

func (c *Conn) discard(n uint64) error {
	if _, err := io.CopyN(io.Discard, c.reader, int64(n)); err != nil {
		return c.readError(err)
	}
	return nil
}

// readReplies reads and dispatches replies; it returns why it stopped.
func (c *Conn) readReplies() error {
	var header [wire.StructuredReplyHeaderLength]byte
	for {
		if err := c.readFull(header[:4]); err != nil {
			return err
		}
		switch magic := binary.BigEndian.Uint32(header[:4]); magic {
		case wire.SimpleReplyMagic:
			// S: magic, 32 bits error, 64 bits handle (spec, "Simple
			// reply message").
			if err := c.readFull(header[4:wire.SimpleReplyHeaderLength]); err != nil {
				return err
			}
			reply, err := wire.ParseSimpleReplyHeader(header[:wire.SimpleReplyHeaderLength])
			if err != nil {
				return protocolError("%v", err)
			}
			if err := c.simpleReply(reply.Error, reply.Cookie); err != nil {
				return err
			}
		case wire.StructuredReplyMagic:
			// S: magic, 16 bits flags, 16 bits type, 64 bits handle, 32
			// bits length (spec, "Structured reply chunk message").
			if err := c.readFull(header[4:wire.StructuredReplyHeaderLength]); err != nil {
				return err
			}
			chunk, err := wire.ParseStructuredReplyHeader(header[:])
			if err != nil {
				return protocolError("%v", err)
			}
			if err := c.chunk(chunk.Flags, chunk.Type, chunk.Cookie, chunk.Length); err != nil {
				return err
			}
		default:
			return protocolError("reply magic %#x", magic)
		}
	}
}

// lookup finds the pending call a reply is for.
func (c *Conn) lookup(handle uint64) (*call, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	call := c.pending[handle]
	if call == nil {
		return nil, protocolError("reply for handle %#x, which is not in flight", handle)
	}
	return call, nil
}

func (c *Conn) simpleReply(errno wire.Errno, handle uint64) error {
	call, err := c.lookup(handle)
	if err != nil {
		return err
	}
	switch {
	case call.command == wire.CmdRead && c.structuredReplies:
		// "MUST NOT use a simple reply for NBD_CMD_READ" once structured
		// replies are negotiated (spec, "Structured reply chunk message").
		return protocolError("simple reply to %s after structured replies were negotiated", call.describe())
	case call.command == wire.CmdBlockStatus && errno == wire.NoError:
		return protocolError("simple reply to BLOCK_STATUS (a structured reply is required)")
	}
	if errno != wire.NoError {
		// Refuse new requests before the caller learns of the ESHUTDOWN,
		// so its next request cannot slip out ahead of the refusal.
		if errno == wire.ESHUTDOWN {
			c.serverShuttingDown()
		}
		c.finish(call, call.commandError(uint32(errno), ""), nil)
		return nil
	}
	if call.command == wire.CmdRead {
		// S: length bytes of data.
		if err := c.receive(call, call.buffer); err != nil {
			return err
		}
		call.coveredBytes = uint64(call.length)
	}
	c.finish(call, nil, nil)
	return nil
}

// receive reads the next len(dst) bytes of the stream into dst, the caller's
// buffer, unless the caller abandoned the call (then they are discarded).
func (c *Conn) receive(call *call, dst []byte) error {
	return c.intoBuffer(call, dst, func() error { return c.readFull(dst) }, uint64(len(dst)))
}

// intoBuffer runs fill, which writes into call's buffer, marked as
// receiving so that an abandoning caller waits for it; if the call was
// abandoned, discard bytes of the stream are skipped instead.
func (c *Conn) intoBuffer(call *call, dst []byte, fill func() error, discard uint64) error {
	c.mu.Lock()
	abandoned := call.abandoned || call.finished
	if !abandoned {
		call.receiving = true
	}
	c.mu.Unlock()
	if abandoned {
		return c.discard(discard)
	}
	err := fill()
	c.mu.Lock()
	call.receiving = false
	c.mu.Unlock()
	return err
}

// chunk handles one structured reply chunk (spec, "Structured reply types").
func (c *Conn) chunk(flags, chunkType uint16, handle uint64, length uint32) error {
	if !c.structuredReplies {
		return protocolError("structured reply chunk, but structured replies were not negotiated")
	}
	call, err := c.lookup(handle)
	if err != nil {
		return err
	}
	switch chunkType {
	case wire.ReplyTypeNone:
		// "length MUST be 0"; "MUST always be used with the
		// NBD_REPLY_FLAG_DONE bit set".
		if length != 0 || flags&wire.ReplyFlagDone == 0 {
			return protocolError("NBD_REPLY_TYPE_NONE chunk with length %d and flags %#x", length, flags)
		}
	case wire.ReplyTypeOffsetData:
		if err := c.offsetData(call, length); err != nil {
			return err
		}
	case wire.ReplyTypeOffsetHole:
		if err := c.offsetHole(call, length); err != nil {
			return err
		}
	case wire.ReplyTypeBlockStatus:
		if err := c.blockStatusChunk(call, length); err != nil {
			return err
		}
	default:
		if chunkType&wire.ReplyTypeErrorBit == 0 {
			// "For all other messages with unknown or unexpected type
			// ..., the client MUST initiate a hard disconnect."
			return protocolError("unknown chunk type %d in the reply to %s", chunkType, call.describe())
		}
		if err := c.errorChunk(call, chunkType, length); err != nil {
			return err
		}
	}
	// Unknown reply flags are ignored ("Clients MUST ignore unrecognized
	// flags").
	if flags&wire.ReplyFlagDone != 0 {
		return c.complete(call)
	}
	return nil
}

// complete ends call on its final chunk.
func (c *Conn) complete(call *call) error {
	if call.chunkError != nil {
		var commandError *Error
		if errors.As(call.chunkError, &commandError) && wire.Errno(commandError.Errno) == wire.ESHUTDOWN {
			c.serverShuttingDown() // before the caller hears of it, as above
		}
		c.finish(call, call.chunkError, nil)
		return nil
	}
	switch call.command {
	case wire.CmdRead:
		// "When no error is detected, the server MUST send enough data
		// chunks to cover the entire region".
		if call.coveredBytes != uint64(call.length) {
			return protocolError("the reply to %s covers only %d bytes", call.describe(), call.coveredBytes)
		}
	case wire.CmdBlockStatus:
		// "A successful block status request MUST have exactly one
		// status chunk per negotiated metadata context ID."
		if len(call.seen) == 0 {
			return protocolError("the reply to %s has no block status chunk", call.describe())
		}
		if len(call.seen) != c.selectedContexts() {
			return protocolError("the reply to %s has block status for %d of the %d metadata contexts selected", call.describe(), len(call.seen), c.selectedContexts())
		}
	}
	c.finish(call, nil, call.building)
	return nil
}

// place records that a content chunk covers [offset, offset+n) and returns
// its position in the request. Chunks "MUST lie within the bounds of the
// original offset and length of the client's request, and MUST NOT overlap
// with the bounds of any earlier content chunk" (spec,
// "NBD_REPLY_TYPE_OFFSET_DATA").
func (c *Conn) place(call *call, offset, n uint64) (uint64, error) {
	length := uint64(call.length)
	if n == 0 || offset < call.offset || n > length || offset-call.offset > length-n {
		return 0, protocolError("content chunk of %d bytes at offset %d outside %s", n, offset, call.describe())
	}
	start := offset - call.offset
	end := start + n
	i := sort.Search(len(call.covered), func(i int) bool { return call.covered[i].end > start })
	if i < len(call.covered) && call.covered[i].start < end {
		return 0, protocolError("overlapping content chunks in the reply to %s", call.describe())
	}
	// Insert, merging with touching neighbours so that a reply in order
	// keeps a single interval.
	mergePrevious := i > 0 && call.covered[i-1].end == start
	mergeNext := i < len(call.covered) && call.covered[i].start == end
	switch {
	case mergePrevious && mergeNext:
		call.covered[i-1].end = call.covered[i].end
		call.covered = append(call.covered[:i], call.covered[i+1:]...)
	case mergePrevious:
		call.covered[i-1].end = end
	case mergeNext:
		call.covered[i].start = start
	default:
		call.covered = append(call.covered, interval{})
		copy(call.covered[i+1:], call.covered[i:])
		call.covered[i] = interval{start, end}
	}
	call.coveredBytes += n
	return start, nil
}

// offsetData handles NBD_REPLY_TYPE_OFFSET_DATA: 64 bits offset, length - 8
// bytes of data; "length MUST be at least 9".
func (c *Conn) offsetData(call *call, length uint32) error {
	if call.command != wire.CmdRead {
		return protocolError("data chunk in the reply to %s", call.describe())
	}
	if length < 9 || length-8 > call.length {
		return protocolError("data chunk of length %d in the reply to %s", length, call.describe())
	}
	var field [8]byte
	if err := c.readFull(field[:]); err != nil {
		return err
	}
	n := uint64(length - 8)
	start, err := c.place(call, binary.BigEndian.Uint64(field[:]), n)
	if err != nil {
		return err
	}
	return c.receive(call, call.buffer[start:start+n])
}

// offsetHole handles NBD_REPLY_TYPE_OFFSET_HOLE: 64 bits offset, 32 bits
// hole size (nonzero); "length MUST be exactly 12".
func (c *Conn) offsetHole(call *call, length uint32) error {
	if call.command != wire.CmdRead {
		return protocolError("hole chunk in the reply to %s", call.describe())
	}
	if length != 12 {
		return protocolError("hole chunk of length %d", length)
	}
	var fields [12]byte
	if err := c.readFull(fields[:]); err != nil {
		return err
	}
	n := uint64(binary.BigEndian.Uint32(fields[8:]))
	start, err := c.place(call, binary.BigEndian.Uint64(fields[:]), n)
	if err != nil {
		return err
	}
	dst := call.buffer[start : start+n]
	return c.intoBuffer(call, dst, func() error { clear(dst); return nil }, 0)
}

// blockStatusChunk handles NBD_REPLY_TYPE_BLOCK_STATUS: 32 bits context id,
// then descriptors of 32 bits length (nonzero) and 32 bits flags; "length
// MUST be 4 + (a positive integer multiple of 8)". Descriptors past the
// request's end are refused, except that the last may reach beyond it (the
// spec allows that); it is cut to the request.
func (c *Conn) blockStatusChunk(call *call, length uint32) error {
	if call.command != wire.CmdBlockStatus {
		return protocolError("block status chunk in the reply to %s", call.describe())
	}
	if length < 12 || (length-4)%8 != 0 {
		return protocolError("block status chunk of length %d", length)
	}
	count := (length - 4) / 8
	if count > wire.MaximumBlockStatusDescriptors {
		return protocolError("block status chunk with %d descriptors", count)
	}
	var field [8]byte
	if err := c.readFull(field[:4]); err != nil {
		return err
	}
	id := binary.BigEndian.Uint32(field[:4])
	if !c.contextSelected(id) {
		return protocolError("block status for metadata context %d, which was not selected", id)
	}
	if slices.Contains(call.seen, id) {
		// "This chunk type MUST appear exactly once per metadata ID".
		return protocolError("two block status chunks for one context in the reply to %s", call.describe())
	}
	call.seen = append(call.seen, id)
	// Only the wanted context's extents are kept (a reply never makes
	// the client hold more than one context's answer); the others are
	// checked all the same.
	keep := id == call.want
	allocation := c.blockStatus && id == c.allocationID
	remaining := uint64(call.length)
	for range count {
		if err := c.readFull(field[:]); err != nil {
			return err
		}
		n := uint64(binary.BigEndian.Uint32(field[:4]))
		status := binary.BigEndian.Uint32(field[4:])
		if n == 0 {
			return protocolError("block status descriptor of length 0")
		}
		if remaining == 0 {
			return protocolError("block status descriptors beyond the end of %s", call.describe())
		}
		n = min(n, remaining)
		remaining -= n
		switch {
		case !keep:
		case allocation:
			// Unknown status bits are ignored ("clients MUST ignore
			// unknown flags").
			call.building = appendExtent(call.building, Extent{Length: n, Hole: status&wire.StateHole != 0, Zero: status&wire.StateZero != 0})
		default:
			call.buildingMeta = appendMetaExtent(call.buildingMeta, MetaExtent{Length: n, Flags: status})
		}
	}
	return nil
}

// contextSelected reports whether id is the id of a selected context.
func (c *Conn) contextSelected(id uint32) bool {
	if c.blockStatus && id == c.allocationID {
		return true
	}
	for _, selected := range c.metaIDs {
		if selected == id {
			return true
		}
	}
	return false
}

// errorChunk handles error chunks (spec, "Structured reply types"): 32 bits
// error (nonzero), 16 bits message length, message, then for
// NBD_REPLY_TYPE_ERROR_OFFSET 64 bits offset. Unknown error types make the
// reply an error too ("If the client receives an unknown or unexpected type
// with bit 15 set, it MUST consider the current reply as errored, but MAY
// continue transmission unless ... message length is too large").
func (c *Conn) errorChunk(call *call, chunkType uint16, length uint32) error {
	if length < 6 {
		return protocolError("error chunk of length %d", length)
	}
	var fields [8]byte
	if err := c.readFull(fields[:6]); err != nil {
		return err
	}
	errno := binary.BigEndian.Uint32(fields[:4])
	messageLength := uint32(binary.BigEndian.Uint16(fields[4:]))
	if messageLength > length-6 {
		return protocolError("error message of %d bytes in a chunk of %d", messageLength, length)
	}
	message := make([]byte, messageLength)
	if err := c.readFull(message); err != nil {
		return err
	}
	commandError := call.commandError(errno, cleanMessage(message))
	rest := uint64(length - 6 - messageLength)
	if chunkType == wire.ReplyTypeErrorOffset {
		if rest != 8 {
			return protocolError("NBD_REPLY_TYPE_ERROR_OFFSET chunk with %d bytes after the message", rest)
		}
		if err := c.readFull(fields[:]); err != nil {
			return err
		}
		offset := binary.BigEndian.Uint64(fields[:])
		if call.command != wire.CmdFlush {
			// The offset "MUST lie within the original offset and length
			// of the request".
			if offset < call.offset || offset-call.offset >= uint64(call.length) {
				return protocolError("error offset %d outside %s", offset, call.describe())
			}
		}
		commandError.ErrorOffset, commandError.HasErrorOffset = offset, true
	} else if err := c.discard(rest); err != nil {
		return err
	}
	if errno == 0 {
		return protocolError("error chunk with error value 0 in the reply to %s", call.describe())
	}
	if call.chunkError == nil {
		call.chunkError = commandError
	}
	return nil
}
