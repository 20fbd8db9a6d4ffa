package nbd

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"time"

	"github.com/herd-storage/herd/internal/nbd/wire"
	"github.com/herd-storage/herd/internal/tlsbatch"
)

// This file is NBD_OPT_STARTTLS (spec, "TLS support" and
// "NBD_OPT_STARTTLS"): the in-session upgrade of a connection to TLS.
// Server.TLSConfig is the spec's FORCEDTLS mode with Server.RequireTLS, and
// otherwise its SELECTIVETLS mode where every export is available with and
// without TLS (the Backend may still refuse a client without a
// certificate).

// tlsAvailable reports whether this connection may upgrade to TLS: "The
// server MUST operate in NOTLS mode unless the server set flag
// NBD_FLAG_FIXED_NEWSTYLE and the client replied with
// NBD_FLAG_C_FIXED_NEWSTYLE" (spec, "Server-side requirements").
func (c *connection) tlsAvailable() bool {
	return c.server.TLSConfig != nil && c.negotiation.clientFlags&wire.FlagCFixedNewstyle != 0
}

// startTLS answers NBD_OPT_STARTTLS.
func (c *connection) startTLS(ctx context.Context, data []byte) error {
	switch {
	case len(data) != 0:
		// "The client MUST NOT send any additional data with the
		// option", NBD_REP_ERR_INVALID "if the client included data".
		return c.sendOptionReply(wire.OptStartTLS, wire.RepErrInvalid, []byte("nbd: NBD_OPT_STARTTLS carries no data"))
	case c.session.TLS:
		// "If the server receives NBD_OPT_STARTTLS when TLS has already
		// been negotiated, it MUST reply with NBD_REP_ERR_INVALID."
		return c.sendOptionReply(wire.OptStartTLS, wire.RepErrInvalid, []byte("nbd: TLS is already active on this connection"))
	case !c.tlsAvailable():
		// NOTLS mode: NBD_REP_ERR_POLICY.
		return c.sendOptionReply(wire.OptStartTLS, wire.RepErrPolicy, []byte("nbd: TLS is not configured on this server"))
	}
	if err := c.sendOptionReply(wire.OptStartTLS, wire.RepAck); err != nil {
		return err
	}
	// From the ACK on, "all further data MUST be sent and received over
	// TLS", and a failed handshake ends the session: "it is too late to
	// continue without TLS" (spec, "FORCEDTLS mode"). The handshake runs
	// under the handshake deadline, set on netConn and carried by ctx.
	tlsConn := tls.Server(tlsbatch.Wrap(&prefixConn{Conn: c.netConn, reader: c.reader}), c.server.TLSConfig)
	if err := tlsConn.HandshakeContext(ctx); err != nil {
		if c.wasInterrupted() {
			// A graceful shutdown stops reads; logged as such.
			return fmt.Errorf("nbd: TLS handshake cut short by the server's shutdown: %w", err)
		}
		// The deadline bites through the socket or the context, whichever
		// comes first: one message for both.
		if errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("%w: not completed within the handshake timeout of %v: %w", errTLSHandshake, c.server.handshakeTimeout(), err)
		}
		return fmt.Errorf("%w: %w", errTLSHandshake, err)
	}
	state := tlsConn.ConnectionState()
	client := ""
	var certificate *x509.Certificate
	// VerifiedChains is empty unless the configuration verified the
	// client's certificate: an unverified name is no name. The chain
	// starts with the client's own certificate.
	if len(state.VerifiedChains) > 0 && len(state.VerifiedChains[0]) > 0 {
		certificate = state.VerifiedChains[0][0]
		client = certificate.Subject.CommonName
	}
	c.tlsConn = tlsConn
	c.reader = bufio.NewReaderSize(tlsConn, readBufferSize)
	c.writer = tlsConn
	c.session.TLS = true
	c.session.Client = client
	c.session.ClientCertificate = certificate
	c.logger = c.logger.With("client", client)
	// "When this command succeeds, the server MUST NOT preserve any
	// negotiation state (such as a request for NBD_OPT_STRUCTURED_REPLY,
	// or metadata contexts from NBD_OPT_SET_META_CONTEXT) issued before
	// this command." The client flags belong to the greeting, not to
	// option haggling.
	c.negotiation = negotiation{clientFlags: c.negotiation.clientFlags}
	c.logger.Debug("nbd: TLS established", "version", tls.VersionName(state.Version))

	// The connection now counts against its certificate rather than its
	// address (or, if it was in the pool of unauthenticated connections,
	// leaves it and counts for the first time). Over the limit, it is
	// refused by option replies, which tell the client why (closing it
	// here would only show a dropped connection).
	if c.unauthenticated != nil {
		return c.authenticated(client)
	}
	key := clientKeyCertified + client
	if reason := c.server.admission.switchClient(c.server, c.clientKey, key); reason != "" {
		c.clientKey = ""
		c.refusal = "nbd: too many connections: " + reason
		c.logLimited(slog.LevelWarn, refusedClientFull, "reason", reason)
		return nil
	}
	c.clientKey = key
	return nil
}

// closeTLS ends the TLS session, if there is one, before the connection
// closes: on NBD_CMD_DISC "the server MUST close down the TLS session (if
// one is running) and then close the TCP connection", and on a hard
// disconnect it "SHOULD" (spec, "Terminating the transmission phase"). The
// close_notify alert is written within the reply timeout: a client that
// does not read does not get it. After a failed write (a reply timeout, a
// hard close) it fails at once.
func (c *connection) closeTLS() {
	if c.tlsConn == nil {
		return
	}
	c.netConn.SetWriteDeadline(time.Now().Add(c.server.replyTimeout()))
	c.tlsConn.CloseWrite()
}

// prefixConn is the connection the TLS layer reads: first what the
// handshake's reader had already buffered (a client may send its
// ClientHello right behind NBD_OPT_STARTTLS), then the connection itself.
// Deadlines and Close are the connection's.
type prefixConn struct {
	net.Conn
	reader *bufio.Reader
}

func (p *prefixConn) Read(b []byte) (int, error) {
	if p.reader.Buffered() > 0 {
		return p.reader.Read(b)
	}
	return p.Conn.Read(b)
}
