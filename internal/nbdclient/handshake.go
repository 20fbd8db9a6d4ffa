package nbdclient

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/herd-storage/herd/internal/nbd/wire"
	"github.com/herd-storage/herd/internal/tlsbatch"
)

// defaultHandshakeTimeout bounds the handshake when the caller's context has
// no deadline, so that a server that accepts and then says nothing cannot
// hold Dial forever.
const defaultHandshakeTimeout = 30 * time.Second

// readBufferSize is the reply reader's buffer. READ payloads larger than it
// go straight from the socket into the caller's buffer.
const readBufferSize = 256 << 10

// Dialer holds connection options; the zero value is usable and is what
// Dial uses.
type Dialer struct {
	// SimpleReplies skips NBD_OPT_STRUCTURED_REPLY, so the server answers
	// with simple replies only (and BLOCK_STATUS is unavailable). For
	// tests and for servers whose structured replies are broken.
	SimpleReplies bool
	// NoMetaContext does not select base:allocation: BlockStatus is
	// unavailable. Without MetaContexts, NBD_OPT_SET_META_CONTEXT is not
	// sent at all.
	NoMetaContext bool
	// MetaContexts are metadata contexts to select besides
	// base:allocation, by their exact names (such as
	// "qemu:dirty-bitmap:TAG" or "qemu:allocation-depth"), in the same
	// NBD_OPT_SET_META_CONTEXT. Those the server does not select are not
	// an error: Conn.MetaContexts says which it did. Read them with
	// Conn.MetaStatus. At most MaximumMetaContexts.
	MetaContexts []string
	// HandshakeTimeout bounds the handshake when ctx has no deadline. Zero
	// means 30 s.
	HandshakeTimeout time.Duration
	// TLSConfig, when set, upgrades the connection with NBD_OPT_STARTTLS
	// before any other option (spec, "NBD_OPT_STARTTLS"); a server that
	// refuses fails the handshake.
	TLSConfig *tls.Config
}

// Dial connects to the NBD server at address (host:port) and opens the
// export named exportName, with the zero Dialer's options. ctx bounds the
// connection and the handshake only.
func Dial(ctx context.Context, address, exportName string) (*Conn, error) {
	var d Dialer
	return d.Dial(ctx, address, exportName)
}

// Dial connects to address and opens exportName; see the package Dial.
// An address starting with "/" is a unix socket's path.
func (d *Dialer) Dial(ctx context.Context, address, exportName string) (*Conn, error) {
	var netDialer net.Dialer
	network := "tcp"
	if strings.HasPrefix(address, "/") {
		network = "unix"
	}
	netConn, err := netDialer.DialContext(ctx, network, address)
	if err != nil {
		return nil, fmt.Errorf("nbdclient: connect to %s: %w", address, err)
	}
	c, err := d.Handshake(ctx, netConn, exportName)
	if err != nil {
		netConn.Close()
		return nil, err
	}
	return c, nil
}

// Handshake runs the NBD handshake on an established connection and returns
// the Conn in the transmission phase. On error the caller still owns netConn
// and must close it.
func (d *Dialer) Handshake(ctx context.Context, netConn net.Conn, exportName string) (*Conn, error) {
	if len(exportName) > wire.MaximumStringLength {
		return nil, fmt.Errorf("%w: export name of %d bytes (the limit is %d)", ErrInvalid, len(exportName), wire.MaximumStringLength)
	}
	if err := d.checkMetaContexts(); err != nil {
		return nil, err
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		timeout := d.HandshakeTimeout
		if timeout <= 0 {
			timeout = defaultHandshakeTimeout
		}
		deadline = time.Now().Add(timeout)
	}
	if err := netConn.SetDeadline(deadline); err != nil {
		return nil, fmt.Errorf("nbdclient: %w", err)
	}
	// Cancelling ctx interrupts the blocked read or write at once.
	stop := context.AfterFunc(ctx, func() { netConn.SetDeadline(time.Unix(1, 0)) })
	h := &handshake{
		dialer:     d,
		netConn:    netConn,
		reader:     bufio.NewReaderSize(netConn, readBufferSize),
		exportName: exportName,
	}
	state, err := h.run()
	if !stop() || (err != nil && ctx.Err() != nil) {
		// The context fired (the deadline was, or is being, moved to the
		// past, whatever the handshake's outcome), or its deadline, which
		// is the connection's, passed.
		return nil, fmt.Errorf("nbdclient: handshake with %s: %w", remoteAddress(netConn), ctx.Err())
	}
	if err != nil {
		var netError net.Error
		if errors.As(err, &netError) && netError.Timeout() {
			// The connection's deadline is the context's: when it has
			// passed, report the context's error even if its timer has
			// not fired yet.
			if deadline, ok := ctx.Deadline(); ok && !time.Now().Before(deadline) {
				return nil, fmt.Errorf("nbdclient: handshake with %s: %w", remoteAddress(netConn), context.DeadlineExceeded)
			}
			return nil, fmt.Errorf("nbdclient: handshake with %s: no answer in time: %w", remoteAddress(netConn), err)
		}
		return nil, err
	}
	if err := netConn.SetDeadline(time.Time{}); err != nil {
		return nil, fmt.Errorf("nbdclient: %w", err)
	}
	return newConn(h.netConn, h.reader, state), nil
}

// MaximumMetaContexts is the most Dialer.MetaContexts may name.
const MaximumMetaContexts = 32

// checkMetaContexts refuses context names the option cannot carry.
func (d *Dialer) checkMetaContexts() error {
	if len(d.MetaContexts) > MaximumMetaContexts {
		return fmt.Errorf("%w: %d metadata contexts (at most %d)", ErrInvalid, len(d.MetaContexts), MaximumMetaContexts)
	}
	for _, name := range d.MetaContexts {
		namespace, leaf, ok := strings.Cut(name, ":")
		if !ok || namespace == "" || leaf == "" || len(name) > wire.MaximumStringLength {
			return fmt.Errorf("%w: metadata context %q: want NAMESPACE:NAME of at most %d bytes", ErrInvalid, name, wire.MaximumStringLength)
		}
	}
	return nil
}

func remoteAddress(netConn net.Conn) string {
	if address := netConn.RemoteAddr(); address != nil {
		return address.String()
	}
	return "the server"
}

// negotiated is what the handshake learnt; it does not change afterwards.
type negotiated struct {
	exportName        string
	size              uint64
	flags             uint16 // transmission flags
	structuredReplies bool
	blockStatus       bool   // base:allocation selected for this export
	allocationID      uint32 // its context id
	// metaIDs are the other contexts selected (Dialer.MetaContexts), by
	// name: their ids.
	metaIDs            map[string]uint32
	blockSizeMinimum   uint32
	blockSizePreferred uint32
	payloadMaximum     uint32 // largest READ or WRITE this client sends
}

// handshake runs on the caller's goroutine; nothing else touches the
// connection until it is done.
type handshake struct {
	dialer     *Dialer
	netConn    net.Conn
	reader     *bufio.Reader
	exportName string
	noZeroes   bool
	state      negotiated
}

func (h *handshake) run() (negotiated, error) {
	h.state = negotiated{exportName: h.exportName, blockSizeMinimum: 1, blockSizePreferred: 4096, payloadMaximum: wire.MaximumPayloadLength}
	// Spec, "Newstyle negotiation": S: "NBDMAGIC", "IHAVEOPT", 16 bits of
	// handshake flags.
	var greeting [18]byte
	if err := h.readFull(greeting[:], "greeting"); err != nil {
		return negotiated{}, err
	}
	if magic := binary.BigEndian.Uint64(greeting[0:]); magic != wire.NBDMagic {
		return negotiated{}, protocolError("greeting magic %#x: is this an NBD server?", magic)
	}
	switch magic := binary.BigEndian.Uint64(greeting[8:]); magic {
	case wire.IHaveOptMagic:
	case wire.CliservMagic:
		return negotiated{}, fmt.Errorf("%w: the server speaks the oldstyle handshake, which has no export names and is not supported", ErrUnsupported)
	default:
		return negotiated{}, protocolError("greeting second magic %#x", magic)
	}
	serverFlags := binary.BigEndian.Uint16(greeting[16:])
	if serverFlags&wire.FlagFixedNewstyle == 0 {
		// Without fixed newstyle only NBD_OPT_EXPORT_NAME may be sent,
		// and an unknown export just closes the connection: not worth
		// supporting.
		return negotiated{}, fmt.Errorf("%w: the server does not offer fixed newstyle negotiation", ErrUnsupported)
	}
	// C: 32 bits of client flags; "MUST NOT set any other flags" and
	// NO_ZEROES only if offered (spec, "Client flags"). Unknown server flags
	// are ignored ("The client SHOULD ignore any handshake flags it does not
	// recognize").
	clientFlags := wire.FlagCFixedNewstyle
	if serverFlags&wire.FlagNoZeroes != 0 {
		clientFlags |= wire.FlagCNoZeroes
		h.noZeroes = true
	}
	if err := h.write(binary.BigEndian.AppendUint32(nil, clientFlags)); err != nil {
		return negotiated{}, err
	}
	if h.dialer.TLSConfig != nil {
		if err := h.startTLS(); err != nil {
			return negotiated{}, err
		}
	}

	if !h.dialer.SimpleReplies {
		if err := h.structuredReply(); err != nil {
			return negotiated{}, err
		}
	}
	if h.state.structuredReplies && (!h.dialer.NoMetaContext || len(h.dialer.MetaContexts) > 0) {
		if err := h.setMetaContext(); err != nil {
			return negotiated{}, err
		}
	}
	if err := h.goOption(); err != nil {
		return negotiated{}, err
	}
	return h.state, nil
}

// startTLS sends NBD_OPT_STARTTLS and, once the server acknowledged it,
// runs a TLS client handshake on the connection; option haggling goes on
// over TLS. The connection's deadline bounds the TLS handshake too.
func (h *handshake) startTLS() error {
	replyType, data, err := h.option(wire.OptStartTLS, nil)
	if err != nil {
		return err
	}
	switch {
	case replyType == wire.RepAck:
	case replyType&wire.RepFlagError != 0:
		return h.optionRefused(wire.OptStartTLS, replyType, data, true)
	default:
		return protocolError("reply type %#x to NBD_OPT_STARTTLS", replyType)
	}
	if h.reader.Buffered() != 0 {
		return protocolError("the server sent %d bytes after acknowledging NBD_OPT_STARTTLS", h.reader.Buffered())
	}
	tlsConn := tls.Client(tlsbatch.Wrap(h.netConn), h.dialer.TLSConfig)
	if err := tlsConn.Handshake(); err != nil {
		return fmt.Errorf("nbdclient: TLS with %s: %w", remoteAddress(h.netConn), err)
	}
	h.netConn = tlsConn
	h.reader = bufio.NewReaderSize(tlsConn, readBufferSize)
	return nil
}

// structuredReply sends NBD_OPT_STRUCTURED_REPLY (spec,
// "NBD_OPT_STRUCTURED_REPLY"): an ACK enables structured replies; an error
// reply leaves simple replies.
func (h *handshake) structuredReply() error {
	replyType, data, err := h.option(wire.OptStructuredReply, nil)
	if err != nil {
		return err
	}
	switch {
	case replyType == wire.RepAck:
		if len(data) != 0 {
			return protocolError("NBD_REP_ACK with %d bytes of data", len(data))
		}
		h.state.structuredReplies = true
		return nil
	case replyType&wire.RepFlagError != 0:
		return h.optionRefused(wire.OptStructuredReply, replyType, data, false)
	default:
		return protocolError("reply type %#x to NBD_OPT_STRUCTURED_REPLY", replyType)
	}
}

// setMetaContext selects base:allocation (unless Dialer.NoMetaContext) and
// Dialer.MetaContexts for the export (spec, "NBD_OPT_SET_META_CONTEXT"):
// C: 32 bits export name length, name, 32 bits number of queries, then
// per query 32 bits length and the query. The server answers with one
// NBD_REP_META_CONTEXT per selected context, then an ACK.
func (h *handshake) setMetaContext() error {
	var queries []string
	if !h.dialer.NoMetaContext {
		queries = append(queries, wire.BaseAllocation)
	}
	for _, name := range h.dialer.MetaContexts {
		if !slices.Contains(queries, name) {
			queries = append(queries, name)
		}
	}
	data := binary.BigEndian.AppendUint32(nil, uint32(len(h.exportName)))
	data = append(data, h.exportName...)
	data = binary.BigEndian.AppendUint32(data, uint32(len(queries)))
	for _, query := range queries {
		data = binary.BigEndian.AppendUint32(data, uint32(len(query)))
		data = append(data, query...)
	}
	if err := h.sendOption(wire.OptSetMetaContext, data); err != nil {
		return err
	}
	ids := map[uint32]bool{}
	for {
		replyType, data, err := h.readOptionReply(wire.OptSetMetaContext)
		if err != nil {
			return err
		}
		switch {
		case replyType == wire.RepMetaContext:
			if len(data) < 4 {
				return protocolError("NBD_REP_META_CONTEXT of %d bytes", len(data))
			}
			id, name := binary.BigEndian.Uint32(data), string(data[4:])
			if !slices.Contains(queries, name) {
				// The server "MUST NOT" select what was not asked for;
				// its BLOCK_STATUS replies would carry chunks this client
				// cannot interpret.
				return protocolError("the server selected metadata context %q, which was not requested", cleanMessage(data[4:]))
			}
			_, selected := h.state.metaIDs[name]
			if selected || (name == wire.BaseAllocation && h.state.blockStatus) {
				return protocolError("metadata context %s selected twice", name)
			}
			if ids[id] {
				// "each with a unique metadata context ID".
				return protocolError("metadata context id %d given twice", id)
			}
			ids[id] = true
			if name == wire.BaseAllocation {
				h.state.blockStatus = true
				h.state.allocationID = id
				continue
			}
			if h.state.metaIDs == nil {
				h.state.metaIDs = map[string]uint32{}
			}
			h.state.metaIDs[name] = id
		case replyType == wire.RepAck:
			if len(data) != 0 {
				return protocolError("NBD_REP_ACK with %d bytes of data", len(data))
			}
			return nil
		case replyType&wire.RepFlagError != 0:
			h.state.blockStatus = false
			h.state.metaIDs = nil
			return h.optionRefused(wire.OptSetMetaContext, replyType, data, false)
		default:
			return protocolError("reply type %#x to NBD_OPT_SET_META_CONTEXT", replyType)
		}
	}
}

// goOption sends NBD_OPT_GO (spec, "NBD_OPT_INFO and NBD_OPT_GO"): C: 32 bits
// name length, name, 16 bits number of information requests, each 16 bits.
// The server answers with NBD_REP_INFO replies (NBD_INFO_EXPORT is
// mandatory) and an ACK, after which the transmission phase begins.
func (h *handshake) goOption() error {
	data := binary.BigEndian.AppendUint32(nil, uint32(len(h.exportName)))
	data = append(data, h.exportName...)
	data = binary.BigEndian.AppendUint16(data, 1)
	data = binary.BigEndian.AppendUint16(data, wire.InfoBlockSize)
	if err := h.sendOption(wire.OptGo, data); err != nil {
		return err
	}
	haveExport := false
	for {
		replyType, data, err := h.readOptionReply(wire.OptGo)
		if err != nil {
			return err
		}
		switch {
		case replyType == wire.RepInfo:
			if len(data) < 2 {
				return protocolError("NBD_REP_INFO of %d bytes", len(data))
			}
			switch binary.BigEndian.Uint16(data) {
			case wire.InfoExport:
				// 16 bits type, 64 bits size, 16 bits transmission flags.
				if len(data) != 12 {
					return protocolError("NBD_INFO_EXPORT of %d bytes", len(data))
				}
				h.state.size = binary.BigEndian.Uint64(data[2:])
				h.state.flags = binary.BigEndian.Uint16(data[10:])
				haveExport = true
			case wire.InfoBlockSize:
				// 16 bits type, 32 bits minimum, preferred, maximum.
				if len(data) != 14 {
					return protocolError("NBD_INFO_BLOCK_SIZE of %d bytes", len(data))
				}
				if err := h.blockSizes(binary.BigEndian.Uint32(data[2:]), binary.BigEndian.Uint32(data[6:]), binary.BigEndian.Uint32(data[10:])); err != nil {
					return err
				}
			default:
				// NBD_INFO_NAME, NBD_INFO_DESCRIPTION and unknown types:
				// "the client MUST ignore information types that it does
				// not recognise".
			}
		case replyType == wire.RepAck:
			if len(data) != 0 {
				return protocolError("NBD_REP_ACK with %d bytes of data", len(data))
			}
			if !haveExport {
				return protocolError("NBD_OPT_GO acknowledged without NBD_INFO_EXPORT")
			}
			return h.checkFlags()
		case replyType == wire.RepErrUnsup:
			// A server older than NBD_OPT_GO (spec: "the client MAY
			// fall back to NBD_OPT_EXPORT_NAME").
			return h.exportNameOption()
		case replyType&wire.RepFlagError != 0:
			return h.optionRefused(wire.OptGo, replyType, data, true)
		default:
			return protocolError("reply type %#x to NBD_OPT_GO", replyType)
		}
	}
}

// blockSizes checks NBD_INFO_BLOCK_SIZE against the spec's "Block size
// constraints" and derives the largest payload this client sends.
func (h *handshake) blockSizes(minimum, preferred, maximum uint32) error {
	if !powerOfTwo(minimum) || minimum > wire.MaximumMinimumBlockSize {
		return protocolError("minimum block size %d is not a power of two up to 64 KiB", minimum)
	}
	if !powerOfTwo(preferred) || preferred < minimum {
		return protocolError("preferred block size %d is not a power of two of at least the minimum %d", preferred, minimum)
	}
	if maximum < minimum || (maximum != 0xffffffff && maximum%minimum != 0) {
		return protocolError("maximum block size %d is not a multiple of the minimum %d", maximum, minimum)
	}
	h.state.blockSizeMinimum = minimum
	h.state.blockSizePreferred = preferred
	// Requests are capped at 32 MiB whatever the server allows, so that
	// one request never holds the connection for long. The minimum is a
	// power of two up to 64 KiB, so it divides 32 MiB.
	h.state.payloadMaximum = min(maximum, wire.MaximumPayloadLength) / minimum * minimum
	return nil
}

// exportNameOption enters the transmission phase the old way (spec,
// "NBD_OPT_EXPORT_NAME"): S: 64 bits size, 16 bits flags, 124 zero bytes
// unless NO_ZEROES; a refusal closes the connection.
func (h *handshake) exportNameOption() error {
	if err := h.sendOption(wire.OptExportName, []byte(h.exportName)); err != nil {
		return err
	}
	reply := make([]byte, 10, 10+wire.ExportNameZeroPadding)
	if !h.noZeroes {
		reply = reply[:cap(reply)]
	}
	if _, err := io.ReadFull(h.reader, reply); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return fmt.Errorf("nbdclient: the server closed the connection: it refused export %q (it does not support NBD_OPT_GO, so it cannot say why)", h.exportName)
		}
		return fmt.Errorf("nbdclient: handshake: %w", err)
	}
	h.state.size = binary.BigEndian.Uint64(reply)
	h.state.flags = binary.BigEndian.Uint16(reply[8:])
	return h.checkFlags()
}

// checkFlags validates the transmission flags (spec, "Transmission flags").
func (h *handshake) checkFlags() error {
	flags := h.state.flags
	if flags&wire.FlagHasFlags == 0 {
		return protocolError("transmission flags %#x lack NBD_FLAG_HAS_FLAGS", flags)
	}
	if flags&wire.FlagSendFastZero != 0 && flags&wire.FlagSendWriteZeroes == 0 {
		return protocolError("NBD_FLAG_SEND_FAST_ZERO without NBD_FLAG_SEND_WRITE_ZEROES")
	}
	if h.state.size > 1<<63-1 {
		// Offsets beyond 2^63 cannot be sent through io interfaces or
		// off_t; no real disk is that large.
		return protocolError("export size %d", h.state.size)
	}
	return nil
}

// optionRefused turns an error reply into an error. Optional options
// (fatal false) just stay off, unless the server is shutting down; a refused
// NBD_OPT_GO ends the handshake with an OptionError carrying the server's
// message, after a polite NBD_OPT_ABORT (spec, "Termination of the session
// during option haggling": a client "MUST use soft disconnect").
func (h *handshake) optionRefused(option, replyType uint32, data []byte, fatal bool) error {
	if replyType != wire.RepErrShutdown && !fatal {
		return nil
	}
	refusal := &OptionError{Export: h.exportName, Option: option, Reply: replyType, Message: cleanMessage(data)}
	h.abort()
	return refusal
}

// abort sends NBD_OPT_ABORT and waits briefly for the ACK the server "MUST"
// send; the answer does not matter.
func (h *handshake) abort() {
	h.netConn.SetDeadline(time.Now().Add(time.Second))
	if h.sendOption(wire.OptAbort, nil) == nil {
		h.readOptionReply(wire.OptAbort)
	}
}

func (h *handshake) option(option uint32, data []byte) (uint32, []byte, error) {
	if err := h.sendOption(option, data); err != nil {
		return 0, nil, err
	}
	return h.readOptionReply(option)
}

// sendOption sends C: "IHAVEOPT", 32 bits option, 32 bits length, data.
func (h *handshake) sendOption(option uint32, data []byte) error {
	message := make([]byte, 0, wire.OptionHeaderLength+len(data))
	message = wire.OptionHeader{Option: option, Length: uint32(len(data))}.Append(message)
	return h.write(append(message, data...))
}

// readOptionReply reads S: magic, 32 bits option, 32 bits reply type, 32 bits
// length, data (spec, "Fixed newstyle negotiation").
func (h *handshake) readOptionReply(option uint32) (uint32, []byte, error) {
	var header [wire.OptionReplyHeaderLength]byte
	if err := h.readFull(header[:], "option reply"); err != nil {
		return 0, nil, err
	}
	reply, err := wire.ParseOptionReplyHeader(header[:])
	if err != nil {
		return 0, nil, protocolError("%v", err)
	}
	if reply.Option != option {
		return 0, nil, protocolError("reply to option %d while option %d was sent", reply.Option, option)
	}
	if reply.Length > maximumOptionReplyLength {
		return 0, nil, protocolError("option reply of %d bytes", reply.Length)
	}
	data := make([]byte, reply.Length)
	if err := h.readFull(data, "option reply"); err != nil {
		return 0, nil, err
	}
	return reply.Type, data, nil
}

func (h *handshake) readFull(p []byte, what string) error {
	if _, err := io.ReadFull(h.reader, p); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return fmt.Errorf("nbdclient: the server closed the connection during the handshake (reading the %s)", what)
		}
		return fmt.Errorf("nbdclient: handshake: reading the %s: %w", what, err)
	}
	return nil
}

func (h *handshake) write(p []byte) error {
	if _, err := h.netConn.Write(p); err != nil {
		return fmt.Errorf("nbdclient: handshake: %w", err)
	}
	return nil
}

func powerOfTwo(n uint32) bool {
	return n != 0 && n&(n-1) == 0
}
