package api

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/herd-storage/herd/internal/logging"
	"github.com/herd-storage/herd/internal/netserve"
)

// The admin port's connections. Anyone who reaches the port can open
// one, and complete its TLS handshake (the admin API has no client
// certificates): a connection counts as authenticated only once one of
// its requests carried a valid token. Until then it is in a pool of its
// own (netserve.Unauthenticated: a bound in all and per remote address,
// the oldest closed to admit a new one when full) and is closed after
// UnauthenticatedTimeout; authenticated connections are capped by
// MaxConnections. So strangers holding connections cost the node a
// bounded number of sockets and never keep an operator out.
//
// An authenticated connection between requests (a client's keep-alive)
// holds its place too: a monitoring loop that makes a new client per
// call leaves one behind each time, until IdleTimeout. When the bound is
// reached the connection idle the longest is closed to admit the new
// one, as an HTTP client expects of an idle keep-alive connection, and
// only when none is idle is the new one refused.

// ConnectionLimits bound the admin port's connections (herd server
// --admin-max-*); zero fields take the defaults.
type ConnectionLimits struct {
	// MaxConnections bounds the connections that carried a request with
	// a valid token; a request that would authenticate one more is
	// answered 503 and its connection closed. Default 256.
	MaxConnections int
	// MaxUnauthenticated and MaxUnauthenticatedPerSource bound the other
	// connections, in all and per remote IP address. Defaults 64 and 16.
	MaxUnauthenticated          int
	MaxUnauthenticatedPerSource int
	// UnauthenticatedTimeout is how long a connection may stay without
	// a request with a valid token. Default 10 s.
	UnauthenticatedTimeout time.Duration
}

// Defaults of ConnectionLimits.
const (
	DefaultMaxConnections              = 256
	DefaultMaxUnauthenticated          = 512
	DefaultMaxUnauthenticatedPerSource = 128
	DefaultUnauthenticatedTimeout      = 10 * time.Second
)

func (l ConnectionLimits) withDefaults() ConnectionLimits {
	if l.MaxConnections <= 0 {
		l.MaxConnections = DefaultMaxConnections
	}
	if l.MaxUnauthenticated <= 0 {
		l.MaxUnauthenticated = DefaultMaxUnauthenticated
	}
	if l.MaxUnauthenticatedPerSource <= 0 {
		l.MaxUnauthenticatedPerSource = DefaultMaxUnauthenticatedPerSource
	}
	if l.UnauthenticatedTimeout <= 0 {
		l.UnauthenticatedTimeout = DefaultUnauthenticatedTimeout
	}
	return l
}

// SetConnectionLimits sets the limits Serve applies; call it before Serve.
func (s *Server) SetConnectionLimits(l ConnectionLimits) { s.conns = newConnections(s, l) }

// connections is the state of the admin port's connections.
type connections struct {
	server        *Server
	limits        ConnectionLimits
	pool          *netserve.Unauthenticated
	mu            sync.Mutex // guards the fields below
	authenticated int
	idle          map[*adminConn]time.Time // authenticated, between requests: since when
}

func newConnections(s *Server, l ConnectionLimits) *connections {
	l = l.withDefaults()
	return &connections{
		server: s, limits: l, idle: map[*adminConn]time.Time{},
		pool: &netserve.Unauthenticated{Max: l.MaxUnauthenticated, MaxPerSource: l.MaxUnauthenticatedPerSource},
	}
}

// connState follows the authenticated connections between requests
// (http.Server's ConnState).
func (c *connections) connState(conn net.Conn, state http.ConnState) {
	if t, ok := conn.(*tls.Conn); ok {
		conn = t.NetConn()
	}
	ac, ok := conn.(*adminConn)
	if !ok {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if state == http.StateIdle && ac.counted {
		c.idle[ac] = time.Now()
	} else {
		delete(c.idle, ac)
	}
}

// oldestIdleLocked returns the authenticated connection idle the longest, or
// nil. c.mu is held.
func (c *connections) oldestIdleLocked() *adminConn {
	var oldest *adminConn
	var since time.Time
	for ac, t := range c.idle {
		if oldest == nil || t.Before(since) {
			oldest, since = ac, t
		}
	}
	return oldest
}

// Counts returns the admin port's connections: authenticated, and not
// (yet), for metrics and tests.
func (c *connections) Counts() (authenticated, unauthenticated int) {
	c.mu.Lock()
	authenticated = c.authenticated
	c.mu.Unlock()
	unauthenticated, _ = c.pool.Len("")
	return authenticated, unauthenticated
}

// AdminConnections returns the admin port's connections: authenticated,
// and not (yet).
func (s *Server) AdminConnections() (authenticated, unauthenticated int) {
	return s.conns.Counts()
}

// listener wraps the admin port's listener: every connection accepted
// enters the unauthenticated pool.
type connectionListener struct {
	net.Listener
	conns *connections
}

func (l *connectionListener) Accept() (net.Conn, error) {
	conn, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	c := &adminConn{Conn: conn, conns: l.conns}
	pending, evicted := l.conns.pool.Admit(netserve.Source(conn), func() { conn.Close() })
	c.pending = pending
	if evicted != "" {
		total, fromSource := l.conns.pool.Len(evicted)
		l.conns.server.logger.Warn("admin API: too many connections without a valid token; closed the oldest to admit a new one",
			logging.From("admin", evicted), "unauthenticated", total, "unauthenticated_from_there", fromSource,
			"max", l.conns.limits.MaxUnauthenticated, "max_per_source", l.conns.limits.MaxUnauthenticatedPerSource)
	}
	c.timer = time.AfterFunc(l.conns.limits.UnauthenticatedTimeout, c.expire)
	return c, nil
}

// adminConn is one connection of the admin port.
type adminConn struct {
	net.Conn
	conns *connections

	mu            sync.Mutex // guards the fields below
	pending       *netserve.Pending
	timer         *time.Timer
	authenticated bool // counted in connections.authenticated
	closed        bool
	counted       bool // authenticated; guarded by conns.mu (read by connState)
}

// expire closes a connection still unauthenticated after the timeout.
func (c *adminConn) expire() {
	c.mu.Lock()
	stillPending := !c.authenticated && !c.closed
	c.mu.Unlock()
	if stillPending {
		c.Conn.Close()
	}
}

// authenticate counts the connection as authenticated (a request on it
// carried a valid token). At the bound it closes the authenticated
// connection idle the longest to make room. It reports false if it
// cannot be: the authenticated connections are at their bound and none
// is idle, or the connection was closed to admit another.
func (c *adminConn) authenticate() bool {
	for range 2 {
		ok, victim := c.tryAuthenticate()
		if victim == nil {
			return ok
		}
		c.conns.server.logger.Info("admin API: authenticated connections at their bound; closed the one idle the longest to admit a new one",
			logging.From("admin", victim.RemoteAddr().String()), "max", c.conns.limits.MaxConnections)
		victim.Close()
	}
	ok, _ := c.tryAuthenticate()
	return ok
}

// tryAuthenticate authenticates c if there is room. At the bound it
// returns the connection to close to make room, if one is idle.
func (c *adminConn) tryAuthenticate() (ok bool, victim *adminConn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.authenticated {
		return true, nil
	}
	if c.closed || !c.pending.Leave() {
		return false, nil
	}
	c.timer.Stop()
	c.conns.mu.Lock()
	defer c.conns.mu.Unlock()
	if c.conns.authenticated >= c.conns.limits.MaxConnections {
		if victim = c.conns.oldestIdleLocked(); victim != nil {
			delete(c.conns.idle, victim) // closed by the caller, once
		}
		return false, victim
	}
	c.conns.authenticated++
	c.authenticated = true
	c.counted = true
	return true, nil
}

func (c *adminConn) Close() error {
	c.mu.Lock()
	if !c.closed {
		c.closed = true
		c.timer.Stop()
		c.pending.Leave()
		if c.authenticated {
			c.conns.mu.Lock()
			c.conns.authenticated--
			c.counted = false
			delete(c.conns.idle, c)
			c.conns.mu.Unlock()
		}
	}
	c.mu.Unlock()
	return c.Conn.Close()
}

type connContextKey struct{}

// connContext puts a request's connection in its context (http.Server's
// ConnContext).
func connContext(ctx context.Context, conn net.Conn) context.Context {
	if t, ok := conn.(*tls.Conn); ok {
		conn = t.NetConn()
	}
	if c, ok := conn.(*adminConn); ok {
		return context.WithValue(ctx, connContextKey{}, c)
	}
	return ctx
}

// authenticatedConnection counts the connection of r as authenticated.
// If it cannot be, it answers 503 and reports false.
func (s *Server) authenticatedConnection(w http.ResponseWriter, r *http.Request) bool {
	c, ok := r.Context().Value(connContextKey{}).(*adminConn)
	if !ok || c.authenticate() {
		return true
	}
	s.logger.Warn("admin API: too many connections with a valid token; request refused", logging.From("admin", r.RemoteAddr),
		"max", s.conns.limits.MaxConnections)
	w.Header().Set("Connection", "close")
	writeJSON(w, http.StatusServiceUnavailable, ErrorResponse{
		Error: fmt.Sprintf("this node serves at most %d admin connections with a token at once (herd server --admin-max-connections); try again", s.conns.limits.MaxConnections),
		Code:  "too_many_connections",
	})
	return false
}
