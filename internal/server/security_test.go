package server

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/peer"
	"github.com/herd-storage/herd/internal/pki"
)

// startingState is a member's log that learns the join secret's hash only
// after the first unknownFor reads, as the first node's does while it
// elects itself and commits InitSecurity.
type startingState struct {
	hash  string
	level int // the cluster's feature level (0: LevelBase)

	mu         sync.Mutex // guards the following fields
	unknownFor int
	reads      int
}

func (s *startingState) JoinHash() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reads++
	if s.reads <= s.unknownFor {
		return ""
	}
	return s.hash
}

func (s *startingState) NodeRemoved(string) bool { return false }

func (s *startingState) Level() int { return max(s.level, cluster.LevelBase) }

func (s *startingState) KnownNode(string) bool { return false }

func (s *startingState) Admit(context.Context, string, string, string) error { return nil }

func (s *startingState) Sync(context.Context) error { return nil }

func (s *startingState) MatchJoinSecret(secret string, _ time.Time) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !pki.SecretMatches(s.hash, secret) {
		return "", errors.New("wrong join secret")
	}
	return "", nil
}

func (s *startingState) readCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reads
}

// startJoinMember starts a member's peer port on 127.0.0.1 whose join
// handler is the real one over state, and returns its address and the
// join token.
func startJoinMember(t *testing.T, state *startingState) (string, pki.JoinToken) {
	t.Helper()
	ca, err := pki.NewCA("test CA")
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err := ca.IssueNode("00000000000000aa", []net.IP{net.ParseIP("127.0.0.1")})
	if err != nil {
		t.Fatal(err)
	}
	creds, err := peer.NewCredentials(certPEM, keyPEM, ca.CertPEM, nil)
	if err != nil {
		t.Fatal(err)
	}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	listener, err := peer.Listen("127.0.0.1:0", creds, logger)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { listener.Close() })
	token := pki.JoinToken{Fingerprint: pki.Fingerprint(ca.Cert), Secret: pki.NewSecret()}
	state.hash = pki.HashSecret(token.Secret)
	member := &credentials{ca: ca, gossipKey: []byte("gossip-key-32-bytes-long-enough!")}
	listener.SetJoinHandler(member.joinHandler(state, "127.0.0.1:7001", logger))
	return listener.Addr().String(), token
}

// TestJoinWaitsForStartingCluster: a node that asks a member which does
// not know the join secret yet (the cluster is starting) is told to come
// back, and does until it is admitted, instead of giving up at the first
// answer.
func TestJoinWaitsForStartingCluster(t *testing.T) {
	state := &startingState{unknownFor: 2}
	address, token := startJoinMember(t, state)
	dir := t.TempDir()
	joiner := &credentials{}
	o := Options{DataDir: dir, JoinToken: token.String(), JoinTimeout: 30 * time.Second}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	if err := joiner.join(t.Context(), o, "00000000000000bb", net.ParseIP("127.0.0.1"), []string{address}, logger); err != nil {
		t.Fatalf("join through a member that learns the join secret after 2 requests: %v", err)
	}
	if reads := state.readCount(); reads != 3 {
		t.Fatalf("the member was asked %d times, want 3 (two while starting, then admitted)", reads)
	}
	if _, err := os.Stat(filepath.Join(dir, nodeCertFile)); err != nil {
		t.Fatalf("the admitted node has no certificate: %v", err)
	}
}

// TestJoinGivesUpAfterJoinTimeout: a member that never learns the join
// secret is asked until --join-timeout, and the final error says why.
func TestJoinGivesUpAfterJoinTimeout(t *testing.T) {
	state := &startingState{unknownFor: 1 << 30}
	address, token := startJoinMember(t, state)
	joiner := &credentials{}
	o := Options{DataDir: t.TempDir(), JoinToken: token.String(), JoinTimeout: 1500 * time.Millisecond}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	start := time.Now()
	err := joiner.join(t.Context(), o, "00000000000000bb", net.ParseIP("127.0.0.1"), []string{address}, logger)
	if !errors.Is(err, peer.ErrJoinNotReady) || errors.Is(err, peer.ErrJoinRefused) ||
		!strings.Contains(err.Error(), "--join-timeout") || !strings.Contains(err.Error(), "the cluster is starting") {
		t.Fatalf("join through a member that never knows the secret: %v; want ErrJoinNotReady naming --join-timeout and the starting cluster", err)
	}
	if elapsed := time.Since(start); elapsed < o.JoinTimeout {
		t.Fatalf("gave up after %v, before --join-timeout %v", elapsed, o.JoinTimeout)
	}
	if reads := state.readCount(); reads < 2 {
		t.Fatalf("the member was asked %d times, want retries", reads)
	}
}

// TestJoinRefusedBelowClusterLevel: a node whose herd supports less than
// the cluster's feature level is refused at once (not retried until
// --join-timeout), with a message that says to run the members' version;
// one older than feature levels (no level in its request) counts as level
// 1, and a node at the cluster's level is admitted.
func TestJoinRefusedBelowClusterLevel(t *testing.T) {
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	state := &startingState{level: cluster.SupportedLevel + 1}
	address, token := startJoinMember(t, state)
	joiner := &credentials{}
	o := Options{DataDir: t.TempDir(), JoinToken: token.String(), JoinTimeout: time.Minute}
	start := time.Now()
	err := joiner.join(t.Context(), o, "00000000000000bb", net.ParseIP("127.0.0.1"), []string{address}, logger)
	if !errors.Is(err, peer.ErrJoinRefused) || !strings.Contains(err.Error(), "feature level") {
		t.Fatalf("join of a node below the cluster's level: %v; want a refusal naming the feature level", err)
	}
	if elapsed := time.Since(start); elapsed > 20*time.Second {
		t.Fatalf("the refusal took %v: it was retried", elapsed)
	}

	state.level = cluster.LevelVDICopies
	old := peer.JoinRequest{NodeID: "00000000000000cc", IPs: []string{"127.0.0.1"}} // as a herd older than feature levels sends it
	if _, err := peer.RequestJoin(t.Context(), address, token, old); !errors.Is(err, peer.ErrJoinRefused) || !strings.Contains(err.Error(), "supports only 1") {
		t.Fatalf("join without a level into a level-%d cluster: %v; want refused as level 1", state.level, err)
	}
	old.Level = cluster.SupportedLevel
	if _, err := peer.RequestJoin(t.Context(), address, token, old); err != nil {
		t.Fatalf("join at the cluster's level: %v", err)
	}
}
