package nbdclient

// Wire constants, named after the spec's identifiers (spec, section "Values"
// and the message layouts under "Protocol phases"). All integers on the wire
// are big-endian. The server package (internal/nbd) keeps its own copy:
// both sides are written from the spec, so that one cannot hide a
// misreading of it in the other.

// Magic numbers.
const (
	magicNBD             uint64 = 0x4e42444d41474943 // "NBDMAGIC"
	magicOption          uint64 = 0x49484156454f5054 // "IHAVEOPT"
	magicOldstyle        uint64 = 0x00420281861253   // cliserv_magic of oldstyle servers
	magicOptionReply     uint64 = 0x0003e889045565a9
	magicRequest         uint32 = 0x25609513 // NBD_REQUEST_MAGIC
	magicSimpleReply     uint32 = 0x67446698 // NBD_SIMPLE_REPLY_MAGIC
	magicStructuredReply uint32 = 0x668e33ef // NBD_STRUCTURED_REPLY_MAGIC
)

// Handshake flags (server) and client flags (spec, "Handshake flags",
// "Client flags").
const (
	handshakeFlagFixedNewstyle uint16 = 1 << 0
	handshakeFlagNoZeroes      uint16 = 1 << 1
	clientFlagFixedNewstyle    uint32 = 1 << 0
	clientFlagNoZeroes         uint32 = 1 << 1
)

// Transmission flags (spec, "Transmission flags").
const (
	flagHasFlags        uint16 = 1 << 0  // NBD_FLAG_HAS_FLAGS
	flagReadOnly        uint16 = 1 << 1  // NBD_FLAG_READ_ONLY
	flagSendFlush       uint16 = 1 << 2  // NBD_FLAG_SEND_FLUSH
	flagSendFUA         uint16 = 1 << 3  // NBD_FLAG_SEND_FUA
	flagRotational      uint16 = 1 << 4  // NBD_FLAG_ROTATIONAL
	flagSendTrim        uint16 = 1 << 5  // NBD_FLAG_SEND_TRIM
	flagSendWriteZeroes uint16 = 1 << 6  // NBD_FLAG_SEND_WRITE_ZEROES
	flagSendDF          uint16 = 1 << 7  // NBD_FLAG_SEND_DF
	flagCanMultiConn    uint16 = 1 << 8  // NBD_FLAG_CAN_MULTI_CONN
	flagSendCache       uint16 = 1 << 10 // NBD_FLAG_SEND_CACHE
	flagSendFastZero    uint16 = 1 << 11 // NBD_FLAG_SEND_FAST_ZERO
)

// Options (spec, "Option types").
const (
	optionExportName      uint32 = 1  // NBD_OPT_EXPORT_NAME
	optionAbort           uint32 = 2  // NBD_OPT_ABORT
	optionGo              uint32 = 7  // NBD_OPT_GO
	optionStructuredReply uint32 = 8  // NBD_OPT_STRUCTURED_REPLY
	optionSetMetaContext  uint32 = 10 // NBD_OPT_SET_META_CONTEXT
)

// Option reply types (spec, "Option reply types").
const (
	replyAck         uint32 = 1 // NBD_REP_ACK
	replyInfo        uint32 = 3 // NBD_REP_INFO
	replyMetaContext uint32 = 4 // NBD_REP_META_CONTEXT
	replyErrorBit    uint32 = 1 << 31
	replyErrorUnsup  uint32 = replyErrorBit + 1 // NBD_REP_ERR_UNSUP
	replyErrorShut   uint32 = replyErrorBit + 7 // NBD_REP_ERR_SHUTDOWN
)

// Information types of NBD_REP_INFO (spec, "NBD_REP_INFO").
const (
	infoExport    uint16 = 0 // NBD_INFO_EXPORT
	infoBlockSize uint16 = 3 // NBD_INFO_BLOCK_SIZE
)

// Commands (spec, "Request types").
const (
	commandRead        uint16 = 0
	commandWrite       uint16 = 1
	commandDisconnect  uint16 = 2
	commandFlush       uint16 = 3
	commandTrim        uint16 = 4
	commandWriteZeroes uint16 = 6
	commandBlockStatus uint16 = 7
)

// Command flags (spec, "Command flags").
const (
	commandFlagFUA      uint16 = 1 << 0 // NBD_CMD_FLAG_FUA
	commandFlagNoHole   uint16 = 1 << 1 // NBD_CMD_FLAG_NO_HOLE
	commandFlagFastZero uint16 = 1 << 4 // NBD_CMD_FLAG_FAST_ZERO
)

// Structured replies (spec, "Structured reply flags", "Structured reply
// types").
const (
	replyFlagDone    uint16 = 1 << 0
	chunkNone        uint16 = 0
	chunkOffsetData  uint16 = 1
	chunkOffsetHole  uint16 = 2
	chunkBlockStatus uint16 = 5
	chunkErrorBit    uint16 = 1 << 15
	chunkError       uint16 = chunkErrorBit + 1
	chunkErrorOffset uint16 = chunkErrorBit + 2
)

// base:allocation flags (spec, "Metadata contexts").
const (
	stateHole uint32 = 1 << 0 // NBD_STATE_HOLE
	stateZero uint32 = 1 << 1 // NBD_STATE_ZERO
)

// Sizes and limits.
const (
	requestHeaderLength     = 28
	optionHeaderLength      = 16
	optionReplyHeaderLength = 20
	simpleReplyLength       = 16 // magic, error, handle
	chunkHeaderLength       = 20 // magic, flags, type, handle, length
	metaContextAllocation   = "base:allocation"

	// maximumStringLength is the spec's limit for strings (spec,
	// "Conventions"); error messages longer than this are cut.
	maximumStringLength = 4096
	// maximumOptionReplyLength caps the data of one option reply the client
	// accepts. The largest legitimate reply this client provokes is an
	// error message or a meta context name (at most 4096 bytes each) or a
	// 14-byte NBD_REP_INFO; anything far larger is a broken server.
	maximumOptionReplyLength = 64 << 10
	// defaultPayloadMaximum is the largest READ or WRITE sent when the
	// server did not advertise NBD_INFO_BLOCK_SIZE: "a maximum block size
	// that is effectively unlimited ..., while still honoring the maximum
	// payload size of 32 MiB" (spec, "Block size constraints").
	defaultPayloadMaximum = 32 << 20
	// maximumMinimumBlockSize: "the minimum block size ... MUST NOT be
	// larger than 64 KiB" (spec, "Block size constraints").
	maximumMinimumBlockSize = 64 << 10
	// maximumDescriptors bounds the descriptors of one block status chunk
	// (the spec recommends at most 2^20; spec, "NBD_REPLY_TYPE_BLOCK_STATUS").
	// More is treated as a broken server, so that a reply cannot make the
	// client hold an unbounded extent list.
	maximumDescriptors = 1 << 20
	// maximumRequestLength is the largest length field of a TRIM,
	// WRITE_ZEROES or BLOCK_STATUS request this client sends: 32-bit
	// lengths without extended headers, kept a round power of two so that
	// pieces stay aligned to any minimum block size.
	maximumRequestLength = 1 << 30
)

// Errno values (spec, "Error values"), for messages.
var errnoNames = map[uint32]string{
	1:   "EPERM",
	5:   "EIO",
	12:  "ENOMEM",
	22:  "EINVAL",
	28:  "ENOSPC",
	75:  "EOVERFLOW",
	95:  "ENOTSUP",
	108: "ESHUTDOWN",
}

const errnoShutdown = 108

// Option and option reply names, for messages.
var optionNames = map[uint32]string{
	1: "NBD_OPT_EXPORT_NAME", 2: "NBD_OPT_ABORT", 3: "NBD_OPT_LIST", 5: "NBD_OPT_STARTTLS",
	6: "NBD_OPT_INFO", 7: "NBD_OPT_GO", 8: "NBD_OPT_STRUCTURED_REPLY",
	9: "NBD_OPT_LIST_META_CONTEXT", 10: "NBD_OPT_SET_META_CONTEXT",
}

var replyErrorNames = map[uint32]string{
	replyErrorBit + 1:  "NBD_REP_ERR_UNSUP",
	replyErrorBit + 2:  "NBD_REP_ERR_POLICY",
	replyErrorBit + 3:  "NBD_REP_ERR_INVALID",
	replyErrorBit + 4:  "NBD_REP_ERR_PLATFORM",
	replyErrorBit + 5:  "NBD_REP_ERR_TLS_REQD",
	replyErrorBit + 6:  "NBD_REP_ERR_UNKNOWN",
	replyErrorBit + 7:  "NBD_REP_ERR_SHUTDOWN",
	replyErrorBit + 8:  "NBD_REP_ERR_BLOCK_SIZE_REQD",
	replyErrorBit + 9:  "NBD_REP_ERR_TOO_BIG",
	replyErrorBit + 10: "NBD_REP_ERR_EXT_HEADER_REQD",
}

var commandNames = map[uint16]string{
	commandRead: "READ", commandWrite: "WRITE", commandDisconnect: "DISC",
	commandFlush: "FLUSH", commandTrim: "TRIM", commandWriteZeroes: "WRITE_ZEROES",
	commandBlockStatus: "BLOCK_STATUS",
}
