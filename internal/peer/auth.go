// Package peer owns the node-to-node TCP port (7000 by default). Every
// connection starts with a mutual challenge-response handshake keyed by the
// cluster's secret, then names the protocol it carries (the raft log now,
// the object protocol later), so one port serves them all and nothing
// reaches raft or the store from a process without the secret.
//
// Handshake (all integers big-endian):
//
//	client -> server: "HERDPEER" version(1) protocol(1) client-nonce(32)
//	server -> client: "HERDPEER" version(1) server-nonce(32) HMAC(key, "server"|cn|sn)(32)
//	client -> server: HMAC(key, "client"|cn|sn|protocol)(32)
//	server -> client: status(1)  0 = accepted, 1 = refused
//
// The key is derived from the cluster token; each side proves it holds it
// without sending it, and the nonces make every proof single-use.
package peer

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"time"
)

// Protocol numbers carried on the peer port.
type Protocol byte

const (
	ProtocolRaft    Protocol = 1
	ProtocolObject  Protocol = 2
	ProtocolForward Protocol = 3 // log commands from followers to the leader
)

const (
	magic            = "HERDPEER"
	version          = 1
	nonceSize        = 32
	macSize          = sha256.Size
	HandshakeTimeout = 5 * time.Second
)

var (
	ErrNotHerd       = errors.New("peer: not a herd peer")
	ErrWrongToken    = errors.New("peer: wrong cluster token")
	ErrVersion       = errors.New("peer: unsupported protocol version")
	ErrUnknownProto  = errors.New("peer: unknown protocol")
	ErrListenerClose = errors.New("peer: listener closed")
)

// Key derives the handshake key from the cluster token.
func Key(token string) []byte {
	sum := sha256.Sum256([]byte("herd peer key v1\x00" + token))
	return sum[:]
}

func mac(key []byte, parts ...[]byte) []byte {
	h := hmac.New(sha256.New, key)
	for _, p := range parts {
		h.Write(p)
	}
	return h.Sum(nil)
}

// ClientHandshake authenticates conn as a client asking for protocol.
func ClientHandshake(conn net.Conn, key []byte, protocol Protocol) error {
	conn.SetDeadline(time.Now().Add(HandshakeTimeout))
	defer conn.SetDeadline(time.Time{})
	clientNonce := make([]byte, nonceSize)
	rand.Read(clientNonce)
	hello := append([]byte(magic), version, byte(protocol))
	hello = append(hello, clientNonce...)
	if _, err := conn.Write(hello); err != nil {
		return fmt.Errorf("peer: handshake with %s: %w", conn.RemoteAddr(), err)
	}
	reply := make([]byte, len(magic)+1+nonceSize+macSize)
	if _, err := io.ReadFull(conn, reply); err != nil {
		return fmt.Errorf("%w: %s did not answer the handshake (%v)", ErrNotHerd, conn.RemoteAddr(), err)
	}
	if string(reply[:len(magic)]) != magic {
		return fmt.Errorf("%w: %s answered with something else", ErrNotHerd, conn.RemoteAddr())
	}
	if reply[len(magic)] != version {
		return fmt.Errorf("%w: %s speaks version %d, we speak %d", ErrVersion, conn.RemoteAddr(), reply[len(magic)], version)
	}
	serverNonce := reply[len(magic)+1 : len(magic)+1+nonceSize]
	serverMAC := reply[len(magic)+1+nonceSize:]
	if !hmac.Equal(serverMAC, mac(key, []byte("server"), clientNonce, serverNonce)) {
		return fmt.Errorf("%w: %s belongs to a cluster with another token", ErrWrongToken, conn.RemoteAddr())
	}
	if _, err := conn.Write(mac(key, []byte("client"), clientNonce, serverNonce, []byte{byte(protocol)})); err != nil {
		return fmt.Errorf("peer: handshake with %s: %w", conn.RemoteAddr(), err)
	}
	status := []byte{0}
	if _, err := io.ReadFull(conn, status); err != nil {
		return fmt.Errorf("peer: handshake with %s: %w", conn.RemoteAddr(), err)
	}
	if status[0] != 0 {
		return fmt.Errorf("%w: %s refused us", ErrWrongToken, conn.RemoteAddr())
	}
	return nil
}

// ServerHandshake authenticates a client on conn and returns the protocol
// it asked for.
func ServerHandshake(conn net.Conn, key []byte) (Protocol, error) {
	conn.SetDeadline(time.Now().Add(HandshakeTimeout))
	defer conn.SetDeadline(time.Time{})
	hello := make([]byte, len(magic)+2+nonceSize)
	if _, err := io.ReadFull(conn, hello); err != nil {
		return 0, fmt.Errorf("%w: incomplete greeting (%v)", ErrNotHerd, err)
	}
	if string(hello[:len(magic)]) != magic {
		return 0, fmt.Errorf("%w: bad greeting %q", ErrNotHerd, printable(hello[:len(magic)]))
	}
	if hello[len(magic)] != version {
		return 0, fmt.Errorf("%w: client speaks version %d, we speak %d", ErrVersion, hello[len(magic)], version)
	}
	protocol := Protocol(hello[len(magic)+1])
	clientNonce := hello[len(magic)+2:]
	serverNonce := make([]byte, nonceSize)
	rand.Read(serverNonce)
	reply := append([]byte(magic), version)
	reply = append(reply, serverNonce...)
	reply = append(reply, mac(key, []byte("server"), clientNonce, serverNonce)...)
	if _, err := conn.Write(reply); err != nil {
		return 0, err
	}
	proof := make([]byte, macSize)
	if _, err := io.ReadFull(conn, proof); err != nil {
		return 0, fmt.Errorf("%w: client did not prove the cluster token (%v)", ErrWrongToken, err)
	}
	if !hmac.Equal(proof, mac(key, []byte("client"), clientNonce, serverNonce, []byte{byte(protocol)})) {
		conn.Write([]byte{1})
		return 0, fmt.Errorf("%w: client does not hold this cluster's token", ErrWrongToken)
	}
	if _, err := conn.Write([]byte{0}); err != nil {
		return 0, err
	}
	return protocol, nil
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
