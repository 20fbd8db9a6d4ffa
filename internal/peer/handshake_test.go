package peer

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/logging"
	"github.com/herd-storage/herd/internal/pki"
)

// refusalWait is how long a test waits to be sure that a refused
// connection did not reach a sub-listener: the handshake is done (and
// refused) before the dialer returns, so any delivery would be immediate.
const refusalWait = 100 * time.Millisecond

// TestPeerProtocols: a node with the cluster's certificate reaches every
// protocol, over TLS 1.3, and each side learns the other's node id.
func TestPeerProtocols(t *testing.T) {
	server := listen(t, testCredentials(t, testCA(t), "node-a"))
	client := testCredentials(t, testCA(t), "node-b")
	for _, protocol := range []Protocol{ProtocolRaft, ProtocolObject, ProtocolForward} {
		t.Run(fmt.Sprint(protocol), func(t *testing.T) {
			sub := server.Protocol(protocol)
			conn, err := Dial(t.Context(), server.address(), client, protocol)
			if err != nil {
				t.Fatalf("dial: %v", err)
			}
			defer conn.Close()
			state := conn.(*tls.Conn).ConnectionState()
			if state.Version != tls.VersionTLS13 {
				t.Fatalf("TLS version %#x, want 1.3", state.Version)
			}
			accepted := acceptOne(sub, 5*time.Second)
			if accepted == nil {
				t.Fatal("the connection never reached the sub-listener")
			}
			defer accepted.Close()
			if node, ok := RemoteNode(accepted); !ok || node != "node-b" {
				t.Fatalf("RemoteNode = %q, %v; want node-b", node, ok)
			}
			conn.Write([]byte("ping"))
			buffer := make([]byte, 4)
			if _, err := io.ReadFull(accepted, buffer); err != nil || string(buffer) != "ping" {
				t.Fatalf("payload after the handshake: %q, %v", buffer, err)
			}
			accepted.Write([]byte("pong"))
			if _, err := io.ReadFull(conn, buffer); err != nil || string(buffer) != "pong" {
				t.Fatalf("answer after the handshake: %q, %v", buffer, err)
			}
		})
	}
}

// TestNoCertificateOnlyJoin: a connection without a certificate may ask
// for nothing but the join protocol.
func TestNoCertificateOnlyJoin(t *testing.T) {
	creds := testCredentials(t, testCA(t), "node-a")
	server := listen(t, creds)
	for _, protocol := range []Protocol{ProtocolRaft, ProtocolObject, ProtocolForward, 77} {
		server.Protocol(protocol)
		if _, err := dialWithoutCertificate(t, server.address(), creds, protocol); !errors.Is(err, ErrCertificateRequired) {
			t.Fatalf("protocol %d without a certificate: %v, want ErrCertificateRequired", protocol, err)
		}
		if conn := acceptOne(server.Protocol(protocol), refusalWait); conn != nil {
			t.Fatalf("protocol %d reached its sub-listener without a certificate", protocol)
		}
	}
	server.waitLog(t, "a node certificate is required")
	// Join without a handler: refused as such.
	if _, err := dialWithoutCertificate(t, server.address(), creds, ProtocolJoin); !errors.Is(err, ErrJoinClosed) {
		t.Fatalf("join without a handler: %v, want ErrJoinClosed", err)
	}
}

// TestOtherClusterRefused: a certificate from another CA is refused in
// both directions, and nothing reaches a sub-listener.
func TestOtherClusterRefused(t *testing.T) {
	server := listen(t, testCredentials(t, testCA(t), "node-a"))
	sub := server.Protocol(ProtocolRaft)

	// The dialer refuses a server of another cluster.
	stranger := testCredentials(t, newTestCA(t), "node-x")
	if _, err := Dial(t.Context(), server.address(), stranger, ProtocolRaft); !errors.Is(err, ErrWrongCluster) || !strings.Contains(err.Error(), server.address()) {
		t.Fatalf("dial into another cluster: %v, want ErrWrongCluster naming the address", err)
	}

	// The server refuses a client of another cluster, even one that
	// trusts the server's CA.
	trusting := testCredentials(t, newTestCA(t), "node-y")
	trusting.CA = testCA(t).Pool()
	if _, err := Dial(t.Context(), server.address(), trusting, ProtocolRaft); !errors.Is(err, ErrCertificateRefused) {
		t.Fatalf("a client with another cluster's certificate: %v, want ErrCertificateRefused", err)
	}
	server.waitLog(t, "TLS handshake failed")
	if conn := acceptOne(sub, refusalWait); conn != nil {
		t.Fatal("a node of another cluster reached raft")
	}

	// And a server of another cluster refuses our node.
	other := listen(t, stranger)
	other.Protocol(ProtocolRaft)
	ours := testCredentials(t, testCA(t), "node-b")
	ours.CA.AddCert(newTestCA(t).Cert) // irrelevant CA: still not the server's
	if _, err := Dial(t.Context(), other.address(), ours, ProtocolRaft); !errors.Is(err, ErrWrongCluster) {
		t.Fatalf("dial into another cluster trusting a third CA: %v", err)
	}
}

// TestAllowedRefuses: a node that Allowed refuses (removed for good) is
// refused, by the server and by the dialer.
func TestAllowedRefuses(t *testing.T) {
	removed := func(node, _ string) error {
		if node == "node-removed" {
			return errors.New("removed from the cluster")
		}
		return nil
	}
	serverCreds := testCredentials(t, testCA(t), "node-a")
	serverCreds.Allowed = removed
	server := listen(t, serverCreds)
	sub := server.Protocol(ProtocolObject)

	if _, err := Dial(t.Context(), server.address(), testCredentials(t, testCA(t), "node-removed"), ProtocolObject); !errors.Is(err, ErrNodeRemoved) {
		t.Fatalf("a removed node dialling: %v, want ErrNodeRemoved", err)
	}
	server.waitLog(t, "node-removed")
	if conn := acceptOne(sub, refusalWait); conn != nil {
		t.Fatal("a removed node reached the object protocol")
	}
	if conn, err := Dial(t.Context(), server.address(), testCredentials(t, testCA(t), "node-b"), ProtocolObject); err != nil {
		t.Fatalf("a member dialling: %v", err)
	} else {
		conn.Close()
	}

	// The dialer refuses a removed server.
	removedServer := listen(t, testCredentials(t, testCA(t), "node-removed"))
	removedServer.Protocol(ProtocolObject)
	dialer := testCredentials(t, testCA(t), "node-b")
	dialer.Allowed = removed
	if _, err := Dial(t.Context(), removedServer.address(), dialer, ProtocolObject); !errors.Is(err, ErrNodeRemoved) || !strings.Contains(err.Error(), "removed from the cluster") {
		t.Fatalf("dial to a removed node: %v, want ErrNodeRemoved with Allowed's reason", err)
	}
}

// TestClientCertificateRefused: an operator's client certificate, though
// from the cluster's CA, is neither a peer nor a server.
func TestClientCertificateRefused(t *testing.T) {
	server := listen(t, testCredentials(t, testCA(t), "node-a"))
	sub := server.Protocol(ProtocolRaft)
	operator := clientCredentials(t, testCA(t), "alice")
	if _, err := Dial(t.Context(), server.address(), operator, ProtocolRaft); !errors.Is(err, ErrNotNode) {
		t.Fatalf("a client certificate asking for raft: %v, want ErrNotNode", err)
	}
	if conn := acceptOne(sub, refusalWait); conn != nil {
		t.Fatal("a client certificate reached raft")
	}

	// A port that presents a client certificate is no node to a dialer
	// (and crypto/tls's checks may refuse it earlier still).
	impostor := listen(t, operator)
	impostor.Protocol(ProtocolRaft)
	if _, err := Dial(t.Context(), impostor.address(), testCredentials(t, testCA(t), "node-b"), ProtocolRaft); !errors.Is(err, ErrNotNode) {
		t.Fatalf("dial to a server with a client certificate: %v, want ErrNotNode", err)
	}
}

// TestUnknownProtocol: a member asking for a protocol the port does not
// serve is told so.
func TestUnknownProtocol(t *testing.T) {
	server := listen(t, testCredentials(t, testCA(t), "node-a"))
	server.Protocol(ProtocolRaft)
	client := testCredentials(t, testCA(t), "node-b")
	for _, protocol := range []Protocol{ProtocolForward, 0, 200} {
		if _, err := Dial(t.Context(), server.address(), client, protocol); !errors.Is(err, ErrUnknownProto) {
			t.Fatalf("protocol %d: %v, want ErrUnknownProto", protocol, err)
		}
	}
	// A closed sub-listener's protocol is no longer served.
	server.Protocol(ProtocolObject).Close()
	if _, err := Dial(t.Context(), server.address(), client, ProtocolObject); !errors.Is(err, ErrUnknownProto) {
		t.Fatalf("protocol of a closed sub-listener: %v, want ErrUnknownProto", err)
	}
}

// TestGarbageOnPeerPort: bytes that are not TLS, and a TLS client whose
// greeting is not herd's, are refused without an answer; the port keeps
// serving.
func TestGarbageOnPeerPort(t *testing.T) {
	creds := testCredentials(t, testCA(t), "node-a")
	server := listen(t, creds)
	sub := server.Protocol(ProtocolRaft)

	raw, err := net.Dial("tcp", server.address())
	if err != nil {
		t.Fatal(err)
	}
	raw.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
	raw.SetReadDeadline(time.Now().Add(5 * time.Second))
	// Closed, possibly with a reset: the server closes with the rest of
	// the request unread.
	if answer, err := io.ReadAll(raw); (err != nil && !errors.Is(err, syscall.ECONNRESET)) || strings.Contains(string(answer), "HTTP") {
		t.Fatalf("an HTTP request got %q, %v; want the connection closed", answer, err)
	}
	raw.Close()
	server.waitLog(t, "TLS handshake failed")

	// TLS, then an HTTP request where the greeting belongs.
	raw, err = dialTCP(t.Context(), server.address())
	if err != nil {
		t.Fatal(err)
	}
	conn := tls.Client(raw, creds.clientConfig())
	if err := conn.Handshake(); err != nil {
		t.Fatal(err)
	}
	conn.Write([]byte("GET / HTTP/1.1\r\n\r\n"))
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if answer, _ := io.ReadAll(conn); len(answer) != 0 {
		t.Fatalf("a bad greeting got the answer %q", answer)
	}
	conn.Close()
	server.waitLog(t, "bad greeting")

	if conn := acceptOne(sub, refusalWait); conn != nil {
		t.Fatal("garbage reached raft")
	}
	conn2, err := Dial(t.Context(), server.address(), testCredentials(t, testCA(t), "node-b"), ProtocolRaft)
	if err != nil {
		t.Fatalf("a member after the garbage: %v", err)
	}
	conn2.Close()
}

// TestDialNonHerdPort: a port that does not speak TLS is no herd peer.
func TestDialNonHerdPort(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		c, err := l.Accept()
		if err == nil {
			c.Write([]byte("SSH-2.0-OpenSSH_9.2\r\n" + string(make([]byte, 64))))
			c.Close()
		}
	}()
	_, err = Dial(t.Context(), l.Addr().String(), testCredentials(t, testCA(t), "node-b"), ProtocolRaft)
	if !errors.Is(err, ErrNotHerd) {
		t.Fatalf("dial a non-herd port: %v, want ErrNotHerd", err)
	}
}

// TestDialSilentPort: a port that accepts and never answers fails the
// dial when its context ends, not later.
func TestDialSilentPort(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := Dial(ctx, l.Addr().String(), testCredentials(t, testCA(t), "node-b"), ProtocolRaft); err == nil {
		t.Fatal("dial to a silent port succeeded")
	}
	if elapsed := time.Since(start); elapsed > 3*time.Second {
		t.Fatalf("dial took %v with a 200 ms context", elapsed)
	}

	// A TLS server that never answers the greeting: cancelling the
	// context ends the dial.
	serverCreds := testCredentials(t, testCA(t), "node-a")
	go func() {
		for {
			raw, err := l.Accept()
			if err != nil {
				return
			}
			conn := tls.Server(raw, serverCreds.serverConfig())
			go func() {
				defer conn.Close()
				io.Copy(io.Discard, conn) // the handshake, then silence
			}()
		}
	}()
	ctx, cancel = context.WithCancel(t.Context())
	time.AfterFunc(300*time.Millisecond, cancel)
	start = time.Now()
	if _, err := Dial(ctx, l.Addr().String(), testCredentials(t, testCA(t), "node-b"), ProtocolRaft); !errors.Is(err, context.Canceled) {
		t.Fatalf("dial cancelled during the greeting: %v, want context.Canceled", err)
	}
	if elapsed := time.Since(start); elapsed > 3*time.Second {
		t.Fatalf("cancelling took %v to end the dial", elapsed)
	}
}

// TestRefusalsRateLimited: a flood of refused connections from one
// address logs one line per reason and interval (internal/logging).
func TestRefusalsRateLimited(t *testing.T) {
	server := listen(t, testCredentials(t, testCA(t), "node-a"))
	const attempts = 40
	start := time.Now()
	for range attempts {
		raw, err := net.Dial("tcp", server.address())
		if err != nil {
			t.Fatal(err)
		}
		raw.Write([]byte("GET / HTTP/1.1\r\n\r\n"))
		raw.SetReadDeadline(time.Now().Add(5 * time.Second))
		io.ReadAll(raw)
		raw.Close()
	}
	server.waitLog(t, "refused connection")
	lines := strings.Count(server.logs.String(), "refused connection")
	// One, plus one per interval the loop took.
	if allowed := 1 + int(time.Since(start)/logging.DefaultRefusalInterval); lines > allowed {
		t.Fatalf("%d refusals logged %d lines, more than %d", attempts, lines, allowed)
	}
}

func TestNoCredentials(t *testing.T) {
	if _, err := Listen("127.0.0.1:0", nil, nil); !errors.Is(err, ErrNoCredentials) {
		t.Fatalf("Listen without credentials: %v", err)
	}
	if _, err := Dial(t.Context(), "127.0.0.1:1", &Credentials{}, ProtocolRaft); !errors.Is(err, ErrNoCredentials) {
		t.Fatalf("Dial without credentials: %v", err)
	}
}

// TestAllowedSeesTheSerial: Allowed is given the peer certificate's
// serial on both sides, so a certificate minted for a member's id with
// the CA key but not the one the log names is refused.
func TestAllowedSeesTheSerial(t *testing.T) {
	ca := testCA(t)
	member := testCredentials(t, ca, "node-b")
	forged := testCredentials(t, ca, "node-b") // same id, another serial
	serial := pki.Serial(member.Certificate.Leaf)
	if member.Certificate.Leaf == nil {
		t.Fatal("credentials without a parsed leaf")
	}
	onlyMember := func(node, got string) error {
		if got != serial {
			return fmt.Errorf("certificate %s is not node %s's", got, node)
		}
		return nil
	}
	serverCreds := testCredentials(t, ca, "node-a")
	serverCreds.Allowed = func(node, got string) error {
		if node == "node-a" {
			return nil
		}
		return onlyMember(node, got)
	}
	server := listen(t, serverCreds)
	server.Protocol(ProtocolObject)
	if _, err := Dial(t.Context(), server.address(), forged, ProtocolObject); !errors.Is(err, ErrNodeRemoved) {
		t.Fatalf("a certificate for a member's id with another serial: %v, want refused", err)
	}
	conn, err := Dial(t.Context(), server.address(), member, ProtocolObject)
	if err != nil {
		t.Fatalf("the member's own certificate: %v", err)
	}
	conn.Close()

	forgedServer := listen(t, testCredentials(t, ca, "node-b"))
	forgedServer.Protocol(ProtocolObject)
	dialer := testCredentials(t, ca, "node-c")
	dialer.Allowed = onlyMember
	if _, err := Dial(t.Context(), forgedServer.address(), dialer, ProtocolObject); !errors.Is(err, ErrNodeRemoved) {
		t.Fatalf("dialling a server with a forged certificate: %v, want refused", err)
	}
}

// TestStrangersCannotTakeThePeerPort: silent connections that never
// finish a TLS handshake hold at most the port's pool of them (the
// oldest closed to admit a newcomer), so a member still gets through,
// and a join holds its slot until it is answered.
func TestStrangersCannotTakeThePeerPort(t *testing.T) {
	defer func(total, perSource int) { maxUnauthenticated, maxUnauthenticatedPerSource = total, perSource }(maxUnauthenticated, maxUnauthenticatedPerSource)
	maxUnauthenticated, maxUnauthenticatedPerSource = 8, 4
	ca := testCA(t)
	server := listen(t, testCredentials(t, ca, "node-a"))
	sub := server.Protocol(ProtocolRaft)
	var strangers []net.Conn
	for range 40 {
		conn, err := net.Dial("tcp", server.address())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		strangers = append(strangers, conn)
	}
	waitFor(t, 5*time.Second, "the port to hold at most its pool of strangers", func() bool {
		total, _ := server.strangers.Len("127.0.0.1")
		return total <= 4
	})
	// The ones closed to admit others read EOF at once; the others time
	// out (HandshakeTimeout is longer than this wait).
	closed := 0
	for _, conn := range strangers {
		conn.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		if _, err := conn.Read(make([]byte, 1)); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			closed++
		}
	}
	if closed < 40-4 {
		t.Errorf("%d of 40 silent connections closed, want at least 36 (4 per source)", closed)
	}
	server.waitLog(t, "closed the oldest to admit a new one")

	// A member gets through, from the strangers' own address, many times.
	member := testCredentials(t, ca, "node-b")
	for i := range 10 {
		conn, err := Dial(t.Context(), server.address(), member, ProtocolRaft)
		if err != nil {
			t.Fatalf("member dial %d while strangers hold the port: %v", i, err)
		}
		accepted := acceptOne(sub, 5*time.Second)
		if accepted == nil {
			t.Fatalf("member connection %d never reached the sub-listener", i)
		}
		accepted.Close()
		conn.Close()
	}
	// Authenticated connections left the pool.
	if total, _ := server.strangers.Len("127.0.0.1"); total > 4 {
		t.Errorf("the pool holds %d connections after the member's", total)
	}
}
