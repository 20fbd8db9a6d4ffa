package peer

import "errors"

// Errors of the peer port's handshake and join protocol. The dialer's
// error wraps one of them and names the address; a refusal the server
// explains (a status byte) arrives as the matching sentinel.
var (
	// ErrNotHerd: the other side does not speak the peer protocol (not
	// TLS, or not herd's greeting).
	ErrNotHerd = errors.New("peer: not a herd peer")
	// ErrVersion: the other side speaks another version of the greeting.
	ErrVersion = errors.New("peer: unsupported protocol version")
	// ErrUnknownProto: the server does not serve the protocol asked for.
	ErrUnknownProto = errors.New("peer: unknown protocol")
	// ErrWrongCluster: the other side's certificate does not chain to our
	// cluster's CA (another cluster, or no cluster at all).
	ErrWrongCluster = errors.New("peer: certificate from another cluster")
	// ErrCertificateRefused: the server refused our certificate during
	// TLS (it is from another CA, or expired).
	ErrCertificateRefused = errors.New("peer: our certificate was refused")
	// ErrNotNode: a certificate of the cluster that is not a node's (an
	// operator's client certificate) asked for a node-to-node protocol.
	ErrNotNode = errors.New("peer: not a herd node")
	// ErrNodeRemoved: Credentials.Allowed refused the node: it was removed
	// from the cluster.
	ErrNodeRemoved = errors.New("peer: node removed from the cluster")
	// ErrCertificateRequired: a connection without a certificate asked for
	// a protocol other than ProtocolJoin.
	ErrCertificateRequired = errors.New("peer: a node certificate is required")
	// ErrJoinClosed: the node does not admit joining nodes (no handler).
	ErrJoinClosed = errors.New("peer: this node does not admit joining nodes")
	// ErrJoinRefused: the join handler refused; the error carries its
	// reason (for instance a wrong join secret).
	ErrJoinRefused = errors.New("peer: join refused")
	// ErrJoinNotReady: the member cannot decide a join yet (it does not
	// know the cluster's join secret: the cluster is starting, or the
	// member has not caught up with the log). A join handler returns it
	// (wrapped, with its reason); the joining node receives it, not
	// ErrJoinRefused, and asks again later.
	ErrJoinNotReady = errors.New("peer: the member cannot admit nodes yet")
	// ErrNoCredentials: Listen or Dial without a certificate and CA.
	ErrNoCredentials = errors.New("peer: no credentials")
	// ErrListenerClose: the peer port or the protocol's sub-listener was
	// closed.
	ErrListenerClose = errors.New("peer: listener closed")
)
