// Package nbdclient is a client for the Network Block Device protocol, written
// from the specification in the NetworkBlockDevice/nbd repository,
// doc/proto.md (cited below as "spec, section ..."). herd uses it to move
// VDI images in and out of a cluster (`herd vdi import|export`) without the
// data passing through the admin API.
//
// What is implemented:
//
//   - the fixed newstyle handshake (NBD_FLAG_C_FIXED_NEWSTYLE, and
//     NBD_FLAG_C_NO_ZEROES when offered); oldstyle servers are refused;
//   - options NBD_OPT_STRUCTURED_REPLY, NBD_OPT_SET_META_CONTEXT for
//     "base:allocation" and the contexts of Dialer.MetaContexts (such as
//     "qemu:dirty-bitmap:TAG"), NBD_OPT_GO asking for NBD_INFO_BLOCK_SIZE (with a
//     fall back to NBD_OPT_EXPORT_NAME for servers that answer
//     NBD_REP_ERR_UNSUP), and NBD_OPT_ABORT to leave politely;
//   - commands READ (simple replies, or structured replies with
//     OFFSET_DATA, OFFSET_HOLE and error chunks), WRITE (with FUA), FLUSH,
//     TRIM, WRITE_ZEROES (with NO_HOLE, FAST_ZERO), BLOCK_STATUS for
//     base:allocation (Conn.BlockStatus) and the other selected contexts
//     (Conn.MetaStatus; every reply carries one chunk per selected
//     context, and only the asked one's extents are kept), and DISC.
//
// Concurrency model: a Conn is safe for concurrent use. Any number of
// requests may be in flight; each caller writes its request (header and
// payload, as one vectored write) while holding the connection's write slot,
// then waits for its reply. One goroutine per connection reads replies and
// matches them to requests by handle (the spec's "cookie"), copying READ data
// straight into the caller's buffer.
//
// Every field of every reply is checked against the request it answers
// (magic, handle, chunk type and length, offsets inside the request, no
// overlapping content chunks, a READ fully covered on success, block status
// lengths). A server that breaks the protocol gets a hard disconnect, as the
// spec allows ("Either side MAY initiate a hard disconnect if it detects a
// violation by the other party of a mandatory condition"); the pending
// requests then fail with an error wrapping ErrProtocol. A reply never makes
// the client panic, allocate more than the request's own size, or wait
// without end while the caller's context is live.
//
// Not implemented: TLS, extended headers (NBD_OPT_EXTENDED_HEADERS, 64-bit
// lengths), NBD_CMD_CACHE, NBD_CMD_RESIZE, NBD_OPT_LIST_META_CONTEXT
// (contexts are selected by exact name).
package nbdclient
