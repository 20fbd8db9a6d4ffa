// Package pki is the cluster's certificate authority: it issues the
// certificates nodes and clients prove themselves with, names what a
// certificate may do, checks chains for clients that know only the CA's
// fingerprint, and handles the tokens and files that carry secrets.
//
// What it guarantees:
//
//   - A node certificate (IssueNode) has organizational unit "herd-node",
//     the node id as common name, and may act as a TLS server and client.
//     A client certificate (IssueClient) has unit "herd-client" and may act
//     only as a TLS client: it never verifies as a server (VerifyServerChain
//     and every x509 check for ExtKeyUsageServerAuth refuse it), and
//     NodeID refuses it, so an operator's credential can never impersonate
//     a node.
//   - NodeID and ClientName read the certificate only: they mean something
//     once its chain has been verified against the cluster's CA.
//   - VerifyServerChain accepts a server only if its chain holds a CA
//     certificate with the given fingerprint and the leaf is a herd node
//     certificate that this CA signed for server use. Whoever lacks the
//     CA's private key cannot pass it, whatever address they answer on.
//   - A secret (a token's, a private key) is written only by
//     WriteSecretFile (mode 0600, durable once it returns) and read by
//     ReadSecretFile, which refuses a file others may read.
//
// Keys are ECDSA P-256; certificates carry random 128-bit serials. The CA
// signs leaves directly: there are no intermediates.
package pki

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"github.com/herd-storage/herd/internal/pki/pkiconst"
	"math/big"
	"net"
	"net/url"
	"strings"
	"time"
)

// Organizational units and names that say what a certificate is.
const (
	caUnit     = "herd-ca"
	nodeUnit   = "herd-node"
	clientUnit = "herd-client"
	// NodeDNSName is a DNS name every node certificate carries, for a
	// client that checks names and dials a node by address (libnbd and
	// QEMU check the IP SANs; a name gives them one to pin instead).
	NodeDNSName = "herd-node"
)

// Validity periods.
const (
	caValidity     = 10 * 365 * 24 * time.Hour
	nodeValidity   = 10 * 365 * 24 * time.Hour
	clientValidity = pkiconst.ClientValidity
	// backdate covers clocks behind the issuer's: a certificate issued
	// by a node whose clock runs ahead is still valid on the others.
	backdate = time.Hour
)

// ClientValidity is how long a client certificate is valid (at most
// until its CA's end).
const ClientValidity = clientValidity

// FingerprintLength is the length of Fingerprint's result.
const FingerprintLength = pkiconst.FingerprintLength

// CA is the cluster's certificate authority. Every node holds it, so any
// member can admit a joining node.
type CA struct {
	Cert    *x509.Certificate
	Key     crypto.Signer
	CertPEM []byte
	KeyPEM  []byte
}

// NewCA creates a self-signed CA named name, valid for 10 years.
func NewCA(name string) (*CA, error) {
	if name == "" {
		return nil, errors.New("pki: a CA needs a name")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("pki: generate CA key: %w", err)
	}
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	template := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: name, OrganizationalUnit: []string{caUnit}},
		NotBefore:             now.Add(-backdate),
		NotAfter:              now.Add(caValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		// Leaves only: a leaf can never sign another certificate that
		// chains to this CA.
		MaxPathLen:     0,
		MaxPathLenZero: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, template, template, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("pki: create CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("pki: parse the new CA certificate: %w", err)
	}
	keyPEM, err := encodeKey(key)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: cert, Key: key, CertPEM: encodeCert(der), KeyPEM: keyPEM}, nil
}

// ParseCA loads a CA from its PEM certificate and private key, checking
// that the certificate is a CA's and that the key is its key.
func ParseCA(certPEM, keyPEM []byte) (*CA, error) {
	cert, err := ParseCertificate(certPEM)
	if err != nil {
		return nil, err
	}
	if !cert.BasicConstraintsValid || !cert.IsCA || cert.KeyUsage&x509.KeyUsageCertSign == 0 {
		return nil, fmt.Errorf("pki: the certificate %q is not a CA certificate", cert.Subject.CommonName)
	}
	key, err := ParsePrivateKey(keyPEM)
	if err != nil {
		return nil, err
	}
	if !publicKeysEqual(cert.PublicKey, key.Public()) {
		return nil, fmt.Errorf("pki: the CA key does not belong to the CA certificate %q", cert.Subject.CommonName)
	}
	return &CA{Cert: cert, Key: key, CertPEM: bytes.Clone(certPEM), KeyPEM: bytes.Clone(keyPEM)}, nil
}

// ParseCACertificate is ParseCA without the key: a CA that verifies and
// cannot sign (Key is nil; the Issue methods refuse).
func ParseCACertificate(certPEM []byte) (*CA, error) {
	cert, err := ParseCertificate(certPEM)
	if err != nil {
		return nil, err
	}
	if !cert.BasicConstraintsValid || !cert.IsCA || cert.KeyUsage&x509.KeyUsageCertSign == 0 {
		return nil, fmt.Errorf("pki: the certificate %q is not a CA certificate", cert.Subject.CommonName)
	}
	return &CA{Cert: cert, CertPEM: bytes.Clone(certPEM)}, nil
}

// CanSign says whether the CA holds its key.
func (ca *CA) CanSign() bool { return ca.Key != nil }

// ErrNoCAKey: this CA has no key to sign with.
var ErrNoCAKey = errors.New("pki: this node does not hold the cluster CA's key")

// Fingerprint is the CA certificate's fingerprint (see Fingerprint).
func (ca *CA) Fingerprint() string { return Fingerprint(ca.Cert) }

// Pool is a certificate pool holding the CA alone: the roots to verify
// peers against.
func (ca *CA) Pool() *x509.CertPool {
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	return pool
}

// IssueNode issues a certificate for node nodeID, valid as a TLS server
// and client, for the addresses ips (clients such as QEMU and libnbd check
// the address they dialled against them) and the name NodeDNSName.
func (ca *CA) IssueNode(nodeID string, ips []net.IP) (certPEM, keyPEM []byte, err error) {
	if err := checkName("node id", nodeID); err != nil {
		return nil, nil, err
	}
	template := &x509.Certificate{
		Subject:     pkix.Name{CommonName: nodeID, OrganizationalUnit: []string{nodeUnit}},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses: ips,
		DNSNames:    []string{NodeDNSName},
	}
	certPEM, keyPEM, _, err = ca.issue(template, nodeValidity)
	return certPEM, keyPEM, err
}

// IssueClient issues a certificate for the client name (an operator, a
// program), valid as a TLS client only. serial (see Serial) identifies it,
// for instance to revoke it.
func (ca *CA) IssueClient(name string) (certPEM, keyPEM []byte, serial string, err error) {
	if err := checkName("client name", name); err != nil {
		return nil, nil, "", err
	}
	template := &x509.Certificate{
		Subject:     pkix.Name{CommonName: name, OrganizationalUnit: []string{clientUnit}},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	return ca.issue(template, clientValidity)
}

// Session certificates: short-lived NBD client certificates that the
// admin API issues to a holder of an admin token (herd vdi import and
// export use them). They carry their scope in their unit and the id of
// the token that asked for them (a URI "herd-token:ID"), and need no
// record in the log: a node accepts one only while that token is not
// revoked, at the open and at every revalidation of an open connection,
// and nobody accepts it after it expires.
const (
	sessionUnit         = "herd-session"
	readOnlySessionUnit = "herd-session-read-only"
	sessionTokenScheme  = "herd-token"
	// SessionValidity is how long a session certificate is valid: long
	// enough to connect (a transfer opens its connections at its start;
	// an open connection outlives its certificate), short enough that a
	// copy left behind is soon worthless.
	SessionValidity = 10 * time.Minute
)

// SessionScope is what a session certificate allows.
type SessionScope struct {
	// TokenID is the id of the admin token the certificate was issued
	// to; empty in a certificate from a herd that did not record it.
	TokenID  string
	ReadOnly bool
}

// IssueSession issues a session certificate named name (client use only)
// for the admin token tokenID.
func (ca *CA) IssueSession(name, tokenID string, readOnly bool) (certPEM, keyPEM []byte, err error) {
	if err := checkName("session name", name); err != nil {
		return nil, nil, err
	}
	if !validTokenID(tokenID) {
		return nil, nil, fmt.Errorf("pki: session for token id %q: want 1 to 64 hex digits", tokenID)
	}
	unit := sessionUnit
	if readOnly {
		unit = readOnlySessionUnit
	}
	template := &x509.Certificate{
		Subject:     pkix.Name{CommonName: name, OrganizationalUnit: []string{unit}},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		URIs:        []*url.URL{{Scheme: sessionTokenScheme, Opaque: tokenID}},
	}
	certPEM, keyPEM, _, err = ca.issue(template, SessionValidity)
	return certPEM, keyPEM, err
}

// MaxSessionSpan is the longest span (NotAfter minus NotBefore) of a
// session certificate a herd issues: SessionValidity, the backdate for
// clocks behind the issuer's, and a minute of slack. A longer one was
// not issued by a node (it was minted with a copy of the CA key), and
// nodes refuse it (SessionSpanOK).
const MaxSessionSpan = SessionValidity + backdate + time.Minute

// SessionSpanOK reports whether cert's validity span is at most
// MaxSessionSpan, with the error to give if not.
func SessionSpanOK(cert *x509.Certificate) error {
	if span := cert.NotAfter.Sub(cert.NotBefore); span > MaxSessionSpan {
		return fmt.Errorf("a session certificate valid for %v, longer than any herd issues (%v): not issued by a node", span.Round(time.Minute), MaxSessionSpan)
	}
	return nil
}

// SessionAccess reports whether cert is a session certificate, and what
// it allows. Like NodeID it reads the certificate only.
func SessionAccess(cert *x509.Certificate) (SessionScope, bool) {
	var scope SessionScope
	if _, ok := subjectOf(cert, sessionUnit); ok {
		scope.ReadOnly = false
	} else if _, ok := subjectOf(cert, readOnlySessionUnit); ok {
		scope.ReadOnly = true
	} else {
		return SessionScope{}, false
	}
	for _, uri := range cert.URIs {
		if uri.Scheme != sessionTokenScheme {
			continue
		}
		if scope.TokenID != "" || !validTokenID(uri.Opaque) {
			return SessionScope{ReadOnly: scope.ReadOnly}, true // two ids, or a malformed one: none
		}
		scope.TokenID = uri.Opaque
	}
	return scope, true
}

func validTokenID(id string) bool {
	if id == "" || len(id) > 64 {
		return false
	}
	_, err := hex.DecodeString(id)
	return err == nil
}

// issue completes template with a new key, a serial and validity, signs
// it, and returns the PEMs and the serial.
func (ca *CA) issue(template *x509.Certificate, validity time.Duration) (certPEM, keyPEM []byte, serial string, err error) {
	if ca.Key == nil {
		return nil, nil, "", ErrNoCAKey
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, "", fmt.Errorf("pki: generate key: %w", err)
	}
	if template.SerialNumber, err = newSerial(); err != nil {
		return nil, nil, "", err
	}
	now := time.Now()
	template.NotBefore = now.Add(-backdate)
	template.NotAfter = now.Add(validity)
	// A leaf never outlives its CA: past the CA's end it could not be
	// verified anyway, and a date that says otherwise misleads.
	if template.NotAfter.After(ca.Cert.NotAfter) {
		template.NotAfter = ca.Cert.NotAfter
	}
	template.BasicConstraintsValid = true
	der, err := x509.CreateCertificate(rand.Reader, template, ca.Cert, key.Public(), ca.Key)
	if err != nil {
		return nil, nil, "", fmt.Errorf("pki: sign certificate for %q: %w", template.Subject.CommonName, err)
	}
	if keyPEM, err = encodeKey(key); err != nil {
		return nil, nil, "", err
	}
	return encodeCert(der), keyPEM, hex.EncodeToString(template.SerialNumber.Bytes()), nil
}

// checkName refuses names that cannot identify anything, or that a log
// line or a subject would render misleadingly.
func checkName(what, name string) error {
	if name == "" {
		return fmt.Errorf("pki: empty %s", what)
	}
	if len(name) > 64 {
		return fmt.Errorf("pki: %s %q is longer than 64 bytes", what, name)
	}
	for _, c := range name {
		if c < 0x20 || c == 0x7f {
			return fmt.Errorf("pki: %s %q holds a control character", what, name)
		}
	}
	return nil
}

func newSerial() (*big.Int, error) {
	for {
		serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
		if err != nil {
			return nil, fmt.Errorf("pki: serial: %w", err)
		}
		if serial.Sign() > 0 { // RFC 5280 4.1.2.2: positive
			return serial, nil
		}
	}
}

// Fingerprint is the lowercase hex SHA-256 of the certificate's DER: 64
// characters.
func Fingerprint(cert *x509.Certificate) string {
	sum := sha256.Sum256(cert.Raw)
	return hex.EncodeToString(sum[:])
}

// NodeID returns the node id of a herd node certificate; false for any
// other certificate (a client's, the CA's).
func NodeID(cert *x509.Certificate) (string, bool) {
	return subjectOf(cert, nodeUnit)
}

// ClientName returns the name of a herd client certificate; false for any
// other certificate.
func ClientName(cert *x509.Certificate) (string, bool) {
	return subjectOf(cert, clientUnit)
}

func subjectOf(cert *x509.Certificate, unit string) (string, bool) {
	if cert == nil || cert.IsCA || cert.Subject.CommonName == "" {
		return "", false
	}
	units := cert.Subject.OrganizationalUnit
	if len(units) != 1 || units[0] != unit {
		return "", false
	}
	return cert.Subject.CommonName, true
}

// Serial is the certificate's serial number in lowercase hex, as
// IssueClient returns it.
func Serial(cert *x509.Certificate) string {
	return hex.EncodeToString(cert.SerialNumber.Bytes())
}

// VerifyServerChain checks the certificates a TLS server presented
// (rawCerts, leaf first) for a client that knows only the cluster CA's
// fingerprint, such as the CLI or a joining node: the chain must hold a CA
// certificate whose Fingerprint is fingerprint, and the leaf must verify
// against that CA for server use and be a herd node certificate. Host
// names and addresses are not checked: the CA signs only herd nodes, and
// any of them may answer on any address. It returns the leaf.
//
// Use it as
//
//	&tls.Config{InsecureSkipVerify: true, VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
//		_, err := pki.VerifyServerChain(raw, fingerprint)
//		return err
//	}}
//
// InsecureSkipVerify only turns off crypto/tls's own check against the
// system roots and the host name; VerifyPeerCertificate still runs before
// the handshake completes, and TLS 1.3 has the server sign the handshake
// with the leaf's key (CertificateVerify, RFC 8446 4.4.3), so a server
// that passes holds a key the pinned CA certified. Nothing is sent to the
// server before that.
func VerifyServerChain(rawCerts [][]byte, fingerprint string) (*x509.Certificate, error) {
	fingerprint = strings.ToLower(fingerprint)
	if err := checkFingerprint(fingerprint); err != nil {
		return nil, fmt.Errorf("pki: %w", err)
	}
	if len(rawCerts) == 0 {
		return nil, errors.New("pki: the server sent no certificate")
	}
	certs := make([]*x509.Certificate, len(rawCerts))
	for i, raw := range rawCerts {
		cert, err := x509.ParseCertificate(raw)
		if err != nil {
			return nil, fmt.Errorf("pki: the server's certificate %d does not parse: %w", i, err)
		}
		certs[i] = cert
	}
	leaf := certs[0]
	var ca *x509.Certificate
	var presented []string
	for _, cert := range certs[1:] {
		if !cert.IsCA {
			continue
		}
		presented = append(presented, Fingerprint(cert))
		if Fingerprint(cert) == fingerprint {
			ca = cert
		}
	}
	if ca == nil {
		if len(presented) == 0 {
			return nil, fmt.Errorf("%w: the server sent no CA certificate, the token names CA %s", ErrFingerprintMismatch, fingerprint)
		}
		return nil, fmt.Errorf("%w: the server presents CA %s, the token names CA %s (another cluster, or a machine in between)", ErrFingerprintMismatch, strings.Join(presented, ", "), fingerprint)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		return nil, fmt.Errorf("pki: the server's certificate does not verify against CA %s: %w", fingerprint, err)
	}
	if _, ok := NodeID(leaf); !ok {
		return nil, fmt.Errorf("%w: the server's certificate is %q (%v)", ErrNotNode, leaf.Subject.CommonName, leaf.Subject.OrganizationalUnit)
	}
	return leaf, nil
}

// NodeTLSCertificate builds the TLS certificate a node presents: its leaf,
// then the CA certificate, so that a client knowing only the CA's
// fingerprint can verify it (VerifyServerChain).
func NodeTLSCertificate(certPEM, keyPEM, caPEM []byte) (tls.Certificate, error) {
	certificate, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("pki: node certificate and key: %w", err)
	}
	ca, err := ParseCertificate(caPEM)
	if err != nil {
		return tls.Certificate{}, err
	}
	if !ca.IsCA {
		return tls.Certificate{}, fmt.Errorf("pki: %q is not a CA certificate", ca.Subject.CommonName)
	}
	if err := certificate.Leaf.CheckSignatureFrom(ca); err != nil {
		return tls.Certificate{}, fmt.Errorf("pki: the node certificate %q was not issued by CA %q: %w", certificate.Leaf.Subject.CommonName, ca.Subject.CommonName, err)
	}
	certificate.Certificate = append(certificate.Certificate[:1:1], ca.Raw)
	return certificate, nil
}

// TLSCertificate is NodeTLSCertificate with this CA's certificate.
func (ca *CA) TLSCertificate(certPEM, keyPEM []byte) (tls.Certificate, error) {
	return NodeTLSCertificate(certPEM, keyPEM, ca.CertPEM)
}

// ParseCertificate decodes the first CERTIFICATE block of a PEM input.
func ParseCertificate(certPEM []byte) (*x509.Certificate, error) {
	rest := certPEM
	for {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			return nil, fmt.Errorf("%w: no CERTIFICATE block", ErrBadPEM)
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("%w: certificate: %v", ErrBadPEM, err)
		}
		return cert, nil
	}
}

// ParsePrivateKey decodes a PEM private key (PKCS #8, or SEC 1 EC).
func ParsePrivateKey(keyPEM []byte) (crypto.Signer, error) {
	rest := keyPEM
	for {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			return nil, fmt.Errorf("%w: no PRIVATE KEY block", ErrBadPEM)
		}
		switch block.Type {
		case "PRIVATE KEY":
			key, err := x509.ParsePKCS8PrivateKey(block.Bytes)
			if err != nil {
				return nil, fmt.Errorf("%w: private key: %v", ErrBadPEM, err)
			}
			signer, ok := key.(crypto.Signer)
			if !ok {
				return nil, fmt.Errorf("%w: a %T cannot sign", ErrBadPEM, key)
			}
			return signer, nil
		case "EC PRIVATE KEY":
			key, err := x509.ParseECPrivateKey(block.Bytes)
			if err != nil {
				return nil, fmt.Errorf("%w: private key: %v", ErrBadPEM, err)
			}
			return key, nil
		}
	}
}

func encodeCert(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func encodeKey(key crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("pki: encode key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

func publicKeysEqual(a, b crypto.PublicKey) bool {
	comparable, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && comparable.Equal(b)
}
