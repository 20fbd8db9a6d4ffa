package peer

import (
	"crypto/tls"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/pki"
)

// sharedTestCA is the cluster CA of the package's tests: nodes started by
// different helpers trust each other, as in one cluster.
var sharedTestCA = sync.OnceValues(func() (*pki.CA, error) { return pki.NewCA("peer-test") })

func testCA(t testing.TB) *pki.CA {
	t.Helper()
	ca, err := sharedTestCA()
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// newTestCA is another cluster's CA.
func newTestCA(t testing.TB) *pki.CA {
	t.Helper()
	ca, err := pki.NewCA("other-cluster")
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// testCredentials are node nodeID's credentials, certified by ca.
func testCredentials(t testing.TB, ca *pki.CA, nodeID string) *Credentials {
	t.Helper()
	certPEM, keyPEM, err := ca.IssueNode(nodeID, []net.IP{net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	creds, err := NewCredentials(certPEM, keyPEM, ca.CertPEM, nil)
	if err != nil {
		t.Fatal(err)
	}
	return creds
}

// clientCredentials are credentials holding an operator's client
// certificate where a node's belongs.
func clientCredentials(t testing.TB, ca *pki.CA, name string) *Credentials {
	t.Helper()
	certPEM, keyPEM, _, err := ca.IssueClient(name)
	if err != nil {
		t.Fatal(err)
	}
	creds, err := NewCredentials(certPEM, keyPEM, ca.CertPEM, nil)
	if err != nil {
		t.Fatal(err)
	}
	return creds
}

// testPort is a peer port on loopback whose log the test can read.
type testPort struct {
	*Listener
	logs *lockedBuffer
}

func listen(t testing.TB, creds *Credentials) *testPort {
	t.Helper()
	logs := &lockedBuffer{}
	l, err := Listen("127.0.0.1:0", creds, slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return &testPort{Listener: l, logs: logs}
}

func (p *testPort) address() string { return p.Addr().String() }

// waitLog waits until the port's log holds want.
func (p *testPort) waitLog(t testing.TB, want string) {
	t.Helper()
	waitFor(t, 5*time.Second, "the log to say "+want, func() bool { return strings.Contains(p.logs.String(), want) })
}

// dialWithoutCertificate dials like a joining node does, trusting creds'
// CA: no certificate of its own.
func dialWithoutCertificate(t testing.TB, address string, creds *Credentials, protocol Protocol) (net.Conn, error) {
	t.Helper()
	raw, err := dialTCP(t.Context(), address)
	if err != nil {
		t.Fatal(err)
	}
	config := creds.clientConfig()
	config.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &tls.Certificate{}, nil }
	return clientHandshake(t.Context(), raw, config, protocol)
}

// acceptOne returns the next connection accepted for protocol p, or nil
// if none arrives within wait.
func acceptOne(sub *SubListener, wait time.Duration) net.Conn {
	accepted := make(chan net.Conn, 1)
	go func() {
		conn, err := sub.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- conn
	}()
	select {
	case conn := <-accepted:
		return conn
	case <-time.After(wait):
		return nil
	}
}

// lockedBuffer collects log output from many goroutines.
type lockedBuffer struct {
	mu     sync.Mutex
	buffer strings.Builder
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buffer.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buffer.String()
}

// waitFor polls condition until it holds or timeout passes.
func waitFor(t testing.TB, timeout time.Duration, what string, condition func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !condition() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}
