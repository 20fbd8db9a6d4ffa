package peer

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/pki"
)

// joinMember is a member's peer port admitting nodes that know the
// secret whose hash it holds, answering with certificates from its CA.
type joinMember struct {
	*testPort
	ca    *pki.CA
	token pki.JoinToken

	mu       sync.Mutex // guards requests
	requests []JoinRequest
	remotes  []net.Addr
}

func startJoinMember(t *testing.T) *joinMember {
	t.Helper()
	ca := testCA(t)
	m := &joinMember{testPort: listen(t, testCredentials(t, ca, "node-a")), ca: ca}
	m.token = pki.JoinToken{Fingerprint: ca.Fingerprint(), Secret: pki.NewSecret()}
	hash := pki.HashSecret(m.token.Secret)
	m.SetJoinHandler(func(ctx context.Context, request JoinRequest, remote net.Addr) (JoinResponse, error) {
		m.mu.Lock()
		m.requests = append(m.requests, request)
		m.remotes = append(m.remotes, remote)
		m.mu.Unlock()
		if !pki.SecretMatches(hash, request.Secret) {
			return JoinResponse{}, errors.New("wrong join secret")
		}
		var ips []net.IP
		for _, ip := range request.IPs {
			ips = append(ips, net.ParseIP(ip))
		}
		certPEM, keyPEM, err := ca.IssueNode(request.NodeID, ips)
		if err != nil {
			return JoinResponse{}, err
		}
		return JoinResponse{NodeCert: certPEM, NodeKey: keyPEM, CACert: ca.CertPEM, CAKey: ca.KeyPEM, GossipKey: []byte("gossip-key-32-bytes-long-enough!")}, nil
	})
	return m
}

func (m *joinMember) seen() []JoinRequest {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]JoinRequest(nil), m.requests...)
}

// TestJoin: a node with the right token receives credentials that make it
// a member: it can then dial raft on the member that admitted it.
func TestJoin(t *testing.T) {
	member := startJoinMember(t)
	sub := member.Protocol(ProtocolRaft)
	response, err := RequestJoin(t.Context(), member.address(), member.token, JoinRequest{NodeID: "node-new", IPs: []string{"127.0.0.1"}})
	if err != nil {
		t.Fatalf("join: %v", err)
	}
	seen := member.seen()
	if len(seen) != 1 || seen[0].NodeID != "node-new" || seen[0].Secret != member.token.Secret || len(seen[0].IPs) != 1 {
		t.Fatalf("the handler saw %+v", seen)
	}
	if !bytes.Equal(response.CACert, member.ca.CertPEM) || !bytes.Equal(response.CAKey, member.ca.KeyPEM) || string(response.GossipKey) != "gossip-key-32-bytes-long-enough!" {
		t.Fatal("the response lost fields")
	}
	creds, err := NewCredentials(response.NodeCert, response.NodeKey, response.CACert, nil)
	if err != nil {
		t.Fatalf("credentials from the join response: %v", err)
	}
	conn, err := Dial(t.Context(), member.address(), creds, ProtocolRaft)
	if err != nil {
		t.Fatalf("the new node dialling raft: %v", err)
	}
	defer conn.Close()
	accepted := acceptOne(sub, 5*time.Second)
	if accepted == nil {
		t.Fatal("the new node never reached raft")
	}
	defer accepted.Close()
	if node, _ := RemoteNode(accepted); node != "node-new" {
		t.Fatalf("RemoteNode = %q", node)
	}
	member.waitLog(t, "admitted a joining node")
}

// TestJoinWrongSecret: the handler's refusal reaches the joining node.
func TestJoinWrongSecret(t *testing.T) {
	member := startJoinMember(t)
	token := pki.JoinToken{Fingerprint: member.token.Fingerprint, Secret: pki.NewSecret()}
	_, err := RequestJoin(t.Context(), member.address(), token, JoinRequest{NodeID: "node-new"})
	if !errors.Is(err, ErrJoinRefused) || !strings.Contains(err.Error(), "wrong join secret") {
		t.Fatalf("join with a wrong secret: %v, want ErrJoinRefused saying wrong join secret", err)
	}
	if strings.Contains(err.Error(), token.Secret) || strings.Contains(member.logs.String(), token.Secret) {
		t.Fatal("the secret appears in an error or the log")
	}
	member.waitLog(t, "wrong join secret")
}

// TestJoinWrongFingerprint: a joining node whose token names another CA
// refuses the member during TLS: the member never sees a request.
func TestJoinWrongFingerprint(t *testing.T) {
	member := startJoinMember(t)
	token := pki.JoinToken{Fingerprint: newTestCA(t).Fingerprint(), Secret: member.token.Secret}
	_, err := RequestJoin(t.Context(), member.address(), token, JoinRequest{NodeID: "node-new"})
	if !errors.Is(err, ErrWrongCluster) || !errors.Is(err, pki.ErrFingerprintMismatch) || !strings.Contains(err.Error(), "does not match") {
		t.Fatalf("join with another CA's fingerprint: %v", err)
	}
	member.waitLog(t, "TLS handshake failed")
	if seen := member.seen(); len(seen) != 0 {
		t.Fatalf("the member saw %d requests", len(seen))
	}
}

// TestJoinManInTheMiddle: a TLS server without the CA's key, even one that
// presents the CA's certificate, receives not a byte of application data:
// the secret never leaves the joining node.
func TestJoinManInTheMiddle(t *testing.T) {
	ca := testCA(t)
	token := pki.JoinToken{Fingerprint: ca.Fingerprint(), Secret: pki.NewSecret()}
	// The impostor's certificate: its own CA's node certificate, with
	// our CA's (public) certificate appended so the fingerprint matches.
	impostorCA := newTestCA(t)
	certPEM, keyPEM, err := impostorCA.IssueNode("node-a", []net.IP{net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	certificate, err := impostorCA.TLSCertificate(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	for _, chain := range []struct {
		name  string
		extra []byte
	}{{"own CA", nil}, {"our CA appended", ca.Cert.Raw}} {
		t.Run(chain.name, func(t *testing.T) {
			presented := certificate
			if chain.extra != nil {
				presented.Certificate = [][]byte{certificate.Certificate[0], chain.extra}
			}
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			var received atomic.Int64
			served := make(chan error, 1)
			go func() {
				raw, err := l.Accept()
				if err != nil {
					served <- err
					return
				}
				defer raw.Close()
				conn := tls.Server(raw, &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{presented}})
				conn.SetDeadline(time.Now().Add(5 * time.Second))
				n, _ := io.Copy(io.Discard, conn)
				received.Store(n)
				served <- conn.Handshake()
			}()
			_, err = RequestJoin(t.Context(), l.Addr().String(), token, JoinRequest{NodeID: "node-new"})
			if err == nil || !errors.Is(err, ErrWrongCluster) {
				t.Fatalf("join through an impostor: %v, want ErrWrongCluster", err)
			}
			if handshake := <-served; handshake == nil {
				t.Fatal("the impostor completed a TLS handshake")
			}
			if n := received.Load(); n != 0 {
				t.Fatalf("the impostor received %d bytes of application data", n)
			}
		})
	}
}

// TestJoinNotReady: a handler that cannot decide yet (ErrJoinNotReady)
// reaches the joining node as ErrJoinNotReady with its reason, not as a
// refusal, so that it asks again.
func TestJoinNotReady(t *testing.T) {
	member := startJoinMember(t)
	member.SetJoinHandler(func(context.Context, JoinRequest, net.Addr) (JoinResponse, error) {
		return JoinResponse{}, fmt.Errorf("%w: the cluster is starting", ErrJoinNotReady)
	})
	_, err := RequestJoin(t.Context(), member.address(), member.token, JoinRequest{NodeID: "n"})
	if !errors.Is(err, ErrJoinNotReady) || errors.Is(err, ErrJoinRefused) || !strings.Contains(err.Error(), "the cluster is starting") {
		t.Fatalf("join through a member not ready: %v, want ErrJoinNotReady (not ErrJoinRefused) with the reason", err)
	}
	if strings.Count(err.Error(), ErrJoinNotReady.Error()) != 1 {
		t.Fatalf("join through a member not ready: %q names ErrJoinNotReady more than once", err)
	}
	member.waitLog(t, "asked a joining node to retry")
}

// TestJoinClosed: a port without a join handler says so.
func TestJoinClosed(t *testing.T) {
	member := startJoinMember(t)
	member.SetJoinHandler(nil)
	if _, err := RequestJoin(t.Context(), member.address(), member.token, JoinRequest{NodeID: "n"}); !errors.Is(err, ErrJoinClosed) {
		t.Fatalf("join without a handler: %v, want ErrJoinClosed", err)
	}
}

// TestJoinBadToken: a token that cannot be valid is refused before
// dialling.
func TestJoinBadToken(t *testing.T) {
	if _, err := RequestJoin(t.Context(), "127.0.0.1:1", pki.JoinToken{Fingerprint: "abc", Secret: "x"}, JoinRequest{}); !errors.Is(err, pki.ErrBadToken) {
		t.Fatalf("join with a bad token: %v, want ErrBadToken", err)
	}
}

// TestJoinBounds: a request over the size limit is refused unread, and
// the handler never runs; a handler's answer over it is not sent.
func TestJoinBounds(t *testing.T) {
	member := startJoinMember(t)
	creds := testCredentials(t, member.ca, "node-a")
	conn, err := dialWithoutCertificate(t, member.address(), creds, ProtocolJoin)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.Write(binary.BigEndian.AppendUint32(nil, maxJoinMessage+1))
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if answer, _ := io.ReadAll(conn); len(answer) != 0 {
		t.Fatalf("an oversized request got the answer %q", answer)
	}
	member.waitLog(t, "bad join request")
	if seen := member.seen(); len(seen) != 0 {
		t.Fatalf("the handler saw %d requests", len(seen))
	}

	member.SetJoinHandler(func(context.Context, JoinRequest, net.Addr) (JoinResponse, error) {
		return JoinResponse{GossipKey: make([]byte, maxJoinMessage)}, nil
	})
	if _, err := RequestJoin(t.Context(), member.address(), member.token, JoinRequest{NodeID: "n"}); !errors.Is(err, ErrJoinRefused) {
		t.Fatalf("an oversized answer: %v, want ErrJoinRefused", err)
	}
	if _, err := RequestJoin(t.Context(), member.address(), member.token, JoinRequest{NodeID: strings.Repeat("n", maxJoinMessage)}); err == nil {
		t.Fatal("an oversized request was sent")
	}
}

// TestJoinHandlerCancelledOnClose: closing the port ends a handler's
// context, and the joining node hears of it.
func TestJoinHandlerCancelledOnClose(t *testing.T) {
	member := startJoinMember(t)
	started := make(chan struct{})
	member.SetJoinHandler(func(ctx context.Context, _ JoinRequest, _ net.Addr) (JoinResponse, error) {
		close(started)
		<-ctx.Done()
		return JoinResponse{}, errors.New("the member is stopping")
	})
	result := make(chan error, 1)
	go func() {
		_, err := RequestJoin(t.Context(), member.address(), member.token, JoinRequest{NodeID: "n"})
		result <- err
	}()
	<-started
	member.Close()
	select {
	case err := <-result:
		if !errors.Is(err, ErrJoinRefused) || !strings.Contains(err.Error(), "stopping") {
			t.Fatalf("join interrupted by Close: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the handler's context did not end on Close")
	}
}
