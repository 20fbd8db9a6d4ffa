package nbd

import (
	"context"
	"crypto/x509"
)

// Backend resolves export names to exports. In herd the gateway implements it:
// an export name is a VDI name ("vdi"), or a snapshot ("vdi@tag"), which is
// read-only.
//
// Implementations must be safe for concurrent use: every connection calls
// them from its own goroutine.
type Backend interface {
	// List returns the exports to advertise in reply to NBD_OPT_LIST to the
	// client of session. It should omit the exports that client may not
	// open, so that it does not learn they exist. An error wrapping
	// ErrPermission refuses the listing (NBD_REP_ERR_POLICY).
	List(ctx context.Context, session Session) ([]ExportSummary, error)

	// Open opens the named export for one client connection. The empty name
	// is the client's request for a default export. The export stays open
	// until its Close method is called, once, when the connection ends (or,
	// for NBD_OPT_INFO, right after its information has been sent). ctx
	// bounds the Open call only (it carries the handshake deadline): the
	// export must not depend on it afterwards.
	//
	// Errors should wrap one of this package's sentinels so that the server
	// can tell the client why, with the error's text as the message:
	// session.InfoOnly is set when the export is opened for NBD_OPT_INFO
	// only: it is closed right after its Info has been read, no I/O
	// method is called, and Info should describe what an open for
	// NBD_OPT_GO would get (in herd: without taking the VDI's lock).
	//
	// ErrUnknownExport (NBD_REP_ERR_UNKNOWN), ErrExportBusy with a message
	// naming the holder (NBD_REP_ERR_POLICY), ErrNotReady
	// (NBD_REP_ERR_POLICY), ErrPermission (NBD_REP_ERR_POLICY), ErrInvalid
	// (NBD_REP_ERR_INVALID), ErrShutdown (NBD_REP_ERR_SHUTDOWN). Any other
	// error is reported as NBD_REP_ERR_UNKNOWN.
	Open(ctx context.Context, name string, session Session) (Export, error)
}

// Export is one open export, used by one client connection.
//
// Its I/O methods are called concurrently from many goroutines, one per
// request in flight; an implementation must not serialise them more than its
// own consistency requires. The context of each call is cancelled when the
// connection is torn down (client gone, protocol violation, forced server
// shutdown), so a call that waits on the network should return promptly
// then. p, off and length are always validated against Info first: a call
// never reaches past Size, never writes to a read-only export, and only uses
// the operations Info advertises.
//
// Errors should wrap one of this package's sentinels (ErrIO, ErrNoSpace,
// ErrInvalid, ErrReadOnly, ErrPermission, ErrNotSupported, ErrOverflow,
// ErrShutdown); they are translated to NBD error values by the server, and
// their text is shown to the client's user when structured replies are in
// use. Unknown errors become NBD_EIO.
type Export interface {
	// Info describes the export. It is called once, when the export is
	// opened; its result holds for the whole connection.
	Info() ExportInfo

	// ReadAt fills p with the bytes at offset off.
	ReadAt(ctx context.Context, p []byte, off uint64) error

	// WriteAt writes p at offset off. If fua is set, WriteAt must not return
	// before the data is on stable storage (spec, "Ordering of messages and
	// writes"). p is only valid until WriteAt returns.
	WriteAt(ctx context.Context, p []byte, off uint64, fua bool) error

	// Flush returns once every write that has completed before Flush was
	// called is on stable storage.
	Flush(ctx context.Context) error

	// Trim discards the range; later reads of it return unspecified data
	// until it is written again (spec, "NBD_CMD_TRIM").
	Trim(ctx context.Context, off, length uint64, fua bool) error

	// WriteZeroes makes the range read as zeroes. If noHole is set the range
	// must stay allocated (no hole may be punched).
	WriteZeroes(ctx context.Context, off, length uint64, noHole, fua bool) error

	// BlockStatus describes the allocation ("base:allocation") of the
	// range starting at off, as consecutive extents from off. It may
	// describe less than length (at least one non-empty extent), or more; the
	// server trims the answer to the request.
	BlockStatus(ctx context.Context, off, length uint64) ([]Extent, error)

	// Close releases the export (for instance the VDI's write lock). It is
	// called exactly once, after every other call has returned.
	Close() error
}

// Cacher is optionally implemented by an Export that can act on NBD_CMD_CACHE
// (prefetch a range). Without it the command succeeds without effect, which
// the spec allows (spec, "NBD_CMD_CACHE").
type Cacher interface {
	Cache(ctx context.Context, off, length uint64) error
}

// Revalidator is optionally implemented by a Backend whose clients' rights
// can change while they are connected (a revoked client certificate). It
// says whether session may keep the export it opened (writable: opened
// for writing); an error ends the connection (Server.Revalidate).
type Revalidator interface {
	Revalidate(session Session, export string, writable bool) error
}

// MetaContexter is optionally implemented by a Backend that serves
// metadata contexts besides "base:allocation" (which the server answers
// itself, for every export). It is asked during option haggling, before
// any export is opened (spec, "Metadata querying").
type MetaContexter interface {
	// MetaContexts answers NBD_OPT_LIST_META_CONTEXT (list) or
	// NBD_OPT_SET_META_CONTEXT (!list) for the export named exportName,
	// for the client of session. queries are the client's, without those
	// of the "base:" namespace; for list they may be none, which asks for
	// every context of the export.
	//
	// For list it returns every context of the export that a query
	// matches (the Backend defines its namespaces' wildcards, such as
	// QEMU's "qemu:" and "qemu:dirty-bitmap:"); for set, the contexts
	// selected, each exactly one of the queries. Queries it does not
	// know are ignored (spec: "the server MUST ignore query strings
	// belonging to an unknown namespace"). An export that does not
	// exist, or that the session may not open, should have no contexts,
	// without an error, so that the answer tells no more than NBD_OPT_GO
	// would. An error wrapping ErrPermission refuses the option
	// (NBD_REP_ERR_POLICY); other errors are mapped as Open's.
	//
	// What it selects is checked again when the export is opened
	// (MetaStatuser.HasMetaContext).
	MetaContexts(ctx context.Context, exportName string, session Session, queries []string, list bool) ([]string, error)
}

// MetaStatuser is optionally implemented by an Export whose Backend is a
// MetaContexter: it answers BLOCK_STATUS for the contexts other than
// base:allocation.
type MetaStatuser interface {
	// HasMetaContext reports whether the open export serves the named
	// context. It is asked when the transmission phase begins, for every
	// context that NBD_OPT_SET_META_CONTEXT selected for this export: if
	// one is no longer served (the export changed in between), no context
	// is selected, and BLOCK_STATUS is refused as if none had been.
	HasMetaContext(name string) bool

	// MetaStatus describes the range starting at off for the named
	// context (one HasMetaContext accepted), as consecutive extents from
	// off, like BlockStatus: it may describe less than length (at least
	// one non-empty extent), or more; the server trims the answer.
	MetaStatus(ctx context.Context, name string, off, length uint64) ([]MetaExtent, error)
}

// MetaExtent is one run of a block status answer for a metadata context
// other than base:allocation: Flags are that context's status flags.
type MetaExtent struct {
	Length uint64
	Flags  uint32
}

// ExportSummary is one entry of NBD_OPT_LIST.
type ExportSummary struct {
	Name        string
	Description string
}

// ExportInfo describes an open export. Zero values for the block sizes mean
// the protocol defaults: minimum 1, preferred 4096, maximum payload 32 MiB.
type ExportInfo struct {
	// Size of the export in bytes.
	Size uint64
	// Name is the canonical name (NBD_INFO_NAME); empty means the name the
	// client asked for.
	Name string
	// Description is shown to humans (NBD_INFO_DESCRIPTION); may be empty.
	Description string

	ReadOnly       bool
	CanFlush       bool // NBD_CMD_FLUSH is meaningful (a write cache exists)
	CanFUA         bool // writes honour the FUA flag
	CanTrim        bool
	CanWriteZeroes bool
	// CanFastZero says WriteZeroes is always faster than writing zeroes
	// (for example metadata only); without it a NBD_CMD_FLAG_FAST_ZERO
	// request fails quickly with NBD_ENOTSUP (spec, "NBD_CMD_WRITE_ZEROES").
	CanFastZero bool
	// CanMultiConn promises that flushes and FUA writes on one connection
	// are visible to every other connection to the same export (spec,
	// "NBD_FLAG_CAN_MULTI_CONN").
	CanMultiConn bool

	// BlockSizeMinimum is the alignment of every request's offset and
	// length: a power of two, at most 64 KiB.
	BlockSizeMinimum uint32
	// BlockSizePreferred is the size at which I/O is efficient: a power of
	// two, at least 512 and at least BlockSizeMinimum.
	BlockSizePreferred uint32
	// PayloadSizeMaximum is the largest READ or WRITE accepted, at least
	// BlockSizePreferred; values above 32 MiB are lowered to 32 MiB.
	PayloadSizeMaximum uint32
}

// Extent is one run of a "base:allocation" block status answer.
type Extent struct {
	Length uint64
	// Hole: the range is not allocated (NBD_STATE_HOLE).
	Hole bool
	// Zero: the range reads as zeroes (NBD_STATE_ZERO).
	Zero bool
}

// Session identifies the client connection an export is opened or listed
// for; a Backend uses it to authorise the client and to name the holder of
// a lock.
type Session struct {
	// ID is unique among the connections of one Server.
	ID            uint64
	RemoteAddress string
	LocalAddress  string
	// TLS is set once NBD_OPT_STARTTLS has upgraded the connection.
	TLS bool
	// Client is the Subject CommonName of the client certificate that the
	// TLS handshake verified against Server.TLSConfig's ClientCAs; empty
	// without TLS, or when the configuration did not require and verify a
	// client certificate.
	Client string
	// ClientCertificate is that verified certificate (nil when Client is
	// empty), for a Backend that tells certificates of one name apart.
	ClientCertificate *x509.Certificate
	// InfoOnly is set for an Open made for NBD_OPT_INFO rather than
	// NBD_OPT_GO or NBD_OPT_EXPORT_NAME.
	InfoOnly bool
}
