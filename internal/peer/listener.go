package peer

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/herd-storage/herd/internal/logging"
	"github.com/herd-storage/herd/internal/netserve"
	"github.com/herd-storage/herd/internal/tlsbatch"
)

// LogPort names the peer port in refusal lines: they are bounded
// (internal/logging: values cut, one line per source address and reason
// per interval, a burst per port), so that a scanner or a misconfigured
// node hammering the port does not flood the log; the next line of a
// source and reason counts the refusals left out.
const LogPort = "peer"

// The pool of the peer port's connections that have not authenticated
// yet (netserve.Unauthenticated): in the TLS handshake or the greeting,
// or asking to join (a join keeps its slot until it is answered). Anyone
// who reaches the port can open them; when the pool is full the oldest
// of the busiest source is closed to admit a newcomer, so strangers
// holding connections do not keep members, whose handshakes take
// milliseconds, out. A member's connections leave the pool once its
// greeting is accepted.
var (
	maxUnauthenticated          = 128
	maxUnauthenticatedPerSource = 16
)

// Listener accepts authenticated connections on the peer port and hands
// each to the sub-listener of the protocol it asked for; join requests go
// to the join handler (SetJoinHandler).
type Listener struct {
	listener  net.Listener
	creds     *Credentials
	tlsConfig *tls.Config
	logger    *slog.Logger
	// strangers is the pool of connections not authenticated yet.
	strangers *netserve.Unauthenticated

	mu        sync.Mutex // guards protocols and join
	protocols map[Protocol]*SubListener
	join      JoinHandler

	closeOnce sync.Once
	closed    chan struct{}
	ctx       context.Context // cancelled by Close: ends join handlers
	cancel    context.CancelFunc
}

// Listen opens the peer port, serving as the node creds names, without
// admitting joining nodes (SetJoinHandler; ListenJoin).
func Listen(address string, creds *Credentials, logger *slog.Logger) (*Listener, error) {
	return ListenJoin(address, creds, logger, nil)
}

// ListenJoin is Listen admitting joining nodes through join from the
// start. A node's port exists before its cluster does: its join handler
// asks joining nodes to come again (ErrJoinNotReady) until the cluster
// it needs has started.
func ListenJoin(address string, creds *Credentials, logger *slog.Logger, join JoinHandler) (*Listener, error) {
	if err := creds.check(); err != nil {
		return nil, err
	}
	l, err := net.Listen("tcp", address)
	if err != nil {
		return nil, err
	}
	pl := &Listener{
		listener:  l,
		creds:     creds,
		tlsConfig: creds.serverConfig(),
		logger:    logging.WithBounds(logger),
		strangers: &netserve.Unauthenticated{Max: maxUnauthenticated, MaxPerSource: maxUnauthenticatedPerSource},
		protocols: map[Protocol]*SubListener{},
		join:      join,
		closed:    make(chan struct{}),
	}
	pl.ctx, pl.cancel = context.WithCancel(context.Background())
	go pl.acceptLoop()
	return pl, nil
}

// Addr is the listening address.
func (l *Listener) Addr() net.Addr { return l.listener.Addr() }

// Close stops accepting; sub-listeners return errors from Accept, and
// join handlers running see their context cancelled.
func (l *Listener) Close() error {
	l.closeOnce.Do(func() {
		close(l.closed)
		l.cancel()
	})
	return l.listener.Close()
}

// Protocol returns the net.Listener that receives authenticated
// connections for p. Call it before peers may connect. ProtocolJoin is not
// served this way (see SetJoinHandler).
func (l *Listener) Protocol(p Protocol) *SubListener {
	if p == ProtocolJoin {
		panic("peer: ProtocolJoin is served by SetJoinHandler, not a sub-listener")
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	s, ok := l.protocols[p]
	if !ok {
		s = &SubListener{parent: l, conns: make(chan net.Conn, 16), closed: make(chan struct{})}
		l.protocols[p] = s
	}
	return s
}

// offered reports whether the port serves p now: a sub-listener for it
// exists and is open, or, for ProtocolJoin, a join handler is set.
func (l *Listener) offered(p Protocol) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if p == ProtocolJoin {
		return l.join != nil
	}
	sub, ok := l.protocols[p]
	if !ok {
		return false
	}
	select {
	case <-sub.closed:
		return false
	default:
		return true
	}
}

func (l *Listener) acceptLoop() {
	for {
		conn, err := l.listener.Accept()
		if err != nil {
			select {
			case <-l.closed:
				return
			default:
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			l.logger.Error("peer: accept failed", "err", err)
			time.Sleep(50 * time.Millisecond) // avoid spinning on e.g. EMFILE
			continue
		}
		// Admitted to the pool here, before its goroutine runs: the
		// connections (and goroutines) strangers make the node hold
		// stay within the pool however fast they come.
		pending, evicted := l.strangers.Admit(netserve.Source(conn), func() { conn.Close() })
		if evicted != "" {
			total, fromSource := l.strangers.Len(evicted)
			l.logger.Warn("peer: too many connections not authenticated yet; closed the oldest to admit a new one",
				logging.From(LogPort, evicted), "unauthenticated", total, "unauthenticated_from_there", fromSource,
				"max", l.strangers.Max, "max_per_source", l.strangers.MaxPerSource)
		}
		go l.handshake(conn, pending)
	}
}

// handshake runs steps 1 to 3 of the connection (handshake.go) as the
// server, then hands the connection on; pending is its place in the pool
// of connections not authenticated yet, which it leaves once its
// greeting is accepted (a join once it is answered).
func (l *Listener) handshake(raw net.Conn, pending *netserve.Pending) {
	defer pending.Leave()
	raw.SetDeadline(time.Now().Add(HandshakeTimeout))
	conn := tls.Server(tlsbatch.Wrap(raw), l.tlsConfig)
	if err := conn.Handshake(); err != nil {
		if !pending.Evicted() {
			l.refused(raw.RemoteAddr(), "TLS handshake failed", err)
		}
		raw.Close()
		return
	}
	identity := identify(conn.ConnectionState())
	allowed := func(node, serial string) error { return l.creds.allow(node, serial, identity.ca) }
	protocol, err := admit(conn, identity, allowed, l.offered)
	if err != nil && pending.Evicted() {
		conn.Close()
		return
	}
	if err != nil {
		var attrs []any
		if identity.node != "" {
			attrs = append(attrs, "node", identity.node)
		}
		l.refused(raw.RemoteAddr(), "greeting refused", err, attrs...)
		conn.Close()
		return
	}
	raw.SetDeadline(time.Time{})
	if protocol == ProtocolJoin {
		l.serveJoin(conn) // in the pool until answered
		return
	}
	if !pending.Leave() {
		conn.Close() // closed to admit another meanwhile
		return
	}
	l.mu.Lock()
	sub := l.protocols[protocol] // present: admit checked offered
	l.mu.Unlock()
	select {
	case sub.conns <- conn:
	case <-l.closed:
		conn.Close()
	case <-sub.closed:
		conn.Close()
	}
}

// refused logs a refused connection at Warn, bounded.
func (l *Listener) refused(remote net.Addr, what string, err error, attrs ...any) {
	attrs = append([]any{logging.From(LogPort, remote), "reason", err.Error()}, attrs...)
	l.logger.Warn("peer: refused connection: "+what, attrs...)
}

// SubListener is a net.Listener for one protocol on the peer port. Its
// connections are *tls.Conn whose handshake is done (RemoteNode names the
// node).
type SubListener struct {
	parent    *Listener
	conns     chan net.Conn
	closeOnce sync.Once
	closed    chan struct{}
}

// Accept implements net.Listener.
func (s *SubListener) Accept() (net.Conn, error) {
	select {
	case c := <-s.conns:
		return c, nil
	case <-s.parent.closed:
		return nil, ErrListenerClose
	case <-s.closed:
		return nil, ErrListenerClose
	}
}

// Close implements net.Listener: Accept returns and later connections for
// this protocol are refused. The shared port is closed by its owner.
func (s *SubListener) Close() error {
	s.closeOnce.Do(func() { close(s.closed) })
	return nil
}

// Addr implements net.Listener.
func (s *SubListener) Addr() net.Addr { return s.parent.Addr() }

// Dial connects to the peer at address as the node creds names, verifies
// that it is a herd node of creds' CA that creds.Allowed accepts, and asks
// for protocol. The connection returned is a *tls.Conn.
func Dial(ctx context.Context, address string, creds *Credentials, protocol Protocol) (net.Conn, error) {
	if err := creds.check(); err != nil {
		return nil, err
	}
	raw, err := dialTCP(ctx, address)
	if err != nil {
		return nil, err
	}
	return clientHandshake(ctx, withTestDelay(raw, address), creds.clientConfig(), protocol)
}

func dialTCP(ctx context.Context, address string) (net.Conn, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", address)
	if err != nil {
		return nil, err
	}
	if tcp, ok := conn.(*net.TCPConn); ok {
		tcp.SetNoDelay(true) // Go's default; the protocols rely on it
	}
	return conn, nil
}
