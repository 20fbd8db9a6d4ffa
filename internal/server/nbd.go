package server

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"time"

	"github.com/herd-storage/herd/internal/bufpool"
	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/export"
	"github.com/herd-storage/herd/internal/nbd"
	"github.com/herd-storage/herd/internal/pki"
)

// NBDLimits bound what NBD clients, authorized or not, may make one node
// spend (flags of herd server; zero means the nbd package's default).
type NBDLimits struct {
	MemoryBudget            int64         // payload bytes held for all NBD connections together
	MaxConnections          int           // NBD connections in all
	MaxConnectionsPerClient int           // per client certificate (or remote IP, or the local socket)
	MaxOptions              int           // options per handshake
	HandshakeTimeout        time.Duration // the whole handshake, TLS included
	ReplyTimeout            time.Duration // a client that does not read its replies this long is cut off
	// connections not through their TLS handshake yet, in all and per
	// remote IP (the oldest closed to admit a new one when full)
	MaxUnauthenticated          int
	MaxUnauthenticatedPerSource int
}

// server is an NBD server within these limits; servers given the same
// memory budget share it (the TCP port and the local socket).
func (l NBDLimits) server(backend nbd.Backend, memory *bufpool.Budget, logger *slog.Logger) *nbd.Server {
	return &nbd.Server{
		Backend:                 backend,
		Logger:                  logger,
		MemoryBudget:            l.MemoryBudget,
		Memory:                  memory,
		MaxConnections:          l.MaxConnections,
		MaxConnectionsPerClient: l.MaxConnectionsPerClient,
		MaxOptions:              l.MaxOptions,
		HandshakeTimeout:        l.HandshakeTimeout,
		ReplyTimeout:            l.ReplyTimeout,

		MaxUnauthenticated:          l.MaxUnauthenticated,
		MaxUnauthenticatedPerSource: l.MaxUnauthenticatedPerSource,
	}
}

// memory is the node's one NBD memory budget.
func (l NBDLimits) memory() *bufpool.Budget {
	bytes := l.MemoryBudget
	if bytes <= 0 {
		bytes = 256 << 20
	}
	return bufpool.NewBudget(max(bytes, 32<<20))
}

// nbdTLS12Suites are the TLS 1.2 suites NBD accepts (TLS 1.3's are all
// AEAD): ECDHE with AES-GCM or ChaCha20-Poly1305.
var nbdTLS12Suites = []uint16{
	tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
	tls.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
	tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
	tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
	tls.TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
	tls.TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
}

// nbdTLS is the NBD server's TLS configuration: a client certificate from
// the cluster CA is required. During a CA rotation a certificate from
// either CA is (trust.go), and the node shows its certificate from the
// CA a client names, else from the old one.
func (cr *credentials) nbdTLS() *tls.Config {
	return &tls.Config{
		MinVersion:   tls.VersionTLS12,
		CipherSuites: nbdTLS12Suites,
		GetConfigForClient: func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
			t := cr.now()
			return cr.nbdTLSWith(*t.serverCertificate(hello.ServerName), t.pool), nil
		},
	}
}

func (cr *credentials) nbdTLSWith(certificate tls.Certificate, pool *x509.CertPool) *tls.Config {
	return &tls.Config{
		// QEMU's and libnbd's GnuTLS speak 1.3; 1.2 keeps older hosts
		// working, with AEAD suites and forward secrecy only (no CBC, no
		// SHA-1 MACs, no RSA key exchange).
		MinVersion:   tls.VersionTLS12,
		CipherSuites: nbdTLS12Suites,
		Certificates: []tls.Certificate{certificate},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    pool,
		VerifyConnection: func(state tls.ConnectionState) error {
			if len(state.PeerCertificates) == 0 {
				return errors.New("nbd: a client certificate is required")
			}
			if _, ok := pki.ClientName(state.PeerCertificates[0]); ok {
				return nil
			}
			if _, ok := pki.SessionAccess(state.PeerCertificates[0]); !ok {
				return errors.New("nbd: the certificate is not an NBD client's (herd client add)")
			}
			if err := pki.SessionSpanOK(state.PeerCertificates[0]); err != nil {
				return fmt.Errorf("nbd: %w", err)
			}
			return nil
		},
	}
}

// credentialLog is what NBD authorization reads from the log
// (*cluster.Cluster).
type credentialLog interface {
	LookupClient(name string) (cluster.Client, bool)
	LookupToken(id string) (cluster.Token, bool)
	Clients() []cluster.Client
	Tokens() []cluster.Token
	CatchUp(ctx context.Context) error
}

// nbdAuthorizer maps a TLS client to what its record in the log allows:
// the VDIs matching its pattern, read-only if so issued. A client whose
// certificate is unknown, revoked or superseded (another serial) is
// refused. A session certificate (herd vdi import/export) allows every
// VDI, read-only for a read-only token, only while the token that asked
// for it is valid and may read VDI data, and only if it is valid no
// longer than a node issues them for (pki.MaxSessionSpan: one minted
// with a stolen CA key for years is refused). Plaintext sessions (the local
// socket, --insecure-nbd) have full access. It is asked at every open,
// when an open completes, before a take-over of a VDI's writer lock and
// at every revalidation (revalidateNBDClients), so a revoke is final.
func nbdAuthorizer(c credentialLog) func(nbd.Session) (export.Access, error) {
	return func(session nbd.Session) (export.Access, error) {
		all := func(string) bool { return true }
		if !session.TLS {
			return export.Access{Match: all}, nil
		}
		if scope, ok := pki.SessionAccess(session.ClientCertificate); ok {
			if err := pki.SessionSpanOK(session.ClientCertificate); err != nil {
				return export.Access{}, err
			}
			token, err := sessionToken(c, scope)
			if err != nil {
				return export.Access{}, err
			}
			return export.Access{Match: all, ReadOnly: scope.ReadOnly || token.ReadOnly}, nil
		}
		record, ok := c.LookupClient(session.Client)
		if !ok || !record.Accepts(serialOf(session)) {
			// Added through another node a moment ago: catch up first.
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			if c.CatchUp(ctx) == nil {
				record, ok = c.LookupClient(session.Client)
			}
			cancel()
		}
		switch {
		case !ok:
			return export.Access{}, fmt.Errorf("unknown NBD client %q", session.Client)
		case record.Revoked:
			return export.Access{}, fmt.Errorf("NBD client %q was revoked", session.Client)
		case !record.Accepts(serialOf(session)):
			return export.Access{}, fmt.Errorf("NBD client %q: this certificate was replaced by another", session.Client)
		}
		pattern := record.Pattern
		return export.Access{Match: func(name string) bool { return cluster.MatchPattern(pattern, name) }, ReadOnly: record.ReadOnly}, nil
	}
}

// sessionToken returns the admin token a session certificate was issued
// to, if it is still valid and may read VDI data.
func sessionToken(c credentialLog, scope pki.SessionScope) (cluster.Token, error) {
	if scope.TokenID == "" {
		return cluster.Token{}, errors.New("a session certificate that names no admin token (from an older herd): ask for a new one")
	}
	token, ok := c.LookupToken(scope.TokenID)
	if !ok {
		// Created through another node a moment ago: catch up first.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if c.CatchUp(ctx) == nil {
			token, ok = c.LookupToken(scope.TokenID)
		}
		cancel()
	}
	switch {
	case !ok:
		return cluster.Token{}, fmt.Errorf("a session certificate of unknown admin token %s", scope.TokenID)
	case token.Revoked:
		return cluster.Token{}, fmt.Errorf("a session certificate of admin token %q, which was revoked", token.Name)
	case !token.ReadsData():
		return cluster.Token{}, fmt.Errorf("a session certificate of admin token %q, which may not read VDI data", token.Name)
	}
	return token, nil
}

// revalidateNBDClients cuts the NBD connections, open or still opening,
// of clients whose record changed in the log (revoked, replaced, another
// pattern or read-only) and that may no longer use their export, and
// those of session certificates whose admin token was revoked: a
// revocation ends access at once, not at the client's next open. The
// credentials are compared every second; connections are rechecked when
// they change (nbd.Server.Revalidate covers opens under way too, and a
// connection that becomes active meanwhile checks itself, so none is
// skipped).
func revalidateNBDClients(ctx context.Context, c credentialLog, server *nbd.Server, logger *slog.Logger) {
	ticker := time.NewTicker(time.Second)
	defer ticker.Stop()
	last := nbdCredentialsView(c)
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		now := nbdCredentialsView(c)
		if now == last {
			continue
		}
		last = now
		if n := server.Revalidate(); n > 0 {
			logger.Warn("nbd: connections of clients no longer allowed were closed", "connections", n)
		}
	}
}

// nbdCredentialsView sums up what NBD authorization depends on: the
// client records, and each token's id and scope and whether it is
// revoked.
func nbdCredentialsView(c credentialLog) string {
	type tokenView struct {
		ID       string
		ReadOnly bool
		Data     bool
		Revoked  bool
	}
	var tokens []tokenView
	for _, t := range c.Tokens() {
		tokens = append(tokens, tokenView{t.ID, t.ReadOnly, t.Data, t.Revoked})
	}
	return fmt.Sprint(c.Clients(), tokens)
}

// gossipSeeds are the gossip addresses to join through: those the member
// that admitted this node sent, else (a restart) the --join hosts at the
// gossip port, as a fallback to the members the log and the peers file
// know.
func (cr *credentials) gossipSeeds(members []string, gossipPort int) []string {
	if len(cr.seeds) > 0 {
		return cr.seeds
	}
	var out []string
	for _, member := range members {
		host, _, err := net.SplitHostPort(member)
		if err == nil {
			out = append(out, net.JoinHostPort(host, strconv.Itoa(gossipPort)))
		}
	}
	return out
}

func serialOf(session nbd.Session) string {
	if session.ClientCertificate == nil {
		return ""
	}
	return pki.Serial(session.ClientCertificate)
}
