// Package nbd is herd's NBD frontend: a server for the Network Block Device
// protocol as specified in the NetworkBlockDevice/nbd repository,
// doc/proto.md (cited below as "spec, section ..."). It speaks the protocol
// only; what an export name means, and how data is read and written, is
// delegated to a Backend (in herd, the gateway).
//
// What is implemented:
//
//   - the fixed newstyle handshake with NBD_FLAG_FIXED_NEWSTYLE and
//     NBD_FLAG_NO_ZEROES (oldstyle is not offered);
//   - options NBD_OPT_EXPORT_NAME, NBD_OPT_GO, NBD_OPT_INFO (with
//     NBD_INFO_EXPORT, NBD_INFO_NAME, NBD_INFO_DESCRIPTION and
//     NBD_INFO_BLOCK_SIZE), NBD_OPT_LIST, NBD_OPT_ABORT,
//     NBD_OPT_STRUCTURED_REPLY, NBD_OPT_LIST_META_CONTEXT and
//     NBD_OPT_SET_META_CONTEXT (see "Metadata contexts" below),
//     NBD_OPT_STARTTLS (see below); every other option is refused with
//     NBD_REP_ERR_UNSUP;
//   - commands READ, WRITE, DISC, FLUSH, TRIM, CACHE, WRITE_ZEROES and
//     BLOCK_STATUS, with the flags FUA, NO_HOLE, DF, REQ_ONE and FAST_ZERO,
//     simple replies and (when negotiated) structured replies.
//
// Metadata contexts (spec, "Metadata querying"): "base:allocation" is
// the server's own, on every export (Export.BlockStatus). A Backend that
// implements MetaContexter adds its own namespaces, per export; in herd
// (internal/export):
//
//   - "qemu:allocation-depth": the depth in the snapshot chain of the
//     layer that defines each object, as QEMU defines it (0 unallocated,
//     1 the export's own VDI, 2 its parent snapshot, ...);
//   - "qemu:dirty-bitmap:TAG", one per ancestor snapshot of the export:
//     NBD_STATE_DIRTY (1) where the data changed since that snapshot.
//
// LIST takes "base:", "qemu:" and "qemu:dirty-bitmap:" as wildcards, and
// no query as "everything"; SET selects exact names (at most 64), each
// with an id that stays the same for the whole connection. The contexts
// count only if NBD_OPT_GO (or NBD_OPT_EXPORT_NAME) opens the export the
// last SET named and that export still serves them all; otherwise none
// is selected and BLOCK_STATUS fails with NBD_EINVAL. BLOCK_STATUS
// answers one NBD_REPLY_TYPE_BLOCK_STATUS chunk per selected context (one
// descriptor each under NBD_CMD_FLAG_REQ_ONE), the contexts sharing the
// spec's cap of 2^20 descriptors per reply.
//
// TLS (spec, "TLS support"): with Server.TLSConfig, NBD_OPT_STARTTLS
// upgrades the connection and option haggling goes on over TLS; the
// verified client certificate's CommonName reaches the Backend as
// Session.Client, which authorises it. With Server.RequireTLS the server
// is in FORCEDTLS mode: nothing but NBD_OPT_STARTTLS and NBD_OPT_ABORT is
// served before TLS. Without TLSConfig it is in NOTLS mode.
//
// Bounds against clients that are hostile but may be authenticated, each
// logged (at most once a second per kind) when it bites: connections in
// all and per client (Server.MaxConnections, MaxConnectionsPerClient),
// options per handshake (MaxOptions), time to negotiate
// (HandshakeTimeout, the TLS handshake included), time for a client to
// read a reply (ReplyTimeout), and payload memory per connection
// (MaxBufferedBytes) and for all connections together (MemoryBudget).
//
// Concurrency model of one connection: a single goroutine reads requests and
// dispatches each to its own goroutine, so that many requests are served at
// once (DESIGN.md, "Gateway and replication": nothing may serialise requests
// the client sent concurrently). The number of requests in flight and the
// payload bytes they hold are bounded per connection, so a client cannot make
// the server buffer more than Server.MaxBufferedBytes, and by the Server's
// MemoryBudget shared by all connections. Replies are written under a
// mutex, each as one vectored write with the reply timeout as its deadline,
// and matched to requests by the client's cookie.
//
// Extended headers (NBD_OPT_EXTENDED_HEADERS) and the RESIZE extension are
// not implemented.
package nbd
