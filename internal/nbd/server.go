package nbd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Defaults for the Server's limits.
const (
	defaultMaxRequestsInFlight = 64
	defaultMaxBufferedBytes    = 64 << 20
	defaultHandshakeTimeout    = 30 * time.Second
	acceptRetryDelayMaximum    = time.Second
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
	// so idle half-open clients do not pile up. Zero means 30 s.
	HandshakeTimeout time.Duration

	initOnce sync.Once
	// forceContext is cancelled when a Shutdown's context expires: every
	// connection's context derives from it.
	forceContext context.Context
	forceCancel  context.CancelFunc

	nextConnectionID   atomic.Uint64
	buffersOutstanding atomic.Int64 // payload buffers taken and not returned, for tests

	// mu guards the fields below.
	mu           sync.Mutex
	listeners    map[net.Listener]struct{}
	connections  map[*connection]struct{}
	active       int  // Serve loops plus connections still running
	shuttingDown bool // set once by Shutdown; never cleared
	idle         chan struct{}
}

func (s *Server) init() {
	s.initOnce.Do(func() {
		s.forceContext, s.forceCancel = context.WithCancel(context.Background())
		s.listeners = make(map[net.Listener]struct{})
		s.connections = make(map[*connection]struct{})
		s.idle = make(chan struct{})
	})
}

func (s *Server) logger() *slog.Logger {
	if s.Logger != nil {
		return s.Logger
	}
	return slog.Default()
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
	return max(s.MaxBufferedBytes, maximumPayloadLength)
}

func (s *Server) handshakeTimeout() time.Duration {
	if s.HandshakeTimeout > 0 {
		return s.HandshakeTimeout
	}
	return defaultHandshakeTimeout
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
	s.init()
	s.mu.Lock()
	if s.shuttingDown {
		s.mu.Unlock()
		listener.Close()
		return ErrServerClosed
	}
	s.listeners[listener] = struct{}{}
	s.active++
	s.mu.Unlock()

	stop := context.AfterFunc(ctx, func() { s.beginShutdown() })
	err := s.acceptLoop(ctx, listener)
	stop()
	s.mu.Lock()
	delete(s.listeners, listener)
	s.mu.Unlock()
	listener.Close()
	s.release()

	if ctx.Err() != nil {
		// Also covers stop() winning the race against the AfterFunc.
		<-s.beginShutdown()
		return ctx.Err()
	}
	return err
}

func (s *Server) acceptLoop(ctx context.Context, listener net.Listener) error {
	var retryDelay time.Duration
	for {
		netConn, err := listener.Accept()
		if err != nil {
			if s.isShuttingDown() || ctx.Err() != nil {
				return ErrServerClosed
			}
			if !retryableAcceptError(err) {
				return fmt.Errorf("nbd: accept: %w", err)
			}
			// Running out of file descriptors is an operating error:
			// back off and keep serving the connections we have.
			retryDelay = min(max(2*retryDelay, 5*time.Millisecond), acceptRetryDelayMaximum)
			s.logger().Warn("nbd: accept failed; retrying", "error", err, "delay", retryDelay)
			timer := time.NewTimer(retryDelay)
			select {
			case <-timer.C:
			case <-ctx.Done():
				timer.Stop()
			case <-s.forceContext.Done():
				timer.Stop()
			}
			continue
		}
		retryDelay = 0
		s.startConnection(ctx, netConn)
	}
}

func retryableAcceptError(err error) bool {
	var netError net.Error
	if errors.As(err, &netError) && netError.Timeout() {
		return true
	}
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) ||
		errors.Is(err, syscall.ECONNABORTED) || errors.Is(err, syscall.ENOBUFS) || errors.Is(err, syscall.ENOMEM)
}

func (s *Server) startConnection(serveContext context.Context, netConn net.Conn) {
	c := newConnection(s, netConn)
	s.mu.Lock()
	if s.shuttingDown {
		s.mu.Unlock()
		netConn.Close()
		return
	}
	s.connections[c] = struct{}{}
	s.active++
	s.mu.Unlock()

	go func() {
		defer func() {
			s.mu.Lock()
			delete(s.connections, c)
			s.mu.Unlock()
			s.release()
		}()
		ctx, cancel := context.WithCancel(context.WithoutCancel(serveContext))
		stop := context.AfterFunc(s.forceContext, cancel)
		defer stop()
		defer cancel()
		c.serve(ctx)
	}()
}

// release records the end of a Serve loop or a connection.
func (s *Server) release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.active--
	if s.active < 0 {
		panic("nbd: server active count went negative")
	}
	if s.shuttingDown && s.active == 0 {
		close(s.idle)
	}
}

func (s *Server) isShuttingDown() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.shuttingDown
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
	s.forceCancel()
	s.mu.Lock()
	for c := range s.connections {
		c.netConn.Close()
	}
	s.mu.Unlock()
	<-idle
	return ctx.Err()
}

// beginShutdown starts a graceful shutdown (once) and returns a channel
// closed when every Serve loop and connection has ended.
func (s *Server) beginShutdown() <-chan struct{} {
	s.init()
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.shuttingDown {
		s.shuttingDown = true
		for listener := range s.listeners {
			listener.Close()
		}
		for c := range s.connections {
			c.interrupt()
		}
		if s.active == 0 {
			close(s.idle)
		}
	}
	return s.idle
}

// Close shuts the server down gracefully and waits for every connection to
// end; see Shutdown.
func (s *Server) Close() error {
	return s.Shutdown(context.Background())
}
