package server

// Where the CA key lives. The first node of a cluster creates the CA and
// keeps its key; a node admitted at feature level LevelSecurity or later
// never receives it (the join protocol hands out a node certificate, and
// the gossip key comes over mTLS once the log admitted that certificate,
// cluster/admission.go). A node without the key asks one that holds it to
// sign (ProtocolSign): node certificates for the joins it handles,
// client certificates and NBD session certificates for the admin API.
//
// Why not every member, as before: a key copied to every node outlives
// the node. Whoever held the join secret, or a removed node's disk, kept
// a key that signs certificates for ever. Signing on request ends with
// the membership: the holders refuse a caller the log does not admit
// (peer.Credentials.Allowed). A member can still ask for signatures
// while it is one; it already holds copies of every VDI's objects, so
// this gives it nothing new. Why not the voters: voters change by
// themselves (voters.go), so the key would travel with every change. The
// cost: while no holder is up, no node joins and no client or session
// certificate is issued (data keeps flowing). docs/SECURITY.md tells the
// operator how to make another node a holder (copy ca.key into its data
// directory, mode 0600, and restart it).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/peer"
	"github.com/herd-storage/herd/internal/pki"
)

// signRequest is what a member without the CA key asks a holder to sign.
type signRequest struct {
	Kind    string   `json:"kind"` // "node", "client" or "session"
	NodeID  string   `json:"node_id,omitempty"`
	IPs     []string `json:"ips,omitempty"`
	Name    string   `json:"name,omitempty"`
	TokenID string   `json:"token_id,omitempty"` // a session's admin token
	// TokenSecret is that token's secret, as the admin API was given it:
	// the holder checks it against the log before it signs a session
	// (sessionRefusal). Older builds send none (cluster.LevelSessionProof).
	TokenSecret string `json:"token_secret,omitempty"`
	// ReadOnly: a read-only session.
	ReadOnly bool `json:"read_only,omitempty"`
	// CA is the fingerprint of the CA to sign with ("": the cluster's).
	// During a CA rotation, the new one's holder signs a node
	// certificate from it only for the node that asks.
	CA string `json:"ca,omitempty"`
}

type signAnswer struct {
	Cert   []byte `json:"cert"`
	Key    []byte `json:"key"`
	Serial string `json:"serial,omitempty"`
}

// signLocally signs r with this node's key of the CA r names.
func (cr *credentials) signLocally(r signRequest) (signAnswer, error) {
	t := cr.now()
	ca := t.current
	if r.CA != "" {
		if ca = t.ca(r.CA); ca == nil {
			return signAnswer{}, fmt.Errorf("this node does not trust CA %s", r.CA)
		}
	}
	if !ca.CanSign() {
		return signAnswer{}, pki.ErrNoCAKey
	}
	switch r.Kind {
	case "node":
		if len(r.IPs) == 0 || len(r.IPs) > 8 {
			return signAnswer{}, errors.New("a node certificate names 1 to 8 addresses")
		}
		var ips []net.IP
		for _, text := range r.IPs {
			ip := net.ParseIP(text)
			if ip == nil {
				return signAnswer{}, fmt.Errorf("%q is not an IP address", text)
			}
			ips = append(ips, ip)
		}
		certPEM, keyPEM, err := ca.IssueNode(r.NodeID, ips)
		if err != nil {
			return signAnswer{}, err
		}
		cert, err := pki.ParseCertificate(certPEM)
		if err != nil {
			return signAnswer{}, err
		}
		return signAnswer{Cert: certPEM, Key: keyPEM, Serial: pki.Serial(cert)}, nil
	case "client":
		certPEM, keyPEM, serial, err := ca.IssueClient(r.Name)
		return signAnswer{Cert: certPEM, Key: keyPEM, Serial: serial}, err
	case "session":
		certPEM, keyPEM, err := ca.IssueSession(r.Name, r.TokenID, r.ReadOnly)
		return signAnswer{Cert: certPEM, Key: keyPEM}, err
	}
	return signAnswer{}, fmt.Errorf("unknown kind of certificate %q", r.Kind)
}

// sign signs r here if this node holds the key, else asks a holder.
// Client and session certificates come from the new CA during a CA
// rotation, so that they outlive its end; node certificates (joins) from
// the cluster's.
func (cr *credentials) sign(ctx context.Context, r signRequest) (signAnswer, error) {
	c := cr.cluster.Load()
	var rotation *cluster.CARotation
	if c != nil {
		rotation = c.CA().Rotation
	}
	if r.Kind != "node" && rotation != nil && r.CA == "" {
		r.CA = rotation.Fingerprint
	}
	t := cr.now()
	ca := t.current
	if r.CA != "" {
		ca = t.ca(r.CA)
	}
	if ca != nil && ca.CanSign() {
		return cr.signLocally(r)
	}
	if c == nil {
		return signAnswer{}, fmt.Errorf("%w, and the cluster is not running yet to ask one that does", pki.ErrNoCAKey)
	}
	var holders []string
	if rotation != nil && r.CA == rotation.Fingerprint {
		if holder, ok := c.Node(rotation.Holder); ok {
			holders = []string{holder.PeerAddr}
		}
	} else {
		holders = c.Signers()
	}
	if len(holders) == 0 {
		return signAnswer{}, fmt.Errorf("%w, and no node that holds it is up (herd node list --json: holds_ca_key); start one, or copy ca.key to this node (docs/SECURITY.md)", pki.ErrNoCAKey)
	}
	return cr.askToSign(ctx, holders, r)
}

// askToSign asks each holder in turn to sign r.
func (cr *credentials) askToSign(ctx context.Context, holders []string, r signRequest) (signAnswer, error) {
	request, err := json.Marshal(r)
	if err != nil {
		return signAnswer{}, err
	}
	var errs []string
	for _, holder := range holders {
		attempt, cancel := context.WithTimeout(ctx, 10*time.Second)
		body, err := peer.Call(attempt, holder, cr.peer, peer.ProtocolSign, request)
		cancel()
		if err != nil {
			errs = append(errs, err.Error())
			continue
		}
		var answer signAnswer
		if err := json.Unmarshal(body, &answer); err != nil {
			errs = append(errs, fmt.Sprintf("%s: %v", holder, err))
			continue
		}
		return answer, nil
	}
	return signAnswer{}, fmt.Errorf("no node holding the CA key signed: %s", strings.Join(errs, "; "))
}

// serveSign answers ProtocolSign: a member (Allowed accepted it) asks this
// holder to sign. The caller must run as a member (raft, or alive in
// gossip): an id only admitted (a join's node certificate, no node
// started) gets nothing signed. A session certificate is signed only for
// the secret of an admin token that may read VDI data (sessionRefusal).
func (cr *credentials) serveSign(ctx context.Context, nodeID string, request []byte) ([]byte, error) {
	var r signRequest
	if err := json.Unmarshal(request, &r); err != nil {
		return nil, fmt.Errorf("bad sign request: %v", err)
	}
	log := cr.signing
	if log == nil {
		return nil, errors.New("this node is starting")
	}
	if !log.Running(nodeID) {
		return nil, fmt.Errorf("%w: node %s asks to sign, but it is admitted only: neither a member of raft nor alive in gossip", cluster.ErrForbidden, nodeID)
	}
	if r.Kind == "session" {
		if err := sessionRefusal(ctx, log, log.Level(), &r); err != nil {
			return nil, err
		}
	}
	t := cr.now()
	if r.Kind == "rotate-ca" {
		// A node without the cluster CA's key asks this one to make the
		// new CA (herd cluster rotate-ca).
		c := cr.cluster.Load()
		if c == nil {
			return nil, errors.New("this node is starting")
		}
		state, err := cr.startCARotation(ctx, c)
		if err != nil {
			return nil, err
		}
		return json.Marshal(state)
	}
	if r.CA != "" && r.CA != t.current.Fingerprint() && r.Kind == "node" && r.NodeID != nodeID {
		// A certificate from the new CA is let in before its serial is
		// recorded (cluster/carotation.go): each node gets its own only.
		return nil, fmt.Errorf("node %s asked for node %s's certificate from the new CA: a node asks for its own", nodeID, r.NodeID)
	}
	answer, err := cr.signLocally(r)
	if err != nil {
		return nil, err
	}
	return json.Marshal(answer)
}

// sessionLog is what a holder reads to check a session request
// (*cluster.Cluster).
type sessionLog interface {
	LookupToken(id string) (cluster.Token, bool)
	CatchUp(ctx context.Context) error
}

// signingLog is what a holder reads before it signs for another node
// (*cluster.Cluster, set before ProtocolSign is served).
type signingLog interface {
	sessionLog
	Running(id string) bool
	Level() int
}

// sessionRefusal says why a holder does not sign the session r asks
// for, or nil; it sets r's name and scope from the token's record. The
// request must carry the secret of the admin token it names, still valid
// and allowed VDI data: a node's certificate alone does not make
// sessions for a token id it read in the log. At a level below
// LevelSessionProof a request without the secret is signed as before
// (older builds do not send it).
func sessionRefusal(ctx context.Context, log sessionLog, level int, r *signRequest) error {
	if r.TokenSecret == "" {
		if level < cluster.LevelSessionProof {
			return nil
		}
		return fmt.Errorf("%w: a session certificate is signed only for a request that carries its admin token's secret", cluster.ErrForbidden)
	}
	token, ok := log.LookupToken(r.TokenID)
	if !ok {
		// Created through another node a moment ago: catch up first.
		catchUp, cancel := context.WithTimeout(ctx, 10*time.Second)
		if log.CatchUp(catchUp) == nil {
			token, ok = log.LookupToken(r.TokenID)
		}
		cancel()
	}
	switch {
	case !ok || !pki.SecretMatches(token.Hash, r.TokenSecret):
		return fmt.Errorf("%w: a session for an unknown admin token, or with the wrong secret", cluster.ErrUnauthorized)
	case token.Revoked:
		return fmt.Errorf("%w: a session for admin token %q, which was revoked", cluster.ErrUnauthorized, token.Name)
	case !token.ReadsData():
		return fmt.Errorf("%w: a session for admin token %q, which may not read VDI data", cluster.ErrForbidden, token.Name)
	}
	r.Name = "token-" + token.Name
	r.ReadOnly = r.ReadOnly || token.ReadOnly
	return nil
}

// secrets is what ProtocolSecrets answers an admitted node.
type secrets struct {
	// GossipKey is the key this node encrypts gossip with; GossipKeys
	// its whole keyring, that key first (a rotation under way has two).
	GossipKey  []byte   `json:"gossip_key"`
	GossipKeys [][]byte `json:"gossip_keys,omitempty"`
	// CACerts are the CAs this node trusts (PEM), the cluster's first:
	// a node back from a stop learns of a CA rotation from them before
	// its log catches up (trust.go).
	CACerts [][]byte `json:"ca_certs,omitempty"`
}

func (cr *credentials) serveSecrets(_ context.Context, nodeID string, _ []byte) ([]byte, error) {
	keys := cr.gossipKeys()
	t := cr.now()
	answer := secrets{GossipKey: keys[0], GossipKeys: keys, CACerts: [][]byte{t.current.CertPEM}}
	if t.next != nil {
		answer.CACerts = append(answer.CACerts, t.next.CertPEM)
	}
	return json.Marshal(answer)
}

// fetchSecrets asks member for the cluster's secrets as the node of
// certPEM/keyPEM (just admitted).
func fetchSecrets(ctx context.Context, member string, certPEM, keyPEM, caPEM []byte) (secrets, error) {
	creds, err := peer.NewCredentials(certPEM, keyPEM, caPEM, nil)
	if err != nil {
		return secrets{}, fmt.Errorf("the member sent a damaged node certificate: %w", err)
	}
	attempt, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	body, err := peer.Call(attempt, member, creds, peer.ProtocolSecrets, []byte("{}"))
	if err != nil {
		return secrets{}, err
	}
	var s secrets
	if err := json.Unmarshal(body, &s); err != nil {
		return secrets{}, err
	}
	if _, err := s.keys(); err != nil {
		return secrets{}, err
	}
	return s, nil
}
