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
//     NBD_OPT_SET_META_CONTEXT for "base:allocation"; NBD_OPT_STARTTLS is
//     refused with NBD_REP_ERR_POLICY (NOTLS mode) and every other option
//     with NBD_REP_ERR_UNSUP;
//   - commands READ, WRITE, DISC, FLUSH, TRIM, CACHE, WRITE_ZEROES and
//     BLOCK_STATUS, with the flags FUA, NO_HOLE, DF, REQ_ONE and FAST_ZERO,
//     simple replies and (when negotiated) structured replies.
//
// Concurrency model of one connection: a single goroutine reads requests and
// dispatches each to its own goroutine, so that many requests are served at
// once (DESIGN.md, "Gateway and replication": nothing may serialise requests
// the client sent concurrently). The number of requests in flight and the
// payload bytes they hold are bounded per connection, so a client cannot make
// the server buffer more than Server.MaxBufferedBytes. Replies are written
// under a mutex, each as one vectored write, and matched to requests by the
// client's cookie.
//
// Extended headers (NBD_OPT_EXTENDED_HEADERS), TLS and the RESIZE extension
// are not implemented.
package nbd
