package nbd

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/herd-storage/herd/internal/bufpool"
	"github.com/herd-storage/herd/internal/logging"
	"github.com/herd-storage/herd/internal/nbd/wire"
	"github.com/herd-storage/herd/internal/netserve"
)

// Defaults for the Server's limits.
const (
	defaultMaxRequestsInFlight     = 64
	defaultMaxBufferedBytes        = 64 << 20
	defaultHandshakeTimeout        = 30 * time.Second
	defaultMemoryBudget            = 256 << 20
	defaultReplyTimeout            = 30 * time.Second
	defaultMaxConnections          = 1024
	defaultMaxConnectionsPerClient = 64
	// defaultMaxOptions leaves room for nbdinfo --list, which sends one
	// NBD_OPT_INFO per export after the NBD_OPT_LIST.
	defaultMaxOptions = 1024
)

// Server serves NBD clients on any number of listeners. Set its exported
// fields before the first call to Serve and do not change them afterwards; the
// zero value of every field but Backend is a usable default.
type Server struct {
	// Backend resolves export names. Required.
	Backend Backend
	// Logger receives connection events; nil means slog.Default().
	Logger *slog.Logger
	// MaxRequestsInFlight bounds the requests of one connection being
	// served at once; the connection stops reading requests while at the
	// bound. Zero means 64.
	MaxRequestsInFlight int
	// MaxBufferedBytes bounds the payload bytes (WRITE data received, READ
	// data being gathered) one connection holds. It is raised to at least
	// the 32 MiB maximum payload. Zero means 64 MiB.
	MaxBufferedBytes int64
	// HandshakeTimeout bounds the whole option haggling of a connection,
	// the TLS handshake included, so idle half-open clients do not pile
	// up. Zero means 30 s.
	HandshakeTimeout time.Duration

	// TLSConfig, when set, makes the server accept NBD_OPT_STARTTLS: it
	// replies NBD_REP_ACK, runs a TLS server handshake with this
	// configuration and goes on haggling over TLS (spec, "TLS support").
	// To know its clients the configuration should set ClientAuth to
	// tls.RequireAndVerifyClientCert and ClientCAs: Session.Client is the
	// verified certificate's CommonName. Nil: NBD_OPT_STARTTLS is refused
	// with NBD_REP_ERR_POLICY (spec, "NOTLS mode").
	TLSConfig *tls.Config
	// RequireTLS, with TLSConfig, is the spec's FORCEDTLS mode: before
	// TLS, every option but NBD_OPT_STARTTLS and NBD_OPT_ABORT is refused
	// with NBD_REP_ERR_TLS_REQD, NBD_OPT_EXPORT_NAME closes the
	// connection, and a client without NBD_FLAG_C_FIXED_NEWSTYLE (which
	// cannot use TLS) is dropped. Serve fails if it is set without
	// TLSConfig.
	RequireTLS bool

	// MemoryBudget bounds the payload bytes (WRITE data received, READ
	// data being gathered and sent) held by all the connections of this
	// Server together, so that many connections that send requests and
	// never read the replies cannot grow the node's memory without
	// bound. A connection waiting for room stops reading requests. It is
	// raised to at least the 32 MiB maximum payload. Zero means 256 MiB.
	MemoryBudget int64
	// Memory, when set, is the budget to use instead of one of
	// MemoryBudget bytes: Servers that share it (the TCP port and the
	// local socket) share one bound.
	Memory *bufpool.Budget
	// MemoryPerClient bounds the payload bytes of one client (one
	// certificate, one remote IP, or the local socket) within the
	// budget, so that one client's stalled connections cannot take all
	// of it. Zero means a quarter of the budget, and never less than
	// the 32 MiB maximum payload.
	MemoryPerClient int64
	// ReplyTimeout is the write deadline of every reply in the
	// transmission phase: a client that does not read its replies for
	// this long is disconnected, and the memory its replies held is
	// freed. Zero means 30 s.
	ReplyTimeout time.Duration
	// MaxConnections bounds the connections served at once; a connection
	// beyond it is closed right after accept or, with RequireTLS, refused
	// once its TLS handshake is done (every option but NBD_OPT_ABORT gets
	// NBD_REP_ERR_POLICY saying why). With RequireTLS, connections not yet
	// through their TLS handshake are not counted here but in a pool of
	// their own (MaxUnauthenticated). Zero means 1024.
	MaxConnections int
	// MaxConnectionsPerClient bounds the connections of one client: its
	// certificate's CommonName once TLS is up, before that (or without
	// TLS) its IP address, or "local" for a Unix socket. A connection
	// beyond it is closed right after accept when the address is over
	// the limit; when the certificate is (known only after the TLS
	// handshake), every later option but NBD_OPT_ABORT is refused with
	// NBD_REP_ERR_POLICY and a message saying why, and
	// NBD_OPT_EXPORT_NAME closes the connection. Zero means 64.
	MaxConnectionsPerClient int
	// MaxOptions bounds the options of one handshake; the connection
	// ends when a client sends more. Zero means 1024.
	MaxOptions int
	// MaxUnauthenticated and MaxUnauthenticatedPerSource bound, with
	// RequireTLS, the connections whose TLS handshake has not verified a
	// client certificate yet, in all and per remote IP address. They are
	// not refused when the pool is full: the oldest one is closed to
	// admit the new one (netserve.Unauthenticated says which), so that
	// strangers holding connections never keep a client with a
	// certificate out. Zero means 512 and 64.
	MaxUnauthenticated          int
	MaxUnauthenticatedPerSource int
	// UnauthenticatedTimeout bounds, with RequireTLS, the time from
	// accept to the end of a successful TLS handshake; the rest of the
	// handshake has the rest of HandshakeTimeout. Zero means 10 s (and
	// never more than HandshakeTimeout).
	UnauthenticatedTimeout time.Duration

	initOnce sync.Once
	// forceContext is cancelled when a Shutdown's context expires: every
	// connection's context derives from it.
	forceContext context.Context
	forceCancel  context.CancelFunc

	// memory is the budget of MemoryBudget bytes all connections share.
	memory *bufpool.Budget
	// clientBudgets (guarded by clientMemoryMu) holds each connected
	// client's share of memory, by client key.
	clientMemoryMu sync.Mutex
	clientBudgets  map[string]*clientBudget

	nextConnectionID   atomic.Uint64
	buffersOutstanding atomic.Int64 // payload buffers taken and not returned, for tests
	replyWrites        atomic.Int64 // vectored writes of replies (replies.go), for tests
	// bufferBytesOutstanding and bufferBytesPeak count the bytes of
	// those buffers, for tests of MemoryBudget.
	bufferBytesOutstanding atomic.Int64
	bufferBytesPeak        atomic.Int64

	// admission counts connections against MaxConnections and
	// MaxConnectionsPerClient.
	admission admission
	// unauthenticated is the pool of connections not through TLS yet.
	unauthenticatedOnce sync.Once
	unauthenticated     *netserve.Unauthenticated
	// boundedLogger is Logger, its refusal lines bounded (logger).
	loggerOnce    sync.Once
	boundedLogger *slog.Logger

	// tracker holds the listeners being served and the connections
	// running; it is closed once, by the first Shutdown, and never
	// reopened.
	tracker netserve.Tracker[*connection]
}

func (s *Server) init() {
	s.initOnce.Do(func() {
		s.forceContext, s.forceCancel = context.WithCancel(context.Background())
		s.memory = s.Memory
		if s.memory == nil {
			s.memory = bufpool.NewBudget(s.memoryBudget())
		}
	})
}

func (s *Server) memoryPerClient() int64 {
	if s.MemoryPerClient > 0 {
		return max(s.MemoryPerClient, wire.MaximumPayloadLength)
	}
	return max(s.memoryBudget()/4, wire.MaximumPayloadLength)
}

// clientMemory returns the budget of the client named by key, shared by
// its connections; call releaseClientMemory once per call when the
// connection's transmission ends.
func (s *Server) clientMemory(key string) *bufpool.Budget {
	s.clientMemoryMu.Lock()
	defer s.clientMemoryMu.Unlock()
	if s.clientBudgets == nil {
		s.clientBudgets = map[string]*clientBudget{}
	}
	b, ok := s.clientBudgets[key]
	if !ok {
		b = &clientBudget{budget: bufpool.NewBudget(s.memoryPerClient())}
		s.clientBudgets[key] = b
	}
	b.users++
	return b.budget
}

func (s *Server) releaseClientMemory(key string) {
	s.clientMemoryMu.Lock()
	defer s.clientMemoryMu.Unlock()
	if b, ok := s.clientBudgets[key]; ok {
		if b.users--; b.users == 0 {
			delete(s.clientBudgets, key)
		}
	}
}

// clientBudget is one client's share of the memory budget.
type clientBudget struct {
	budget *bufpool.Budget
	users  int // transmissions using it
}

// logger is Logger (or slog.Default()) with its refusal lines bounded
// (internal/logging), which herd's own logger does already.
func (s *Server) logger() *slog.Logger {
	s.loggerOnce.Do(func() {
		logger := s.Logger
		if logger == nil {
			logger = slog.Default()
		}
		s.boundedLogger = logging.WithBounds(logger)
	})
	return s.boundedLogger
}

func (s *Server) maxRequestsInFlight() int {
	if s.MaxRequestsInFlight > 0 {
		return s.MaxRequestsInFlight
	}
	return defaultMaxRequestsInFlight
}

func (s *Server) maxBufferedBytes() int64 {
	if s.MaxBufferedBytes <= 0 {
		return defaultMaxBufferedBytes
	}
	return max(s.MaxBufferedBytes, wire.MaximumPayloadLength)
}

func (s *Server) handshakeTimeout() time.Duration {
	if s.HandshakeTimeout > 0 {
		return s.HandshakeTimeout
	}
	return defaultHandshakeTimeout
}

func (s *Server) memoryBudget() int64 {
	if s.MemoryBudget <= 0 {
		return defaultMemoryBudget
	}
	return max(s.MemoryBudget, wire.MaximumPayloadLength)
}

func (s *Server) replyTimeout() time.Duration {
	if s.ReplyTimeout > 0 {
		return s.ReplyTimeout
	}
	return defaultReplyTimeout
}

func (s *Server) maxConnections() int {
	if s.MaxConnections > 0 {
		return s.MaxConnections
	}
	return defaultMaxConnections
}

func (s *Server) maxConnectionsPerClient() int {
	if s.MaxConnectionsPerClient > 0 {
		return s.MaxConnectionsPerClient
	}
	return defaultMaxConnectionsPerClient
}

func (s *Server) maxOptions() int {
	if s.MaxOptions > 0 {
		return s.MaxOptions
	}
	return defaultMaxOptions
}

// memoryBudgetShared returns the node-wide budget (made on first use, as
// tests may serve a connection without Serve).
func (s *Server) memoryBudgetShared() *bufpool.Budget {
	s.init()
	return s.memory
}

// Serve accepts connections on listener and serves each on its own
// goroutines until the server is shut down, the listener fails, or ctx is
// cancelled. Cancelling ctx shuts the whole server down like Close, and Serve
// then returns ctx.Err() once every connection has ended. After Close or
// Shutdown, Serve returns ErrServerClosed. Serve closes listener.
//
// Values of ctx are visible to the Backend through the contexts it is called
// with; its cancellation is not (in-flight requests are allowed to finish).
func (s *Server) Serve(ctx context.Context, listener net.Listener) error {
	if s.Backend == nil {
		return errors.New("nbd: Server.Backend is nil")
	}
	if s.RequireTLS && s.TLSConfig == nil {
		return errors.New("nbd: Server.RequireTLS is set without a TLSConfig")
	}
	s.init()
	stop := context.AfterFunc(ctx, func() { s.beginShutdown() })
	err := s.tracker.Accept(listener, s.logger(), "nbd: accept failed; retrying", func(netConn net.Conn) {
		s.startConnection(ctx, netConn)
	})
	stop()
	listener.Close()

	if ctx.Err() != nil {
		// Also covers stop() winning the race against the AfterFunc.
		<-s.beginShutdown()
		return ctx.Err()
	}
	if errors.Is(err, netserve.ErrStopped) {
		return ErrServerClosed
	}
	return fmt.Errorf("nbd: accept: %w", err)
}

func (s *Server) startConnection(serveContext context.Context, netConn net.Conn) {
	var c *connection
	if s.authenticates() {
		// Not authenticated yet: into the pool of such connections,
		// which closes its oldest rather than refuse (unauthenticated.go).
		c = newConnection(s, netConn)
		s.admitUnauthenticated(c)
	} else {
		// Refuse before anything is sent or allocated: a flood of
		// connections costs one accept and one close each.
		key := addressClientKey(netConn)
		if message, reason := s.admission.admit(s, key); message != "" {
			s.logger().Warn(message, logging.From(logPort, netConn.RemoteAddr()), "reason", reason)
			netConn.Close()
			return
		}
		c = newConnection(s, netConn)
		c.admitted, c.clientKey = true, key
	}
	if !s.tracker.Add(c) {
		s.admission.release(c.clientKey, c.admitted)
		c.leaveUnauthenticated()
		netConn.Close()
		return
	}
	go func() {
		defer s.tracker.Remove(c)
		ctx, cancel := context.WithCancel(context.WithoutCancel(serveContext))
		stop := context.AfterFunc(s.forceContext, cancel)
		defer stop()
		defer cancel()
		c.serve(ctx)
	}()
}

// Revalidate asks the Backend (if it is a Revalidator) whether each
// connection may keep the export it opened, or may still open the one it
// is opening (a Backend's Open may wait, for a lock say), and ends at once
// those that may not: their requests in flight are cancelled, the
// requests they sent are not served, an open under way is refused when
// it completes, and the client sees the connection close. It returns how
// many it ended. Herd's server calls it when the cluster's client
// records or tokens change, so that revoking a client cuts its
// connections too. A connection that becomes active while it runs asks
// the Backend itself once active (connection.serve), so none is missed.
func (s *Server) Revalidate() int {
	revalidator, ok := s.Backend.(Revalidator)
	if !ok {
		return 0
	}
	var connections []*connection
	s.tracker.Each(func(c *connection) {
		if c.active.Load() != nil || c.opening.Load() != nil {
			connections = append(connections, c)
		}
	})
	refused := 0
	for _, c := range connections { // outside the tracker's lock: the Backend may wait
		if c.revoked.Load() {
			continue
		}
		if t := c.active.Load(); t != nil {
			if err := s.revalidate(c, t); err != nil {
				c.refuse(c.session, t.exportName, err)
				refused++
			}
			continue
		}
		// An open under way: may the client still open this export?
		// Whether it will be writable is not known yet; the check once
		// it is active asks that.
		if p := c.opening.Load(); p != nil {
			if err := revalidator.Revalidate(p.session, p.export, false); err != nil {
				c.refuse(p.session, p.export, err)
				refused++
			}
		}
	}
	return refused
}

// revalidate asks the Backend whether c may keep t's export (nil if the
// Backend is no Revalidator).
func (s *Server) revalidate(c *connection, t *transmission) error {
	revalidator, ok := s.Backend.(Revalidator)
	if !ok {
		return nil
	}
	return revalidator.Revalidate(c.session, t.exportName, t.flags&wire.FlagReadOnly == 0)
}

// Connections is the number of connections open now.
func (s *Server) Connections() int {
	n := 0
	s.tracker.Each(func(*connection) { n++ })
	return n
}

func (s *Server) isShuttingDown() bool {
	return s.tracker.Closed()
}

// Shutdown stops the server gracefully: it closes the listeners, stops every
// connection from reading further requests, lets the requests in flight
// finish and their replies be sent, then closes the connections (spec,
// "Terminating the transmission phase": "the server SHOULD wait for inflight
// requests to be serviced prior to initiating a hard disconnect").
// Connections still negotiating are closed at once. If ctx expires first, the
// contexts of the requests in flight are cancelled and every connection is
// closed; Shutdown then returns ctx.Err() once the Backend calls have
// returned.
func (s *Server) Shutdown(ctx context.Context) error {
	idle := s.beginShutdown()
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
	}
	// Close the connections before cancelling the requests, so that a
	// request ended by the cancellation finds its connection closed and
	// sends nothing, rather than racing the close with an error reply.
	s.tracker.Each(func(c *connection) { c.netConn.Close() })
	s.forceCancel()
	<-idle
	return ctx.Err()
}

// beginShutdown starts a graceful shutdown (once) and returns a channel
// closed when every Serve loop and connection has ended.
func (s *Server) beginShutdown() <-chan struct{} {
	s.init()
	return s.tracker.Close(func(c *connection) { c.interrupt() })
}

// Close shuts the server down gracefully and waits for every connection to
// end; see Shutdown.
func (s *Server) Close() error {
	return s.Shutdown(context.Background())
}
