package nbd

import (
	"bufio"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/nbd/wire"
)

// dialFrom dials address from the loopback address source (any of
// 127.0.0.0/8 is this host's on Linux), as a client of another host.
func dialFrom(t testing.TB, source, address string) net.Conn {
	t.Helper()
	dialer := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(source)}, Timeout: testTimeout}
	conn, err := dialer.Dial("tcp", address)
	if err != nil {
		t.Fatalf("dial from %s: %v", source, err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// TestStrangersCannotTakeEverySlot: silent connections from many
// addresses, far more than every bound, do not keep out a client with a
// certificate: they wait in the unauthenticated pool, which closes its
// oldest to admit new ones, and do not count against MaxConnections.
// Before the pool, 4 addresses of 2 silent connections took both of
// MaxConnections and every later connection was closed at accept.
func TestStrangersCannotTakeEverySlot(t *testing.T) {
	pki := testCertificates(t)
	var logs logCapture
	server := startServer(t, newTestBackend(), withTLS(pki, true), logs.configure, func(s *Server) {
		s.MaxConnections = 2
		s.MaxConnectionsPerClient = 2
		s.MaxUnauthenticated = 6
		s.MaxUnauthenticatedPerSource = 3
	})
	// 4 addresses x 5 silent connections: each address recycles its own
	// 3 slots, and the pool of 6 closes the oldest of the largest.
	var silent []net.Conn
	for i := range 20 {
		silent = append(silent, dialFrom(t, fmt.Sprintf("127.0.0.%d", 2+i%4), server.address))
	}
	waitFor(t, "the pool to have closed the extra connections", func() bool {
		n, evicted := server.UnauthenticatedConnections()
		return n == 6 && evicted == 14
	})
	logs.waitForLine(t, "too many connections without a certificate; closed the oldest to admit a new one", "max=6", "max_per_source=3")
	if total, _ := server.admission.connections(""); total != 0 {
		t.Fatalf("%d connections counted against MaxConnections before any TLS handshake", total)
	}

	// Two clients with certificates get in, from an address of their own
	// and from one of the strangers'.
	alice, _, _ := connectTLS(t, server.address, "127.0.0.1", pki, "alice")
	bob, _, _ := connectTLS(t, server.address, "127.0.0.3", pki, "bob")
	// A third is over MaxConnections: refused after TLS, saying why.
	carol := dial(t, server.address)
	carol.greet(wire.FlagCFixedNewstyle | wire.FlagCNoZeroes)
	if err := carol.startTLS(pki.clientConfig(t, pki.ca, "carol")); err != nil {
		t.Fatal(err)
	}
	replies := carol.option(wire.OptGo, exportRequestData("disk"))
	if final(replies) != wire.RepErrPolicy || !strings.Contains(string(replies[0].data), "the server has 2 connections (MaxConnections)") {
		t.Fatalf("a client over MaxConnections: %#x %q", final(replies), replies[0].data)
	}
	carol.conn.Close()
	alice.disconnect()
	bob.disconnect()
	for _, conn := range silent {
		conn.Close()
	}
	waitFor(t, "the pool to empty", func() bool {
		n, _ := server.UnauthenticatedConnections()
		total, _ := server.admission.connections("")
		return n == 0 && total == 0
	})
}

// connectTLS connects from source with a certificate for name and opens
// "disk" with NBD_OPT_GO.
func connectTLS(t *testing.T, address, source string, pki *testPKI, name string) (*testClient, uint64, uint16) {
	t.Helper()
	conn := dialFrom(t, source, address)
	conn.SetDeadline(time.Now().Add(testTimeout))
	c := &testClient{t: t, conn: conn, reader: bufio.NewReader(conn), reads: make(map[uint64]uint32)}
	c.greet(wire.FlagCFixedNewstyle | wire.FlagCNoZeroes)
	if err := c.startTLS(pki.clientConfig(t, pki.ca, name)); err != nil {
		t.Fatalf("TLS handshake as %s from %s: %v", name, source, err)
	}
	if got := final(c.option(wire.OptGo, exportRequestData("disk"))); got != wire.RepAck {
		t.Fatalf("NBD_OPT_GO as %s from %s: %#x", name, source, got)
	}
	return c, 0, 0
}

// TestUnauthenticatedTimeout: a connection that has not finished its TLS
// handshake is closed after UnauthenticatedTimeout; once through, the rest
// of HandshakeTimeout is its own.
func TestUnauthenticatedTimeout(t *testing.T) {
	pki := testCertificates(t)
	server := startServer(t, newTestBackend(), withTLS(pki, true), func(s *Server) {
		s.UnauthenticatedTimeout = 300 * time.Millisecond
		s.HandshakeTimeout = 20 * time.Second
	})
	silent := dial(t, server.address)
	start := time.Now()
	silent.readFull(18)
	silent.expectClosed()
	if elapsed := time.Since(start); elapsed < 250*time.Millisecond || elapsed > 5*time.Second {
		t.Fatalf("a silent connection was closed after %v, want about 300ms", elapsed)
	}
	c := dial(t, server.address)
	c.greet(wire.FlagCFixedNewstyle | wire.FlagCNoZeroes)
	if err := c.startTLS(pki.clientConfig(t, pki.ca, "alice")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(600 * time.Millisecond) // past the unauthenticated deadline
	if got := final(c.option(wire.OptGo, exportRequestData("disk"))); got != wire.RepAck {
		t.Fatalf("NBD_OPT_GO after TLS, past the unauthenticated deadline: %#x", got)
	}
	c.disconnect()
	if server.unauthenticatedTimeout() != 300*time.Millisecond || (&Server{HandshakeTimeout: time.Second}).unauthenticatedTimeout() != time.Second ||
		(&Server{}).unauthenticatedTimeout() != 10*time.Second {
		t.Fatal("UnauthenticatedTimeout: 10 s by default, never above HandshakeTimeout")
	}
}
