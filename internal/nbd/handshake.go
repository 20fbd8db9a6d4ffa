package nbd

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"

	"github.com/herd-storage/herd/internal/nbd/wire"
)

// This file is the handshake phase: the newstyle greeting and the fixed
// newstyle option haggling (spec, "Handshake"). It runs on the connection's
// goroutine only, so the negotiation state needs no lock.

// negotiation is the state option haggling builds up (spec, "Option types").
type negotiation struct {
	clientFlags uint32
	// structuredReplies is set by NBD_OPT_STRUCTURED_REPLY.
	structuredReplies bool
	// contexts are the metadata contexts the last NBD_OPT_SET_META_CONTEXT
	// selected for metaContextExport, in the order of its replies.
	// BLOCK_STATUS is only valid if the export then opened has the same
	// name (spec, "NBD_OPT_SET_META_CONTEXT").
	contexts          []metaContext
	metaContextExport string
}

// metaContext is one selected metadata context and the id it was given.
type metaContext struct {
	id   uint32
	name string
}

// negotiate runs the handshake until the client enters the transmission phase
// (the returned transmission) or the session ends (an error).
func (c *connection) negotiate(ctx context.Context) (*transmission, error) {
	// Spec, "Newstyle negotiation": S: NBDMAGIC, IHAVEOPT, 16 bits of
	// handshake flags. This server always offers fixed newstyle and the
	// omission of the 124 zero bytes.
	var greeting [18]byte
	binary.BigEndian.PutUint64(greeting[0:], wire.NBDMagic)
	binary.BigEndian.PutUint64(greeting[8:], wire.IHaveOptMagic)
	binary.BigEndian.PutUint16(greeting[16:], wire.FlagFixedNewstyle|wire.FlagNoZeroes)
	if err := c.write(greeting[:]); err != nil {
		return nil, err
	}

	// C: 32 bits of client flags. "The server MUST drop the TCP connection
	// if the client sets an unknown flag" (spec, "Client flags"). A client
	// without NBD_FLAG_C_FIXED_NEWSTYLE is still answered with fixed
	// newstyle replies, which the spec allows ("Servers MAY choose to
	// honour fixed newstyle from clients that didn't set this bit"); such a
	// client only ever sends NBD_OPT_EXPORT_NAME, which has no reply header.
	var clientFlags [4]byte
	if _, err := io.ReadFull(c.reader, clientFlags[:]); err != nil {
		return nil, err
	}
	c.negotiation.clientFlags = binary.BigEndian.Uint32(clientFlags[:])
	if unknown := c.negotiation.clientFlags &^ clientFlagsKnown; unknown != 0 {
		return nil, fmt.Errorf("%w: unknown client flags %#x", ErrProtocol, unknown)
	}
	if c.server.RequireTLS && !c.tlsAvailable() {
		// Such a client can only send NBD_OPT_EXPORT_NAME, which must
		// then terminate the session (spec, "FORCEDTLS mode"): drop it
		// now.
		return nil, fmt.Errorf("%w: the client did not set NBD_FLAG_C_FIXED_NEWSTYLE, without which there is no TLS", errTLSRequired)
	}

	for {
		var header [wire.OptionHeaderLength]byte
		if _, err := io.ReadFull(c.reader, header[:]); err != nil {
			return nil, err
		}
		option, length, err := decodeOptionHeader(header[:])
		if err != nil {
			return nil, err
		}
		// Every option costs a reply and often a Backend call: bound
		// them, so that a client cannot keep the server busy for the
		// whole handshake timeout.
		c.options++
		if c.options > c.server.maxOptions() {
			return nil, fmt.Errorf("%w: option %d is beyond the limit of %d (MaxOptions)", errTooManyOptions, c.options, c.server.maxOptions())
		}
		if length > maximumOptionLength {
			if option == wire.OptExportName {
				// No error reply exists for NBD_OPT_EXPORT_NAME, and a
				// name this long is invalid: terminate (spec,
				// "NBD_OPT_EXPORT_NAME").
				return nil, fmt.Errorf("%w: NBD_OPT_EXPORT_NAME of %d bytes", ErrProtocol, length)
			}
			// Skip the data so the stream stays in sync and the next
			// option can be parsed (spec, "Baseline": servers "MUST NOT
			// fail to parse the next message received").
			if _, err := io.CopyN(io.Discard, c.reader, int64(length)); err != nil {
				return nil, err
			}
			message := fmt.Sprintf("nbd: option data of %d bytes exceeds the %d-byte limit", length, maximumOptionLength)
			if err := c.sendOptionReply(option, wire.RepErrTooBig, []byte(message)); err != nil {
				return nil, err
			}
			continue
		}
		data := make([]byte, length)
		if _, err := io.ReadFull(c.reader, data); err != nil {
			return nil, err
		}
		next, err := c.handleOption(ctx, option, data)
		if err != nil || next != nil {
			return next, err
		}
	}
}

// decodeOptionHeader decodes "C: IHAVEOPT, 32 bits option, 32 bits length"
// (spec, "Newstyle negotiation").
func decodeOptionHeader(header []byte) (option, length uint32, err error) {
	h, err := wire.ParseOptionHeader(header)
	if err != nil {
		return 0, 0, fmt.Errorf("%w: %w", ErrProtocol, err)
	}
	return h.Option, h.Length, nil
}

// handleOption answers one option. It returns a transmission when the
// client enters the transmission phase, an error when the session ends.
func (c *connection) handleOption(ctx context.Context, option uint32, data []byte) (*transmission, error) {
	if c.server.isShuttingDown() && option != wire.OptAbort {
		// Spec, "Termination of the session during option haggling": a
		// server being shut down "SHOULD error further options received
		// (other than an NBD_OPT_ABORT) with NBD_REP_ERR_SHUTDOWN".
		if option == wire.OptExportName {
			return nil, ErrShutdown
		}
		return nil, c.sendOptionReply(option, wire.RepErrShutdown, []byte(ErrShutdown.Error()))
	}
	if option != wire.OptStartTLS && option != wire.OptAbort {
		if c.server.RequireTLS && !c.session.TLS {
			// FORCEDTLS mode: "If the server receives any other option,
			// it MUST reply with NBD_REP_ERR_TLS_REQD if TLS has not been
			// initiated", and NBD_OPT_EXPORT_NAME, which cannot fail,
			// "MUST terminate the session" (spec, "FORCEDTLS mode").
			if option == wire.OptExportName {
				return nil, fmt.Errorf("%w: NBD_OPT_EXPORT_NAME came before NBD_OPT_STARTTLS", errTLSRequired)
			}
			return nil, c.sendOptionReply(option, wire.RepErrTLSReqd, []byte(errTLSRequired.Error()))
		}
		if c.refusal != "" {
			if option == wire.OptExportName {
				return nil, fmt.Errorf("%w: %s", errClientRefused, c.refusal)
			}
			return nil, c.sendOptionReply(option, wire.RepErrPolicy, []byte(c.refusal))
		}
	}
	switch option {
	case wire.OptExportName:
		return c.exportName(ctx, data)
	case wire.OptAbort:
		// "The server MUST reply with NBD_REP_ACK" and SHOULD ignore
		// any data (spec, "NBD_OPT_ABORT"). The client may already have
		// closed the connection, so a failed write does not matter.
		_ = c.sendOptionReply(option, wire.RepAck)
		return nil, errAborted
	case wire.OptList:
		return nil, c.list(ctx, data)
	case wire.OptStartTLS:
		return nil, c.startTLS(ctx, data)
	case wire.OptInfo, wire.OptGo:
		return c.infoOrGo(ctx, option, data)
	case wire.OptStructuredReply:
		if len(data) != 0 {
			return nil, c.sendOptionReply(option, wire.RepErrInvalid, []byte("nbd: NBD_OPT_STRUCTURED_REPLY carries no data"))
		}
		c.negotiation.structuredReplies = true
		return nil, c.sendOptionReply(option, wire.RepAck)
	case wire.OptListMetaContext, wire.OptSetMetaContext:
		return nil, c.metaContext(ctx, option, data)
	default:
		// Spec, "Baseline": unknown options get NBD_REP_ERR_UNSUP. This
		// includes NBD_OPT_EXTENDED_HEADERS, not implemented yet.
		message := fmt.Sprintf("nbd: option %d is not supported", option)
		return nil, c.sendOptionReply(option, wire.RepErrUnsup, []byte(message))
	}
}

// exportName handles NBD_OPT_EXPORT_NAME (spec, "NBD_OPT_EXPORT_NAME"). It
// cannot report errors: on failure the session is terminated.
func (c *connection) exportName(ctx context.Context, data []byte) (*transmission, error) {
	if !validString(data) {
		return nil, fmt.Errorf("%w: NBD_OPT_EXPORT_NAME with an invalid name", ErrProtocol)
	}
	name := string(data)
	export, info, err := c.openExport(ctx, name, false)
	if err != nil {
		return nil, fmt.Errorf("nbd: open export %q: %w", name, err)
	}
	flags := transmissionFlags(info, c.negotiation.structuredReplies)
	// S: 64 bits size, 16 bits transmission flags, 124 zero bytes unless
	// NBD_FLAG_C_NO_ZEROES (spec, "Newstyle negotiation").
	reply := make([]byte, 10, 10+wire.ExportNameZeroPadding)
	binary.BigEndian.PutUint64(reply[0:], info.Size)
	binary.BigEndian.PutUint16(reply[8:], flags)
	if c.negotiation.clientFlags&wire.FlagCNoZeroes == 0 {
		reply = reply[:10+wire.ExportNameZeroPadding]
	}
	if err := c.write(reply); err != nil {
		c.closeExport(export)
		return nil, err
	}
	return c.newTransmission(export, info, flags, name), nil
}

// infoOrGo handles NBD_OPT_INFO and NBD_OPT_GO, which share their format
// (spec, "NBD_OPT_INFO and NBD_OPT_GO").
func (c *connection) infoOrGo(ctx context.Context, option uint32, data []byte) (*transmission, error) {
	request, err := parseExportRequest(data)
	if err != nil {
		return nil, c.sendOptionReply(option, wire.RepErrInvalid, []byte(messageFor(err)))
	}
	export, info, err := c.openExport(ctx, request.name, option == wire.OptInfo)
	if err != nil {
		c.logLimited(slog.LevelInfo, "nbd: cannot open export", "export", request.name, "error", err)
		return nil, c.sendOptionReply(option, optionReplyFor(err), []byte(messageFor(err)))
	}
	flags := transmissionFlags(info, c.negotiation.structuredReplies)
	if err := c.sendExportInformation(option, request, info, flags); err != nil {
		c.closeExport(export)
		return nil, err
	}
	if option == wire.OptInfo {
		// Close before the ACK: closing may release what opening took
		// (herd's VDI write lock), and a client that goes on to open the
		// export elsewhere right after the ACK must find it released.
		c.closeExport(export)
		return nil, c.sendOptionReply(option, wire.RepAck)
	}
	if err := c.sendOptionReply(option, wire.RepAck); err != nil {
		c.closeExport(export)
		return nil, err
	}
	return c.newTransmission(export, info, flags, request.name), nil
}

// sendExportInformation sends the NBD_REP_INFO replies; the caller sends
// the final ACK.
func (c *connection) sendExportInformation(option uint32, request exportRequest, info ExportInfo, flags uint16) error {
	// NBD_INFO_EXPORT is mandatory before the ACK.
	var export [12]byte
	binary.BigEndian.PutUint16(export[0:], wire.InfoExport)
	binary.BigEndian.PutUint64(export[2:], info.Size)
	binary.BigEndian.PutUint16(export[10:], flags)
	if err := c.sendOptionReply(option, wire.RepInfo, export[:]); err != nil {
		return err
	}
	if request.wants(wire.InfoName) {
		name := info.Name
		if name == "" {
			name = request.name
		}
		if err := c.sendOptionReply(option, wire.RepInfo, infoType(wire.InfoName), []byte(cleanString(name))); err != nil {
			return err
		}
	}
	if request.wants(wire.InfoDescription) && info.Description != "" {
		if err := c.sendOptionReply(option, wire.RepInfo, infoType(wire.InfoDescription), []byte(cleanString(info.Description))); err != nil {
			return err
		}
	}
	// NBD_INFO_BLOCK_SIZE is sent even when not requested, which the spec
	// allows ("The server MAY send information requests back which are not
	// explicitly requested"), so that every client learns the limits.
	var blockSize [14]byte
	binary.BigEndian.PutUint16(blockSize[0:], wire.InfoBlockSize)
	binary.BigEndian.PutUint32(blockSize[2:], info.BlockSizeMinimum)
	binary.BigEndian.PutUint32(blockSize[6:], info.BlockSizePreferred)
	binary.BigEndian.PutUint32(blockSize[10:], info.PayloadSizeMaximum)
	if err := c.sendOptionReply(option, wire.RepInfo, blockSize[:]); err != nil {
		return err
	}
	// "The server MUST NOT send any zero padding bytes after the
	// NBD_REP_ACK data" of NBD_OPT_GO.
	return nil
}

func infoType(kind uint16) []byte {
	return binary.BigEndian.AppendUint16(nil, kind)
}

// list handles NBD_OPT_LIST (spec, "NBD_OPT_LIST").
func (c *connection) list(ctx context.Context, data []byte) error {
	if len(data) != 0 {
		return c.sendOptionReply(wire.OptList, wire.RepErrInvalid, []byte("nbd: NBD_OPT_LIST carries no data"))
	}
	exports, err := c.server.Backend.List(ctx, c.session)
	if err != nil {
		c.logLimited(slog.LevelInfo, "nbd: cannot list exports", "error", err)
		return c.sendOptionReply(wire.OptList, optionReplyFor(err), []byte(messageFor(err)))
	}
	for _, export := range exports {
		if !validString([]byte(export.Name)) {
			c.logger.Warn("nbd: not listing an export whose name the protocol cannot carry", "export", export.Name)
			continue
		}
		// NBD_REP_SERVER: 32 bits name length, name, description.
		name := binary.BigEndian.AppendUint32(nil, uint32(len(export.Name)))
		name = append(name, export.Name...)
		if err := c.sendOptionReply(wire.OptList, wire.RepServer, name, []byte(cleanString(export.Description))); err != nil {
			return err
		}
	}
	return c.sendOptionReply(wire.OptList, wire.RepAck)
}

// metaContext handles NBD_OPT_LIST_META_CONTEXT and NBD_OPT_SET_META_CONTEXT
// (spec, "Metadata querying" and the two options). base:allocation is
// this server's own; a Backend that is a MetaContexter answers for every
// other namespace.
func (c *connection) metaContext(ctx context.Context, option uint32, data []byte) error {
	set := option == wire.OptSetMetaContext
	if set {
		// "Issuing this command replaces all previously-set metadata
		// contexts (including when this command fails)".
		c.negotiation.contexts = nil
		c.negotiation.metaContextExport = ""
	}
	if !c.negotiation.structuredReplies {
		return c.sendOptionReply(option, wire.RepErrInvalid, []byte("nbd: negotiate structured replies before metadata contexts"))
	}
	request, err := parseMetaContextRequest(data)
	if err != nil {
		return c.sendOptionReply(option, wire.RepErrInvalid, []byte(messageFor(err)))
	}
	// "If zero queries are sent, then the server MUST return all the
	// metadata contexts that are available" (LIST), and "MUST select no
	// metadata contexts" (SET).
	all := !set && len(request.queries) == 0
	allocation := all
	var others []string
	for _, query := range request.queries {
		if strings.HasPrefix(query, "base:") {
			// "base:" is a wildcard for LIST and ignored by SET, an
			// unknown leaf name "MUST" be ignored (spec, "The base:
			// metadata namespace").
			if query == wire.BaseAllocation || (query == "base:" && !set) {
				allocation = true
			}
			continue
		}
		// Other namespaces are the Backend's; what it does not know it
		// ignores, as the spec requires.
		others = append(others, query)
	}
	var names []string
	if allocation {
		names = append(names, wire.BaseAllocation)
	}
	if backend, ok := c.server.Backend.(MetaContexter); ok && (all || len(others) > 0) {
		found, err := backend.MetaContexts(ctx, request.exportName, c.session, others, !set)
		if err != nil {
			c.logLimited(slog.LevelInfo, "nbd: cannot answer a metadata context query", "export", request.exportName, "error", err)
			return c.sendOptionReply(option, optionReplyFor(err), []byte(messageFor(err)))
		}
		names = append(names, c.checkMetaContexts(found, others, set)...)
	}
	if set && len(names) > maximumSelectedContexts {
		// "The server MAY return NBD_REP_ERR_TOO_BIG if a request seeks
		// to select too many contexts."
		message := fmt.Sprintf("nbd: %d metadata contexts selected; at most %d may be", len(names), maximumSelectedContexts)
		return c.sendOptionReply(option, wire.RepErrTooBig, []byte(message))
	}
	var selected []metaContext
	for _, name := range names {
		// The id in replies to LIST "is reserved and SHOULD be set to
		// zero".
		id := uint32(0)
		if set {
			id = c.contextID(name)
			selected = append(selected, metaContext{id: id, name: name})
		}
		payload := binary.BigEndian.AppendUint32(make([]byte, 0, 4+len(name)), id)
		payload = append(payload, name...)
		if err := c.sendOptionReply(option, wire.RepMetaContext, payload); err != nil {
			return err
		}
	}
	if set {
		c.negotiation.contexts = selected
		c.negotiation.metaContextExport = request.exportName
	}
	return c.sendOptionReply(option, wire.RepAck)
}

// checkMetaContexts keeps, of the contexts a Backend found, those the
// protocol can carry, outside the base: namespace, once each and, for
// SET, only those a query named exactly (the server "MUST" reply with the
// contexts selected, and a client cannot interpret others).
func (c *connection) checkMetaContexts(found, queries []string, set bool) []string {
	seen := make(map[string]bool, len(found))
	var out []string
	for _, name := range found {
		namespace, _, hasColon := strings.Cut(name, ":")
		switch {
		case seen[name]:
			continue
		case !validString([]byte(name)) || !hasColon || namespace == "" || namespace == "base":
			c.logger.Error("nbd: backend bug: invalid metadata context name", "context", name)
			continue
		case set && !slices.Contains(queries, name):
			c.logger.Error("nbd: backend bug: selected a metadata context no query named", "context", name)
			continue
		}
		seen[name] = true
		out = append(out, name)
	}
	return out
}

// contextID returns the id of a metadata context on this connection:
// the same name gets the same id in every NBD_OPT_SET_META_CONTEXT of
// the connection (the spec only requires ids unique among the contexts
// selected). base:allocation is always allocationContextID.
func (c *connection) contextID(name string) uint32 {
	if name == wire.BaseAllocation {
		return allocationContextID
	}
	if id, ok := c.contextIDs[name]; ok {
		return id
	}
	if c.contextIDs == nil {
		c.contextIDs = make(map[string]uint32)
	}
	id := allocationContextID + 1 + uint32(len(c.contextIDs))
	c.contextIDs[name] = id
	return id
}

// openExport opens name through the Backend and validates what it reports.
// infoOnly: the open is for NBD_OPT_INFO.
func (c *connection) openExport(ctx context.Context, name string, infoOnly bool) (Export, ExportInfo, error) {
	session := c.session
	session.InfoOnly = infoOnly
	c.opening.Store(&pendingOpen{session: session, export: name})
	export, err := c.server.Backend.Open(ctx, name, session)
	c.opening.Store(nil)
	if err != nil {
		return nil, ExportInfo{}, err
	}
	if export == nil {
		return nil, ExportInfo{}, fmt.Errorf("%w: backend returned no export for %q", ErrIO, name)
	}
	if c.revoked.Load() {
		// Server.Revalidate refused the client while Open ran.
		c.closeExport(export)
		return nil, ExportInfo{}, fmt.Errorf("%w: the client may no longer open %q", ErrPermission, name)
	}
	info, err := normaliseExportInfo(export.Info())
	if err != nil {
		c.logger.Error("nbd: backend bug", "export", name, "error", err)
		c.closeExport(export)
		return nil, ExportInfo{}, err
	}
	return export, info, nil
}

func (c *connection) closeExport(export Export) {
	if err := export.Close(); err != nil {
		c.logger.Warn("nbd: closing export", "error", err)
	}
}

// sendOptionReply sends one fixed newstyle option reply: S: magic, option,
// reply type, length, data (spec, "Fixed newstyle negotiation").
func (c *connection) sendOptionReply(option, replyType uint32, payload ...[]byte) error {
	length := 0
	for _, part := range payload {
		length += len(part)
	}
	reply := make([]byte, 0, wire.OptionReplyHeaderLength+length)
	reply = wire.OptionReplyHeader{Option: option, Type: replyType, Length: uint32(length)}.Append(reply)
	for _, part := range payload {
		reply = append(reply, part...)
	}
	if c.logger.Enabled(context.Background(), slog.LevelDebug) {
		c.logger.Debug("nbd: option reply", "option", option, "reply", replyType, "length", length)
	}
	return c.write(reply)
}

// transmissionFlags computes the transmission flags for an export (spec,
// "Transmission flags"). A flag is only set for a feature the server will
// honour.
func transmissionFlags(info ExportInfo, structuredReplies bool) uint16 {
	flags := wire.FlagHasFlags | wire.FlagSendCache
	if info.ReadOnly {
		flags |= wire.FlagReadOnly
	}
	if info.CanFlush {
		flags |= wire.FlagSendFlush
	}
	if info.CanFUA {
		flags |= wire.FlagSendFUA
	}
	if info.CanTrim && !info.ReadOnly {
		flags |= wire.FlagSendTrim
	}
	if info.CanWriteZeroes && !info.ReadOnly {
		flags |= wire.FlagSendWriteZeroes
		// NBD_FLAG_SEND_FAST_ZERO "MUST [be] 0 if
		// NBD_FLAG_SEND_WRITE_ZEROES is not set".
		if info.CanFastZero {
			flags |= wire.FlagSendFastZero
		}
	}
	if structuredReplies {
		// Every READ is answered with at most one data chunk, so DF is
		// always honoured; the flag "MUST [be left] clear if structured
		// replies have not been negotiated".
		flags |= wire.FlagSendDF
	}
	if info.CanMultiConn {
		flags |= wire.FlagCanMultiConn
	}
	return flags
}

// normaliseExportInfo fills in default block sizes and checks the
// constraints of the spec's "Size constraints" section.
func normaliseExportInfo(info ExportInfo) (ExportInfo, error) {
	if info.BlockSizeMinimum == 0 {
		info.BlockSizeMinimum = 1
	}
	if info.BlockSizePreferred == 0 {
		info.BlockSizePreferred = max(4096, info.BlockSizeMinimum)
	}
	if info.PayloadSizeMaximum == 0 || info.PayloadSizeMaximum > wire.MaximumPayloadLength {
		info.PayloadSizeMaximum = wire.MaximumPayloadLength
	}
	switch {
	case !powerOfTwo(info.BlockSizeMinimum) || info.BlockSizeMinimum > wire.MaximumMinimumBlockSize:
		return info, fmt.Errorf("%w: minimum %d is not a power of two up to 64 KiB", errInvalidExportInfo, info.BlockSizeMinimum)
	case !powerOfTwo(info.BlockSizePreferred) || info.BlockSizePreferred < max(512, info.BlockSizeMinimum):
		return info, fmt.Errorf("%w: preferred %d is not a power of two of at least 512 and the minimum", errInvalidExportInfo, info.BlockSizePreferred)
	case info.PayloadSizeMaximum < info.BlockSizePreferred:
		return info, fmt.Errorf("%w: maximum payload %d is below the preferred block size", errInvalidExportInfo, info.PayloadSizeMaximum)
	case info.PayloadSizeMaximum%info.BlockSizeMinimum != 0:
		return info, fmt.Errorf("%w: maximum payload %d is not a multiple of the minimum block size", errInvalidExportInfo, info.PayloadSizeMaximum)
	}
	return info, nil
}

func powerOfTwo(n uint32) bool {
	return n != 0 && n&(n-1) == 0
}

// exportRequest is the data of NBD_OPT_INFO and NBD_OPT_GO.
type exportRequest struct {
	name        string
	information []uint16
}

func (r exportRequest) wants(kind uint16) bool {
	for _, requested := range r.information {
		if requested == kind {
			return true
		}
	}
	return false
}

var errMalformedOption = errors.New("nbd: malformed option data")

// parseExportRequest decodes the data of NBD_OPT_INFO and NBD_OPT_GO: 32 bits
// name length, name, 16 bits count, count 16-bit information requests
// (spec, "NBD_OPT_INFO and NBD_OPT_GO").
func parseExportRequest(data []byte) (exportRequest, error) {
	if len(data) < 6 {
		return exportRequest{}, fmt.Errorf("%w: %d bytes is too short", errMalformedOption, len(data))
	}
	nameLength := uint64(binary.BigEndian.Uint32(data[0:]))
	// "MUST be no larger than the option data length - 6".
	if nameLength > uint64(len(data)-6) {
		return exportRequest{}, fmt.Errorf("%w: name length %d exceeds the option", errMalformedOption, nameLength)
	}
	name := data[4 : 4+nameLength]
	if !validString(name) {
		return exportRequest{}, fmt.Errorf("%w: export name is not a valid string", errMalformedOption)
	}
	rest := data[4+nameLength:]
	count := int(binary.BigEndian.Uint16(rest[0:]))
	rest = rest[2:]
	if len(rest) != 2*count {
		return exportRequest{}, fmt.Errorf("%w: %d information requests in %d bytes", errMalformedOption, count, len(rest))
	}
	request := exportRequest{name: string(name), information: make([]uint16, count)}
	for i := range request.information {
		request.information[i] = binary.BigEndian.Uint16(rest[2*i:])
	}
	return request, nil
}

// metaContextRequest is the data of NBD_OPT_LIST_META_CONTEXT and
// NBD_OPT_SET_META_CONTEXT.
type metaContextRequest struct {
	exportName string
	queries    []string
}

// parseMetaContextRequest decodes: 32 bits name length, name, 32 bits number
// of queries, then per query 32 bits length and the query (spec,
// "NBD_OPT_LIST_META_CONTEXT"). "If the option request is syntactically
// invalid (such as a query length that would require reading beyond the
// original length given in the option header), the server MUST fail the
// request with NBD_REP_ERR_INVALID."
func parseMetaContextRequest(data []byte) (metaContextRequest, error) {
	name, rest, err := takeString(data, "export name")
	if err != nil {
		return metaContextRequest{}, err
	}
	if len(rest) < 4 {
		return metaContextRequest{}, fmt.Errorf("%w: missing the number of queries", errMalformedOption)
	}
	count := uint64(binary.BigEndian.Uint32(rest))
	rest = rest[4:]
	// Each query takes at least 4 bytes: checking this first keeps a
	// forged count from sizing an allocation.
	if count > uint64(len(rest)/4) {
		return metaContextRequest{}, fmt.Errorf("%w: %d queries in %d bytes", errMalformedOption, count, len(rest))
	}
	request := metaContextRequest{exportName: name, queries: make([]string, 0, count)}
	for range count {
		var query string
		query, rest, err = takeString(rest, "query")
		if err != nil {
			return metaContextRequest{}, err
		}
		request.queries = append(request.queries, query)
	}
	if len(rest) != 0 {
		return metaContextRequest{}, fmt.Errorf("%w: %d bytes after the last query", errMalformedOption, len(rest))
	}
	return request, nil
}

// takeString decodes a 32-bit length followed by a string of that length;
// what names the string in errors.
func takeString(data []byte, what string) (string, []byte, error) {
	if len(data) < 4 {
		return "", nil, fmt.Errorf("%w: missing the %s length", errMalformedOption, what)
	}
	length := uint64(binary.BigEndian.Uint32(data))
	data = data[4:]
	if length > uint64(len(data)) {
		return "", nil, fmt.Errorf("%w: %s length %d exceeds the option", errMalformedOption, what, length)
	}
	if !validString(data[:length]) {
		return "", nil, fmt.Errorf("%w: %s is not a valid string", errMalformedOption, what)
	}
	return string(data[:length]), data[length:], nil
}
