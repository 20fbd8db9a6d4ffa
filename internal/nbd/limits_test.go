package nbd

import (
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/logging"
	"github.com/herd-storage/herd/internal/nbd/wire"
)

// Tests of the bounds against clients that are hostile but may be
// authenticated: memory shared by all connections, reply timeout,
// connections in all and per client, options per handshake.

// TestMemoryBudgetSharedAcrossConnections: connections that send READs and
// never read the replies hold, all together, at most MemoryBudget bytes of
// buffers (each alone could hold twice that: the per-connection bound is
// 64 MiB), and are disconnected once a reply waits longer than
// ReplyTimeout, which frees everything they held.
func TestMemoryBudgetSharedAcrossConnections(t *testing.T) {
	const (
		connections     = 6
		readsEach       = 24
		readLength      = 1 << 20
		memoryBudget    = 32 << 20 // the smallest allowed: one maximum payload
		requestedMemory = connections * readsEach * readLength
	)
	disk := newMemoryDisk("disk", 64<<20)
	var logs logCapture
	server := startServer(t, newMemoryBackend(disk), logs.configure, func(s *Server) {
		s.MemoryBudget = memoryBudget
		s.ReplyTimeout = 300 * time.Millisecond
	})
	var clients []*testClient
	for range connections {
		c, _, _ := connect(t, server.address, "disk", connectOptions{})
		// A small receive buffer, so that the kernel holds little of
		// what the server sends and the server's buffers stay full.
		c.conn.(*net.TCPConn).SetReadBuffer(4096)
		clients = append(clients, c)
	}
	var sending sync.WaitGroup
	for _, c := range clients {
		sending.Add(1)
		go func() {
			defer sending.Done()
			for i := range readsEach {
				header := clientRequest(0, wire.CmdRead, uint64(i), uint64(i)*readLength, readLength, nil)
				if _, err := c.conn.Write(header); err != nil {
					return // disconnected already
				}
			}
		}()
	}
	sending.Wait()

	// Every connection ends: its replies are not read.
	waitFor(t, "every connection to be dropped", func() bool {
		return disk.closes.Load() == connections
	})
	if n := server.buffersOutstanding.Load(); n != 0 {
		t.Fatalf("%d buffers held after every connection ended", n)
	}
	if used := server.memoryBudgetShared().InUse(); used != 0 {
		t.Fatalf("%d bytes of memory budget held after every connection ended", used)
	}
	peak := server.bufferBytesPeak.Load()
	t.Logf("peak buffered: %d MiB of %d MiB requested, budget %d MiB", peak>>20, requestedMemory>>20, memoryBudget>>20)
	if peak > memoryBudget {
		t.Fatalf("%d bytes buffered at once, over the budget of %d", peak, memoryBudget)
	}
	logs.waitForLine(t, "memory budget exhausted")
	logs.waitForLine(t, "level=WARN", "did not read its replies within the reply timeout", "remote=127.0.0.1:", "reply_timeout=300ms")

	// The server serves the next client normally.
	c, _, _ := connect(t, server.address, "disk", connectOptions{})
	if r := c.roundTrip(0, wire.CmdRead, 0, readLength, nil); r.errno != wire.NoError || len(r.data) != readLength {
		t.Fatalf("read after the budget was freed: %v", r)
	}
	c.disconnect()
}

// expectRefusedAtAccept checks that a connection is closed before the
// server sends its greeting.
func expectRefusedAtAccept(t *testing.T, address string) {
	t.Helper()
	c := dial(t, address)
	c.expectClosed()
}

func TestMaxConnections(t *testing.T) {
	var logs logCapture
	server := startServer(t, newTestBackend(), logs.configure, func(s *Server) { s.MaxConnections = 2 })
	first := dial(t, server.address)
	first.greet(wire.FlagCFixedNewstyle)
	second, _, _ := connect(t, server.address, "disk", connectOptions{})
	expectRefusedAtAccept(t, server.address)
	logs.waitForLine(t, "connection refused", "the server has 2 connections (MaxConnections)")

	// A connection that ends makes room.
	first.option(wire.OptAbort, nil)
	first.expectClosed()
	waitFor(t, "the ended connection to be released", func() bool {
		total, _ := server.admission.connections("")
		return total == 1
	})
	third, _, _ := connect(t, server.address, "disk", connectOptions{})
	third.disconnect()
	second.disconnect()
}

func TestMaxConnectionsPerClientByAddress(t *testing.T) {
	var logs logCapture
	server := startServer(t, newTestBackend(), logs.configure, func(s *Server) { s.MaxConnectionsPerClient = 2 })
	a, _, _ := connect(t, server.address, "disk", connectOptions{})
	b, _, _ := connect(t, server.address, "disk", connectOptions{})
	expectRefusedAtAccept(t, server.address)
	logs.waitForLine(t, "connection refused", "client ip:127.0.0.1 has 2 connections (MaxConnectionsPerClient)")
	a.disconnect()
	waitFor(t, "the ended connection to be released", func() bool {
		_, client := server.admission.connections("ip:127.0.0.1")
		return client == 1
	})
	c, _, _ := connect(t, server.address, "disk", connectOptions{})
	c.disconnect()
	b.disconnect()
}

// TestMaxConnectionsPerClientByCertificate: after TLS a connection counts
// against its certificate's name, not its address; one over the limit is
// refused with an option reply that says why.
func TestMaxConnectionsPerClientByCertificate(t *testing.T) {
	pki := testCertificates(t)
	var logs logCapture
	server := startServer(t, newTestBackend(), withTLS(pki, true), logs.configure, func(s *Server) { s.MaxConnectionsPerClient = 2 })
	connectAs := func(name string) *testClient {
		c := dial(t, server.address)
		c.greet(wire.FlagCFixedNewstyle | wire.FlagCNoZeroes)
		if err := c.startTLS(pki.clientConfig(t, pki.ca, name)); err != nil {
			t.Fatalf("TLS handshake as %s: %v", name, err)
		}
		return c
	}
	var alices []*testClient
	for range 2 {
		c := connectAs("alice")
		if got := final(c.option(wire.OptGo, exportRequestData("disk"))); got != wire.RepAck {
			t.Fatalf("NBD_OPT_GO as alice: %#x", got)
		}
		alices = append(alices, c)
	}
	// Three connections from one address: the address is not the
	// client any more once TLS is up.
	refused := connectAs("alice")
	replies := refused.option(wire.OptGo, exportRequestData("disk"))
	if final(replies) != wire.RepErrPolicy || !strings.Contains(string(replies[0].data), "client tls:alice has 2 connections (MaxConnectionsPerClient)") {
		t.Fatalf("third connection of alice: reply %#x %q, want NBD_REP_ERR_POLICY naming the limit", final(replies), replies[0].data)
	}
	if got := final(refused.option(wire.OptList, nil)); got != wire.RepErrPolicy {
		t.Fatalf("NBD_OPT_LIST of a refused connection: %#x", got)
	}
	logs.waitForLine(t, "connection refused", "client tls:alice has 2 connections")
	refused.sendOption(wire.OptExportName, []byte("disk"))
	refused.expectClosed()

	bob := connectAs("bob")
	if got := final(bob.option(wire.OptGo, exportRequestData("disk"))); got != wire.RepAck {
		t.Fatalf("NBD_OPT_GO as bob: %#x", got)
	}
	bob.disconnect()
	for _, c := range alices {
		c.disconnect()
	}
	waitFor(t, "every connection to be released", func() bool {
		total, _ := server.admission.connections("")
		return total == 0
	})
	if _, n := server.admission.connections("tls:alice"); n != 0 {
		t.Fatalf("alice still counted for %d connections", n)
	}
}

func TestMaxOptions(t *testing.T) {
	var logs logCapture
	server := startServer(t, newTestBackend(), logs.configure, func(s *Server) { s.MaxOptions = 5 })
	c := dial(t, server.address)
	c.greet(wire.FlagCFixedNewstyle)
	for i := range 5 {
		if got := final(c.option(wire.OptList, nil)); got != wire.RepAck {
			t.Fatalf("option %d: %#x", i+1, got)
		}
	}
	c.sendOption(wire.OptList, nil)
	c.expectClosed()
	logs.waitForLine(t, "level=WARN", "too many options in one handshake", "option 6 is beyond the limit of 5 (MaxOptions)")

	// The default leaves room for nbdinfo --list on many exports.
	if defaultMaxOptions < 1000 {
		t.Fatalf("default MaxOptions %d", defaultMaxOptions)
	}
}

// TestLogLimited: a limit that bites many times in an interval logs once
// per address (a bounded refusal line, internal/logging), then says how
// many lines it left out.
func TestLogLimited(t *testing.T) {
	var logs logCapture
	clock := time.Unix(1000, 0)
	server := &Server{Logger: slog.New(logging.Bounded(slog.NewTextHandler(&logs, nil), logging.BoundOptions{Now: func() time.Time { return clock }}))}
	from := func(address string) *connection {
		a, b := net.Pipe()
		t.Cleanup(func() { a.Close(); b.Close() })
		return newConnection(server, &addressConn{Conn: a, remote: &net.TCPAddr{IP: net.ParseIP(address), Port: 10000}})
	}
	first, second, other := from("10.0.0.1"), from("10.0.0.1"), from("10.0.0.2")
	for range 5 {
		first.logLimited(slog.LevelWarn, "nbd: some limit bit", "n", 1, "name", strings.Repeat("x", 4096))
		second.logLimited(slog.LevelWarn, "nbd: some limit bit", "n", 1)
		clock = clock.Add(logging.DefaultRefusalInterval / 20)
	}
	first.logLimited(slog.LevelWarn, "nbd: another limit bit")
	other.logLimited(slog.LevelWarn, "nbd: some limit bit")
	if got := strings.Count(logs.String(), "some limit bit"); got != 2 {
		t.Fatalf("%d lines of one kind from two addresses, want 2:\n%s", got, logs.String())
	}
	if got := strings.Count(logs.String(), "another limit bit"); got != 1 {
		t.Fatalf("%d lines of another kind, want 1:\n%s", got, logs.String())
	}
	if len(logs.String()) > 2048 {
		t.Fatalf("a 4 KB name was not cut:\n%s", logs.String())
	}
	clock = clock.Add(logging.DefaultRefusalInterval)
	first.logLimited(slog.LevelWarn, "nbd: some limit bit", "n", 1)
	if !strings.Contains(logs.String(), "some limit bit\" connection=1 remote=10.0.0.1:10000 n=1 suppressed=9") {
		t.Fatalf("no line counting the 9 suppressed ones:\n%s", logs.String())
	}
}

// addressConn is a connection with the remote address of a test's choice.
type addressConn struct {
	net.Conn
	remote net.Addr
}

func (c *addressConn) RemoteAddr() net.Addr { return c.remote }
