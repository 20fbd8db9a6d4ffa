package peer

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	"github.com/herd-storage/herd/internal/logging"
	"github.com/herd-storage/herd/internal/pki"
)

// The join protocol (ProtocolJoin): a node that has no certificate yet
// asks a member for one, proving it was invited by the secret of a join
// token. The member's handler decides; the protocol only guarantees that
// the secret goes to no one but a node certified by the CA the token
// names, and that neither side reads more than maxJoinMessage.
//
// After the greeting (handshake.go), on a TLS connection where the joiner
// presented no certificate and verified the server with
// pki.VerifyServerChain against the token's fingerprint:
//
//	joiner -> member: length(4) JSON JoinRequest
//	member -> joiner: status(1) length(4) body
//	                  status 0: body = JSON JoinResponse
//	                  status 1: body = why the handler refused, as text
//	                  status 2: body = why the member cannot decide yet,
//	                            as text (ErrJoinNotReady: ask again later)
const (
	maxJoinMessage = 64 << 10
	joinAccepted   = 0
	joinRefused    = 1
	joinNotReady   = 2
	// joinRequestTimeout bounds reading a request once the greeting is
	// accepted, and writing the answer.
	joinRequestTimeout = 5 * time.Second
	// joinHandlerTimeout bounds the handler: it may commit to the
	// cluster's log (a raft round trip, an election at worst).
	joinHandlerTimeout = 30 * time.Second
	// joinTimeout bounds RequestJoin when its context has no deadline.
	joinTimeout = HandshakeTimeout + joinRequestTimeout + joinHandlerTimeout
	// maxJoinReason bounds the refusal text sent back.
	maxJoinReason = 1 << 10
)

// JoinRequest is what a joining node sends.
type JoinRequest struct {
	NodeID string
	IPs    []string // the addresses its certificate should name
	Secret string   // the join token's secret; RequestJoin fills it in
	// Level is the highest cluster feature level the joiner's binary
	// supports (cluster.SupportedLevel); absent from herds older than
	// feature levels, which support level 1.
	Level int `json:",omitempty"`
}

// JoinResponse is what a member answers: everything the new node needs to
// act as a member. Every node holds the CA key, so that any member can
// admit a joining node.
type JoinResponse struct {
	NodeCert  []byte // PEM
	NodeKey   []byte // PEM
	CACert    []byte // PEM
	CAKey     []byte // PEM
	GossipKey []byte
	// Gossip holds members' gossip addresses to join through.
	Gossip []string
}

// JoinHandler decides a join request from remote. Its error's text is
// sent to the joining node (for instance "wrong join secret"), so it must
// not hold secrets. An error wrapping ErrJoinNotReady tells the joining
// node to ask again later rather than that it was refused. Handlers run concurrently, one per request; ctx ends
// when the listener closes or after 30 s.
type JoinHandler func(ctx context.Context, request JoinRequest, remote net.Addr) (JoinResponse, error)

// SetJoinHandler makes the port admit joining nodes through handler; nil
// stops admitting them.
func (l *Listener) SetJoinHandler(handler JoinHandler) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.join = handler
}

// serveJoin answers one join request on conn, then closes it.
func (l *Listener) serveJoin(conn *tls.Conn) {
	defer conn.Close()
	remote := conn.RemoteAddr()
	conn.SetDeadline(time.Now().Add(joinRequestTimeout))
	body, err := readJoinFrame(conn)
	if err != nil {
		l.refused(remote, "bad join request", err)
		return
	}
	request, err := parseJoinRequest(body)
	if err != nil {
		l.refused(remote, "bad join request", err)
		return
	}
	l.mu.Lock()
	handler := l.join
	l.mu.Unlock()
	if handler == nil { // removed since the greeting
		writeJoinAnswer(conn, joinRefused, []byte(ErrJoinClosed.Error()))
		return
	}
	ctx, cancel := context.WithTimeout(l.ctx, joinHandlerTimeout)
	conn.SetDeadline(time.Time{}) // the handler's time is its own
	response, err := handler(ctx, request, remote)
	cancel()
	conn.SetDeadline(time.Now().Add(joinRequestTimeout))
	if err != nil {
		status := byte(joinRefused)
		if errors.Is(err, ErrJoinNotReady) {
			status = joinNotReady
			l.logger.Info("peer: asked a joining node to retry", logging.From(LogPort, remote), "node", request.NodeID, "reason", err.Error())
		} else {
			l.logger.Warn("peer: refused a joining node", logging.From(LogPort, remote), "node", request.NodeID, "reason", err.Error())
		}
		// The joining node's error names ErrJoinNotReady itself.
		reason := strings.TrimPrefix(err.Error(), ErrJoinNotReady.Error()+": ")
		if len(reason) > maxJoinReason {
			reason = reason[:maxJoinReason]
		}
		writeJoinAnswer(conn, status, []byte(reason))
		return
	}
	encoded, err := json.Marshal(response)
	if err != nil || len(encoded) > maxJoinMessage {
		// A response this package cannot carry is a bug of the handler's
		// caller: say so on both sides rather than truncate it.
		l.logger.Error("peer: join response cannot be sent", "node", request.NodeID, "bytes", len(encoded), "err", err)
		writeJoinAnswer(conn, joinRefused, []byte("the member failed to encode its answer"))
		return
	}
	if err := writeJoinAnswer(conn, joinAccepted, encoded); err != nil {
		l.logger.Warn("peer: could not answer a joining node", "from", remote.String(), "node", request.NodeID, "err", err)
		return
	}
	l.logger.Info("peer: admitted a joining node", "from", remote.String(), "node", request.NodeID)
}

func writeJoinAnswer(conn net.Conn, status byte, body []byte) error {
	frame := make([]byte, 0, 5+len(body))
	frame = append(frame, status)
	frame = binary.BigEndian.AppendUint32(frame, uint32(len(body)))
	_, err := conn.Write(append(frame, body...))
	return err
}

// readJoinFrame reads length(4) then that many bytes, refusing more than
// maxJoinMessage before reading them.
func readJoinFrame(r io.Reader) ([]byte, error) {
	var header [4]byte
	if _, err := io.ReadFull(r, header[:]); err != nil {
		return nil, fmt.Errorf("peer: join message length: %w", err)
	}
	n := binary.BigEndian.Uint32(header[:])
	if n > maxJoinMessage {
		return nil, fmt.Errorf("peer: join message of %d bytes, the limit is %d", n, maxJoinMessage)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return nil, fmt.Errorf("peer: join message: %w", err)
	}
	return body, nil
}

func parseJoinRequest(body []byte) (JoinRequest, error) {
	var request JoinRequest
	if err := json.Unmarshal(body, &request); err != nil {
		return JoinRequest{}, fmt.Errorf("peer: join request: %w", err)
	}
	return request, nil
}

// RequestJoin asks the member at address to admit this node. It connects
// without a certificate, verifies that the member is a node certified by
// the CA whose fingerprint token names (pki.VerifyServerChain), and only
// then sends request with token's secret (request.Secret, if empty). A
// member of another CA, or a machine in between without the CA's key,
// fails the TLS handshake and receives nothing. The error of a refusal
// wraps ErrJoinRefused and carries the member's reason; a member that
// cannot decide yet answers an error wrapping ErrJoinNotReady instead.
func RequestJoin(ctx context.Context, address string, token pki.JoinToken, request JoinRequest) (JoinResponse, error) {
	if request.Secret == "" {
		request.Secret = token.Secret
	}
	fingerprint := token.Fingerprint
	if _, err := pki.ParseJoinToken(token.String()); err != nil {
		return JoinResponse{}, err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, joinTimeout)
		defer cancel()
	}
	raw, err := dialTCP(ctx, address)
	if err != nil {
		return JoinResponse{}, err
	}
	config := &tls.Config{
		MinVersion: tls.VersionTLS13,
		// No certificate: the joiner has none yet.
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return &tls.Certificate{}, nil
		},
		// See pki.VerifyServerChain for why skipping crypto/tls's own
		// verification is safe: ours runs in its place, during the
		// handshake, before the request is written.
		InsecureSkipVerify: true,
		// The member's certificate from the CA the token names, should
		// it hold two (a CA rotation).
		ServerName: pki.CAHint(fingerprint),
		VerifyPeerCertificate: func(rawCerts [][]byte, _ [][]*x509.Certificate) error {
			if _, err := pki.VerifyServerChain(rawCerts, fingerprint); err != nil {
				return fmt.Errorf("%w: %w", ErrWrongCluster, err)
			}
			return nil
		},
	}
	conn, err := clientHandshake(ctx, raw, config, ProtocolJoin)
	if err != nil {
		if errors.Is(err, ErrWrongCluster) {
			return JoinResponse{}, fmt.Errorf("%w; the join secret was not sent", err)
		}
		return JoinResponse{}, err
	}
	defer conn.Close()
	if deadline, ok := ctx.Deadline(); ok {
		conn.SetDeadline(deadline)
	}
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	defer stop()
	encoded, err := json.Marshal(request)
	if err != nil {
		return JoinResponse{}, err
	}
	if len(encoded) > maxJoinMessage {
		return JoinResponse{}, fmt.Errorf("peer: join request of %d bytes, the limit is %d", len(encoded), maxJoinMessage)
	}
	frame := binary.BigEndian.AppendUint32(make([]byte, 0, 4+len(encoded)), uint32(len(encoded)))
	if _, err := conn.Write(append(frame, encoded...)); err != nil {
		return JoinResponse{}, fmt.Errorf("peer: join %s: %w", address, err)
	}
	var status [1]byte
	if _, err := io.ReadFull(conn, status[:]); err != nil {
		return JoinResponse{}, fmt.Errorf("peer: join %s: no answer: %w", address, contextError(ctx, err))
	}
	body, err := readJoinFrame(conn)
	if err != nil {
		return JoinResponse{}, fmt.Errorf("peer: join %s: %w", address, contextError(ctx, err))
	}
	switch status[0] {
	case joinAccepted:
		var response JoinResponse
		if err := json.Unmarshal(body, &response); err != nil {
			return JoinResponse{}, fmt.Errorf("peer: join %s: bad answer: %w", address, err)
		}
		return response, nil
	case joinRefused:
		return JoinResponse{}, fmt.Errorf("%w by %s: %s", ErrJoinRefused, address, printableText(body))
	case joinNotReady:
		return JoinResponse{}, fmt.Errorf("%w (%s): %s", ErrJoinNotReady, address, printableText(body))
	default:
		return JoinResponse{}, fmt.Errorf("%w: %s answered the join with status %d", ErrNotHerd, address, status[0])
	}
}

// contextError prefers the context's error to the deadline it caused.
func contextError(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// printableText keeps a remote reason from writing control characters to
// a terminal or a log.
func printableText(b []byte) string {
	out := []rune(string(b))
	for i, c := range out {
		if c < 32 || c == 127 {
			out[i] = '.'
		}
	}
	return string(out)
}
