package nbd

import (
	"errors"
	"log/slog"
	"time"

	"github.com/herd-storage/herd/internal/logging"
	"github.com/herd-storage/herd/internal/netserve"
)

// This file keeps the connections of a Server that requires TLS apart
// until their TLS handshake has verified a client certificate: they are
// anyone's (a port scan, a flood of silent connections), so they have
// their own pool (netserve.Unauthenticated: MaxUnauthenticated in all,
// MaxUnauthenticatedPerSource per remote IP), their own deadline
// (UnauthenticatedTimeout), and count against MaxConnections and
// MaxConnectionsPerClient only once they are a certificate's. A full
// pool closes its oldest connection (of the source holding the most) to
// admit a new one, so strangers cannot keep out a client that has a
// certificate: its connection gets through its TLS handshake before
// strangers' connections from other addresses push it out.

// Defaults of the unauthenticated pool.
const (
	defaultMaxUnauthenticated          = 512
	defaultMaxUnauthenticatedPerSource = 64
	defaultUnauthenticatedTimeout      = 10 * time.Second
)

// errEvicted ends a connection closed to admit another unauthenticated one.
var errEvicted = errors.New("nbd: connection closed to admit another: too many connections without a certificate")

// authenticates reports whether connections authenticate before they
// count as a client's: TLS with a client certificate is required.
func (s *Server) authenticates() bool {
	return s.RequireTLS && s.TLSConfig != nil
}

func (s *Server) unauthenticatedPool() *netserve.Unauthenticated {
	s.unauthenticatedOnce.Do(func() {
		s.unauthenticated = &netserve.Unauthenticated{Max: s.MaxUnauthenticated, MaxPerSource: s.MaxUnauthenticatedPerSource}
		if s.unauthenticated.Max <= 0 {
			s.unauthenticated.Max = defaultMaxUnauthenticated
		}
		if s.unauthenticated.MaxPerSource <= 0 {
			s.unauthenticated.MaxPerSource = defaultMaxUnauthenticatedPerSource
		}
	})
	return s.unauthenticated
}

func (s *Server) unauthenticatedTimeout() time.Duration {
	timeout := s.UnauthenticatedTimeout
	if timeout <= 0 {
		timeout = defaultUnauthenticatedTimeout
	}
	return min(timeout, s.handshakeTimeout())
}

// UnauthenticatedConnections is the number of connections in the pool of
// those not authenticated yet, and how many were closed to admit others.
func (s *Server) UnauthenticatedConnections() (connections int, evicted uint64) {
	pool := s.unauthenticatedPool()
	connections, _ = pool.Len("")
	return connections, pool.Evictions()
}

// admitUnauthenticated puts a new connection in the pool, closing the one
// the pool picks if it is full.
func (s *Server) admitUnauthenticated(c *connection) {
	source := netserve.Source(c.netConn)
	netConn := c.netConn
	pending, evicted := s.unauthenticatedPool().Admit(source, func() { netConn.Close() })
	c.unauthenticated = pending
	if evicted != "" {
		total, fromSource := s.unauthenticatedPool().Len(evicted)
		s.logger().Warn("nbd: too many connections without a certificate; closed the oldest to admit a new one",
			logging.Refusal(logPort, evicted), "closed_from", evicted,
			"unauthenticated", total, "unauthenticated_from_there", fromSource,
			"max", s.unauthenticatedPool().Max, "max_per_source", s.unauthenticatedPool().MaxPerSource)
	}
}

// leaveUnauthenticated takes the connection out of the pool (it ended),
// if it is in it.
func (c *connection) leaveUnauthenticated() {
	if c.unauthenticated != nil {
		c.unauthenticated.Leave()
	}
}

// unauthenticatedDeadline is the connection's deadline from now on: the
// handshake's, or earlier while it is not authenticated.
func (c *connection) unauthenticatedDeadline(handshake time.Time) time.Time {
	if c.unauthenticated == nil {
		return handshake
	}
	if early := time.Now().Add(c.server.unauthenticatedTimeout()); early.Before(handshake) {
		return early
	}
	return handshake
}

// authenticated moves a connection whose TLS handshake verified the
// certificate of client out of the unauthenticated pool: it now counts
// against MaxConnections and, as the certificate's, against
// MaxConnectionsPerClient. Over either, every later option is refused
// saying why. It fails if the pool had closed the connection meanwhile.
func (c *connection) authenticated(client string) error {
	if !c.unauthenticated.Leave() {
		return errEvicted
	}
	c.unauthenticated = nil
	c.setDeadline(c.handshakeDeadline)
	key := clientKeyCertified + client
	if client == "" {
		// TLS without a verified certificate (a configuration that does
		// not require one): the address stays the client.
		key = addressClientKey(c.netConn)
	}
	if message, reason := c.server.admission.admit(c.server, key); message != "" {
		c.refusal = "nbd: too many connections: " + reason
		c.logLimited(slog.LevelWarn, message, "reason", reason)
		return nil
	}
	c.admitted, c.clientKey = true, key
	return nil
}
