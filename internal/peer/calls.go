package peer

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/herd-storage/herd/internal/pki"
)

// Calls: one request and one answer between two members over mTLS, for
// the rare exchanges that need no stream (cluster secrets, signing).
// Credentials.Allowed has accepted the caller before its request is read.
//
//	caller -> member: length(4) request
//	member -> caller: status(1) length(4) body
//	                  status 0: body = the answer
//	                  status 1: body = why not, as text
const (
	// ProtocolSecrets: an admitted node fetches the cluster's shared
	// secrets (the gossip key). The join protocol hands out a node
	// certificate only; what the cluster shares goes to a node that
	// proves that certificate, which Allowed accepts only once the log
	// admitted it (cluster/admission.go).
	ProtocolSecrets Protocol = 5
	// ProtocolSign: a member that does not hold the CA key asks one that
	// does to sign a certificate (server/signing.go).
	ProtocolSign Protocol = 6
)

// CallHandler answers request from node nodeID; its error's text is sent
// back.
type CallHandler func(ctx context.Context, nodeID string, request []byte) ([]byte, error)

// ServeCalls answers every connection of listener (a sub-listener of a
// call protocol) with handler, until listener closes.
func ServeCalls(listener net.Listener, handler CallHandler) {
	for {
		conn, err := listener.Accept()
		if err != nil {
			return
		}
		go serveCall(conn, handler)
	}
}

func serveCall(conn net.Conn, handler CallHandler) {
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(joinRequestTimeout))
	tlsConn, ok := conn.(*tls.Conn)
	if !ok || len(tlsConn.ConnectionState().PeerCertificates) == 0 {
		return
	}
	id, _ := pki.NodeID(tlsConn.ConnectionState().PeerCertificates[0])
	request, err := readJoinFrame(conn)
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), joinHandlerTimeout)
	conn.SetDeadline(time.Time{})
	answer, err := handler(ctx, id, request)
	cancel()
	conn.SetDeadline(time.Now().Add(joinRequestTimeout))
	if err != nil {
		reason := err.Error()
		if len(reason) > maxJoinReason {
			reason = reason[:maxJoinReason]
		}
		writeJoinAnswer(conn, joinRefused, []byte(reason))
		return
	}
	if len(answer) > maxJoinMessage {
		writeJoinAnswer(conn, joinRefused, []byte("the answer is too long"))
		return
	}
	writeJoinAnswer(conn, joinAccepted, answer)
}

// ErrCallRefused: the member answered a call with a refusal.
var ErrCallRefused = errors.New("peer: refused")

// Call sends request to the member at address over protocol, as the node
// creds names, and returns its answer.
func Call(ctx context.Context, address string, creds *Credentials, protocol Protocol, request []byte) ([]byte, error) {
	if len(request) > maxJoinMessage {
		return nil, fmt.Errorf("peer: a call of %d bytes, the limit is %d", len(request), maxJoinMessage)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, joinTimeout)
		defer cancel()
	}
	conn, err := Dial(ctx, address, creds, protocol)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	deadline, _ := ctx.Deadline()
	conn.SetDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	defer stop()
	frame := make([]byte, 0, 4+len(request))
	frame = append(frame, byte(len(request)>>24), byte(len(request)>>16), byte(len(request)>>8), byte(len(request)))
	if _, err := conn.Write(append(frame, request...)); err != nil {
		return nil, fmt.Errorf("peer: call to %s: %w", address, err)
	}
	var status [1]byte
	if _, err := io.ReadFull(conn, status[:]); err != nil {
		return nil, fmt.Errorf("peer: call to %s: %w", address, err)
	}
	body, err := readJoinFrame(conn)
	if err != nil {
		return nil, err
	}
	if status[0] != joinAccepted {
		return nil, fmt.Errorf("%w by %s: %s", ErrCallRefused, address, printableText(body))
	}
	return body, nil
}
