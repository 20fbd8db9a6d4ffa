package server

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/nbd"
	"github.com/herd-storage/herd/internal/pki"
)

// fakeCredentials is a log's credentials; catchUp runs at CatchUp (a
// record arriving from the leader).
type fakeCredentials struct {
	clients map[string]cluster.Client
	tokens  map[string]cluster.Token
	catchUp func()
}

func (f *fakeCredentials) LookupClient(name string) (cluster.Client, bool) {
	c, ok := f.clients[name]
	return c, ok
}

func (f *fakeCredentials) LookupToken(id string) (cluster.Token, bool) {
	t, ok := f.tokens[id]
	return t, ok
}

func (f *fakeCredentials) Clients() (out []cluster.Client) {
	for _, c := range f.clients {
		out = append(out, c)
	}
	return out
}

func (f *fakeCredentials) Tokens() (out []cluster.Token) {
	for _, t := range f.tokens {
		out = append(out, t)
	}
	return out
}

func (f *fakeCredentials) CatchUp(context.Context) error {
	if f.catchUp != nil {
		f.catchUp()
	}
	return nil
}

func sessionOf(t *testing.T, certPEM []byte) nbd.Session {
	t.Helper()
	cert, err := pki.ParseCertificate(certPEM)
	if err != nil {
		t.Fatal(err)
	}
	return nbd.Session{TLS: true, Client: cert.Subject.CommonName, ClientCertificate: cert}
}

// TestSessionCertificateNeedsItsToken: a session certificate is good only
// while the admin token it names is valid and may read VDI data; a
// read-only token's (with the data scope) reads only; one that names no
// token (an older herd's) is refused.
func TestSessionCertificateNeedsItsToken(t *testing.T) {
	ca, err := pki.NewCA("test")
	if err != nil {
		t.Fatal(err)
	}
	admin, backup, monitor, later := pki.NewTokenID(), pki.NewTokenID(), pki.NewTokenID(), pki.NewTokenID()
	log := &fakeCredentials{tokens: map[string]cluster.Token{
		admin:   {ID: admin, Name: "admin"},
		backup:  {ID: backup, Name: "backup", ReadOnly: true, Data: true},
		monitor: {ID: monitor, Name: "monitor", ReadOnly: true},
	}}
	authorize := nbdAuthorizer(log)
	issue := func(name, id string, readOnly bool) nbd.Session {
		certPEM, _, err := ca.IssueSession("token-"+name, id, readOnly)
		if err != nil {
			t.Fatal(err)
		}
		return sessionOf(t, certPEM)
	}

	access, err := authorize(issue("admin", admin, false))
	if err != nil || access.ReadOnly || !access.Match("any-vdi") {
		t.Fatalf("an admin token's session: %+v %v, want every VDI, writable", access, err)
	}
	access, err = authorize(issue("backup", backup, false)) // claims writable: the token says no
	if err != nil || !access.ReadOnly || !access.Match("any-vdi") {
		t.Fatalf("a read-only+data token's session: %+v %v, want every VDI, read-only", access, err)
	}
	if _, err := authorize(issue("monitor", monitor, true)); err == nil || !strings.Contains(err.Error(), "may not read VDI data") {
		t.Fatalf("a read-only token's session: %v, want refused (no data scope)", err)
	}
	// A token created through another node a moment ago: found after
	// catching up; one never created: refused.
	log.catchUp = func() { log.tokens[later] = cluster.Token{ID: later, Name: "later"} }
	if _, err := authorize(issue("later", later, false)); err != nil {
		t.Fatalf("a session of a token this node learns by catching up: %v", err)
	}
	if _, err := authorize(issue("ghost", pki.NewTokenID(), false)); err == nil || !strings.Contains(err.Error(), "unknown admin token") {
		t.Fatalf("a session of an unknown token: %v", err)
	}

	// Revoked: its sessions are refused from then on, and the change is
	// one revalidateNBDClients sees.
	session := issue("admin", admin, false)
	before := nbdCredentialsView(log)
	token := log.tokens[admin]
	token.Revoked = true
	log.tokens[admin] = token
	if nbdCredentialsView(log) == before {
		t.Fatal("revoking a token does not change what revalidation compares")
	}
	if _, err := authorize(session); err == nil || !strings.Contains(err.Error(), "revoked") {
		t.Fatalf("a session of a revoked token: %v, want refused", err)
	}

	// A session certificate as older herds issued it: no token id (its
	// dates within a session's span, to reach that check).
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	template := &x509.Certificate{
		SerialNumber: big.NewInt(7),
		Subject:      pkix.Name{CommonName: "token-admin", OrganizationalUnit: []string{"herd-session"}},
		NotBefore:    time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Minute),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, template, ca.Cert, key.Public(), ca.Key)
	if err != nil {
		t.Fatal(err)
	}
	old, _ := x509.ParseCertificate(der)
	if _, err := authorize(nbd.Session{TLS: true, Client: "token-admin", ClientCertificate: old}); err == nil || !strings.Contains(err.Error(), "names no admin token") {
		t.Fatalf("an older herd's session certificate: %v, want refused", err)
	}
}

// TestSessionCertificateLifetime: a session certificate valid longer
// than a node issues them for (minted with a copy of the CA key: a
// stolen disk's ca.key) is refused at the TLS handshake, at open and at
// revalidation (the same authorizer), though it names a valid token.
func TestSessionCertificateLifetime(t *testing.T) {
	ca, err := pki.NewCA("test")
	if err != nil {
		t.Fatal(err)
	}
	admin := pki.NewTokenID()
	log := &fakeCredentials{tokens: map[string]cluster.Token{admin: {ID: admin, Name: "admin"}}}
	authorize := nbdAuthorizer(log)
	verify := (&credentials{}).nbdTLSWith(tls.Certificate{}, x509.NewCertPool()).VerifyConnection

	// Issued by a node: accepted.
	certPEM, _, err := ca.IssueSession("token-admin", admin, false)
	if err != nil {
		t.Fatal(err)
	}
	issued := sessionOf(t, certPEM)
	if err := verify(tls.ConnectionState{PeerCertificates: []*x509.Certificate{issued.ClientCertificate}}); err != nil {
		t.Fatalf("an issued session certificate at the handshake: %v", err)
	}
	if _, err := authorize(issued); err != nil {
		t.Fatalf("an issued session certificate: %v", err)
	}

	// Minted with the CA key, as a node would but for its dates.
	mint := func(notBefore, notAfter time.Time) nbd.Session {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		template := &x509.Certificate{
			SerialNumber: big.NewInt(time.Now().UnixNano()),
			Subject:      pkix.Name{CommonName: "token-admin", OrganizationalUnit: []string{"herd-session"}},
			NotBefore:    notBefore, NotAfter: notAfter,
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
			URIs: []*url.URL{{Scheme: "herd-token", Opaque: admin}},
		}
		der, err := x509.CreateCertificate(rand.Reader, template, ca.Cert, key.Public(), ca.Key)
		if err != nil {
			t.Fatal(err)
		}
		cert, err := x509.ParseCertificate(der)
		if err != nil {
			t.Fatal(err)
		}
		if scope, ok := pki.SessionAccess(cert); !ok || scope.TokenID != admin {
			t.Fatalf("the minted certificate does not read as a session of the token: %+v %v", scope, ok)
		}
		return nbd.Session{TLS: true, Client: "token-admin", ClientCertificate: cert}
	}
	now := time.Now()
	for _, c := range []struct {
		name    string
		session nbd.Session
		refused bool
	}{
		{"ten years", mint(now.Add(-time.Hour), now.AddDate(10, 0, 0)), true},
		{"one day", mint(now.Add(-time.Minute), now.Add(24*time.Hour)), true},
		{"the longest a node issues, a minute over", mint(now.Add(-time.Hour), now.Add(pki.MaxSessionSpan-time.Hour+time.Minute)), true},
		{"as long as a node issues", mint(now.Add(-time.Hour), now.Add(pki.SessionValidity)), false},
	} {
		errTLS := verify(tls.ConnectionState{PeerCertificates: []*x509.Certificate{c.session.ClientCertificate}})
		_, errOpen := authorize(c.session)
		if !c.refused {
			if errTLS != nil || errOpen != nil {
				t.Errorf("%s: refused (handshake: %v; open: %v)", c.name, errTLS, errOpen)
			}
			continue
		}
		for what, err := range map[string]error{"handshake": errTLS, "open": errOpen} {
			if err == nil || !strings.Contains(err.Error(), "longer than any herd issues") {
				t.Errorf("%s: %s gives %v, want refused for its lifetime", c.name, what, err)
			}
		}
	}
	if pki.MaxSessionSpan > pki.SessionValidity+2*time.Hour {
		t.Errorf("session certificates may span %v", pki.MaxSessionSpan)
	}
}

// TestNBDClientRecords: a client certificate is allowed what its record
// says, and refused once revoked or replaced.
func TestNBDClientRecords(t *testing.T) {
	ca, err := pki.NewCA("test")
	if err != nil {
		t.Fatal(err)
	}
	certPEM, _, serial, err := ca.IssueClient("vmhost")
	if err != nil {
		t.Fatal(err)
	}
	log := &fakeCredentials{clients: map[string]cluster.Client{"vmhost": {Name: "vmhost", Pattern: "vm*", Serial: serial}}}
	authorize := nbdAuthorizer(log)
	session := sessionOf(t, certPEM)
	access, err := authorize(session)
	if err != nil || access.ReadOnly || !access.Match("vm1") || access.Match("db1") {
		t.Fatalf("vmhost: %+v %v", access, err)
	}
	before := nbdCredentialsView(log)
	log.clients["vmhost"] = cluster.Client{Name: "vmhost", Pattern: "vm*", Serial: serial, Revoked: true}
	if nbdCredentialsView(log) == before {
		t.Fatal("revoking a client does not change what revalidation compares")
	}
	if _, err := authorize(session); err == nil || !strings.Contains(err.Error(), "revoked") {
		t.Fatalf("a revoked client: %v", err)
	}
	log.clients["vmhost"] = cluster.Client{Name: "vmhost", Pattern: "vm*", Serial: "0123"}
	if _, err := authorize(session); err == nil || !strings.Contains(err.Error(), "replaced") {
		t.Fatalf("a replaced certificate: %v", err)
	}
}

// TestSessionSigningNeedsTheTokenSecret: a holder of the CA key signs a
// session for another node only when the request carries the secret of
// the admin token it names, the token is valid and may read VDI data;
// the name and scope come from the token's record, not the request.
// Below LevelSessionProof a request without the secret (an older build's)
// is still signed.
func TestSessionSigningNeedsTheTokenSecret(t *testing.T) {
	admin, backup, monitor, later := pki.NewTokenID(), pki.NewTokenID(), pki.NewTokenID(), pki.NewTokenID()
	secret := map[string]string{admin: pki.NewSecret(), backup: pki.NewSecret(), monitor: pki.NewSecret(), later: pki.NewSecret()}
	log := &fakeCredentials{tokens: map[string]cluster.Token{
		admin:   {ID: admin, Name: "admin", Hash: pki.HashSecret(secret[admin])},
		backup:  {ID: backup, Name: "backup", Hash: pki.HashSecret(secret[backup]), ReadOnly: true, Data: true},
		monitor: {ID: monitor, Name: "monitor", Hash: pki.HashSecret(secret[monitor]), ReadOnly: true},
	}}
	level := cluster.LevelSessionProof
	ask := func(id, withSecret string) (signRequest, error) {
		r := signRequest{Kind: "session", Name: "token-whatever", TokenID: id, TokenSecret: withSecret}
		return r, sessionRefusal(context.Background(), log, level, &r)
	}
	if r, err := ask(admin, secret[admin]); err != nil || r.Name != "token-admin" || r.ReadOnly {
		t.Fatalf("an admin token's session with its secret: %+v %v", r, err)
	}
	if r, err := ask(backup, secret[backup]); err != nil || r.Name != "token-backup" || !r.ReadOnly {
		t.Fatalf("a read-only+data token's session (asked writable): %+v %v, want read-only", r, err)
	}
	for what, c := range map[string]struct {
		id, secret string
		want       error
	}{
		"no secret":              {admin, "", cluster.ErrForbidden},
		"another token's secret": {admin, secret[backup], cluster.ErrUnauthorized},
		"an unknown token":       {pki.NewTokenID(), secret[admin], cluster.ErrUnauthorized},
		"a read-only token":      {monitor, secret[monitor], cluster.ErrForbidden},
	} {
		if _, err := ask(c.id, c.secret); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", what, err, c.want)
		}
	}
	// Created through another node a moment ago: found after catching up.
	log.catchUp = func() {
		log.tokens[later] = cluster.Token{ID: later, Name: "later", Hash: pki.HashSecret(secret[later])}
	}
	if _, err := ask(later, secret[later]); err != nil {
		t.Fatalf("a token the holder learns by catching up: %v", err)
	}
	token := log.tokens[admin]
	token.Revoked = true
	log.tokens[admin] = token
	if _, err := ask(admin, secret[admin]); !errors.Is(err, cluster.ErrUnauthorized) || !strings.Contains(err.Error(), "revoked") {
		t.Fatalf("a revoked token: %v", err)
	}

	// An older build's request, before the finalize: signed as before.
	level = cluster.LevelSessionProof - 1
	if r, err := ask(backup, ""); err != nil || r.Name != "token-whatever" {
		t.Fatalf("below LevelSessionProof, a request without the secret: %+v %v, want signed as asked", r, err)
	}
	if _, err := ask(backup, secret[admin]); !errors.Is(err, cluster.ErrUnauthorized) {
		t.Fatalf("below LevelSessionProof, a wrong secret: %v, want refused", err)
	}
}
