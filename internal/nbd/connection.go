package nbd

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/herd-storage/herd/internal/netserve"
)

const readBufferSize = 64 << 10

// connection is one client connection, from the greeting to the close.
type connection struct {
	server *Server
	// netConn is the accepted connection. Deadlines and hard closes act
	// on it even after TLS: they reach the TLS layer's reads and writes
	// underneath, and closing it never blocks on a TLS alert.
	netConn net.Conn
	session Session
	logger  *slog.Logger

	// reader and writer carry the protocol bytes: on netConn, or on the
	// tls.Conn after NBD_OPT_STARTTLS. The connection's goroutine
	// replaces them, during the handshake only.
	reader *bufio.Reader
	writer io.Writer
	// tlsConn is the TLS session once NBD_OPT_STARTTLS succeeded.
	tlsConn *tls.Conn

	// The fields below are touched by the connection's goroutine only
	// (and by startConnection before it starts).
	negotiation negotiation
	// contextIDs are the ids given to metadata contexts other than
	// base:allocation on this connection, so that a context keeps its id
	// across NBD_OPT_SET_META_CONTEXT options. At most
	// maximumSelectedContexts per option, and MaxOptions options, bound
	// it.
	contextIDs map[string]uint32
	// options counts the options of the handshake, against MaxOptions.
	options int
	// admitted: counted in the Server's MaxConnections; clientKey: the
	// client counted in MaxConnectionsPerClient ("" for none).
	admitted  bool
	clientKey string
	// unauthenticated is the connection's place in the Server's pool of
	// connections not authenticated yet (unauthenticated.go), until its
	// TLS handshake verified a client certificate; nil if it never was
	// in it (no TLS required) or has left it.
	unauthenticated *netserve.Pending
	// handshakeDeadline ends the handshake; an unauthenticated
	// connection's deadline is earlier (Server.UnauthenticatedTimeout).
	handshakeDeadline time.Time
	// refusal, when set, is why every option from now on is refused: the
	// client's certificate is over MaxConnectionsPerClient.
	refusal string

	// active is the transmission once the handshake is over: the session
	// no longer changes, and Server.Revalidate may look at it.
	active atomic.Pointer[transmission]
	// opening is the open under way while the Backend's Open runs (which
	// may wait, for a VDI's writer lock say): Server.Revalidate asks
	// about it as about an open export, and sets revoked when the client
	// may no longer open it. revoked also marks an active connection
	// Revalidate refused. A revoked connection opens and serves nothing
	// more.
	opening atomic.Pointer[pendingOpen]
	revoked atomic.Bool

	// deadlineMutex guards interrupted and orders it with the deadline
	// changes, so that a graceful shutdown's interruption is never undone
	// by the connection moving to its next phase.
	deadlineMutex sync.Mutex
	interrupted   bool
}

func newConnection(server *Server, netConn net.Conn) *connection {
	id := server.nextConnectionID.Add(1)
	session := Session{ID: id}
	if address := netConn.RemoteAddr(); address != nil {
		session.RemoteAddress = address.String()
	}
	if address := netConn.LocalAddr(); address != nil {
		session.LocalAddress = address.String()
	}
	return &connection{
		server:  server,
		netConn: netConn,
		session: session,
		logger:  server.logger().With("connection", id, "remote", session.RemoteAddress),
		reader:  bufio.NewReaderSize(netConn, readBufferSize),
		writer:  netConn,
	}
}

// serve runs the connection to its end and closes it.
func (c *connection) serve(ctx context.Context) {
	defer c.netConn.Close()
	defer c.closeTLS()
	defer func() { c.server.admission.release(c.clientKey, c.admitted) }()
	defer c.leaveUnauthenticated()
	c.logger.Debug("nbd: connection opened")
	// The handshake deadline bounds the client (through the socket) and
	// the Backend calls made while negotiating (through the context).
	deadline := time.Now().Add(c.server.handshakeTimeout())
	c.handshakeDeadline = deadline
	c.setDeadline(c.unauthenticatedDeadline(deadline))
	handshakeContext, cancel := context.WithDeadline(ctx, deadline)
	transmission, err := c.negotiate(handshakeContext)
	cancel()
	if err != nil {
		c.logEnd("nbd: connection ended during negotiation", err)
		return
	}
	c.setDeadline(time.Time{})
	c.logger.Debug("nbd: transmission phase", "export", transmission.exportName,
		"size", transmission.info.Size, "flags", transmission.flags,
		"structured_replies", transmission.structuredReplies)
	c.active.Store(transmission)
	// Asked again once active: a revocation the Backend's Open did not
	// see, applied before Server.Revalidate could find this connection
	// active, is seen here; one applied later, by Revalidate.
	if err := c.server.revalidate(c, transmission); err != nil {
		c.refuse(c.session, transmission.exportName, err)
	}
	err = transmission.serve(ctx)
	if c.wasInterrupted() {
		c.closeGracefully()
	}
	c.logEnd("nbd: connection ended", err)
}

// lingerTimeout bounds how long a connection ended by a graceful server
// shutdown waits for the client to close its end (closeGracefully).
const lingerTimeout = time.Second

// closeGracefully ends a connection whose transmission a graceful server
// shutdown ended, every request it read answered: it closes the sending
// side (TLS close_notify, then a TCP FIN), so that the client reads every
// reply and then the end of the stream, and discards what the client
// still sends until it closes its end too, or lingerTimeout passes.
// Closing at once would lose replies: the client's requests the server
// stopped reading sit unread in the socket, and closing a socket with
// unread data makes the kernel reset the connection, dropping whatever
// replies it had not sent yet. Those unread requests are never answered
// (not with NBD_ESHUTDOWN either: QEMU reports a server's error reply to
// the guest as a failed request, while a connection that closes makes it
// reconnect, with reconnect-delay, and send them again). Shutdown's
// deadline still bounds it: it closes every connection when it passes.
func (c *connection) closeGracefully() {
	if c.tlsConn != nil {
		c.tlsConn.CloseWrite()
	}
	half, ok := c.netConn.(interface{ CloseWrite() error })
	if !ok || half.CloseWrite() != nil {
		return
	}
	c.deadlineMutex.Lock()
	c.netConn.SetReadDeadline(time.Now().Add(lingerTimeout))
	c.deadlineMutex.Unlock()
	io.Copy(io.Discard, c.reader)
}

// logEnd logs why a connection ended, loudly only for the unusual reasons.
func (c *connection) logEnd(message string, err error) {
	negotiating := c.active.Load() == nil
	switch {
	case c.unauthenticated != nil && c.unauthenticated.Evicted():
		// Logged when it was closed (startConnection).
		c.logger.Debug(message, "reason", "closed to admit another unauthenticated connection")
	// The kinds a scan or a misconfigured client repeats at a high rate
	// are bounded refusal lines, each with its own message, and so is
	// every other end of a negotiation (whoever reaches the port can
	// cause one). A failed TLS handshake comes first: it may wrap io.EOF,
	// and is worth a line even then.
	case errors.Is(err, errTLSHandshake):
		c.logLimited(slog.LevelWarn, "nbd: TLS handshake failed; connection closed", "error", err)
	case errors.Is(err, errTLSRequired):
		c.logLimited(slog.LevelWarn, "nbd: plaintext client on a server that requires TLS; connection closed", "error", err)
	case errors.Is(err, errTooManyOptions):
		c.logLimited(slog.LevelWarn, "nbd: too many options in one handshake; connection closed", "error", err)
	case errors.Is(err, errClientRefused):
		c.logLimited(slog.LevelWarn, "nbd: refused client sent NBD_OPT_EXPORT_NAME; connection closed", "error", err)
	case err == nil, errors.Is(err, io.EOF), errors.Is(err, errAborted), errors.Is(err, net.ErrClosed):
		c.logger.Debug(message, "reason", err)
	case c.wasInterrupted() && errors.Is(err, os.ErrDeadlineExceeded):
		c.logger.Debug(message, "reason", "server shutdown")
	case errors.Is(err, ErrProtocol) && negotiating:
		c.logLimited(slog.LevelWarn, message, "error", err)
	case errors.Is(err, ErrProtocol):
		c.logger.Warn(message, "error", err)
	case negotiating:
		c.logLimited(slog.LevelInfo, message, "error", err)
	default:
		c.logger.Info(message, "error", err)
	}
}

// write sends b during the handshake (the transmission phase has its own,
// serialised writer).
func (c *connection) write(b []byte) error {
	_, err := c.writer.Write(b)
	return err
}

// setDeadline sets the read and write deadline, except that the read deadline
// stays in the past once the connection has been interrupted.
func (c *connection) setDeadline(deadline time.Time) {
	c.deadlineMutex.Lock()
	defer c.deadlineMutex.Unlock()
	if c.interrupted {
		c.netConn.SetWriteDeadline(deadline)
		return
	}
	c.netConn.SetDeadline(deadline)
}

// interrupt makes the connection stop reading: a blocked read returns at
// once, and so does every later one. Requests in flight are not affected.
func (c *connection) interrupt() {
	c.deadlineMutex.Lock()
	defer c.deadlineMutex.Unlock()
	c.interrupted = true
	c.netConn.SetReadDeadline(time.Now())
}

func (c *connection) wasInterrupted() bool {
	c.deadlineMutex.Lock()
	defer c.deadlineMutex.Unlock()
	return c.interrupted
}

// hardClose initiates a hard disconnect (spec, "Terminating the transmission
// phase"): blocked reads and writes on the connection fail at once.
func (c *connection) hardClose() {
	c.netConn.Close()
}

// pendingOpen is an open under way (connection.opening).
type pendingOpen struct {
	session Session
	export  string
}

// refuse ends a connection whose client may no longer use export: from
// now on nothing more is opened or served on it (requests already read
// are refused, not served), and it is closed at once.
func (c *connection) refuse(session Session, export string, err error) {
	c.revoked.Store(true)
	c.logger.Warn("nbd: client no longer allowed its export; connection closed", "client", session.Client, "export", export, "error", err)
	c.hardClose()
}
