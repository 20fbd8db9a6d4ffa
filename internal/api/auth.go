package api

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/logging"
	"github.com/herd-storage/herd/internal/pki"
)

// Security is what the admin API needs to authenticate its callers and
// to be authenticated by them.
type Security struct {
	// Fingerprint is the cluster CA's: tokens carry it, and a token for
	// another cluster is refused.
	Fingerprint string
	// ServerTLS serves HTTPS with this node's certificate (its chain
	// includes the CA certificate, so a CLI that knows only the
	// fingerprint can verify it).
	ServerTLS *tls.Config
	// PeerTLS verifies other nodes' admin APIs (fan-out requests).
	PeerTLS *tls.Config
	// Authority issues NBD client certificates.
	Authority Authority
	// Trust, if not nil, names the CAs whose fingerprint a token may
	// carry (two during a CA rotation) and the one new tokens carry, in
	// place of Fingerprint.
	Trust Trust
	// CA starts CA rotations (herd cluster rotate-ca; server/trust.go).
	CA CARotator
}

// Trust is the CAs a node trusts (server/trust.go).
type Trust interface {
	Fingerprints() []string // trusted, the cluster's first
	Fingerprint() string    // the one new tokens carry
	// NodeCertificateExpires is when the node's certificate (from the
	// cluster's CA) expires.
	NodeCertificateExpires() time.Time
}

// CARotator starts a CA rotation: on a node holding the cluster CA's
// key, or by asking one; and finishes it, waiting (a bounded time) until
// every alive node trusts the new CA alone: it returns the nodes that
// did not yet.
type CARotator interface {
	StartCARotation(ctx context.Context) (cluster.CAState, error)
	FinishCARotation(ctx context.Context, force bool) (cluster.CAState, []string, error)
}

// fingerprint is the CA fingerprint new tokens carry.
func (s *Server) fingerprint() string {
	if s.sec.Trust != nil {
		return s.sec.Trust.Fingerprint()
	}
	return s.sec.Fingerprint
}

// joinFingerprint is the CA fingerprint join tokens carry: the
// cluster's (during a rotation the old one; a joining node receives its
// certificate from it, and the new CA from the log).
func (s *Server) joinFingerprint() string {
	if s.sec.Trust != nil {
		return s.sec.Trust.Fingerprints()[0]
	}
	return s.sec.Fingerprint
}

// trusted says whether a token's fingerprint names a CA this node trusts.
func (s *Server) trusted(fingerprint string) bool {
	if s.sec.Trust == nil {
		return fingerprint == s.sec.Fingerprint
	}
	for _, f := range s.sec.Trust.Fingerprints() {
		if f == fingerprint {
			return true
		}
	}
	return false
}

// Authority issues NBD client certificates signed by the cluster CA.
type Authority interface {
	IssueClient(name string) (certPEM, keyPEM []byte, serial string, err error)
	// IssueSession issues a session certificate for the admin token
	// tokenID; tokenSecret is its secret, which a node holding the CA
	// key checks before it signs for another.
	IssueSession(name, tokenID, tokenSecret string, readOnly bool) (certPEM, keyPEM []byte, err error)
	CACertPEM() []byte
}

// access is what a request needs.
type access int

const (
	readAccess  access = iota // GET: any live token
	writeAccess               // everything else: a token that is not read-only
)

type tokenContextKey struct{}

// catchUpTimeout bounds how long a node that does not know a token waits
// to catch up with the leader before it answers.
const catchUpTimeout = 10 * time.Second

// authenticate checks the request's bearer token against this node's
// copy of the log and returns the raw token (passed on to other nodes for
// fan-out requests).
func (s *Server) authenticate(r *http.Request, need access) (string, error) {
	const prefix = "Bearer "
	header := r.Header.Get("Authorization")
	if !strings.HasPrefix(header, prefix) {
		return "", fmt.Errorf("%w: no token given; the admin token is in the first node's DATA/admin.token (give it with HERD_TOKEN or --token-file)", cluster.ErrUnauthorized)
	}
	raw := strings.TrimSpace(header[len(prefix):])
	token, err := pki.ParseAdminToken(raw)
	if err != nil {
		return "", fmt.Errorf("%w: %v", cluster.ErrUnauthorized, err)
	}
	if !s.trusted(token.Fingerprint) {
		return "", fmt.Errorf("%w: the token belongs to another cluster (its CA fingerprint differs; after a CA rotation, a token names the new CA: herd token refresh)", cluster.ErrUnauthorized)
	}
	record, ok := s.cluster.LookupToken(token.ID)
	if !ok {
		// This node may not have applied the token's creation yet (it
		// just joined or restarted, or the token was made through
		// another node): catch up with the leader first.
		ctx, cancel := context.WithTimeout(r.Context(), catchUpTimeout)
		err := s.cluster.CatchUp(ctx)
		cancel()
		if err != nil {
			return "", fmt.Errorf("cannot check the token: this node has not caught up with the cluster: %w", err)
		}
		record, ok = s.cluster.LookupToken(token.ID)
	}
	if !ok || !pki.SecretMatches(record.Hash, token.Secret) {
		return "", fmt.Errorf("%w: unknown token", cluster.ErrUnauthorized)
	}
	if record.Revoked {
		return "", fmt.Errorf("%w: token %q was revoked", cluster.ErrUnauthorized, record.Name)
	}
	if need == writeAccess && record.ReadOnly {
		return "", fmt.Errorf("%w: token %q is read-only", cluster.ErrForbidden, record.Name)
	}
	return raw, nil
}

// guard authenticates a request before h runs; GET and HEAD need a token,
// anything else one that may write.
func (s *Server) guard(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		need := writeAccess
		if r.Method == http.MethodGet || r.Method == http.MethodHead {
			need = readAccess
		}
		s.guardWith(need, h)(w, r)
	}
}

func (s *Server) guardWith(need access, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		raw, err := s.authenticate(r, need)
		if err != nil {
			if errors.Is(err, cluster.ErrUnauthorized) {
				s.logger.Warn("admin API: refused request", logging.From("admin", r.RemoteAddr), "method", r.Method, "path", r.URL.Path, "reason", err.Error())
			}
			writeError(w, err)
			return
		}
		if !s.authenticatedConnection(w, r) {
			return
		}
		h(w, r.WithContext(context.WithValue(r.Context(), tokenContextKey{}, raw)))
	}
}

// peerClient calls another node's admin API with the token of the
// request being served.
func (s *Server) peerClient(ctx context.Context, address string) *Client {
	raw, _ := ctx.Value(tokenContextKey{}).(string)
	c := newClient(address, raw, s.sec.PeerTLS)
	// One transport for every call to other nodes, so that their
	// connections are reused instead of a new one per call left idle for
	// a minute (a dashboard polling through one node would fill the
	// other nodes' admin connection caps).
	s.peerHTTPOnce.Do(func() { s.peerHTTP = c.http })
	c.http = s.peerHTTP
	return c
}

// Token and client management bodies.
type (
	CreateTokenRequest struct {
		Name     string `json:"name"`
		ReadOnly bool   `json:"read_only"`
		Data     bool   `json:"data,omitempty"` // a read-only token that may read VDI data
	}
	// CreatedToken carries the new token's secret: it is shown once and
	// never stored anywhere but in the caller's hands.
	CreatedToken struct {
		cluster.Token
		Secret string `json:"token"`
	}
	AddClientRequest struct {
		Name     string `json:"name"`
		Pattern  string `json:"pattern"`
		ReadOnly bool   `json:"read_only"`
		// Renew issues a new certificate to a live client, same pattern
		// and scope (Pattern and ReadOnly are ignored).
		Renew bool `json:"renew,omitempty"`
	}
	// AddedClient carries the client's certificate and key (PEM), and the
	// cluster CA's certificate: QEMU's tls-creds-x509 directory layout.
	AddedClient struct {
		cluster.Client
		CACert     string `json:"ca_cert"`
		ClientCert string `json:"client_cert"`
		ClientKey  string `json:"client_key"`
	}
	JoinTokenResponse struct {
		Token string `json:"token"`
	}
	// NBDSession is a short-lived NBD client certificate for the token's
	// holder (herd vdi import/export): full access for an admin token,
	// read-only for a read-only token with the data scope (others get
	// none); valid until Expires, and only while the token is not
	// revoked.
	NBDSession struct {
		CACert     string    `json:"ca_cert"`
		ClientCert string    `json:"client_cert"`
		ClientKey  string    `json:"client_key"`
		ReadOnly   bool      `json:"read_only"`
		Expires    time.Time `json:"expires"`
	}
)

// publicToken hides the hash.
func publicToken(t cluster.Token) cluster.Token {
	t.Hash = ""
	return t
}

func (s *Server) securityRoutes(mux *http.ServeMux) {
	c := s.cluster
	s.handle(mux, "GET /v1/tokens", func(r *http.Request) (any, error) {
		out := []cluster.Token{}
		for _, t := range c.Tokens() {
			out = append(out, publicToken(t))
		}
		return out, nil
	})
	s.handle(mux, "POST /v1/tokens", func(r *http.Request) (any, error) {
		var req CreateTokenRequest
		if err := decodeBody(r, &req); err != nil {
			return nil, err
		}
		if err := cluster.ValidateCredentialName("token", req.Name); err != nil {
			return nil, err
		}
		id, secret := pki.NewTokenID(), pki.NewSecret()
		created, err := c.CreateToken(r.Context(), cluster.Token{ID: id, Name: req.Name, Hash: pki.HashSecret(secret), ReadOnly: req.ReadOnly, Data: req.Data})
		if err != nil {
			return nil, err
		}
		full := pki.AdminToken{Fingerprint: s.fingerprint(), ID: id, Secret: secret}
		return CreatedToken{Token: publicToken(created), Secret: full.String()}, nil
	})
	s.handle(mux, "DELETE /v1/tokens/{id}", func(r *http.Request) (any, error) {
		t, err := c.RevokeToken(r.Context(), r.PathValue("id"))
		return publicToken(t), err
	})
	s.handle(mux, "GET /v1/clients", func(r *http.Request) (any, error) {
		out := c.Clients()
		if out == nil {
			out = []cluster.Client{}
		}
		return out, nil
	})
	s.handle(mux, "POST /v1/clients", func(r *http.Request) (any, error) {
		var req AddClientRequest
		if err := decodeBody(r, &req); err != nil {
			return nil, err
		}
		if err := cluster.ValidateCredentialName("client", req.Name); err != nil {
			return nil, err
		}
		old, exists := c.LookupClient(req.Name)
		exists = exists && !old.Revoked
		if req.Renew {
			// The same name, pattern and scope; a new certificate (from
			// the new CA during a CA rotation).
			if err := c.Requires(cluster.FeatureCARotation); err != nil {
				return nil, err
			}
			if !exists {
				return nil, fmt.Errorf("client %q: %w: nothing to renew", req.Name, cluster.ErrNotFound)
			}
			req.Pattern, req.ReadOnly = old.Pattern, old.ReadOnly
		} else if exists {
			return nil, fmt.Errorf("client %q: %w (revoke it first, or renew it: client add --renew)", req.Name, cluster.ErrAlreadyExists)
		}
		if err := cluster.ValidatePattern(req.Pattern); err != nil {
			return nil, err
		}
		certPEM, keyPEM, serial, err := s.sec.Authority.IssueClient(req.Name)
		if err != nil {
			return nil, err
		}
		record := cluster.Client{Name: req.Name, Pattern: req.Pattern, ReadOnly: req.ReadOnly, Serial: serial, Renew: req.Renew}
		if cert, err := pki.ParseCertificate(certPEM); err == nil && c.Level() >= cluster.LevelSecurity {
			record.Expires = cert.NotAfter.UTC()
		}
		added, err := c.AddClient(r.Context(), record)
		if err != nil {
			return nil, err
		}
		return AddedClient{Client: added, CACert: string(s.sec.Authority.CACertPEM()), ClientCert: string(certPEM), ClientKey: string(keyPEM)}, nil
	})
	s.handle(mux, "DELETE /v1/clients/{name}", func(r *http.Request) (any, error) {
		return c.RevokeClient(r.Context(), r.PathValue("name"))
	})
	// GET: it changes nothing in the cluster. VDI data needs a token
	// that may read it (an admin token, or a read-only one with the
	// data scope, which gets a read-only session); the certificate
	// names the token, and nodes refuse it once the token is revoked.
	s.handle(mux, "GET /v1/nbd-session", func(r *http.Request) (any, error) {
		raw, _ := r.Context().Value(tokenContextKey{}).(string)
		token, _ := pki.ParseAdminToken(raw)
		record, ok := c.LookupToken(token.ID)
		if !ok || record.Revoked {
			return nil, fmt.Errorf("%w: token %q is no longer valid", cluster.ErrUnauthorized, record.Name)
		}
		if !record.ReadsData() {
			return nil, fmt.Errorf("%w: token %q is read-only: it sees the cluster, not VDI data; reading VDI data needs an admin token or one made with `herd token create NAME --read-only --data`", cluster.ErrForbidden, record.Name)
		}
		certPEM, keyPEM, err := s.sec.Authority.IssueSession("token-"+record.Name, record.ID, token.Secret, record.ReadOnly)
		if err != nil {
			return nil, err
		}
		return NBDSession{CACert: string(s.sec.Authority.CACertPEM()), ClientCert: string(certPEM), ClientKey: string(keyPEM),
			ReadOnly: record.ReadOnly, Expires: time.Now().Add(pki.SessionValidity).UTC()}, nil
	})
	s.handle(mux, "DELETE /v1/nodes/{id}", func(r *http.Request) (any, error) {
		id := r.PathValue("id")
		if err := s.safeToRemove(r.Context(), id); err != nil {
			return nil, err
		}
		return map[string]string{"removed": id}, c.RemoveNode(r.Context(), id)
	})
	s.handle(mux, "POST /v1/cluster/join-token", func(r *http.Request) (any, error) {
		secret := pki.NewSecret()
		if err := c.SetJoinHash(r.Context(), pki.HashSecret(secret)); err != nil {
			return nil, err
		}
		return JoinTokenResponse{Token: pki.JoinToken{Fingerprint: s.joinFingerprint(), Secret: secret}.String()}, nil
	})
}

// safeToRemove refuses to forget a dead node for good while it may hold
// the only current copy of an object: until every alive node has
// finished recovering the current epoch (which re-created the node's
// copies elsewhere) with no object unavailable.
func (s *Server) safeToRemove(ctx context.Context, id string) error {
	n, ok := s.cluster.Node(id)
	if !ok || n.State == cluster.NodeAlive || !s.cluster.Info().Formatted {
		return nil // the log refuses the first two with its own message; no objects exist before format
	}
	epoch := s.cluster.Epoch()
	for _, e := range s.recovery(ctx) {
		switch {
		case e.Error != "":
			return fmt.Errorf("%w: cannot tell whether node %s holds the only copy of anything: node %s did not answer (%s); try again", cluster.ErrBusy, id, e.Node, e.Error)
		case e.Status.Unavailable > 0:
			return fmt.Errorf("%w: node %s may hold the only current copy of %d objects (node %s cannot recover them); bring it back, or wait until those objects are written again", cluster.ErrBusy, id, e.Status.Unavailable, e.Node)
		case uint64(e.Status.Epoch) != epoch || (e.Status.State != "done" && e.Status.State != "idle"):
			return fmt.Errorf("%w: node %s's copies are still being re-created on node %s (recovery of epoch %d: %s); wait for herd node recovery to finish", cluster.ErrBusy, id, e.Node, e.Status.Epoch, e.Status.State)
		}
	}
	return nil
}
