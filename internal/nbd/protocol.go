package nbd

// Wire constants, named after the spec's identifiers (spec, section "Values"
// and the message layouts under "Protocol phases"). All integers on the wire
// are big-endian ("network byte order").

// Magic numbers.
const (
	// magicNBD is "NBDMAGIC", the first 8 bytes the server sends.
	magicNBD uint64 = 0x4e42444d41474943
	// magicOption is "IHAVEOPT": sent by the server after magicNBD in the
	// newstyle greeting and by the client before every option.
	magicOption uint64 = 0x49484156454f5054
	// magicOptionReply starts every fixed newstyle option reply.
	magicOptionReply uint64 = 0x0003e889045565a9
	// magicRequest is NBD_REQUEST_MAGIC.
	magicRequest uint32 = 0x25609513
	// magicSimpleReply is NBD_SIMPLE_REPLY_MAGIC.
	magicSimpleReply uint32 = 0x67446698
	// magicStructuredReply is NBD_STRUCTURED_REPLY_MAGIC.
	magicStructuredReply uint32 = 0x668e33ef
)

// Handshake flags sent by the server (spec, "Handshake flags").
const (
	handshakeFlagFixedNewstyle uint16 = 1 << 0 // NBD_FLAG_FIXED_NEWSTYLE
	handshakeFlagNoZeroes      uint16 = 1 << 1 // NBD_FLAG_NO_ZEROES
)

// Client flags (spec, "Client flags").
const (
	clientFlagFixedNewstyle uint32 = 1 << 0 // NBD_FLAG_C_FIXED_NEWSTYLE
	clientFlagNoZeroes      uint32 = 1 << 1 // NBD_FLAG_C_NO_ZEROES
	clientFlagsKnown               = clientFlagFixedNewstyle | clientFlagNoZeroes
)

// Transmission flags (spec, "Transmission flags").
const (
	transmissionFlagHasFlags         uint16 = 1 << 0  // NBD_FLAG_HAS_FLAGS
	transmissionFlagReadOnly         uint16 = 1 << 1  // NBD_FLAG_READ_ONLY
	transmissionFlagSendFlush        uint16 = 1 << 2  // NBD_FLAG_SEND_FLUSH
	transmissionFlagSendFUA          uint16 = 1 << 3  // NBD_FLAG_SEND_FUA
	transmissionFlagRotational       uint16 = 1 << 4  // NBD_FLAG_ROTATIONAL
	transmissionFlagSendTrim         uint16 = 1 << 5  // NBD_FLAG_SEND_TRIM
	transmissionFlagSendWriteZeroes  uint16 = 1 << 6  // NBD_FLAG_SEND_WRITE_ZEROES
	transmissionFlagSendDontFragment uint16 = 1 << 7  // NBD_FLAG_SEND_DF
	transmissionFlagCanMultiConn     uint16 = 1 << 8  // NBD_FLAG_CAN_MULTI_CONN
	transmissionFlagSendCache        uint16 = 1 << 10 // NBD_FLAG_SEND_CACHE
	transmissionFlagSendFastZero     uint16 = 1 << 11 // NBD_FLAG_SEND_FAST_ZERO
)

// Option types (spec, "Option types").
const (
	optionExportName        uint32 = 1  // NBD_OPT_EXPORT_NAME
	optionAbort             uint32 = 2  // NBD_OPT_ABORT
	optionList              uint32 = 3  // NBD_OPT_LIST
	optionPeekExport        uint32 = 4  // NBD_OPT_PEEK_EXPORT (withdrawn)
	optionStartTLS          uint32 = 5  // NBD_OPT_STARTTLS
	optionInfo              uint32 = 6  // NBD_OPT_INFO
	optionGo                uint32 = 7  // NBD_OPT_GO
	optionStructuredReply   uint32 = 8  // NBD_OPT_STRUCTURED_REPLY
	optionListMetaContext   uint32 = 9  // NBD_OPT_LIST_META_CONTEXT
	optionSetMetaContext    uint32 = 10 // NBD_OPT_SET_META_CONTEXT
	optionExtendedHeaders   uint32 = 11 // NBD_OPT_EXTENDED_HEADERS (not implemented)
	replyTypeErrorBit       uint32 = 1 << 31
	optionReplyHeaderLength        = 20
	optionHeaderLength             = 16
)

// Option reply types (spec, "Option reply types").
const (
	replyAck                   uint32 = 1                      // NBD_REP_ACK
	replyServer                uint32 = 2                      // NBD_REP_SERVER
	replyInfo                  uint32 = 3                      // NBD_REP_INFO
	replyMetaContext           uint32 = 4                      // NBD_REP_META_CONTEXT
	replyErrorUnsupported      uint32 = replyTypeErrorBit + 1  // NBD_REP_ERR_UNSUP
	replyErrorPolicy           uint32 = replyTypeErrorBit + 2  // NBD_REP_ERR_POLICY
	replyErrorInvalid          uint32 = replyTypeErrorBit + 3  // NBD_REP_ERR_INVALID
	replyErrorPlatform         uint32 = replyTypeErrorBit + 4  // NBD_REP_ERR_PLATFORM
	replyErrorTLSRequired      uint32 = replyTypeErrorBit + 5  // NBD_REP_ERR_TLS_REQD
	replyErrorUnknown          uint32 = replyTypeErrorBit + 6  // NBD_REP_ERR_UNKNOWN
	replyErrorShutdown         uint32 = replyTypeErrorBit + 7  // NBD_REP_ERR_SHUTDOWN
	replyErrorBlockSizeNeeded  uint32 = replyTypeErrorBit + 8  // NBD_REP_ERR_BLOCK_SIZE_REQD
	replyErrorTooBig           uint32 = replyTypeErrorBit + 9  // NBD_REP_ERR_TOO_BIG
	replyErrorExtendedRequired uint32 = replyTypeErrorBit + 10 // NBD_REP_ERR_EXT_HEADER_REQD
)

// Information types carried by NBD_REP_INFO (spec, "NBD_REP_INFO").
const (
	infoExport      uint16 = 0 // NBD_INFO_EXPORT
	infoName        uint16 = 1 // NBD_INFO_NAME
	infoDescription uint16 = 2 // NBD_INFO_DESCRIPTION
	infoBlockSize   uint16 = 3 // NBD_INFO_BLOCK_SIZE
)

// Request types (spec, "Request types").
const (
	commandRead        uint16 = 0 // NBD_CMD_READ
	commandWrite       uint16 = 1 // NBD_CMD_WRITE
	commandDisconnect  uint16 = 2 // NBD_CMD_DISC
	commandFlush       uint16 = 3 // NBD_CMD_FLUSH
	commandTrim        uint16 = 4 // NBD_CMD_TRIM
	commandCache       uint16 = 5 // NBD_CMD_CACHE
	commandWriteZeroes uint16 = 6 // NBD_CMD_WRITE_ZEROES
	commandBlockStatus uint16 = 7 // NBD_CMD_BLOCK_STATUS
)

// Command flags (spec, "Command flags").
const (
	commandFlagFUA          uint16 = 1 << 0 // NBD_CMD_FLAG_FUA
	commandFlagNoHole       uint16 = 1 << 1 // NBD_CMD_FLAG_NO_HOLE
	commandFlagDontFragment uint16 = 1 << 2 // NBD_CMD_FLAG_DF
	commandFlagRequestOne   uint16 = 1 << 3 // NBD_CMD_FLAG_REQ_ONE
	commandFlagFastZero     uint16 = 1 << 4 // NBD_CMD_FLAG_FAST_ZERO
)

// Structured reply flags and chunk types (spec, "Structured reply flags",
// "Structured reply types").
const (
	replyFlagDone         uint16 = 1 << 0        // NBD_REPLY_FLAG_DONE
	chunkNone             uint16 = 0             // NBD_REPLY_TYPE_NONE
	chunkOffsetData       uint16 = 1             // NBD_REPLY_TYPE_OFFSET_DATA
	chunkOffsetHole       uint16 = 2             // NBD_REPLY_TYPE_OFFSET_HOLE
	chunkBlockStatus      uint16 = 5             // NBD_REPLY_TYPE_BLOCK_STATUS
	chunkError            uint16 = (1 << 15) + 1 // NBD_REPLY_TYPE_ERROR
	chunkErrorOffset      uint16 = (1 << 15) + 2 // NBD_REPLY_TYPE_ERROR_OFFSET
	requestHeaderLength          = 28            // magic, flags, type, cookie, offset, length
	simpleReplyLength            = 16            // magic, error, cookie
	chunkHeaderLength            = 20            // magic, flags, type, cookie, length
	stateHole             uint32 = 1 << 0        // NBD_STATE_HOLE (base:allocation)
	stateZero             uint32 = 1 << 1        // NBD_STATE_ZERO (base:allocation)
	metaContextAllocation        = "base:allocation"
	// allocationContextID is the id this server gives base:allocation; the
	// spec only requires it to be unique among the selected contexts.
	allocationContextID uint32 = 1
)

// errno is an NBD error value (spec, "Error values"). The values are the
// common Linux errno numbers, but they are protocol constants, not the host's.
type errno uint32

const (
	errnoNone         errno = 0
	errnoPermission   errno = 1   // NBD_EPERM
	errnoInputOutput  errno = 5   // NBD_EIO
	errnoNoMemory     errno = 12  // NBD_ENOMEM
	errnoInvalid      errno = 22  // NBD_EINVAL
	errnoNoSpace      errno = 28  // NBD_ENOSPC
	errnoOverflow     errno = 75  // NBD_EOVERFLOW
	errnoNotSupported errno = 95  // NBD_ENOTSUP
	errnoShutdown     errno = 108 // NBD_ESHUTDOWN
)

// Limits.
const (
	// maximumStringLength is the longest string (export name, query, error
	// message) the spec allows (spec, "Conventions").
	maximumStringLength = 4096
	// maximumOptionLength caps the option data the server buffers during
	// option haggling. The largest legitimate option is a meta-context
	// request with a 4096-byte name and a few queries; longer options are
	// skipped and refused with NBD_REP_ERR_TOO_BIG.
	maximumOptionLength = 64 << 10
	// maximumPayloadLength is the largest request payload (WRITE) or
	// simple READ reply this server accepts. The spec says a payload up to
	// 2^25 bytes SHOULD NOT be considered a denial of service (spec, "Size
	// constraints"); a WRITE announcing more is treated as one and the
	// connection is dropped, because its payload would have to be read to
	// stay in sync.
	maximumPayloadLength = 32 << 20
	// maximumMinimumBlockSize is the largest minimum block size the spec
	// allows to be advertised (spec, "Size constraints").
	maximumMinimumBlockSize = 64 << 10
	// maximumExtentsPerReply is the spec's recommended cap on block status
	// descriptors in one chunk (spec, "NBD_REPLY_TYPE_BLOCK_STATUS").
	maximumExtentsPerReply = 1 << 20
	// exportNameZeroPadding is the reserved zero block that follows the
	// NBD_OPT_EXPORT_NAME reply unless NBD_FLAG_C_NO_ZEROES was negotiated.
	exportNameZeroPadding = 124
)
