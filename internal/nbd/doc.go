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
//     NBD_OPT_SET_META_CONTEXT for "base:allocation", NBD_OPT_STARTTLS
//     (see below); every other option is refused with NBD_REP_ERR_UNSUP;
//   - commands READ, WRITE, DISC, FLUSH, TRIM, CACHE, WRITE_ZEROES and
//     BLOCK_STATUS, with the flags FUA, NO_HOLE, DF, REQ_ONE and FAST_ZERO,
//     simple replies and (when negotiated) structured replies.
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
