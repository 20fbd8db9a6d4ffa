package nbdclient

import "github.com/herd-storage/herd/internal/nbd/wire"

// The protocol's constants and header codecs are internal/nbd/wire's,
// shared with the server. What is here is this client's own choice, and the
// spec's names of values for messages.

const (
	// maximumOptionReplyLength caps the data of one option reply the client
	// accepts. The largest legitimate reply this client provokes is an
	// error message or a meta context name (at most 4096 bytes each) or a
	// 14-byte NBD_REP_INFO; anything far larger is a broken server.
	maximumOptionReplyLength = 64 << 10
	// maximumRequestLength is the largest length field of a TRIM,
	// WRITE_ZEROES or BLOCK_STATUS request this client sends: 32-bit
	// lengths without extended headers, kept a round power of two so that
	// pieces stay aligned to any minimum block size.
	maximumRequestLength = 1 << 30
)

// Errno values (spec, "Error values"), for messages.
var errnoNames = map[wire.Errno]string{
	wire.EPERM:     "EPERM",
	wire.EIO:       "EIO",
	wire.ENOMEM:    "ENOMEM",
	wire.EINVAL:    "EINVAL",
	wire.ENOSPC:    "ENOSPC",
	wire.EOVERFLOW: "EOVERFLOW",
	wire.ENOTSUP:   "ENOTSUP",
	wire.ESHUTDOWN: "ESHUTDOWN",
}

// Option and option reply names, for messages.
var optionNames = map[uint32]string{
	wire.OptExportName: "NBD_OPT_EXPORT_NAME", wire.OptAbort: "NBD_OPT_ABORT", wire.OptList: "NBD_OPT_LIST",
	wire.OptStartTLS: "NBD_OPT_STARTTLS", wire.OptInfo: "NBD_OPT_INFO", wire.OptGo: "NBD_OPT_GO",
	wire.OptStructuredReply: "NBD_OPT_STRUCTURED_REPLY", wire.OptListMetaContext: "NBD_OPT_LIST_META_CONTEXT",
	wire.OptSetMetaContext: "NBD_OPT_SET_META_CONTEXT",
}

var replyErrorNames = map[uint32]string{
	wire.RepErrUnsup:         "NBD_REP_ERR_UNSUP",
	wire.RepErrPolicy:        "NBD_REP_ERR_POLICY",
	wire.RepErrInvalid:       "NBD_REP_ERR_INVALID",
	wire.RepErrPlatform:      "NBD_REP_ERR_PLATFORM",
	wire.RepErrTLSReqd:       "NBD_REP_ERR_TLS_REQD",
	wire.RepErrUnknown:       "NBD_REP_ERR_UNKNOWN",
	wire.RepErrShutdown:      "NBD_REP_ERR_SHUTDOWN",
	wire.RepErrBlockSizeReqd: "NBD_REP_ERR_BLOCK_SIZE_REQD",
	wire.RepErrTooBig:        "NBD_REP_ERR_TOO_BIG",
	wire.RepErrExtHeaderReqd: "NBD_REP_ERR_EXT_HEADER_REQD",
}

var commandNames = map[uint16]string{
	wire.CmdRead: "READ", wire.CmdWrite: "WRITE", wire.CmdDisc: "DISC",
	wire.CmdFlush: "FLUSH", wire.CmdTrim: "TRIM", wire.CmdWriteZeroes: "WRITE_ZEROES",
	wire.CmdBlockStatus: "BLOCK_STATUS",
}
