// Package wire holds the NBD protocol's constants and the codecs of its
// fixed-size message headers, shared by herd's server (internal/nbd) and
// client (internal/nbdclient). Both are written from the specification in
// the NetworkBlockDevice/nbd repository, doc/proto.md (cited below as
// "spec, section ...").
//
// Every name is the spec's identifier without its NBD_ prefix, in Go's
// case: NBD_OPT_GO is OptGo, NBD_REP_ERR_UNSUP is RepErrUnsup,
// NBD_CMD_FLAG_FUA is CmdFlagFUA, NBD_REPLY_TYPE_OFFSET_DATA is
// ReplyTypeOffsetData, NBD_EIO is EIO. All integers on the wire are
// big-endian ("network byte order").
//
// The package has no I/O and no policy: what a side accepts, refuses or
// limits beyond what the spec fixes stays in that side's package. The
// header codecs are checked against byte vectors written from the spec
// (wire_test.go), so that a misreading of the spec cannot hide behind the
// server and the client sharing it.
package wire

// Magic numbers.
const (
	// NBDMagic is "NBDMAGIC" (also known as INIT_PASSWD), the first 8
	// bytes the server sends (spec, "Newstyle negotiation").
	NBDMagic uint64 = 0x4e42444d41474943
	// IHaveOptMagic is "IHAVEOPT": sent by the server after NBDMagic in the
	// newstyle greeting and by the client before every option.
	IHaveOptMagic uint64 = 0x49484156454f5054
	// CliservMagic (cliserv_magic) follows NBDMagic in the oldstyle
	// greeting (spec, "Oldstyle negotiation"), which herd does not speak.
	CliservMagic uint64 = 0x00420281861253
	// OptionReplyMagic starts every fixed newstyle option reply (spec,
	// "Fixed newstyle negotiation": "magic number for replies";
	// NBD_REP_MAGIC in the reference implementation).
	OptionReplyMagic uint64 = 0x0003e889045565a9
	// RequestMagic is NBD_REQUEST_MAGIC.
	RequestMagic uint32 = 0x25609513
	// SimpleReplyMagic is NBD_SIMPLE_REPLY_MAGIC.
	SimpleReplyMagic uint32 = 0x67446698
	// StructuredReplyMagic is NBD_STRUCTURED_REPLY_MAGIC.
	StructuredReplyMagic uint32 = 0x668e33ef
)

// Handshake flags, sent by the server (spec, "Handshake flags").
const (
	FlagFixedNewstyle uint16 = 1 << 0 // NBD_FLAG_FIXED_NEWSTYLE
	FlagNoZeroes      uint16 = 1 << 1 // NBD_FLAG_NO_ZEROES
)

// Client flags (spec, "Client flags").
const (
	FlagCFixedNewstyle uint32 = 1 << 0 // NBD_FLAG_C_FIXED_NEWSTYLE
	FlagCNoZeroes      uint32 = 1 << 1 // NBD_FLAG_C_NO_ZEROES
)

// Transmission flags (spec, "Transmission flags").
const (
	FlagHasFlags        uint16 = 1 << 0  // NBD_FLAG_HAS_FLAGS
	FlagReadOnly        uint16 = 1 << 1  // NBD_FLAG_READ_ONLY
	FlagSendFlush       uint16 = 1 << 2  // NBD_FLAG_SEND_FLUSH
	FlagSendFUA         uint16 = 1 << 3  // NBD_FLAG_SEND_FUA
	FlagRotational      uint16 = 1 << 4  // NBD_FLAG_ROTATIONAL
	FlagSendTrim        uint16 = 1 << 5  // NBD_FLAG_SEND_TRIM
	FlagSendWriteZeroes uint16 = 1 << 6  // NBD_FLAG_SEND_WRITE_ZEROES
	FlagSendDF          uint16 = 1 << 7  // NBD_FLAG_SEND_DF
	FlagCanMultiConn    uint16 = 1 << 8  // NBD_FLAG_CAN_MULTI_CONN
	FlagSendCache       uint16 = 1 << 10 // NBD_FLAG_SEND_CACHE
	FlagSendFastZero    uint16 = 1 << 11 // NBD_FLAG_SEND_FAST_ZERO
)

// Option types (spec, "Option types").
const (
	OptExportName      uint32 = 1  // NBD_OPT_EXPORT_NAME
	OptAbort           uint32 = 2  // NBD_OPT_ABORT
	OptList            uint32 = 3  // NBD_OPT_LIST
	OptPeekExport      uint32 = 4  // NBD_OPT_PEEK_EXPORT (withdrawn)
	OptStartTLS        uint32 = 5  // NBD_OPT_STARTTLS
	OptInfo            uint32 = 6  // NBD_OPT_INFO
	OptGo              uint32 = 7  // NBD_OPT_GO
	OptStructuredReply uint32 = 8  // NBD_OPT_STRUCTURED_REPLY
	OptListMetaContext uint32 = 9  // NBD_OPT_LIST_META_CONTEXT
	OptSetMetaContext  uint32 = 10 // NBD_OPT_SET_META_CONTEXT
	OptExtendedHeaders uint32 = 11 // NBD_OPT_EXTENDED_HEADERS (implemented by neither side)
)

// Option reply types (spec, "Option reply types"). An error reply has bit
// 31, RepFlagError, set.
const (
	RepAck              uint32 = 1                 // NBD_REP_ACK
	RepServer           uint32 = 2                 // NBD_REP_SERVER
	RepInfo             uint32 = 3                 // NBD_REP_INFO
	RepMetaContext      uint32 = 4                 // NBD_REP_META_CONTEXT
	RepFlagError        uint32 = 1 << 31           // NBD_REP_FLAG_ERROR
	RepErrUnsup         uint32 = RepFlagError + 1  // NBD_REP_ERR_UNSUP
	RepErrPolicy        uint32 = RepFlagError + 2  // NBD_REP_ERR_POLICY
	RepErrInvalid       uint32 = RepFlagError + 3  // NBD_REP_ERR_INVALID
	RepErrPlatform      uint32 = RepFlagError + 4  // NBD_REP_ERR_PLATFORM
	RepErrTLSReqd       uint32 = RepFlagError + 5  // NBD_REP_ERR_TLS_REQD
	RepErrUnknown       uint32 = RepFlagError + 6  // NBD_REP_ERR_UNKNOWN
	RepErrShutdown      uint32 = RepFlagError + 7  // NBD_REP_ERR_SHUTDOWN
	RepErrBlockSizeReqd uint32 = RepFlagError + 8  // NBD_REP_ERR_BLOCK_SIZE_REQD
	RepErrTooBig        uint32 = RepFlagError + 9  // NBD_REP_ERR_TOO_BIG
	RepErrExtHeaderReqd uint32 = RepFlagError + 10 // NBD_REP_ERR_EXT_HEADER_REQD
)

// Information types carried by NBD_REP_INFO (spec, "NBD_REP_INFO").
const (
	InfoExport      uint16 = 0 // NBD_INFO_EXPORT
	InfoName        uint16 = 1 // NBD_INFO_NAME
	InfoDescription uint16 = 2 // NBD_INFO_DESCRIPTION
	InfoBlockSize   uint16 = 3 // NBD_INFO_BLOCK_SIZE
)

// Request types (spec, "Request types").
const (
	CmdRead        uint16 = 0 // NBD_CMD_READ
	CmdWrite       uint16 = 1 // NBD_CMD_WRITE
	CmdDisc        uint16 = 2 // NBD_CMD_DISC
	CmdFlush       uint16 = 3 // NBD_CMD_FLUSH
	CmdTrim        uint16 = 4 // NBD_CMD_TRIM
	CmdCache       uint16 = 5 // NBD_CMD_CACHE
	CmdWriteZeroes uint16 = 6 // NBD_CMD_WRITE_ZEROES
	CmdBlockStatus uint16 = 7 // NBD_CMD_BLOCK_STATUS
)

// Command flags (spec, "Command flags").
const (
	CmdFlagFUA      uint16 = 1 << 0 // NBD_CMD_FLAG_FUA
	CmdFlagNoHole   uint16 = 1 << 1 // NBD_CMD_FLAG_NO_HOLE
	CmdFlagDF       uint16 = 1 << 2 // NBD_CMD_FLAG_DF
	CmdFlagReqOne   uint16 = 1 << 3 // NBD_CMD_FLAG_REQ_ONE
	CmdFlagFastZero uint16 = 1 << 4 // NBD_CMD_FLAG_FAST_ZERO
)

// Structured reply flags and types (spec, "Structured reply flags",
// "Structured reply types"). A type with bit 15, ReplyTypeErrorBit, set is
// an error chunk, known or not.
const (
	ReplyFlagDone        uint16 = 1 << 0                // NBD_REPLY_FLAG_DONE
	ReplyTypeNone        uint16 = 0                     // NBD_REPLY_TYPE_NONE
	ReplyTypeOffsetData  uint16 = 1                     // NBD_REPLY_TYPE_OFFSET_DATA
	ReplyTypeOffsetHole  uint16 = 2                     // NBD_REPLY_TYPE_OFFSET_HOLE
	ReplyTypeBlockStatus uint16 = 5                     // NBD_REPLY_TYPE_BLOCK_STATUS
	ReplyTypeErrorBit    uint16 = 1 << 15               // the error chunk category
	ReplyTypeError       uint16 = ReplyTypeErrorBit + 1 // NBD_REPLY_TYPE_ERROR
	ReplyTypeErrorOffset uint16 = ReplyTypeErrorBit + 2 // NBD_REPLY_TYPE_ERROR_OFFSET
)

// The base:allocation metadata context (spec, "Metadata contexts").
const (
	BaseAllocation        = "base:allocation"
	StateHole      uint32 = 1 << 0 // NBD_STATE_HOLE
	StateZero      uint32 = 1 << 1 // NBD_STATE_ZERO
)

// Errno is an NBD error value (spec, "Error values"). The values are the
// common Linux errno numbers, but they are protocol constants, not the
// host's.
type Errno uint32

const (
	NoError   Errno = 0   // the error field of a successful reply
	EPERM     Errno = 1   // NBD_EPERM
	EIO       Errno = 5   // NBD_EIO
	ENOMEM    Errno = 12  // NBD_ENOMEM
	EINVAL    Errno = 22  // NBD_EINVAL
	ENOSPC    Errno = 28  // NBD_ENOSPC
	EOVERFLOW Errno = 75  // NBD_EOVERFLOW
	ENOTSUP   Errno = 95  // NBD_ENOTSUP
	ESHUTDOWN Errno = 108 // NBD_ESHUTDOWN
)

// Limits the spec sets.
const (
	// MaximumStringLength: a string (export name, query, error message)
	// "MUST be no longer than 4096 bytes" (spec, "Conventions").
	MaximumStringLength = 4096
	// MaximumPayloadLength is the 32 MiB (2^25 bytes) payload that "SHOULD
	// NOT be considered a denial of service attack" and the maximum a
	// client honours when the server states none (spec, "Size
	// constraints").
	MaximumPayloadLength = 32 << 20
	// MaximumMinimumBlockSize: the minimum block size "MUST NOT be larger
	// than 64 KiB" (spec, "Size constraints").
	MaximumMinimumBlockSize = 64 << 10
	// MaximumBlockStatusDescriptors is the spec's recommended cap on the
	// descriptors of one block status chunk (spec,
	// "NBD_REPLY_TYPE_BLOCK_STATUS").
	MaximumBlockStatusDescriptors = 1 << 20
	// ExportNameZeroPadding is the reserved zero block that follows the
	// NBD_OPT_EXPORT_NAME reply unless NBD_FLAG_C_NO_ZEROES was negotiated
	// (spec, "Newstyle negotiation").
	ExportNameZeroPadding = 124
)
