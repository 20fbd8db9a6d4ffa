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
	// ReadOnly: a read-only session.
	ReadOnly bool `json:"read_only,omitempty"`
}

type signAnswer struct {
	Cert   []byte `json:"cert"`
	Key    []byte `json:"key"`
	Serial string `json:"serial,omitempty"`
}

// signLocally signs r with this node's CA key.
func (cr *credentials) signLocally(r signRequest) (signAnswer, error) {
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
		certPEM, keyPEM, err := cr.ca.IssueNode(r.NodeID, ips)
		if err != nil {
			return signAnswer{}, err
		}
		cert, err := pki.ParseCertificate(certPEM)
		if err != nil {
			return signAnswer{}, err
		}
		return signAnswer{Cert: certPEM, Key: keyPEM, Serial: pki.Serial(cert)}, nil
	case "client":
		certPEM, keyPEM, serial, err := cr.ca.IssueClient(r.Name)
		return signAnswer{Cert: certPEM, Key: keyPEM, Serial: serial}, err
	case "session":
		certPEM, keyPEM, err := cr.ca.IssueSession(r.Name, r.TokenID, r.ReadOnly)
		return signAnswer{Cert: certPEM, Key: keyPEM}, err
	}
	return signAnswer{}, fmt.Errorf("unknown kind of certificate %q", r.Kind)
}

// sign signs r here if this node holds the CA key, else asks a holder.
func (cr *credentials) sign(ctx context.Context, r signRequest) (signAnswer, error) {
	if cr.ca.CanSign() {
		return cr.signLocally(r)
	}
	c := cr.cluster.Load()
	if c == nil {
		return signAnswer{}, fmt.Errorf("%w, and the cluster is not running yet to ask one that does", pki.ErrNoCAKey)
	}
	request, err := json.Marshal(r)
	if err != nil {
		return signAnswer{}, err
	}
	holders := c.Signers()
	if len(holders) == 0 {
		return signAnswer{}, fmt.Errorf("%w, and no node that holds it is up (herd node list --json: holds_ca_key); start one, or copy ca.key to this node (docs/SECURITY.md)", pki.ErrNoCAKey)
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
// holder to sign.
func (cr *credentials) serveSign(_ context.Context, nodeID string, request []byte) ([]byte, error) {
	if !cr.ca.CanSign() {
		return nil, pki.ErrNoCAKey
	}
	var r signRequest
	if err := json.Unmarshal(request, &r); err != nil {
		return nil, fmt.Errorf("bad sign request: %v", err)
	}
	answer, err := cr.signLocally(r)
	if err != nil {
		return nil, err
	}
	return json.Marshal(answer)
}

// secrets is what ProtocolSecrets answers an admitted node.
type secrets struct {
	// GossipKey is the key this node encrypts gossip with; GossipKeys
	// its whole keyring, that key first (a rotation under way has two).
	GossipKey  []byte   `json:"gossip_key"`
	GossipKeys [][]byte `json:"gossip_keys,omitempty"`
}

func (cr *credentials) serveSecrets(_ context.Context, nodeID string, _ []byte) ([]byte, error) {
	keys := cr.gossipKeys()
	return json.Marshal(secrets{GossipKey: keys[0], GossipKeys: keys})
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
