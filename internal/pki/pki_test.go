package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"errors"
	"net"
	"slices"
	"strings"
	"testing"
	"time"
)

func newTestCA(t *testing.T, name string) *CA {
	t.Helper()
	ca, err := NewCA(name)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func mustParse(t *testing.T, certPEM []byte) *x509.Certificate {
	t.Helper()
	cert, err := ParseCertificate(certPEM)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}

// issueNodeChain returns a node's TLS chain (leaf, then CA) as DER.
func issueNodeChain(t *testing.T, ca *CA, nodeID string) [][]byte {
	t.Helper()
	certPEM, keyPEM, err := ca.IssueNode(nodeID, []net.IP{net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	certificate, err := ca.TLSCertificate(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return certificate.Certificate
}

func TestNewCA(t *testing.T) {
	ca := newTestCA(t, "test-cluster")
	cert := ca.Cert
	if !cert.IsCA || !cert.BasicConstraintsValid || cert.KeyUsage&x509.KeyUsageCertSign == 0 {
		t.Fatalf("not a CA: IsCA %v, constraints %v, usage %v", cert.IsCA, cert.BasicConstraintsValid, cert.KeyUsage)
	}
	if cert.MaxPathLen != 0 || !cert.MaxPathLenZero {
		t.Fatalf("the CA allows intermediates: MaxPathLen %d", cert.MaxPathLen)
	}
	key, ok := cert.PublicKey.(*ecdsa.PublicKey)
	if !ok || key.Curve != elliptic.P256() {
		t.Fatalf("CA key is %T, want ECDSA P-256", cert.PublicKey)
	}
	if years := cert.NotAfter.Sub(time.Now()).Hours() / 24 / 365; years < 9.9 || years > 10.1 {
		t.Fatalf("CA valid for %.1f years, want 10", years)
	}
	if cert.Subject.CommonName != "test-cluster" {
		t.Fatalf("CA name %q", cert.Subject.CommonName)
	}
	if _, err := cert.Verify(x509.VerifyOptions{Roots: ca.Pool()}); err != nil {
		t.Fatalf("the CA does not verify against itself: %v", err)
	}
	if _, err := NewCA(""); err == nil {
		t.Fatal("NewCA accepted an empty name")
	}
}

func TestParseCA(t *testing.T) {
	ca := newTestCA(t, "a")
	parsed, err := ParseCA(ca.CertPEM, ca.KeyPEM)
	if err != nil {
		t.Fatalf("ParseCA of a new CA: %v", err)
	}
	if !parsed.Cert.Equal(ca.Cert) || !publicKeysEqual(parsed.Key.Public(), ca.Key.Public()) {
		t.Fatal("ParseCA returned another CA")
	}
	// The parsed CA issues certificates the original's pool accepts.
	certPEM, _, err := parsed.IssueNode("n1", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := mustParse(t, certPEM).Verify(x509.VerifyOptions{Roots: ca.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		t.Fatalf("a certificate from the parsed CA: %v", err)
	}

	other := newTestCA(t, "b")
	if _, err := ParseCA(ca.CertPEM, other.KeyPEM); err == nil || !strings.Contains(err.Error(), "does not belong") {
		t.Fatalf("ParseCA with another CA's key: %v", err)
	}
	nodePEM, nodeKeyPEM, err := ca.IssueNode("n1", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ParseCA(nodePEM, nodeKeyPEM); err == nil || !strings.Contains(err.Error(), "not a CA") {
		t.Fatalf("ParseCA of a node certificate: %v", err)
	}
	if _, err := ParseCA([]byte("garbage"), ca.KeyPEM); !errors.Is(err, ErrBadPEM) {
		t.Fatalf("ParseCA of garbage: %v", err)
	}
	if _, err := ParseCA(ca.CertPEM, ca.CertPEM); !errors.Is(err, ErrBadPEM) {
		t.Fatalf("ParseCA with a certificate for a key: %v", err)
	}
}

func TestFingerprint(t *testing.T) {
	ca := newTestCA(t, "a")
	fingerprint := Fingerprint(ca.Cert)
	sum := sha256.Sum256(ca.Cert.Raw)
	if fingerprint != hex.EncodeToString(sum[:]) || len(fingerprint) != 64 || fingerprint != strings.ToLower(fingerprint) {
		t.Fatalf("fingerprint %q", fingerprint)
	}
	if ca.Fingerprint() != fingerprint {
		t.Fatal("CA.Fingerprint differs from Fingerprint")
	}
	if Fingerprint(newTestCA(t, "a").Cert) == fingerprint {
		t.Fatal("two CAs share a fingerprint")
	}
}

func TestIssueNode(t *testing.T) {
	ca := newTestCA(t, "a")
	ips := []net.IP{net.ParseIP("10.0.0.7"), net.ParseIP("fd00::7")}
	certPEM, keyPEM, err := ca.IssueNode("0123456789abcdef", ips)
	if err != nil {
		t.Fatal(err)
	}
	cert := mustParse(t, certPEM)
	if cert.Subject.CommonName != "0123456789abcdef" || !slices.Equal(cert.Subject.OrganizationalUnit, []string{"herd-node"}) {
		t.Fatalf("subject %v", cert.Subject)
	}
	if !slices.Equal(cert.ExtKeyUsage, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}) {
		t.Fatalf("extended key usage %v", cert.ExtKeyUsage)
	}
	if len(cert.IPAddresses) != 2 || !cert.IPAddresses[0].Equal(ips[0]) || !cert.IPAddresses[1].Equal(ips[1]) {
		t.Fatalf("IP SANs %v, want %v", cert.IPAddresses, ips)
	}
	if !slices.Equal(cert.DNSNames, []string{NodeDNSName}) {
		t.Fatalf("DNS SANs %v", cert.DNSNames)
	}
	if cert.IsCA {
		t.Fatal("a node certificate is a CA")
	}
	if cert.SerialNumber.Sign() <= 0 || cert.SerialNumber.BitLen() > 128 {
		t.Fatalf("serial %v", cert.SerialNumber)
	}
	if years := cert.NotAfter.Sub(time.Now()).Hours() / 24 / 365; years < 9.9 || years > 10.1 || cert.NotAfter.After(ca.Cert.NotAfter) {
		t.Fatalf("node certificate valid until %v (%.1f years), CA until %v", cert.NotAfter, years, ca.Cert.NotAfter)
	}
	for _, usage := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
		if _, err := cert.Verify(x509.VerifyOptions{Roots: ca.Pool(), KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
			t.Fatalf("node certificate for usage %v: %v", usage, err)
		}
	}
	// Clients that check addresses (QEMU, libnbd) accept the IPs.
	if err := cert.VerifyHostname("10.0.0.7"); err != nil {
		t.Fatal(err)
	}
	if id, ok := NodeID(cert); !ok || id != "0123456789abcdef" {
		t.Fatalf("NodeID = %q, %v", id, ok)
	}
	if _, ok := ClientName(cert); ok {
		t.Fatal("ClientName accepted a node certificate")
	}
	if _, err := tls.X509KeyPair(certPEM, keyPEM); err != nil {
		t.Fatalf("the key does not match the certificate: %v", err)
	}
	other, _, err := ca.IssueNode("0123456789abcdef", ips)
	if err != nil {
		t.Fatal(err)
	}
	if Serial(mustParse(t, other)) == Serial(cert) {
		t.Fatal("two certificates share a serial")
	}
	for _, id := range []string{"", strings.Repeat("x", 65), "a\nb"} {
		if _, _, err := ca.IssueNode(id, nil); err == nil {
			t.Fatalf("IssueNode accepted node id %q", id)
		}
	}
}

func TestIssueClient(t *testing.T) {
	ca := newTestCA(t, "a")
	certPEM, keyPEM, serial, err := ca.IssueClient("alice")
	if err != nil {
		t.Fatal(err)
	}
	cert := mustParse(t, certPEM)
	if !slices.Equal(cert.ExtKeyUsage, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}) {
		t.Fatalf("extended key usage %v, want client authentication only", cert.ExtKeyUsage)
	}
	if !slices.Equal(cert.Subject.OrganizationalUnit, []string{"herd-client"}) || cert.Subject.CommonName != "alice" {
		t.Fatalf("subject %v", cert.Subject)
	}
	if serial != Serial(cert) || len(serial) == 0 || len(serial) > 32 {
		t.Fatalf("serial %q, certificate's %q", serial, Serial(cert))
	}
	if years := cert.NotAfter.Sub(time.Now()).Hours() / 24 / 365; years < 4.9 || years > 5.1 {
		t.Fatalf("client certificate valid for %.1f years, want 5", years)
	}
	if _, err := cert.Verify(x509.VerifyOptions{Roots: ca.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Fatalf("client certificate as a client: %v", err)
	}
	if _, err := cert.Verify(x509.VerifyOptions{Roots: ca.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err == nil {
		t.Fatal("a client certificate verified as a server")
	}
	if _, ok := NodeID(cert); ok {
		t.Fatal("NodeID accepted a client certificate")
	}
	if name, ok := ClientName(cert); !ok || name != "alice" {
		t.Fatalf("ClientName = %q, %v", name, ok)
	}
	if _, ok := NodeID(ca.Cert); ok {
		t.Fatal("NodeID accepted the CA")
	}
	if _, err := tls.X509KeyPair(certPEM, keyPEM); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := ca.IssueClient(""); err == nil {
		t.Fatal("IssueClient accepted an empty name")
	}
}

func TestVerifyServerChain(t *testing.T) {
	ca := newTestCA(t, "a")
	chain := issueNodeChain(t, ca, "n1")
	fingerprint := ca.Fingerprint()
	leaf, err := VerifyServerChain(chain, fingerprint)
	if err != nil {
		t.Fatalf("a node's chain: %v", err)
	}
	if id, _ := NodeID(leaf); id != "n1" {
		t.Fatalf("leaf %q", id)
	}
	if _, err := VerifyServerChain(chain, strings.ToUpper(fingerprint)); err != nil {
		t.Fatalf("an upper-case fingerprint: %v", err)
	}

	t.Run("wrong fingerprint", func(t *testing.T) {
		_, err := VerifyServerChain(chain, newTestCA(t, "a").Fingerprint())
		if !errors.Is(err, ErrFingerprintMismatch) || !strings.Contains(err.Error(), fingerprint) {
			t.Fatalf("%v; want ErrFingerprintMismatch naming the CA presented", err)
		}
	})
	t.Run("no CA in the chain", func(t *testing.T) {
		if _, err := VerifyServerChain(chain[:1], fingerprint); !errors.Is(err, ErrFingerprintMismatch) {
			t.Fatalf("leaf alone: %v", err)
		}
		if _, err := VerifyServerChain(nil, fingerprint); err == nil {
			t.Fatal("no certificate accepted")
		}
	})
	t.Run("certificate from another CA", func(t *testing.T) {
		// A server with another CA's node certificate appends our CA
		// certificate (it is public): the fingerprint matches, the
		// signature does not.
		other := newTestCA(t, "a")
		forged := [][]byte{issueNodeChain(t, other, "n1")[0], ca.Cert.Raw}
		if _, err := VerifyServerChain(forged, fingerprint); err == nil || errors.Is(err, ErrFingerprintMismatch) {
			t.Fatalf("another CA's leaf with our CA appended: %v", err)
		}
	})
	t.Run("client certificate as a server", func(t *testing.T) {
		certPEM, _, _, err := ca.IssueClient("alice")
		if err != nil {
			t.Fatal(err)
		}
		clientChain := [][]byte{mustParse(t, certPEM).Raw, ca.Cert.Raw}
		if _, err := VerifyServerChain(clientChain, fingerprint); err == nil {
			t.Fatal("a client certificate verified as a server")
		}
	})
	t.Run("CA certificate as the leaf", func(t *testing.T) {
		if _, err := VerifyServerChain([][]byte{ca.Cert.Raw, ca.Cert.Raw}, fingerprint); err == nil {
			t.Fatal("the CA certificate verified as a node")
		}
	})
	t.Run("bad fingerprint", func(t *testing.T) {
		for _, bad := range []string{"", "abc", strings.Repeat("g", 64)} {
			if _, err := VerifyServerChain(chain, bad); err == nil {
				t.Fatalf("fingerprint %q accepted", bad)
			}
		}
	})
	t.Run("garbage", func(t *testing.T) {
		if _, err := VerifyServerChain([][]byte{[]byte("not DER"), ca.Cert.Raw}, fingerprint); err == nil {
			t.Fatal("garbage accepted")
		}
	})
}

// TestVerifyServerChainOverTLS runs the tls.Config that VerifyServerChain
// documents against a server presenting NodeTLSCertificate.
func TestVerifyServerChainOverTLS(t *testing.T) {
	ca := newTestCA(t, "a")
	certPEM, keyPEM, err := ca.IssueNode("n1", []net.IP{net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	certificate, err := NodeTLSCertificate(certPEM, keyPEM, ca.CertPEM)
	if err != nil {
		t.Fatal(err)
	}
	handshake := func(fingerprint string) error {
		server, client := net.Pipe()
		defer client.Close()
		go func() {
			defer server.Close()
			tls.Server(server, &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{certificate}}).Handshake()
		}()
		return tls.Client(client, &tls.Config{
			MinVersion:         tls.VersionTLS13,
			InsecureSkipVerify: true,
			VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
				_, err := VerifyServerChain(raw, fingerprint)
				return err
			},
		}).Handshake()
	}
	if err := handshake(ca.Fingerprint()); err != nil {
		t.Fatalf("handshake with the right fingerprint: %v", err)
	}
	if err := handshake(newTestCA(t, "a").Fingerprint()); !errors.Is(err, ErrFingerprintMismatch) {
		t.Fatalf("handshake with another fingerprint: %v", err)
	}
}

func TestNodeTLSCertificate(t *testing.T) {
	ca := newTestCA(t, "a")
	certPEM, keyPEM, err := ca.IssueNode("n1", nil)
	if err != nil {
		t.Fatal(err)
	}
	certificate, err := NodeTLSCertificate(certPEM, keyPEM, ca.CertPEM)
	if err != nil {
		t.Fatal(err)
	}
	if len(certificate.Certificate) != 2 || !slices.Equal(certificate.Certificate[1], ca.Cert.Raw) {
		t.Fatalf("chain of %d certificates, want the leaf then the CA", len(certificate.Certificate))
	}
	if _, err := NodeTLSCertificate(certPEM, keyPEM, newTestCA(t, "a").CertPEM); err == nil {
		t.Fatal("a node certificate was chained to a CA that did not issue it")
	}
	_, otherKey, err := ca.IssueNode("n1", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NodeTLSCertificate(certPEM, otherKey, ca.CertPEM); err == nil {
		t.Fatal("a certificate was paired with another key")
	}
	if _, err := NodeTLSCertificate(certPEM, keyPEM, certPEM); err == nil {
		t.Fatal("a node certificate was accepted as the CA")
	}
}

func TestIssueSession(t *testing.T) {
	ca, err := NewCA("test")
	if err != nil {
		t.Fatal(err)
	}
	tokenID := NewTokenID()
	for _, readOnly := range []bool{false, true} {
		certPEM, keyPEM, err := ca.IssueSession("token-admin", tokenID, readOnly)
		if err != nil {
			t.Fatal(err)
		}
		if len(keyPEM) == 0 {
			t.Fatal("no key")
		}
		cert := mustParse(t, certPEM)
		scope, ok := SessionAccess(cert)
		if !ok || scope.ReadOnly != readOnly || scope.TokenID != tokenID {
			t.Errorf("SessionAccess(read-only %v, token %s) = %+v, %v", readOnly, tokenID, scope, ok)
		}
		if _, ok := ClientName(cert); ok {
			t.Error("a session certificate passes as a named client")
		}
		if _, ok := NodeID(cert); ok {
			t.Error("a session certificate passes as a node")
		}
		if len(cert.ExtKeyUsage) != 1 || cert.ExtKeyUsage[0] != x509.ExtKeyUsageClientAuth {
			t.Errorf("session certificate key usage %v, want client only", cert.ExtKeyUsage)
		}
		if life := time.Until(cert.NotAfter); life > SessionValidity || life < SessionValidity-time.Minute {
			t.Errorf("session certificate valid for %v, want %v", life, SessionValidity)
		}
		if err := SessionSpanOK(cert); err != nil {
			t.Errorf("an issued session certificate: %v", err)
		}
	}
	if SessionValidity > 10*time.Minute {
		t.Errorf("session certificates live %v, at most 10 minutes", SessionValidity)
	}
	for _, bad := range []string{"", "not-hex", strings.Repeat("ab", 33)} {
		if _, _, err := ca.IssueSession("token-admin", bad, false); err == nil {
			t.Errorf("a session for token id %q was issued", bad)
		}
	}
	client, _, _, err := ca.IssueClient("vmhost")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := SessionAccess(mustParse(t, client)); ok {
		t.Error("a named client certificate passes as a session")
	}
	// A session certificate as herds before token ids issued it: a
	// session, with no token to check it against.
	old := &x509.Certificate{
		Subject:     pkix.Name{CommonName: "token-admin", OrganizationalUnit: []string{readOnlySessionUnit}},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	certPEM, _, _, err := ca.issue(old, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if scope, ok := SessionAccess(mustParse(t, certPEM)); !ok || scope.TokenID != "" || !scope.ReadOnly {
		t.Errorf("an older session certificate: %+v, %v; want a read-only session without a token id", scope, ok)
	}
}
