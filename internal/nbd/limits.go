package nbd

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"
)

// This file holds the bounds a Server keeps against clients that are
// hostile but may well be authenticated: how many connections in all and
// per client (admission), and a log that says once a second, not once per
// connection, that a bound bit (limitLog). The memory bound is the
// Server's shared bufpool.Budget, taken in transmission.go.

// Client keys name the client a connection counts against in
// MaxConnectionsPerClient. The prefixes keep a certificate named like an
// address from sharing its count.
const (
	clientKeyLocal     = "local"
	clientKeyAddress   = "ip:"
	clientKeyCertified = "tls:"
)

// addressClientKey is the client key of a connection before (or without)
// TLS: its remote IP address, or "local" for anything but TCP (a Unix
// socket, or a test's in-memory connection).
func addressClientKey(conn net.Conn) string {
	if address, ok := conn.RemoteAddr().(*net.TCPAddr); ok {
		return clientKeyAddress + address.IP.String()
	}
	return clientKeyLocal
}

// admission counts the connections of a Server: in all, and per client key.
type admission struct {
	mu      sync.Mutex // guards the fields below
	total   int
	clients map[string]int
}

// The log messages of a refused connection, one per limit (and so one
// rate limit each).
const (
	refusedServerFull = "nbd: connection refused: the server is at MaxConnections"
	refusedClientFull = "nbd: connection refused: the client is at MaxConnectionsPerClient"
)

// admit counts a new connection of the client named by key against both
// limits. It returns "" if admitted, else the log message of the limit
// and why.
func (a *admission) admit(s *Server, key string) (message, reason string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.total >= s.maxConnections() {
		return refusedServerFull, fmt.Sprintf("the server has %d connections (MaxConnections)", a.total)
	}
	if reason := a.admitClientLocked(s, key); reason != "" {
		return refusedClientFull, reason
	}
	a.total++
	return "", ""
}

func (a *admission) admitClientLocked(s *Server, key string) string {
	if a.clients == nil {
		a.clients = make(map[string]int)
	}
	if n := a.clients[key]; n >= s.maxConnectionsPerClient() {
		return fmt.Sprintf("client %s has %d connections (MaxConnectionsPerClient)", key, n)
	}
	a.clients[key]++
	return ""
}

// switchClient moves a connection from the client key from (if not
// empty) to the key to: after TLS, a connection counts against its
// certificate rather than its address. It returns why the new key was
// refused ("" if counted); a refused connection counts against no client.
func (a *admission) switchClient(s *Server, from, to string) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.releaseClientLocked(from)
	return a.admitClientLocked(s, to)
}

// release undoes admit (counted) and admitClient (key not empty).
func (a *admission) release(key string, counted bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if counted {
		a.total--
		if a.total < 0 {
			panic("nbd: more connections released than admitted")
		}
	}
	a.releaseClientLocked(key)
}

func (a *admission) releaseClientLocked(key string) {
	if key == "" {
		return
	}
	a.clients[key]--
	switch n := a.clients[key]; {
	case n == 0:
		delete(a.clients, key)
	case n < 0:
		panic(fmt.Sprintf("nbd: client %s released more connections than admitted", key))
	}
}

// connections returns the connections counted in all and for key, for
// tests.
func (a *admission) connections(key string) (total, client int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.total, a.clients[key]
}

// limitLogInterval is the least time between two log lines of one kind.
const limitLogInterval = time.Second

// limitLog rate-limits log lines by message: a limit that bites for many
// connections at once (a flood, a client whose every connection stalls)
// says so once a second, with the number of lines it did not write.
type limitLog struct {
	// now is the clock; nil means time.Now (tests set their own).
	now func() time.Time

	mu    sync.Mutex // guards kinds
	kinds map[string]*limitLogKind
}

type limitLogKind struct {
	last       time.Time
	suppressed int
}

// logLimited logs message with args at level, unless a line with the same
// message was logged less than limitLogInterval ago.
func (s *Server) logLimited(logger *slog.Logger, level slog.Level, message string, args ...any) {
	l := &s.limitLog
	now := time.Now
	if l.now != nil {
		now = l.now
	}
	at := now()
	l.mu.Lock()
	if l.kinds == nil {
		l.kinds = make(map[string]*limitLogKind)
	}
	kind := l.kinds[message]
	if kind == nil {
		kind = &limitLogKind{}
		l.kinds[message] = kind
	}
	if !kind.last.IsZero() && at.Sub(kind.last) < limitLogInterval {
		kind.suppressed++
		l.mu.Unlock()
		return
	}
	suppressed := kind.suppressed
	kind.last, kind.suppressed = at, 0
	l.mu.Unlock()
	if suppressed > 0 {
		args = append(args, "similar_lines_suppressed", suppressed)
	}
	logger.Log(context.Background(), level, message, args...)
}
