package nbd

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/nbd/wire"
)

// Tests of NBD_OPT_STARTTLS, Server.TLSConfig and Server.RequireTLS, with
// a real crypto/tls client and certificates made here.

// testCA is a certificate authority for tests.
type testCA struct {
	certificate *x509.Certificate
	key         *ecdsa.PrivateKey
	pem         []byte
	pool        *x509.CertPool
}

func newTestCA(name string) (*testCA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	template := &x509.Certificate{
		SerialNumber:          serialNumber(),
		Subject:               pkix.Name{CommonName: name, Organization: []string{"herd tests"}},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, template, template, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	certificate, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(certificate)
	return &testCA{
		certificate: certificate,
		key:         key,
		pem:         pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pool:        pool,
	}, nil
}

func serialNumber() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		panic(err) // crypto/rand does not fail
	}
	return n
}

// issue makes a certificate for a server (IP SAN 127.0.0.1, as QEMU and
// libnbd check the address they dialled) or a client (commonName is what
// Session.Client must show). The key usages are those QEMU's sanity checks
// of tls-creds-x509 accept.
func (ca *testCA) issue(commonName string, server bool) (certificate tls.Certificate, certificatePEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, nil, nil, err
	}
	template := &x509.Certificate{
		SerialNumber:          serialNumber(),
		Subject:               pkix.Name{CommonName: commonName, Organization: []string{"herd tests"}},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if server {
		template.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		template.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
		template.DNSNames = []string{"localhost"}
	}
	der, err := x509.CreateCertificate(rand.Reader, template, ca.certificate, &key.PublicKey, ca.key)
	if err != nil {
		return tls.Certificate{}, nil, nil, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return tls.Certificate{}, nil, nil, err
	}
	certificatePEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyPEM = pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
	certificate, err = tls.X509KeyPair(certificatePEM, keyPEM)
	return certificate, certificatePEM, keyPEM, err
}

// testPKI is the certificates the tests share: the cluster's CA, the
// server's certificate, and a CA no server trusts.
type testPKI struct {
	ca, otherCA *testCA
	server      tls.Certificate
}

var sharedTestPKI = sync.OnceValues(func() (*testPKI, error) {
	ca, err := newTestCA("herd test CA")
	if err != nil {
		return nil, err
	}
	otherCA, err := newTestCA("some other CA")
	if err != nil {
		return nil, err
	}
	server, _, _, err := ca.issue("herd node", true)
	if err != nil {
		return nil, err
	}
	return &testPKI{ca: ca, otherCA: otherCA, server: server}, nil
})

func testCertificates(t testing.TB) *testPKI {
	t.Helper()
	pki, err := sharedTestPKI()
	if err != nil {
		t.Fatalf("making test certificates: %v", err)
	}
	return pki
}

// serverConfig is what the server's caller is expected to pass: client
// certificates required and verified against the cluster's CA.
func (p *testPKI) serverConfig() *tls.Config {
	return &tls.Config{
		Certificates: []tls.Certificate{p.server},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    p.ca.pool,
		MinVersion:   tls.VersionTLS12,
	}
}

// clientConfig is a client with a certificate named commonName issued by
// ca (nil: no certificate at all).
func (p *testPKI) clientConfig(t testing.TB, ca *testCA, commonName string) *tls.Config {
	t.Helper()
	config := &tls.Config{RootCAs: p.ca.pool, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}
	if ca != nil {
		certificate, _, _, err := ca.issue(commonName, false)
		if err != nil {
			t.Fatalf("issuing a client certificate: %v", err)
		}
		config.Certificates = []tls.Certificate{certificate}
	}
	return config
}

// writeClientDirectory writes ca-cert.pem, client-cert.pem and
// client-key.pem, the layout QEMU's tls-creds-x509 and libnbd's
// tls-certificates read, and returns the directory.
func (p *testPKI) writeClientDirectory(t testing.TB, commonName string) string {
	t.Helper()
	_, certificatePEM, keyPEM, err := p.ca.issue(commonName, false)
	if err != nil {
		t.Fatal(err)
	}
	directory := t.TempDir()
	for name, contents := range map[string][]byte{"ca-cert.pem": p.ca.pem, "client-cert.pem": certificatePEM, "client-key.pem": keyPEM} {
		if err := os.WriteFile(filepath.Join(directory, name), contents, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return directory
}

// withTLS configures a server for TLS, required or not.
func withTLS(p *testPKI, require bool) func(*Server) {
	return func(s *Server) {
		s.TLSConfig = p.serverConfig()
		s.RequireTLS = require
	}
}

// logCapture collects a server's log lines, for tests of what it says.
type logCapture struct {
	mu     sync.Mutex // guards buffer
	buffer bytes.Buffer
}

func (l *logCapture) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if os.Getenv("NBD_TEST_LOG") != "" {
		os.Stderr.Write(p)
	}
	return l.buffer.Write(p)
}

func (l *logCapture) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buffer.String()
}

func (l *logCapture) configure(s *Server) {
	s.Logger = slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// waitForLine waits until a logged line contains every one of parts.
func (l *logCapture) waitForLine(t testing.TB, parts ...string) {
	t.Helper()
	waitFor(t, fmt.Sprintf("a log line with %q", parts), func() bool {
		for _, line := range strings.Split(l.String(), "\n") {
			found := true
			for _, part := range parts {
				found = found && strings.Contains(line, part)
			}
			if found {
				return true
			}
		}
		return false
	})
}

// startTLS sends NBD_OPT_STARTTLS, expects the ACK, and runs the client
// side of the TLS handshake; the client then speaks over TLS. It returns
// the handshake's error (with TLS 1.3 a client may finish its side before
// the server refuses its certificate).
func (c *testClient) startTLS(config *tls.Config) error {
	c.t.Helper()
	if replies := c.option(wire.OptStartTLS, nil); final(replies) != wire.RepAck || len(replies[0].data) != 0 {
		c.t.Fatalf("NBD_OPT_STARTTLS: reply %#x %q, want an empty ACK", final(replies), replies[0].data)
	}
	if c.reader.Buffered() != 0 {
		c.t.Fatalf("the server sent %d bytes after the ACK to NBD_OPT_STARTTLS", c.reader.Buffered())
	}
	tlsConn := tls.Client(c.conn, config)
	err := tlsConn.Handshake()
	c.conn = tlsConn
	c.reader = bufio.NewReader(tlsConn)
	return err
}

// expectRefusedAfterTLS checks that the server drops a client whose
// certificate it refused: whatever the client sends next gets no reply.
func (c *testClient) expectRefusedAfterTLS() {
	c.t.Helper()
	// The write may fail already, if the refusal arrived first.
	c.conn.Write(clientOption(wire.OptList, nil))
	c.expectClosed()
}

func TestRequireTLSRefusesPlaintext(t *testing.T) {
	pki := testCertificates(t)
	backend := newTestBackend()
	var logs logCapture
	server := startServer(t, backend, withTLS(pki, true), logs.configure)

	c := dial(t, server.address)
	c.greet(wire.FlagCFixedNewstyle | wire.FlagCNoZeroes)
	for _, test := range []struct {
		option uint32
		data   []byte
	}{
		{wire.OptList, nil},
		{wire.OptGo, exportRequestData("disk")},
		{wire.OptInfo, exportRequestData("disk")},
		{wire.OptStructuredReply, nil},
		{wire.OptSetMetaContext, metaContextData("disk", wire.BaseAllocation)},
		{77, []byte("unknown")},
	} {
		replies := c.option(test.option, test.data)
		if len(replies) != 1 || final(replies) != wire.RepErrTLSReqd || !strings.Contains(string(replies[0].data), "requires TLS (NBD_OPT_STARTTLS) with a client certificate") {
			t.Errorf("option %d before TLS: %d replies, last %#x %q; want one NBD_REP_ERR_TLS_REQD saying TLS is required",
				test.option, len(replies), final(replies), replies[len(replies)-1].data)
		}
	}
	// STARTTLS with data is invalid, in any mode.
	if got := final(c.option(wire.OptStartTLS, []byte{0})); got != wire.RepErrInvalid {
		t.Errorf("NBD_OPT_STARTTLS with data: %#x, want NBD_REP_ERR_INVALID", got)
	}
	if got := final(c.option(wire.OptAbort, nil)); got != wire.RepAck {
		t.Errorf("NBD_OPT_ABORT before TLS: %#x, want NBD_REP_ACK", got)
	}
	c.expectClosed()

	// NBD_OPT_EXPORT_NAME cannot be refused by a reply: the connection
	// ends.
	c = dial(t, server.address)
	c.greet(wire.FlagCFixedNewstyle)
	c.sendOption(wire.OptExportName, []byte("disk"))
	c.expectClosed()
	logs.waitForLine(t, "plaintext client on a server that requires TLS", "NBD_OPT_EXPORT_NAME came before NBD_OPT_STARTTLS", "remote=127.0.0.1:")

	// A client without fixed newstyle cannot use TLS at all.
	c = dial(t, server.address)
	c.greet(0)
	c.expectClosed()

	if sessions := backend.recordedSessions(); len(sessions) != 0 {
		t.Fatalf("the Backend was called %d times before TLS: %+v", len(sessions), sessions)
	}
}

func TestStartTLSThenGo(t *testing.T) {
	pki := testCertificates(t)
	backend := newTestBackend()
	server := startServer(t, backend, withTLS(pki, true))

	c := dial(t, server.address)
	c.greet(wire.FlagCFixedNewstyle | wire.FlagCNoZeroes)
	if err := c.startTLS(pki.clientConfig(t, pki.ca, "alice")); err != nil {
		t.Fatalf("TLS handshake: %v", err)
	}
	// Spec, "FORCEDTLS mode": STARTTLS once TLS is up is invalid.
	if got := final(c.option(wire.OptStartTLS, nil)); got != wire.RepErrInvalid {
		t.Fatalf("NBD_OPT_STARTTLS over TLS: %#x, want NBD_REP_ERR_INVALID", got)
	}
	if replies := c.option(wire.OptList, nil); len(replies) != 2 || final(replies) != wire.RepAck {
		t.Fatalf("NBD_OPT_LIST over TLS: %v", replies)
	}
	if got := final(c.option(wire.OptStructuredReply, nil)); got != wire.RepAck {
		t.Fatalf("NBD_OPT_STRUCTURED_REPLY over TLS: %#x", got)
	}
	if got := final(c.option(wire.OptGo, exportRequestData("disk"))); got != wire.RepAck {
		t.Fatalf("NBD_OPT_GO over TLS: %#x", got)
	}
	data := pattern(4, 100000)
	if r := c.roundTrip(wire.CmdFlagFUA, wire.CmdWrite, 777, uint32(len(data)), data); r.errno != wire.NoError {
		t.Fatalf("write over TLS: %v", r)
	}
	if r := c.roundTrip(0, wire.CmdRead, 777, uint32(len(data)), nil); r.errno != wire.NoError || !bytes.Equal(r.data, data) {
		t.Fatalf("read over TLS: %v", r)
	}
	c.disconnect()

	sessions := backend.recordedSessions()
	if len(sessions) != 2 {
		t.Fatalf("%d Backend calls, want a List and an Open", len(sessions))
	}
	for _, session := range sessions {
		if !session.TLS || session.Client != "alice" || session.InfoOnly {
			t.Errorf("session %+v, want TLS from client alice", session)
		}
	}
}

// TestStartTLSResetsNegotiation: on a server where TLS is optional,
// plaintext clients are served, and STARTTLS forgets what was negotiated
// before it (spec, "NBD_OPT_STARTTLS").
func TestStartTLSResetsNegotiation(t *testing.T) {
	pki := testCertificates(t)
	backend := newTestBackend()
	server := startServer(t, backend, withTLS(pki, false))

	c := dial(t, server.address)
	c.greet(wire.FlagCFixedNewstyle | wire.FlagCNoZeroes)
	if got := final(c.option(wire.OptStructuredReply, nil)); got != wire.RepAck {
		t.Fatalf("NBD_OPT_STRUCTURED_REPLY: %#x", got)
	}
	if got := final(c.option(wire.OptSetMetaContext, metaContextData("disk", wire.BaseAllocation))); got != wire.RepAck {
		t.Fatalf("NBD_OPT_SET_META_CONTEXT: %#x", got)
	}
	if err := c.startTLS(pki.clientConfig(t, pki.ca, "bob")); err != nil {
		t.Fatalf("TLS handshake: %v", err)
	}
	replies := c.option(wire.OptGo, exportRequestData("disk"))
	if final(replies) != wire.RepAck {
		t.Fatalf("NBD_OPT_GO: %#x", final(replies))
	}
	if _, flags := exportInformation(t, replies); flags&wire.FlagSendDF != 0 {
		t.Fatalf("flags %#x offer DF: structured replies survived STARTTLS", flags)
	}
	if r := c.roundTrip(0, wire.CmdRead, 0, 512, nil); r.structured || r.errno != wire.NoError {
		t.Fatalf("read after STARTTLS: %v, want a simple reply", r)
	}
	if r := c.roundTrip(0, wire.CmdBlockStatus, 0, 512, nil); r.errno != wire.EINVAL {
		t.Fatalf("block status after STARTTLS: %v, want EINVAL (no context selected)", r)
	}
	c.disconnect()

	plain, _, _ := connect(t, server.address, "disk", connectOptions{})
	if r := plain.roundTrip(0, wire.CmdRead, 0, 512, nil); r.errno != wire.NoError {
		t.Fatalf("plaintext read: %v", r)
	}
	plain.disconnect()

	sessions := backend.recordedSessions()
	if len(sessions) != 2 || !sessions[0].TLS || sessions[0].Client != "bob" || sessions[1].TLS || sessions[1].Client != "" {
		t.Fatalf("sessions %+v, want bob over TLS then an anonymous plaintext one", sessions)
	}
}

func TestTLSRefusesUntrustedClients(t *testing.T) {
	pki := testCertificates(t)
	backend := newTestBackend()
	var logs logCapture
	server := startServer(t, backend, withTLS(pki, true), logs.configure)

	serverCertificate := pki.clientConfig(t, nil, "")
	serverCertificate.Certificates = []tls.Certificate{pki.server} // the right CA, but not for clients
	for name, config := range map[string]*tls.Config{
		"no certificate":              pki.clientConfig(t, nil, ""),
		"certificate of another CA":   pki.clientConfig(t, pki.otherCA, "alice"),
		"certificate not for clients": serverCertificate,
	} {
		t.Run(name, func(t *testing.T) {
			c := dial(t, server.address)
			c.greet(wire.FlagCFixedNewstyle)
			if err := c.startTLS(config); err == nil {
				// TLS 1.3: the client's side completed before the
				// server checked its certificate.
				c.expectRefusedAfterTLS()
			}
		})
	}
	logs.waitForLine(t, "TLS handshake failed", "level=WARN")
	if sessions := backend.recordedSessions(); len(sessions) != 0 {
		t.Fatalf("the Backend was called for an untrusted client: %+v", sessions)
	}
}

// TestTLSHandshakeTimeout: HandshakeTimeout also bounds a client that
// stalls inside the TLS handshake.
func TestTLSHandshakeTimeout(t *testing.T) {
	pki := testCertificates(t)
	var logs logCapture
	server := startServer(t, newTestBackend(), withTLS(pki, true), logs.configure, func(s *Server) {
		s.HandshakeTimeout = 200 * time.Millisecond
	})
	c := dial(t, server.address)
	c.greet(wire.FlagCFixedNewstyle)
	if got := final(c.option(wire.OptStartTLS, nil)); got != wire.RepAck {
		t.Fatalf("NBD_OPT_STARTTLS: %#x", got)
	}
	c.write([]byte{0x16, 0x03, 0x01}) // the start of a ClientHello, and no more
	c.expectClosed()
	logs.waitForLine(t, "TLS handshake failed", "not completed within the handshake timeout of 200ms")
}

// pipelinedConn sends NBD_OPT_STARTTLS in the same write as the
// ClientHello and skips the ACK before the TLS layer reads, as a client
// that does not wait for the ACK would.
type pipelinedConn struct {
	net.Conn
	t         testing.TB
	sent, got bool
}

func (p *pipelinedConn) Write(b []byte) (int, error) {
	if !p.sent {
		p.sent = true
		n, err := p.Conn.Write(append(clientOption(wire.OptStartTLS, nil), b...))
		return max(n-wire.OptionHeaderLength, 0), err
	}
	return p.Conn.Write(b)
}

func (p *pipelinedConn) Read(b []byte) (int, error) {
	if !p.got {
		p.got = true
		ack := make([]byte, wire.OptionReplyHeaderLength)
		if _, err := io.ReadFull(p.Conn, ack); err != nil {
			return 0, err
		}
		if binary.BigEndian.Uint32(ack[12:]) != wire.RepAck {
			return 0, fmt.Errorf("reply %x to NBD_OPT_STARTTLS", ack)
		}
	}
	return p.Conn.Read(b)
}

// TestStartTLSWithPipelinedClientHello: TLS bytes that arrive with the
// option, before the ACK was sent, are not lost in the handshake's buffer.
func TestStartTLSWithPipelinedClientHello(t *testing.T) {
	pki := testCertificates(t)
	server := startServer(t, newTestBackend(), withTLS(pki, true))
	c := dial(t, server.address)
	c.greet(wire.FlagCFixedNewstyle | wire.FlagCNoZeroes)
	tlsConn := tls.Client(&pipelinedConn{Conn: c.conn, t: t}, pki.clientConfig(t, pki.ca, "carol"))
	if err := tlsConn.Handshake(); err != nil {
		t.Fatalf("pipelined TLS handshake: %v", err)
	}
	c.conn, c.reader = tlsConn, bufio.NewReader(tlsConn)
	if got := final(c.option(wire.OptGo, exportRequestData("disk"))); got != wire.RepAck {
		t.Fatalf("NBD_OPT_GO: %#x", got)
	}
	c.disconnect()
}

// TestDisconnectClosesTLSSession: after NBD_CMD_DISC "the server MUST
// close down the TLS session (if one is running) and then close the TCP
// connection": a close_notify record comes before the end of the stream.
func TestDisconnectClosesTLSSession(t *testing.T) {
	pki := testCertificates(t)
	server := startServer(t, newTestBackend(), withTLS(pki, true))
	c := dial(t, server.address)
	c.greet(wire.FlagCFixedNewstyle | wire.FlagCNoZeroes)
	if err := c.startTLS(pki.clientConfig(t, pki.ca, "alice")); err != nil {
		t.Fatal(err)
	}
	if got := final(c.option(wire.OptGo, exportRequestData("disk"))); got != wire.RepAck {
		t.Fatalf("NBD_OPT_GO: %#x", got)
	}
	if r := c.roundTrip(0, wire.CmdRead, 0, 512, nil); r.errno != wire.NoError {
		t.Fatalf("read: %v", r)
	}
	c.sendRequest(0, wire.CmdDisc, 0, 0, 0, nil)
	// Read below TLS: nothing is due after DISC but the alert.
	rest, err := io.ReadAll(c.conn.(*tls.Conn).NetConn())
	if err != nil {
		t.Fatalf("reading to the end: %v", err)
	}
	if len(rest) < 5 || (rest[0] != 0x15 && rest[0] != 0x17) || int(binary.BigEndian.Uint16(rest[3:]))+5 != len(rest) {
		t.Fatalf("after NBD_CMD_DISC the server sent %x, want one TLS record (the close_notify alert)", rest)
	}
}

func TestInfoOnlySession(t *testing.T) {
	backend := newTestBackend()
	server := startServer(t, backend)
	c := dial(t, server.address)
	c.greet(wire.FlagCFixedNewstyle)
	c.option(wire.OptInfo, exportRequestData("disk"))
	c.option(wire.OptGo, exportRequestData("disk"))
	c.disconnect()
	sessions := backend.recordedSessions()
	if len(sessions) != 2 || !sessions[0].InfoOnly || sessions[1].InfoOnly {
		t.Fatalf("sessions %+v, want InfoOnly for NBD_OPT_INFO only", sessions)
	}
}

// FuzzTLSHandshake feeds the option stream that follows a successful
// STARTTLS, over an in-memory TLS connection, to a server that requires
// TLS. Besides what every connection must do (end, return its buffers,
// close its exports once), it checks the rules of TLS: the Backend only
// ever sees the certified client, and no option reply over TLS is
// NBD_REP_ERR_TLS_REQD or an ACK to a second NBD_OPT_STARTTLS.
func FuzzTLSHandshake(f *testing.F) {
	for _, seed := range [][]byte{
		concat(clientOption(wire.OptGo, exportRequestData("disk", wire.InfoBlockSize)), clientRequest(0, wire.CmdRead, 1, 0, 512, nil), clientRequest(0, wire.CmdDisc, 2, 0, 0, nil)),
		concat(clientOption(wire.OptExportName, []byte("disk")), clientRequest(0, wire.CmdWrite, 1, 0, 4, []byte{1, 2, 3, 4})),
		concat(clientOption(wire.OptList, nil), clientOption(wire.OptInfo, exportRequestData("disk", wire.InfoName)), clientOption(wire.OptAbort, nil)),
		concat(clientOption(wire.OptStartTLS, nil), clientOption(wire.OptStartTLS, []byte{1}), clientOption(wire.OptGo, exportRequestData("missing"))),
		concat(clientOption(wire.OptStructuredReply, nil), clientOption(wire.OptSetMetaContext, metaContextData("disk", wire.BaseAllocation)),
			clientOption(wire.OptGo, exportRequestData("disk")), clientRequest(0, wire.CmdBlockStatus, 3, 0, 4096, nil)),
		concat(clientOption(wire.OptGo, make([]byte, maximumOptionLength+1))),
		[]byte("IHAVEOPT but not really"),
		nil,
	} {
		f.Add(seed)
	}
	pki := testCertificates(f)
	clientConfig := pki.clientConfig(f, pki.ca, "fuzz-client")
	f.Fuzz(func(t *testing.T, input []byte) {
		backend := newTestBackend()
		server := &Server{Backend: backend, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), TLSConfig: pki.serverConfig(), RequireTLS: true}
		output := serveOverTLS(t, server, clientConfig, input)
		if n := server.buffersOutstanding.Load(); n != 0 {
			t.Fatalf("%d buffers not returned", n)
		}
		disk := backend.disks["disk"]
		if disk.opens.Load() != disk.closes.Load() || disk.misuses.Load() != 0 {
			t.Fatalf("%d opens, %d closes, %d misuses", disk.opens.Load(), disk.closes.Load(), disk.misuses.Load())
		}
		for _, session := range backend.recordedSessions() {
			if !session.TLS || session.Client != "fuzz-client" {
				t.Fatalf("Backend called with session %+v", session)
			}
		}
		// The option replies come first; stop at the first thing that is
		// not one (the transmission phase, or a reply cut short).
		for len(output) >= wire.OptionReplyHeaderLength && binary.BigEndian.Uint64(output) == wire.OptionReplyMagic {
			option, replyType := binary.BigEndian.Uint32(output[8:]), binary.BigEndian.Uint32(output[12:])
			if replyType == wire.RepErrTLSReqd {
				t.Fatalf("NBD_REP_ERR_TLS_REQD over TLS")
			}
			if option == wire.OptStartTLS && replyType != wire.RepErrInvalid {
				t.Fatalf("reply %#x to NBD_OPT_STARTTLS over TLS", replyType)
			}
			length := int(binary.BigEndian.Uint32(output[16:]))
			if len(output) < wire.OptionReplyHeaderLength+length {
				break
			}
			output = output[wire.OptionReplyHeaderLength+length:]
		}
	})
}

// serveOverTLS runs one connection of server over an in-memory pipe: the
// client greets, upgrades to TLS with config, sends input and closes its
// side; it returns what the server sent over TLS.
func serveOverTLS(t *testing.T, server *Server, config *tls.Config, input []byte) []byte {
	clientSide, serverSide := net.Pipe()
	defer clientSide.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		newConnection(server, serverSide).serve(context.Background())
	}()
	clientSide.SetDeadline(time.Now().Add(testTimeout))
	greeting := make([]byte, 18)
	if _, err := io.ReadFull(clientSide, greeting); err != nil {
		t.Fatalf("greeting: %v", err)
	}
	if _, err := clientSide.Write(concat(clientFlagsBytes, clientOption(wire.OptStartTLS, nil))); err != nil {
		t.Fatalf("STARTTLS: %v", err)
	}
	ack := make([]byte, wire.OptionReplyHeaderLength)
	if _, err := io.ReadFull(clientSide, ack); err != nil || binary.BigEndian.Uint32(ack[12:]) != wire.RepAck {
		t.Fatalf("reply to STARTTLS: %x %v", ack, err)
	}
	tlsConn := tls.Client(clientSide, config)
	if err := tlsConn.Handshake(); err != nil {
		t.Fatalf("TLS handshake: %v", err)
	}
	// net.Pipe is unbuffered: read everything the server sends while
	// writing, or both would block.
	received := make(chan []byte, 1)
	go func() {
		output, _ := io.ReadAll(tlsConn)
		received <- output
	}()
	tlsConn.Write(input) // fails if the server hung up first
	tlsConn.CloseWrite()
	select {
	case <-done:
	case <-time.After(testTimeout):
		t.Fatalf("the connection did not end on input %q", input)
	}
	clientSide.Close()
	return <-received
}
