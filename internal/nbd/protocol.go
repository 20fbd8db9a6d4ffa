package nbd

import "github.com/herd-storage/herd/internal/nbd/wire"

// The protocol's constants and header codecs are internal/nbd/wire's,
// shared with the client. What is here is this server's own choice.

const (
	// clientFlagsKnown are the client flags this server understands; any
	// other ends the connection (spec, "Client flags").
	clientFlagsKnown = wire.FlagCFixedNewstyle | wire.FlagCNoZeroes
	// allocationContextID is the id this server gives base:allocation; the
	// spec only requires it to be unique among the selected contexts.
	allocationContextID uint32 = 1
	// maximumSelectedContexts caps the metadata contexts one
	// NBD_OPT_SET_META_CONTEXT may select (more is NBD_REP_ERR_TOO_BIG):
	// every BLOCK_STATUS answers once per context, and the descriptors of
	// one reply, all contexts together, stay within the spec's 2^20.
	maximumSelectedContexts = 64
	// maximumOptionLength caps the option data the server buffers during
	// option haggling. The largest legitimate option is a meta-context
	// request with a 4096-byte name and a few queries; longer options are
	// skipped and refused with NBD_REP_ERR_TOO_BIG.
	maximumOptionLength = 64 << 10
)
