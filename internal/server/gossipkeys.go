package server

// The node's gossip keyring (cluster/gossipkeys.go rotates it): DATA/
// gossip.key holds its keys in hex, one a line, the key the node encrypts
// with first. A file of one line is what herd wrote before rotations.

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/peer"
	"github.com/herd-storage/herd/internal/pki"
)

// maxGossipKeys bounds the keys a keyring file or a member's answer may
// hold (a rotation has two at most).
const maxGossipKeys = 8

func readGossipKeys(dir string) ([][]byte, error) {
	path := filepath.Join(dir, gossipKeyFile)
	text, err := pki.ReadSecretFile(path)
	if err != nil {
		return nil, err
	}
	var keys [][]byte
	for _, line := range strings.Split(string(text), "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		key, err := hex.DecodeString(line)
		if err != nil || len(key) != 32 {
			return nil, fmt.Errorf("%s is damaged: each line must hold 32 bytes in hex", path)
		}
		keys = append(keys, key)
	}
	if len(keys) == 0 || len(keys) > maxGossipKeys {
		return nil, fmt.Errorf("%s is damaged: it holds %d keys", path, len(keys))
	}
	return keys, nil
}

func gossipKeysFile(keys [][]byte) []byte {
	var b strings.Builder
	for _, key := range keys {
		b.WriteString(hex.EncodeToString(key) + "\n")
	}
	return []byte(b.String())
}

// gossipKeys are the keys this node holds, the primary first.
func (cr *credentials) gossipKeys() [][]byte {
	if cr.gossipRing != nil {
		return cr.gossipRing.Keys()
	}
	if cr.gossipKey == nil {
		return nil
	}
	return append([][]byte{cr.gossipKey}, cr.gossipOthers...)
}

// setupGossipRing makes the keyring the cluster rotates, saved to dir.
func (cr *credentials) setupGossipRing(dir string) error {
	ring, err := cluster.NewGossipKeys(cr.gossipKeys(),
		func(keys [][]byte) error {
			return pki.WriteSecretFile(filepath.Join(dir, gossipKeyFile), gossipKeysFile(keys))
		},
		cr.fetchGossipKeys)
	if err != nil {
		return err
	}
	cr.gossipRing = ring
	return nil
}

// fetchGossipKeys asks the member at a peer address, over mTLS, for its
// gossip keys.
func (cr *credentials) fetchGossipKeys(ctx context.Context, member string) ([][]byte, error) {
	body, err := peer.Call(ctx, member, cr.peer, peer.ProtocolSecrets, []byte("{}"))
	if err != nil {
		return nil, err
	}
	var s secrets
	if err := json.Unmarshal(body, &s); err != nil {
		return nil, err
	}
	cr.learnCAs(s.CACerts)
	return s.keys()
}

// learnCAs trusts the new CA of a rotation a member trusts (certs: its
// CAs, the cluster's first) when this node knows only the cluster's: a
// node back from a stop during a rotation gets the new trust at once,
// over its old mTLS identity, before its log catches up.
func (cr *credentials) learnCAs(certs [][]byte) {
	t := cr.now()
	if len(certs) != 2 || t.next != nil {
		return
	}
	current, err := pki.ParseCACertificate(certs[0])
	if err != nil || current.Fingerprint() != t.current.Fingerprint() {
		return
	}
	next, err := pki.ParseCACertificate(certs[1])
	if err != nil || next.Fingerprint() == current.Fingerprint() {
		return
	}
	if err := pki.WriteSecretFile(filepath.Join(cr.dir, caNextCertFile), next.CertPEM); err != nil {
		return
	}
	if cr.trust.CompareAndSwap(t, newTrust(t.current, next, t.node, nil)) && cr.logger != nil {
		cr.logger.Info("CA rotation: a member trusts a new CA; trusting it too", "ca", next.Fingerprint())
	}
}

// keys are the gossip keys of an answer, the primary first: GossipKeys,
// or GossipKey alone from a herd before rotations.
func (s secrets) keys() ([][]byte, error) {
	keys := s.GossipKeys
	if len(keys) == 0 {
		keys = [][]byte{s.GossipKey}
	}
	if len(keys) > maxGossipKeys {
		return nil, fmt.Errorf("the member sent %d gossip keys", len(keys))
	}
	for _, key := range keys {
		if len(key) != 32 {
			return nil, fmt.Errorf("the member sent a gossip key of %d bytes, not 32", len(key))
		}
	}
	return keys, nil
}
