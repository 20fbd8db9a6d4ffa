package peer

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"sync"
	"time"
)

// Listener accepts authenticated connections on the peer port and hands
// each to the sub-listener of the protocol it asked for.
type Listener struct {
	listener net.Listener
	key      []byte
	logger   *slog.Logger

	mu        sync.Mutex // guards protocols
	protocols map[Protocol]*SubListener

	closeOnce sync.Once
	closed    chan struct{}
}

// Listen opens the peer port.
func Listen(address string, key []byte, logger *slog.Logger) (*Listener, error) {
	l, err := net.Listen("tcp", address)
	if err != nil {
		return nil, err
	}
	pl := &Listener{listener: l, key: key, logger: logger, protocols: map[Protocol]*SubListener{}, closed: make(chan struct{})}
	go pl.acceptLoop()
	return pl, nil
}

// Addr is the listening address.
func (l *Listener) Addr() net.Addr { return l.listener.Addr() }

// Close stops accepting; sub-listeners return errors from Accept.
func (l *Listener) Close() error {
	l.closeOnce.Do(func() { close(l.closed) })
	return l.listener.Close()
}

// Protocol returns the net.Listener that receives authenticated
// connections for p. Call it before peers may connect.
func (l *Listener) Protocol(p Protocol) *SubListener {
	l.mu.Lock()
	defer l.mu.Unlock()
	s, ok := l.protocols[p]
	if !ok {
		s = &SubListener{parent: l, conns: make(chan net.Conn, 16), closed: make(chan struct{})}
		l.protocols[p] = s
	}
	return s
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
		go l.handshake(conn)
	}
}

func (l *Listener) handshake(conn net.Conn) {
	protocol, err := ServerHandshake(conn, l.key)
	if err != nil {
		l.logger.Warn("peer: refused connection", "from", conn.RemoteAddr().String(), "reason", err.Error())
		conn.Close()
		return
	}
	l.mu.Lock()
	sub, ok := l.protocols[protocol]
	l.mu.Unlock()
	if !ok {
		l.logger.Warn("peer: refused connection", "from", conn.RemoteAddr().String(), "reason", ErrUnknownProto.Error(), "protocol", protocol)
		conn.Close()
		return
	}
	select {
	case sub.conns <- conn:
	case <-l.closed:
		conn.Close()
	case <-sub.closed:
		conn.Close()
	}
}

// SubListener is a net.Listener for one protocol on the peer port.
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

// Dial connects to a peer and authenticates for protocol.
func Dial(ctx context.Context, address string, key []byte, protocol Protocol) (net.Conn, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", address)
	if err != nil {
		return nil, err
	}
	if tcp, ok := conn.(*net.TCPConn); ok {
		tcp.SetNoDelay(true)
	}
	if err := ClientHandshake(conn, key, protocol); err != nil {
		conn.Close()
		return nil, err
	}
	return conn, nil
}
