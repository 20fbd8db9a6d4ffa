// Package peer owns the node-to-node TCP port (7000 by default): mutual
// TLS 1.3 with certificates from the cluster's CA, then a greeting naming
// the protocol the connection carries (the raft log, the object protocol,
// forwarded log commands, a join), so one port serves them all.
//
// What it guarantees: a connection reaches raft, the store or the leader's
// log only if the other side holds a key the cluster CA certified as a
// herd node's (pki.IssueNode) and Credentials.Allowed accepts its node id;
// the dialer checks the same of the server. A connection without a
// certificate may only ask to join, and a joining node sends its join
// secret only to a server whose chain verifies against the CA fingerprint
// of its join token (RequestJoin).
//
// Connection (all integers big-endian):
//
//  1. TLS 1.3 handshake (RFC 8446). The server requests a client
//     certificate and verifies one if given (tls.VerifyClientCertIfGiven);
//     the client verifies the server's chain against the CA itself, since
//     peers are dialled by address and host names mean nothing here.
//  2. client -> server: "HERDPEER" version(1) protocol(1)
//  3. server -> client: status(1): 0 accepted, else a refusal code
//     (status* below) that the dialer turns into the matching error.
//
// Steps 1 to 3 must end within HandshakeTimeout. Then the protocol's own
// bytes follow on the same TLS connection; ProtocolJoin's are in join.go.
//
// Version 1 was an HMAC challenge keyed by a shared cluster token, in
// clear: a version-1 node fails at step 1 against this one.
package peer

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/herd-storage/herd/internal/pki"
	"github.com/herd-storage/herd/internal/tlsbatch"
)

// Protocol numbers carried on the peer port.
type Protocol byte

const (
	ProtocolRaft    Protocol = 1
	ProtocolObject  Protocol = 2
	ProtocolForward Protocol = 3 // log commands from followers to the leader
	ProtocolJoin    Protocol = 4 // a new node asks for its certificate (join.go)
)

const (
	magic        = "HERDPEER"
	version      = 2
	greetingSize = len(magic) + 2
	// HandshakeTimeout bounds the TLS handshake and the greeting together.
	HandshakeTimeout = 5 * time.Second
)

// Status codes of step 3.
const (
	statusAccepted            = 0
	statusNotNode             = 1 // a certificate of the cluster, not a node's
	statusNodeRemoved         = 2 // Allowed refused the node id
	statusUnknownProtocol     = 3
	statusCertificateRequired = 4 // no certificate, and not ProtocolJoin
	statusVersion             = 5
	statusJoinClosed          = 6 // ProtocolJoin, and no join handler
)

// statusErrors maps a refusal code to the dialer's error and what it
// means from the dialer's side.
var statusErrors = map[byte]struct {
	err    error
	reason string
}{
	statusNotNode:             {ErrNotNode, "our certificate is not a node's"},
	statusNodeRemoved:         {ErrNodeRemoved, "it does not accept our node id (removed from the cluster?)"},
	statusUnknownProtocol:     {ErrUnknownProto, "it does not serve that protocol"},
	statusCertificateRequired: {ErrCertificateRequired, "it needs a node certificate for that protocol"},
	statusVersion:             {ErrVersion, "it speaks another version of the peer protocol"},
	statusJoinClosed:          {ErrJoinClosed, "it does not admit joining nodes"},
}

// Credentials are what a node proves itself with on the peer port and
// checks the others against. One value may be shared by any number of
// listeners and dials at once; do not modify it after first use.
type Credentials struct {
	// Certificate is the node's certificate and key, followed by the CA
	// certificate (pki.NodeTLSCertificate), so that a client knowing only
	// the CA's fingerprint can verify this node.
	Certificate tls.Certificate
	// CA holds the cluster's CA certificate: the roots both directions
	// verify against.
	CA *x509.CertPool
	// Allowed, if not nil, is asked about the node id and certificate
	// serial (pki.Serial) of every verified peer, on both sides, and
	// refuses it by returning an error (a node removed from the cluster
	// for good, one never admitted, a certificate the log does not
	// name). It may be called concurrently.
	Allowed func(nodeID, serial string) error
	// AllowedUnder, if not nil, is asked in place of Allowed, with the
	// fingerprint of the CA the certificate verified against (during a
	// CA rotation two are trusted).
	AllowedUnder func(nodeID, serial, caFingerprint string) error
	// Source, if not nil, gives at each handshake the certificate to
	// present and the CAs to trust, in place of Certificate and CA: they
	// change while the node runs (a CA rotation, server/trust.go).
	Source Source
}

// Source is what a node presents and trusts on the peer port, read at
// each handshake.
type Source interface {
	// Roots are the CAs a peer's certificate must verify against.
	Roots() *x509.CertPool
	// ServerCertificate is the certificate (leaf, then its CA) to
	// present to a client that sent serverName (pki.CAHint names the CA
	// it wants the node's certificate under).
	ServerCertificate(serverName string) *tls.Certificate
	// ClientCertificate is the certificate to present to a server that
	// accepts certificates of the CAs whose subjects (DER) are given
	// (nil: any this node trusts).
	ClientCertificate(acceptable [][]byte) *tls.Certificate
	// Hint is the server name a dialer sends (pki.CAHint).
	Hint() string
}

// roots are the CAs to verify peers against now.
func (c *Credentials) roots() *x509.CertPool {
	if c.Source != nil {
		return c.Source.Roots()
	}
	return c.CA
}

// Leaf is the certificate the node presents to a server that accepts
// every CA it trusts.
func (c *Credentials) Leaf() *x509.Certificate {
	if c.Source != nil {
		if certificate := c.Source.ClientCertificate(nil); certificate != nil {
			return certificate.Leaf
		}
	}
	return c.Certificate.Leaf
}

// allow asks AllowedUnder, or Allowed, about a verified peer.
func (c *Credentials) allow(nodeID, serial, ca string) error {
	switch {
	case c.AllowedUnder != nil:
		return c.AllowedUnder(nodeID, serial, ca)
	case c.Allowed != nil:
		return c.Allowed(nodeID, serial)
	}
	return nil
}

// NewCredentials builds Credentials from PEM: the node's certificate and
// key, and the CA certificate.
func NewCredentials(certPEM, keyPEM, caPEM []byte, allowed func(nodeID, serial string) error) (*Credentials, error) {
	certificate, err := pki.NodeTLSCertificate(certPEM, keyPEM, caPEM)
	if err != nil {
		return nil, err
	}
	ca, err := pki.ParseCertificate(caPEM)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	return &Credentials{Certificate: certificate, CA: pool, Allowed: allowed}, nil
}

func (c *Credentials) check() error {
	if c != nil && c.Source != nil {
		return nil
	}
	if c == nil || c.CA == nil || len(c.Certificate.Certificate) == 0 || c.Certificate.PrivateKey == nil {
		return ErrNoCredentials
	}
	return nil
}

// verifyNode checks a peer's certificates (leaf first) for usage: the leaf
// must be signed by a CA in c.CA, be a herd node's and pass Allowed. It
// returns the node id.
func (c *Credentials) verifyNode(certs []*x509.Certificate, usage x509.ExtKeyUsage) (string, error) {
	if len(certs) == 0 {
		return "", fmt.Errorf("%w: no certificate", ErrWrongCluster)
	}
	leaf := certs[0]
	// No intermediates: the CA signs leaves directly (pki).
	chains, err := leaf.Verify(x509.VerifyOptions{Roots: c.roots(), KeyUsages: []x509.ExtKeyUsage{usage}})
	if err != nil {
		var invalid x509.CertificateInvalidError
		if errors.As(err, &invalid) && invalid.Reason == x509.IncompatibleUsage {
			return "", fmt.Errorf("%w: certificate %q may not be used for this (%v)", ErrNotNode, leaf.Subject.CommonName, err)
		}
		return "", fmt.Errorf("%w: %v", ErrWrongCluster, err)
	}
	id, ok := pki.NodeID(leaf)
	if !ok {
		return "", fmt.Errorf("%w: certificate %q %v", ErrNotNode, leaf.Subject.CommonName, leaf.Subject.OrganizationalUnit)
	}
	chain := chains[0]
	if err := c.allow(id, pki.Serial(leaf), pki.Fingerprint(chain[len(chain)-1])); err != nil {
		return "", fmt.Errorf("%w: node %s: %v", ErrNodeRemoved, id, err)
	}
	return id, nil
}

// serverConfig is the listener's TLS configuration.
func (c *Credentials) serverConfig() *tls.Config {
	if c.Source != nil {
		return &tls.Config{
			MinVersion: tls.VersionTLS13,
			GetConfigForClient: func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
				config := c.staticServerConfig()
				config.Certificates = []tls.Certificate{*c.Source.ServerCertificate(hello.ServerName)}
				config.ClientCAs = c.Source.Roots()
				return config, nil
			},
		}
	}
	return c.staticServerConfig()
}

func (c *Credentials) staticServerConfig() *tls.Config {
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{c.Certificate},
		// A certificate, if given, must chain to the CA (crypto/tls
		// checks it, for client use); none is allowed only so that a
		// joining node can reach the join protocol, and admit lets such
		// a connection do nothing else.
		ClientAuth: tls.VerifyClientCertIfGiven,
		ClientCAs:  c.CA,
		// Peers do not resume sessions: every connection proves its
		// certificate afresh, so Allowed sees every one.
		SessionTicketsDisabled: true,
		// Peer connections are long and carry bulk data: full records
		// from the first byte.
		DynamicRecordSizingDisabled: true,
	}
}

// clientConfig is a dialer's TLS configuration: it presents c's
// certificate and verifies the server as a herd node of c's CA.
func (c *Credentials) clientConfig() *tls.Config {
	config := &tls.Config{
		MinVersion: tls.VersionTLS13,
		// Always present the certificate: crypto/tls would otherwise
		// send none when the server's list of acceptable CAs does not
		// name ours, and the refusal would read "certificate required"
		// instead of a certificate from another cluster.
		GetClientCertificate: func(info *tls.CertificateRequestInfo) (*tls.Certificate, error) {
			if c.Source != nil {
				return c.Source.ClientCertificate(info.AcceptableCAs), nil
			}
			return &c.Certificate, nil
		},
		// InsecureSkipVerify turns off crypto/tls's check against the
		// system roots and the host name only; VerifyConnection checks
		// the chain against the cluster CA during the handshake, before
		// anything is sent. Peers are dialled by address, and any node
		// the CA certified may answer on any address.
		InsecureSkipVerify: true,
		VerifyConnection: func(state tls.ConnectionState) error {
			_, err := c.verifyNode(state.PeerCertificates, x509.ExtKeyUsageServerAuth)
			return err
		},
		DynamicRecordSizingDisabled: true,
	}
	if c.Source != nil {
		config.ServerName = c.Source.Hint()
	}
	return config
}

// peerIdentity is what the TLS handshake proved about the client.
type peerIdentity struct {
	certified bool   // it presented a certificate that chains to the CA
	node      string // the node id, if that certificate is a node's
	serial    string // the certificate's serial (pki.Serial)
	ca        string // the fingerprint of the CA it verified against
}

func identify(state tls.ConnectionState) peerIdentity {
	if len(state.VerifiedChains) == 0 || len(state.PeerCertificates) == 0 {
		return peerIdentity{}
	}
	node, _ := pki.NodeID(state.PeerCertificates[0])
	chain := state.VerifiedChains[0]
	return peerIdentity{certified: true, node: node, serial: pki.Serial(state.PeerCertificates[0]), ca: pki.Fingerprint(chain[len(chain)-1])}
}

// admit reads a client's greeting (step 2) from conn and answers it (step
// 3). A peer protocol needs a node certificate whose id allowed accepts
// (nil accepts all) and that offered serves; ProtocolJoin needs nothing
// but offered, since the join protocol authenticates by its secret. Bytes
// that are not a greeting get no answer; every other refusal gets its
// code. It returns the protocol admitted, or why not.
func admit(conn io.ReadWriter, identity peerIdentity, allowed func(string, string) error, offered func(Protocol) bool) (Protocol, error) {
	var greeting [greetingSize]byte
	if _, err := io.ReadFull(conn, greeting[:]); err != nil {
		return 0, fmt.Errorf("%w: incomplete greeting (%v)", ErrNotHerd, err)
	}
	if string(greeting[:len(magic)]) != magic {
		return 0, fmt.Errorf("%w: bad greeting %q", ErrNotHerd, printable(greeting[:len(magic)]))
	}
	protocol := Protocol(greeting[len(magic)+1])
	refuse := func(status byte, err error) (Protocol, error) {
		conn.Write([]byte{status}) // best effort: the connection is closed next
		return 0, err
	}
	if v := greeting[len(magic)]; v != version {
		return refuse(statusVersion, fmt.Errorf("%w: client speaks version %d, we speak %d", ErrVersion, v, version))
	}
	switch {
	case protocol == ProtocolJoin:
		if !offered(ProtocolJoin) {
			return refuse(statusJoinClosed, ErrJoinClosed)
		}
	case !identity.certified:
		return refuse(statusCertificateRequired, fmt.Errorf("%w: no certificate, asked for protocol %d", ErrCertificateRequired, protocol))
	case identity.node == "":
		return refuse(statusNotNode, fmt.Errorf("%w: a certificate that is not a node's asked for protocol %d", ErrNotNode, protocol))
	default:
		if allowed != nil {
			if err := allowed(identity.node, identity.serial); err != nil {
				return refuse(statusNodeRemoved, fmt.Errorf("%w: node %s: %v", ErrNodeRemoved, identity.node, err))
			}
		}
		if !offered(protocol) {
			return refuse(statusUnknownProtocol, fmt.Errorf("%w %d", ErrUnknownProto, protocol))
		}
	}
	if _, err := conn.Write([]byte{statusAccepted}); err != nil {
		return 0, err
	}
	return protocol, nil
}

// clientHandshake runs steps 1 to 3 as the client on raw, which it closes
// on failure.
func clientHandshake(ctx context.Context, raw net.Conn, config *tls.Config, protocol Protocol) (*tls.Conn, error) {
	address := raw.RemoteAddr().String()
	deadline := time.Now().Add(HandshakeTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	raw.SetDeadline(deadline)
	// ctx ending interrupts the greeting too, not only the TLS handshake.
	stop := context.AfterFunc(ctx, func() { raw.SetDeadline(time.Now()) })
	conn := tls.Client(tlsbatch.Wrap(raw), config)
	fail := func(err error) (*tls.Conn, error) {
		stop()
		raw.Close()
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (%w)", err, ctx.Err())
		}
		return nil, err
	}
	if err := conn.HandshakeContext(ctx); err != nil {
		return fail(handshakeError(address, err))
	}
	greeting := append([]byte(magic), version, byte(protocol))
	if _, err := conn.Write(greeting); err != nil {
		return fail(handshakeError(address, err))
	}
	var status [1]byte
	if _, err := io.ReadFull(conn, status[:]); err != nil {
		return fail(handshakeError(address, err))
	}
	if status[0] != statusAccepted {
		if refusal, ok := statusErrors[status[0]]; ok {
			return fail(fmt.Errorf("%w: %s refused protocol %d: %s", refusal.err, address, protocol, refusal.reason))
		}
		return fail(fmt.Errorf("%w: %s answered status %d", ErrNotHerd, address, status[0]))
	}
	if !stop() { // ctx ended: its deadline may be set on raw already
		return fail(fmt.Errorf("peer: handshake with %s: %w", address, ctx.Err()))
	}
	raw.SetDeadline(time.Time{})
	return conn, nil
}

// handshakeError explains a failure of the TLS handshake or of the
// greeting on the dialer's side.
func handshakeError(address string, err error) error {
	var header tls.RecordHeaderError
	var operation *net.OpError
	switch {
	case errors.Is(err, ErrWrongCluster), errors.Is(err, ErrNotNode), errors.Is(err, ErrNodeRemoved):
		// Our own verification of the server (VerifyConnection).
		return fmt.Errorf("%w (server %s)", err, address)
	case errors.As(err, &header):
		return fmt.Errorf("%w: %s does not speak TLS (%v)", ErrNotHerd, address, err)
	case errors.As(err, &operation) && operation.Op == "remote error":
		// A TLS alert from the server: in TLS 1.3 it checks our
		// certificate after our side of the handshake is done, so its
		// refusal arrives on the first read.
		return fmt.Errorf("%w by %s (%v): is this node's certificate from another cluster's CA, or expired?", ErrCertificateRefused, address, err)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return fmt.Errorf("%w: %s closed the connection during the handshake", ErrNotHerd, address)
	}
	return fmt.Errorf("peer: handshake with %s: %w", address, err)
}

// RemoteNode returns the node id a connection accepted from a
// SubListener proved: the client's verified node certificate. False for
// any other connection.
func RemoteNode(conn net.Conn) (string, bool) {
	t, ok := conn.(*tls.Conn)
	if !ok {
		return "", false
	}
	state := t.ConnectionState()
	if !state.HandshakeComplete || len(state.VerifiedChains) == 0 {
		return "", false
	}
	return pki.NodeID(state.VerifiedChains[0][0])
}

func printable(b []byte) string {
	out := make([]byte, len(b))
	for i, c := range b {
		if c < 32 || c > 126 {
			c = '.'
		}
		out[i] = c
	}
	return string(out)
}
