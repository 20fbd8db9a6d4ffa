package server

// The node's credentials (docs/SECURITY.md). The first node of a cluster
// creates the cluster CA, the gossip key, the join secret and the first
// admin token; a joining node presents the join token to any member over
// TLS (verifying the member by the CA fingerprint the token carries) and
// receives its node certificate, the CA and the gossip key. Every node
// holds the CA key, so any member admits joiners and issues NBD client
// certificates. Files are 0600 in a 0700 data directory and are refused
// on load if others can read them.

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/logging"
	"github.com/herd-storage/herd/internal/peer"
	"github.com/herd-storage/herd/internal/pki"
)

// Files in the data directory.
const (
	caCertFile    = "ca.crt"
	caKeyFile     = "ca.key"
	nodeCertFile  = "node.crt"
	nodeKeyFile   = "node.key"
	gossipKeyFile = "gossip.key"
	// JoinTokenFile and AdminTokenFile are written by the first node only.
	JoinTokenFile  = "join.token"
	AdminTokenFile = "admin.token"
	// legacyTokenFile is the shared secret of herd before TLS.
	legacyTokenFile = "cluster.token"
)

// credentials are a node's keys and what is built from them.
type credentials struct {
	// ca, fingerprint, node and pool are the credentials as set up at
	// start; once running the node reads trust (trust.go), which a CA
	// rotation changes.
	ca          *pki.CA
	fingerprint string
	gossipKey   []byte // the primary gossip key as loaded or received
	// gossipOthers are the other keys of the keyring file (a rotation
	// was under way); gossipRing the keyring the cluster rotates.
	gossipOthers [][]byte
	gossipRing   *cluster.GossipKeys
	node         tls.Certificate // leaf + CA
	pool         *x509.CertPool
	peer         *peer.Credentials
	// cluster is set once the cluster is running; until then no node is
	// known to be removed.
	cluster atomic.Pointer[cluster.Cluster]
	// signing is what serveSign checks callers against (the cluster, set
	// before ProtocolSign is served; nil: nothing is signed for others).
	signing signingLog

	// The first node's initial secrets, recorded in the log (as hashes)
	// by initSecurity; empty on other nodes.
	joinToken  pki.JoinToken
	adminToken pki.AdminToken
	created    bool
	// seeds are the gossip addresses the member that admitted this node
	// sent.
	seeds []string

	dir    string // the data directory
	ip     net.IP // the address the node binds, which its certificates name
	logger *slog.Logger
	trust  atomic.Pointer[trust]
	// creatingCA: this node is making a new CA for a rotation;
	// leftBehind: the cluster's CA changed and this node has no
	// certificate from the new one (said once).
	creatingCA atomic.Bool
	leftBehind atomic.Bool
}

// setupCredentials loads the node's credentials, or creates a cluster's
// (first node), or obtains them by joining through a member.
func setupCredentials(ctx context.Context, o Options, id string, ip net.IP, members []string, logger *slog.Logger) (*credentials, error) {
	dir := o.DataDir
	if _, err := os.Stat(filepath.Join(dir, legacyTokenFile)); err == nil {
		if _, err := os.Stat(filepath.Join(dir, caCertFile)); err != nil {
			return nil, fmt.Errorf("%s holds a cluster made by a herd without TLS (%s): start this version on a new data directory", dir, legacyTokenFile)
		}
	}
	cr := &credentials{dir: dir, ip: ip, logger: logger}
	_, err := os.Stat(filepath.Join(dir, caCertFile))
	switch {
	case err == nil:
		if err := cr.load(dir); err != nil {
			return nil, err
		}
	case !errors.Is(err, os.ErrNotExist):
		return nil, err
	case len(members) > 0:
		if err := cr.join(ctx, o, id, ip, members, logger); err != nil {
			return nil, err
		}
	default:
		if _, err := os.Stat(filepath.Join(dir, "raft")); err == nil {
			return nil, fmt.Errorf("%s has cluster state but no %s: restore the node's credentials or start it on a new data directory", dir, caCertFile)
		}
		if err := cr.create(dir, id); err != nil {
			return nil, err
		}
	}
	if err := cr.ensureNodeCertificate(dir, id, ip); err != nil {
		return nil, err
	}
	// The first node keeps its initial secrets until the log has them.
	if token, err := readTokenFile(dir, JoinTokenFile); err != nil {
		return nil, err
	} else if token != nil {
		if cr.joinToken, err = pki.ParseJoinToken(strings.TrimSpace(string(token))); err != nil {
			return nil, fmt.Errorf("%s: %w", filepath.Join(dir, JoinTokenFile), err)
		}
	}
	if token, err := readTokenFile(dir, AdminTokenFile); err != nil {
		return nil, err
	} else if token != nil {
		if cr.adminToken, err = pki.ParseAdminToken(strings.TrimSpace(string(token))); err != nil {
			return nil, fmt.Errorf("%s: %w", filepath.Join(dir, AdminTokenFile), err)
		}
	}
	if err := cr.loadRotation(dir); err != nil {
		return nil, err
	}
	cr.peer = &peer.Credentials{Certificate: cr.node, CA: cr.pool, Allowed: cr.allowed, AllowedUnder: cr.allowedUnder, Source: trustSource{cr}}
	if err := cr.setupGossipRing(dir); err != nil {
		return nil, err
	}
	return cr, nil
}

// allowed refuses nodes removed for good (herd node remove) and, from
// LevelSecurity on, every certificate the log does not name
// (cluster/admission.go).
func (cr *credentials) allowed(nodeID, serial string) error {
	if c := cr.cluster.Load(); c != nil {
		return c.PeerAllowed(nodeID, serial)
	}
	return nil
}

// allowedUnder is allowed for a certificate from the CA of fingerprint
// ca: during a CA rotation the log names a node's certificate from the
// new CA once the node recorded it (cluster/carotation.go).
func (cr *credentials) allowedUnder(nodeID, serial, ca string) error {
	c := cr.cluster.Load()
	if c == nil {
		return nil
	}
	return cr.allowedBy(c, nodeID, serial, ca)
}

// peerLog is what allowedBy reads from the log (*cluster.Cluster).
type peerLog interface {
	PeerAllowedUnder(id, serial, ca string) error
	PeerAdmitted(id string) error
	CA() cluster.CAState
}

// allowedBy is allowedUnder on the log c.
func (cr *credentials) allowedBy(c peerLog, nodeID, serial, ca string) error {
	err := c.PeerAllowedUnder(nodeID, serial, ca)
	if t := cr.now(); err != nil && t.next != nil && ca == t.next.Fingerprint() {
		// A new CA this node learned from a member before its log
		// names it (learnCAs: it is catching up): as during a rotation,
		// the node must be admitted; its serial is not known here yet.
		if r := c.CA().Rotation; r == nil || r.Fingerprint != ca {
			return c.PeerAdmitted(nodeID)
		}
	}
	return err
}

func (cr *credentials) load(dir string) error {
	certPEM, err := os.ReadFile(filepath.Join(dir, caCertFile))
	if err != nil {
		return err
	}
	keyPEM, err := pki.ReadSecretFile(filepath.Join(dir, caKeyFile))
	switch {
	case errors.Is(err, os.ErrNotExist):
		// A node admitted at LevelSecurity: it verifies with the CA and
		// asks a node holding the key to sign (signing.go).
		if cr.ca, err = pki.ParseCACertificate(certPEM); err != nil {
			return fmt.Errorf("%s: %w", filepath.Join(dir, caCertFile), err)
		}
	case err != nil:
		return err
	default:
		if cr.ca, err = pki.ParseCA(certPEM, keyPEM); err != nil {
			// A CA rotation's end stopped half way on its holder: the
			// new certificate is in, its key still in ca-next.key.
			nextKey, nextErr := pki.ReadSecretFile(filepath.Join(dir, caNextKeyFile))
			if nextErr != nil {
				return fmt.Errorf("%s: %w", filepath.Join(dir, caCertFile), err)
			}
			if cr.ca, err = pki.ParseCA(certPEM, nextKey); err != nil {
				return fmt.Errorf("%s: %w", filepath.Join(dir, caCertFile), err)
			}
			if err := pki.WriteSecretFile(filepath.Join(dir, caKeyFile), nextKey); err != nil {
				return err
			}
		}
	}
	// The same stop on any node: its certificate from the new CA is
	// still node-next.crt.
	if next := loadNodeCertificate(dir, nodeNextCertFile, nodeNextKeyFile, cr.ca); next != nil {
		nextCert, _ := os.ReadFile(filepath.Join(dir, nodeNextCertFile))
		nextKey, _ := pki.ReadSecretFile(filepath.Join(dir, nodeNextKeyFile))
		if err := pki.WriteSecretFile(filepath.Join(dir, nodeKeyFile), nextKey); err != nil {
			return err
		}
		if err := pki.WriteSecretFile(filepath.Join(dir, nodeCertFile), nextCert); err != nil {
			return err
		}
		os.Remove(filepath.Join(dir, nodeNextCertFile))
		os.Remove(filepath.Join(dir, nodeNextKeyFile))
	}
	keys, err := readGossipKeys(dir)
	if err != nil {
		return err
	}
	cr.gossipKey, cr.gossipOthers = keys[0], keys[1:]
	cr.fingerprint = pki.Fingerprint(cr.ca.Cert)
	return nil
}

// create makes a new cluster's secrets (first node).
func (cr *credentials) create(dir, id string) error {
	ca, err := pki.NewCA("herd cluster CA " + id)
	if err != nil {
		return err
	}
	cr.ca, cr.fingerprint, cr.created = ca, pki.Fingerprint(ca.Cert), true
	cr.gossipKey = make([]byte, 32)
	rand.Read(cr.gossipKey)
	join := pki.JoinToken{Fingerprint: cr.fingerprint, Secret: pki.NewSecret()}
	admin := pki.AdminToken{Fingerprint: cr.fingerprint, ID: pki.NewTokenID(), Secret: pki.NewSecret()}
	// The token files first: a crash before the CA is written starts over.
	for _, f := range []struct {
		name string
		data []byte
	}{
		{JoinTokenFile, []byte(join.String() + "\n")},
		{AdminTokenFile, []byte(admin.String() + "\n")},
		{gossipKeyFile, []byte(hex.EncodeToString(cr.gossipKey) + "\n")},
		{caKeyFile, ca.KeyPEM},
		{caCertFile, ca.CertPEM},
	} {
		if err := pki.WriteSecretFile(filepath.Join(dir, f.name), f.data); err != nil {
			return err
		}
	}
	return nil
}

// join obtains the node's credentials from a member.
func (cr *credentials) join(ctx context.Context, o Options, id string, ip net.IP, members []string, logger *slog.Logger) error {
	raw := o.JoinToken
	if raw == "" {
		return fmt.Errorf("joining needs the cluster's join token: set HERD_JOIN_TOKEN or give --join-token-file (the first node wrote it to DATA/%s)", JoinTokenFile)
	}
	token, err := pki.ParseJoinToken(strings.TrimSpace(raw))
	if err != nil {
		return fmt.Errorf("join token: %w", err)
	}
	request := peer.JoinRequest{NodeID: id, IPs: []string{ip.String()}, Secret: token.Secret, Level: cluster.SupportedLevel}
	// Every answer but a refusal is retried until --join-timeout: nodes
	// started at the same moment (deploy/docker-compose.yml) reach the
	// first node before it listens, and then before it has recorded its
	// join secret in the log (peer.ErrJoinNotReady).
	deadline := time.Now().Add(o.JoinTimeout)
	var last error
	for {
		for _, member := range members {
			attempt, cancel := context.WithTimeout(ctx, 10*time.Second)
			response, err := peer.RequestJoin(attempt, member, token, request)
			cancel()
			if err == nil {
				return cr.adopt(ctx, o.DataDir, member, response, token.Fingerprint)
			}
			last = fmt.Errorf("join through %s: %w", member, err)
			var dialError *net.OpError
			if errors.As(err, &dialError) && dialError.Op == "dial" {
				last = fmt.Errorf("join through %s: nothing answers there (%v); is a herd node running at that address and peer port (default %d)?", member, err, DefaultPeerPort)
			}
			if errors.Is(err, peer.ErrJoinRefused) {
				return last // the member said no: retrying will not help
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("gave up joining after %v (--join-timeout): %w", o.JoinTimeout, last)
		}
		if errors.Is(last, peer.ErrJoinNotReady) {
			logger.Info("cluster: the cluster is starting, retrying the join", "err", last)
		} else {
			logger.Warn("cluster: join failed, retrying", "err", last)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// adopt stores what a member sent a joining node.
func (cr *credentials) adopt(ctx context.Context, dir, member string, r peer.JoinResponse, fingerprint string) error {
	var ca *pki.CA
	var err error
	if len(r.CAKey) > 0 {
		ca, err = pki.ParseCA(r.CACert, r.CAKey) // a member of a cluster below LevelSecurity
	} else {
		ca, err = pki.ParseCACertificate(r.CACert)
	}
	if err != nil {
		return fmt.Errorf("the member sent a damaged CA: %w", err)
	}
	if pki.Fingerprint(ca.Cert) != fingerprint {
		return errors.New("the member sent a CA that is not the one the join token names")
	}
	gossipKeys := [][]byte{r.GossipKey}
	if len(r.GossipKey) == 0 {
		// Admitted (cluster/admission.go): the cluster's secrets come
		// over mTLS, to the certificate the log now names.
		secrets, err := fetchSecrets(ctx, member, r.NodeCert, r.NodeKey, r.CACert)
		if err != nil {
			return fmt.Errorf("admitted, but the cluster's secrets did not come from %s: %w", member, err)
		}
		if gossipKeys, err = secrets.keys(); err != nil {
			return err
		}
	}
	if len(gossipKeys[0]) != 32 {
		return errors.New("the member sent a damaged gossip key")
	}
	cr.ca, cr.fingerprint, cr.gossipKey, cr.gossipOthers, cr.seeds = ca, fingerprint, gossipKeys[0], gossipKeys[1:], r.Gossip
	files := []struct {
		name string
		data []byte
	}{
		{gossipKeyFile, gossipKeysFile(gossipKeys)},
		{nodeKeyFile, r.NodeKey},
		{nodeCertFile, r.NodeCert},
		{caKeyFile, r.CAKey},
		{caCertFile, r.CACert}, // last: its presence says the node has its credentials
	}
	for _, f := range files {
		if len(f.data) == 0 {
			continue // no CA key: this node does not sign
		}
		if err := pki.WriteSecretFile(filepath.Join(dir, f.name), f.data); err != nil {
			return err
		}
	}
	return nil
}

// ensureNodeCertificate loads the node certificate, issuing a new one
// when there is none or it does not name the address the node binds to
// (QEMU and libnbd check it).
func (cr *credentials) ensureNodeCertificate(dir, id string, ip net.IP) error {
	certPath, keyPath := filepath.Join(dir, nodeCertFile), filepath.Join(dir, nodeKeyFile)
	certPEM, certErr := os.ReadFile(certPath)
	keyPEM, keyErr := pki.ReadSecretFile(keyPath)
	if certErr == nil && keyErr == nil {
		leaf, err := tls.X509KeyPair(certPEM, keyPEM)
		if err == nil {
			parsed, err := x509.ParseCertificate(leaf.Certificate[0])
			if err == nil && certificateFits(parsed, id, ip, cr.ca.Cert) {
				return cr.useNodeCertificate(certPEM, keyPEM)
			}
		}
	} else if keyErr != nil && !errors.Is(keyErr, os.ErrNotExist) {
		return keyErr
	}
	if !cr.ca.CanSign() {
		// Admitted without the CA key (signing.go): the certificate the
		// log names is the one to keep. Peers do not check its
		// addresses; NBD clients that do must use the old address until
		// the node is admitted again.
		if certErr == nil && keyErr == nil {
			if leaf, err := tls.X509KeyPair(certPEM, keyPEM); err == nil {
				if parsed, err := x509.ParseCertificate(leaf.Certificate[0]); err == nil {
					if nodeID, ok := pki.NodeID(parsed); ok && nodeID == id && parsed.CheckSignatureFrom(cr.ca.Cert) == nil && time.Now().Before(parsed.NotAfter) {
						return cr.useNodeCertificate(certPEM, keyPEM)
					}
				}
			}
		}
		return fmt.Errorf("%s: no valid node certificate for node %s, and this node does not hold the CA key to issue one: start it on a new data directory to join again", dir, id)
	}
	certPEM, keyPEM, err := cr.ca.IssueNode(id, []net.IP{ip})
	if err != nil {
		return err
	}
	if err := pki.WriteSecretFile(keyPath, keyPEM); err != nil {
		return err
	}
	if err := pki.WriteSecretFile(certPath, certPEM); err != nil {
		return err
	}
	return cr.useNodeCertificate(certPEM, keyPEM)
}

func certificateFits(cert *x509.Certificate, id string, ip net.IP, ca *x509.Certificate) bool {
	if nodeID, ok := pki.NodeID(cert); !ok || nodeID != id {
		return false
	}
	if cert.CheckSignatureFrom(ca) != nil || time.Now().Add(30*24*time.Hour).After(cert.NotAfter) {
		return false
	}
	for _, named := range cert.IPAddresses {
		if named.Equal(ip) {
			return true
		}
	}
	return false
}

func (cr *credentials) useNodeCertificate(certPEM, keyPEM []byte) error {
	var err error
	if cr.node, err = pki.NodeTLSCertificate(certPEM, keyPEM, cr.ca.CertPEM); err != nil {
		return err
	}
	cr.pool = x509.NewCertPool()
	cr.pool.AddCert(cr.ca.Cert)
	return nil
}

// initSecurity records the first node's join secret and admin token in
// the log (hashes only), retrying until it is committed.
func (cr *credentials) initSecurity(ctx context.Context, c *cluster.Cluster, logger *slog.Logger) error {
	if cr.joinToken.Secret == "" || cr.adminToken.Secret == "" || c.JoinHash() != "" {
		return nil
	}
	admin := cluster.Token{ID: cr.adminToken.ID, Name: "admin", Hash: pki.HashSecret(cr.adminToken.Secret)}
	for {
		attempt, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := c.InitSecurity(attempt, pki.HashSecret(cr.joinToken.Secret), admin, pki.Serial(cr.node.Leaf))
		cancel()
		if err == nil {
			return nil
		}
		logger.Warn("recording the cluster's first credentials, retrying", "err", err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// joinState is what the join handler reads from this node's copy of the
// log (*cluster.Cluster); safe for concurrent use.
type joinState interface {
	// JoinHash is the join secret's hash, "" until the log has it.
	JoinHash() string
	NodeRemoved(nodeID string) bool
	// Level is the cluster's feature level (cluster/features.go).
	Level() int
	// KnownNode says whether the id is a member, admitted or removed;
	// Admit records a new node's admission (cluster/admission.go).
	KnownNode(nodeID string) bool
	Admit(ctx context.Context, nodeID, serial, joinToken string) error
	// Sync waits for this node to apply what the leader had committed;
	// MatchJoinSecret finds the join secret or token a secret matches
	// (cluster/jointokens.go).
	Sync(ctx context.Context) error
	MatchJoinSecret(secret string, now time.Time) (tokenID string, err error)
}

// joinHandler admits a node that presents the join secret (or a join
// token's): from LevelSecurity the log records the node's id and
// certificate serial, and the node receives that certificate and the CA
// certificate only; it fetches the gossip key over mutual TLS once
// admitted (ProtocolSecrets). Below it, as older herds expect, the
// answer also holds the CA key and the gossip key.
func (cr *credentials) joinHandler(c joinState, gossipAddr string, logger *slog.Logger) func(context.Context, peer.JoinRequest, net.Addr) (peer.JoinResponse, error) {
	return func(ctx context.Context, req peer.JoinRequest, remote net.Addr) (peer.JoinResponse, error) {
		hash := c.JoinHash()
		if hash == "" {
			// Not a refusal: the joining node asks again (until its
			// --join-timeout).
			return peer.JoinResponse{}, fmt.Errorf("%w: this node does not know the cluster's join secret yet (the cluster is starting)", peer.ErrJoinNotReady)
		}
		// A read index first: a rotation or a revoke the leader committed
		// before this join holds here too (jointokens.go).
		if err := c.Sync(ctx); err != nil {
			return peer.JoinResponse{}, fmt.Errorf("%w: this node cannot confirm it is up to date with the cluster's log: %v", peer.ErrJoinNotReady, err)
		}
		joinToken, secretErr := c.MatchJoinSecret(req.Secret, time.Now())
		if secretErr != nil {
			logger.Warn("refused a join: wrong join secret", logging.From("peer", remote), "node", req.NodeID)
			return peer.JoinResponse{}, errors.New(strings.TrimPrefix(secretErr.Error(), cluster.ErrUnauthorized.Error()+": "))
		}
		if len(req.NodeID) != 16 {
			return peer.JoinResponse{}, fmt.Errorf("malformed node id %q", req.NodeID)
		}
		if _, err := hex.DecodeString(req.NodeID); err != nil {
			return peer.JoinResponse{}, fmt.Errorf("malformed node id %q", req.NodeID)
		}
		if c.NodeRemoved(req.NodeID) {
			return peer.JoinResponse{}, fmt.Errorf("node %s was removed from the cluster for good; start it on a new data directory", req.NodeID)
		}
		if level, supported := c.Level(), max(req.Level, cluster.LevelBase); supported < level {
			logger.Warn("refused a join: the node's herd is older than the cluster's feature level", logging.From("peer", remote), "node", req.NodeID, "supports", supported, "cluster_level", level)
			return peer.JoinResponse{}, fmt.Errorf("the cluster is at feature level %d and this node's herd supports only %d: run the herd version the other nodes run (herd version on a member, herd node list)", level, supported)
		}
		if len(req.IPs) == 0 || len(req.IPs) > 8 {
			return peer.JoinResponse{}, errors.New("a join names 1 to 8 addresses")
		}
		for _, text := range req.IPs {
			if net.ParseIP(text) == nil {
				return peer.JoinResponse{}, fmt.Errorf("%q is not an IP address", text)
			}
		}
		if c.Level() < cluster.LevelSecurity {
			// Below the level every member holds the CA key and the
			// join hands it out, as older herds expect.
			signed, err := cr.signLocally(signRequest{Kind: "node", NodeID: req.NodeID, IPs: req.IPs})
			if err != nil {
				return peer.JoinResponse{}, err
			}
			logger.Info("admitted a new node", "node", req.NodeID, "from", remote.String())
			ca := cr.now().current
			return peer.JoinResponse{NodeCert: signed.Cert, NodeKey: signed.Key, CACert: ca.CertPEM, CAKey: ca.KeyPEM, GossipKey: cr.gossipKeys()[0], Gossip: []string{gossipAddr}}, nil
		}
		// Admission before credentials (cluster/admission.go): the log
		// names the node and its certificate first; the node receives
		// that certificate and the CA certificate, never the CA key, and
		// fetches the gossip key over mTLS once admitted.
		if c.KnownNode(req.NodeID) {
			return peer.JoinResponse{}, fmt.Errorf("node %s is already a member or was admitted before; a new node starts on an empty data directory (it gets a new id)", req.NodeID)
		}
		signed, err := cr.sign(ctx, signRequest{Kind: "node", NodeID: req.NodeID, IPs: req.IPs})
		if err != nil {
			return peer.JoinResponse{}, fmt.Errorf("%w: %v", peer.ErrJoinNotReady, err)
		}
		if err := c.Admit(ctx, req.NodeID, signed.Serial, joinToken); err != nil {
			return peer.JoinResponse{}, fmt.Errorf("%w: recording the admission: %v", peer.ErrJoinNotReady, err)
		}
		logger.Info("admitted a new node", "node", req.NodeID, "certificate", signed.Serial, "from", remote.String())
		return peer.JoinResponse{NodeCert: signed.Cert, NodeKey: signed.Key, CACert: cr.now().current.CertPEM, Gossip: []string{gossipAddr}}, nil
	}
}

// IssueClient implements api.Authority: here, or by a node holding the
// CA key (signing.go).
func (cr *credentials) IssueClient(name string) ([]byte, []byte, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	signed, err := cr.sign(ctx, signRequest{Kind: "client", Name: name})
	return signed.Cert, signed.Key, signed.Serial, err
}

// IssueSession implements api.Authority: the token's secret goes with a
// request to a holder, which checks it (sessionRefusal).
func (cr *credentials) IssueSession(name, tokenID, tokenSecret string, readOnly bool) ([]byte, []byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	signed, err := cr.sign(ctx, signRequest{Kind: "session", Name: name, TokenID: tokenID, TokenSecret: tokenSecret, ReadOnly: readOnly})
	return signed.Cert, signed.Key, err
}

// CACertPEM implements api.Authority: the CA certificates a client
// trusts, both during a CA rotation.
func (cr *credentials) CACertPEM() []byte { return cr.now().caCertificates() }

// Fingerprints implements api.Trust: admin tokens carrying any of them
// are taken.
func (cr *credentials) Fingerprints() []string { return cr.now().fingerprints() }

// Fingerprint implements api.Trust: the CA new tokens name, the new one
// during a rotation.
func (cr *credentials) Fingerprint() string { return cr.now().newest().Fingerprint() }

// serverTLS is the TLS configuration of the admin API: the certificate
// from the CA the client names (trust.go).
func (cr *credentials) serverTLS() *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS13, GetCertificate: func(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
		return cr.now().serverCertificate(hello.ServerName), nil
	}}
}

// peerTLS verifies other nodes' admin APIs against any CA trusted.
func (cr *credentials) peerTLS() *tls.Config {
	return &tls.Config{
		MinVersion:         tls.VersionTLS13,
		InsecureSkipVerify: true, // verified by the CA below, not by host name
		// Without it a node might show the certificate from the old CA
		// only (trust.go); both verify.
		VerifyPeerCertificate: func(rawCerts [][]byte, _ [][]*x509.Certificate) error {
			var err error
			for _, fingerprint := range cr.now().fingerprints() {
				if _, err = pki.VerifyServerChain(rawCerts, fingerprint); err == nil {
					return nil
				}
			}
			return err
		},
	}
}

// joinAddresses turns --join's IP[:PORT] entries into peer addresses.
func joinAddresses(list string) ([]string, error) {
	var out []string
	for _, part := range strings.Split(list, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		host, port, err := net.SplitHostPort(part)
		if err != nil {
			host, port = part, strconv.Itoa(DefaultPeerPort)
		}
		if net.ParseIP(host) == nil {
			return nil, fmt.Errorf("--join %q: %q is not an IP address", part, host)
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return nil, fmt.Errorf("--join %q: %q is not a port", part, port)
		}
		out = append(out, net.JoinHostPort(host, port))
	}
	return out, nil
}
