package nbd

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"sync"

	"github.com/herd-storage/herd/internal/logging"
	"github.com/herd-storage/herd/internal/netserve"
)

// This file holds the bounds a Server keeps against clients that are
// hostile but may well be authenticated: how many connections in all and
// per client (admission), and a log that says once per interval and
// address, not once per connection, that a bound bit (logLimited). The
// memory bound is the Server's shared bufpool.Budget, taken in
// transmission.go; the pool of connections not authenticated yet is in
// unauthenticated.go.

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

// logPort names the NBD servers in refusal lines (internal/logging).
const logPort = "nbd"

// logLimited logs message with args at level on the connection's logger
// as a refusal line of its remote address: bounded (internal/logging:
// values cut, one line per address and message per interval with a count
// of the ones left out, a burst per port), so that a limit that bites for
// many connections at once (a flood, a client whose every connection
// stalls), or a refusal a client repeats as fast as it can, says so
// without filling the log.
func (c *connection) logLimited(level slog.Level, message string, args ...any) {
	c.logger.Log(context.Background(), level, message, append([]any{logging.Refusal(logPort, netserve.Source(c.netConn))}, args...)...)
}
