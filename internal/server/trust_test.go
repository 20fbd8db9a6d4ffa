package server

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/peer"
	"github.com/herd-storage/herd/internal/pki"
)

// The node's side of the trust state machine (trust.go) on the real log
// (cluster.Local: the real commands and FSM), the real files and real TLS
// on loopback: what each node trusts and presents at each phase of a CA
// rotation, for peers, NBD clients and the admin API, and a node that was
// down while the log moved through the phases.

var loopback = net.ParseIP("127.0.0.1")

// trustNode is one node's process: its credentials as setupCredentials
// loads them from its data directory, its peer port serving the sign and
// secrets protocols, and its member of the log.
type trustNode struct {
	id       string
	dir      string
	cr       *credentials
	listener *peer.Listener
	member   *cluster.LocalMember
	log      *memberLog
}

// memberLog is the member as trustLoop's rotationState; Halt records.
type memberLog struct {
	*cluster.LocalMember
	mu     sync.Mutex
	halted error
	// leader, if set, is Sync's new connection to the leader (the
	// cluster's read index goes over the peer port): Sync fails with it.
	leader func() error
}

func (m *memberLog) Sync(ctx context.Context) error {
	m.mu.Lock()
	leader := m.leader
	m.mu.Unlock()
	if leader != nil {
		if err := leader(); err != nil {
			return fmt.Errorf("%w: the leader refused this node: %v", cluster.ErrNoQuorum, err)
		}
	}
	return m.LocalMember.Sync(ctx)
}

func (m *memberLog) Halt(err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.halted == nil {
		m.halted = err
	}
}

func (m *memberLog) haltedWith() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.halted
}

// writeNodeDir makes node id's data directory as a node admitted at
// LevelSecurity has it (the CA key only on the holder), and returns its
// certificate's serial.
func writeNodeDir(t *testing.T, dir, id string, ca *pki.CA, holder bool) string {
	t.Helper()
	certPEM, keyPEM, err := ca.IssueNode(id, []net.IP{loopback})
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{caCertFile: ca.CertPEM, nodeCertFile: certPEM, nodeKeyFile: keyPEM, gossipKeyFile: []byte(hex.EncodeToString(make([]byte, 32)) + "\n")}
	if holder {
		files[caKeyFile] = ca.KeyPEM
	}
	for name, data := range files {
		if err := pki.WriteSecretFile(filepath.Join(dir, name), data); err != nil {
			t.Fatal(err)
		}
	}
	cert, err := pki.ParseCertificate(certPEM)
	if err != nil {
		t.Fatal(err)
	}
	return pki.Serial(cert)
}

// start starts a process of node id on dir: its credentials loaded as at
// a start, its peer port, and its member of the log from entry `from`
// (what it applied before it stopped), not yet connected.
func startTrustNode(t *testing.T, log *cluster.Local, id, dir, incarnation string, from uint64) *trustNode {
	t.Helper()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	cr, err := setupCredentials(context.Background(), Options{DataDir: dir}, id, loopback, nil, logger)
	if err != nil {
		t.Fatal(err)
	}
	n := &trustNode{id: id, dir: dir, cr: cr}
	n.member = log.Member(id, incarnation, from)
	n.log = &memberLog{LocalMember: n.member}
	cr.peer.AllowedUnder = func(nodeID, serial, ca string) error { return cr.allowedBy(n.member, nodeID, serial, ca) }
	n.listener, err = peer.Listen("127.0.0.1:0", cr.peer, logger)
	if err != nil {
		t.Fatal(err)
	}
	cr.signing = everyoneRuns{}
	go peer.ServeCalls(n.listener.Protocol(peer.ProtocolSign), cr.serveSign)
	go peer.ServeCalls(n.listener.Protocol(peer.ProtocolSecrets), cr.serveSecrets)
	t.Cleanup(n.stop)
	return n
}

// everyoneRuns is a holder's view where every caller runs as a member
// (these tests sign node certificates only).
type everyoneRuns struct{}

func (everyoneRuns) LookupToken(string) (cluster.Token, bool) { return cluster.Token{}, false }
func (everyoneRuns) CatchUp(context.Context) error            { return nil }
func (everyoneRuns) Running(string) bool                      { return true }
func (everyoneRuns) Level() int                               { return cluster.SupportedLevel }

func (n *trustNode) addr() string { return n.listener.Addr().String() }

func (n *trustNode) record(incarnation string) cluster.Node {
	return cluster.Node{ID: n.id, Address: n.id, PeerAddr: n.addr(), Incarnation: incarnation}
}

// stop ends the process (kill -9: its files stay).
func (n *trustNode) stop() {
	n.listener.Close()
	n.member.Stop()
}

// trusts are the CAs the node trusts now.
func (n *trustNode) trusts() []string { return n.cr.now().fingerprints() }

// logTrusts are the CAs the node's log trusts: the cluster's (first the
// one every node started with, which the log names "") and the new one.
func logTrusts(s cluster.CAState, first string) []string {
	out := []string{s.Fingerprint}
	if out[0] == "" {
		out[0] = first
	}
	if s.Rotation != nil {
		out = append(out, s.Rotation.Fingerprint)
	}
	return out
}

// follow runs the node's trustLoop turns until done says the node is
// where it should be, or fails at the deadline.
func (n *trustNode) follow(t *testing.T, what string, done func() bool) {
	t.Helper()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	deadline := time.Now().Add(20 * time.Second)
	var err error
	for !done() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: node %s did not get there within 20 s (trusts %v; last step: %v)", what, n.id, n.trusts(), err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = n.cr.followRotation(ctx, n.log, logger)
		cancel()
		if !done() {
			// The member applies committed entries in its own goroutine:
			// wait for the next change rather than spin.
			waitApplied(n.member, 50*time.Millisecond)
		}
	}
}

// waitApplied waits until the member applied something new, at most d.
func waitApplied(m *cluster.LocalMember, d time.Duration) {
	before := m.Applied()
	deadline := time.Now().Add(d)
	for m.Applied() == before && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
}

// waitCaughtUp waits until every member applied the whole log.
func waitCaughtUp(t *testing.T, log *cluster.Local, nodes ...*trustNode) {
	t.Helper()
	for _, n := range nodes {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := n.member.Sync(ctx)
		cancel()
		if err != nil {
			t.Fatalf("node %s did not apply the log: %v", n.id, err)
		}
	}
}

// peerCall asks server for its secrets as dialer, over mutual TLS.
func peerCall(dialer, server *trustNode) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := peer.Call(ctx, server.addr(), dialer.cr.peer, peer.ProtocolSecrets, []byte("{}"))
	return err
}

// handshake runs a TLS handshake of a client with config against a
// server with serverConfig on loopback, and returns the server's and the
// client's errors.
func handshake(t *testing.T, serverConfig, clientConfig *tls.Config) (serverErr, clientErr error) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	done := make(chan error, 1)
	go func() {
		conn, err := l.Accept()
		if err != nil {
			done <- err
			return
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(5 * time.Second))
		s := tls.Server(conn, serverConfig)
		err = s.Handshake()
		if err == nil {
			// TLS 1.3: the server checks the client's certificate
			// after the client's handshake returned; a byte settles it.
			_, err = s.Write([]byte{1})
		}
		done <- err
	}()
	conn, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	c := tls.Client(conn, clientConfig)
	clientErr = c.Handshake()
	if clientErr == nil {
		_, clientErr = c.Read(make([]byte, 1))
	}
	c.Close()
	return <-done, clientErr
}

// nbdClient is QEMU's side: its certificate, the CAs of its ca-cert.pem,
// no server name (it names no CA).
func nbdClient(t *testing.T, certificate tls.Certificate, cas ...*pki.CA) *tls.Config {
	pool := x509.NewCertPool()
	for _, ca := range cas {
		pool.AddCert(ca.Cert)
	}
	return &tls.Config{Certificates: []tls.Certificate{certificate}, RootCAs: pool, ServerName: "127.0.0.1"}
}

// adminClient is the CLI's side (api.NewClient): it pins the CA of its
// token's fingerprint and names it.
func adminClient(fingerprint string) *tls.Config {
	return &tls.Config{
		MinVersion:         tls.VersionTLS13,
		InsecureSkipVerify: true,
		ServerName:         pki.CAHint(fingerprint),
		VerifyPeerCertificate: func(rawCerts [][]byte, _ [][]*x509.Certificate) error {
			_, err := pki.VerifyServerChain(rawCerts, fingerprint)
			return err
		},
	}
}

func clientCertificate(t *testing.T, ca *pki.CA, name string) tls.Certificate {
	t.Helper()
	certPEM, keyPEM, _, err := ca.IssueClient(name)
	if err != nil {
		t.Fatal(err)
	}
	certificate, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return certificate
}

// TestCARotationTrustOnTheNodes: three nodes on the real log through a CA
// rotation, with c down from before its start until before its finish.
// At each phase every running node trusts exactly the CAs its log does,
// and connections with certificates from either CA succeed (peer port
// both ways, NBD clients with the old and the new CA's certificate, the
// CLI pinning the old or the new CA); the finish is refused while c,
// down, has no certificate from the new CA, and the state stays as it
// was. c starts again on its files (old CA only) with its old log: it
// learns the new CA from a member at once (before its log catches up),
// the others' new certificates are let in meanwhile, it gets its own
// certificate from the holder and records it, and the finish goes
// through. After it every node trusts the new CA alone: a node's old
// certificate, an old client certificate and the CLI pinning the old CA
// are refused; the holder keeps the new key as ca.key, the others hold
// none; a restart keeps the trust.
func TestCARotationTrustOnTheNodes(t *testing.T) {
	log := cluster.NewLocal()
	defer log.Close()
	oldCA, err := pki.NewCA("herd cluster CA test")
	if err != nil {
		t.Fatal(err)
	}
	oldFP := oldCA.Fingerprint()
	dirs := map[string]string{}
	serials := map[string]string{}
	for _, id := range []string{"a", "b", "c"} {
		dirs[id] = t.TempDir()
		serials[id] = writeNodeDir(t, dirs[id], id, oldCA, id == "a")
	}
	// b's files before the rotation: what a stolen disk, or a stale
	// copy, would present after the finish.
	staleB := t.TempDir()
	for _, name := range []string{caCertFile, nodeCertFile, nodeKeyFile, gossipKeyFile} {
		data, err := os.ReadFile(filepath.Join(dirs["b"], name))
		if err != nil {
			t.Fatal(err)
		}
		if err := pki.WriteSecretFile(filepath.Join(staleB, name), data); err != nil {
			t.Fatal(err)
		}
	}
	if err := log.InitSecurity("a", serials); err != nil {
		t.Fatal(err)
	}
	a := startTrustNode(t, log, "a", dirs["a"], "a.1", 0)
	b := startTrustNode(t, log, "b", dirs["b"], "b.1", 0)
	c := startTrustNode(t, log, "c", dirs["c"], "c.1", 0)
	for _, n := range []*trustNode{a, b, c} {
		if _, err := log.NodeJoin(n.record(n.member.Incarnation())); err != nil {
			t.Fatal(err)
		}
		n.member.SetConnected(true)
	}
	waitCaughtUp(t, log, a, b, c)
	oldClient := clientCertificate(t, oldCA, "vm")

	// checkTrust: every node given trusts what its log does.
	checkTrust := func(phase string, want []string, nodes ...*trustNode) {
		t.Helper()
		for _, n := range nodes {
			if got, logs := n.trusts(), logTrusts(n.member.CA(), oldFP); !slices.Equal(got, want) || !slices.Equal(logs, want) {
				t.Errorf("%s: node %s trusts %v, its log %v; want %v", phase, n.id, got, logs, want)
			}
		}
	}
	connects := func(phase string, pairs ...[2]*trustNode) {
		t.Helper()
		for _, p := range pairs {
			if err := peerCall(p[0], p[1]); err != nil {
				t.Errorf("%s: node %s cannot reach node %s on the peer port: %v", phase, p[0].id, p[1].id, err)
			}
		}
	}
	nbd := func(phase string, n *trustNode, certificate tls.Certificate, cas []*pki.CA, want bool) {
		t.Helper()
		serverErr, clientErr := handshake(t, n.cr.nbdTLS(), nbdClient(t, certificate, cas...))
		if ok := serverErr == nil && clientErr == nil; ok != want {
			t.Errorf("%s: an NBD client's certificate from %s to node %s: connected %v (server %v, client %v), want %v", phase, certificate.Leaf.Issuer.CommonName, n.id, ok, serverErr, clientErr, want)
		}
	}
	admin := func(phase string, n *trustNode, fingerprint string, want bool) {
		t.Helper()
		_, clientErr := handshake(t, n.cr.serverTLS(), adminClient(fingerprint))
		if ok := clientErr == nil; ok != want {
			t.Errorf("%s: the CLI pinning CA %s to node %s: connected %v (%v), want %v", phase, fingerprint, n.id, ok, clientErr, want)
		}
	}
	parse := func(certificate tls.Certificate) tls.Certificate {
		leaf, err := x509.ParseCertificate(certificate.Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		certificate.Leaf = leaf
		return certificate
	}
	oldClient = parse(oldClient)

	checkTrust("before the rotation", []string{oldFP}, a, b, c)
	connects("before the rotation", [2]*trustNode{a, b}, [2]*trustNode{b, a}, [2]*trustNode{c, a})
	nbd("before the rotation", a, oldClient, []*pki.CA{oldCA}, true)
	admin("before the rotation", b, oldFP, true)

	// c goes down; the log records it gone.
	cApplied := c.member.Applied()
	c.stop()
	if _, err := log.NodeLeave("c", "killed"); err != nil {
		t.Fatal(err)
	}

	// The rotation starts on a, the holder of the CA key.
	if _, err := a.cr.startCARotation(context.Background(), a.member); err != nil {
		t.Fatal(err)
	}
	if _, err := a.cr.startCARotation(context.Background(), a.member); !errors.Is(err, cluster.ErrBusy) {
		t.Fatalf("a second rotate-ca during one: %v, want ErrBusy", err)
	}
	rotation := log.CA().Rotation
	nextFP := rotation.Fingerprint
	next, err := pki.ParseCACertificate(rotation.Cert)
	if err != nil {
		t.Fatal(err)
	}
	recorded := func(ids ...string) func() bool {
		return func() bool {
			r := log.CA().Rotation
			for _, id := range ids {
				if r == nil || r.Certificates[id] == "" {
					return false
				}
			}
			return true
		}
	}
	a.follow(t, "the start", recorded("a"))
	b.follow(t, "the start", recorded("b"))
	waitCaughtUp(t, log, a, b)
	checkTrust("during the rotation", []string{oldFP, nextFP}, a, b)
	for _, n := range []*trustNode{a, b} {
		if held := n.cr.now().nodeNext; held == nil || pki.Serial(held.Leaf) != log.CA().Rotation.Certificates[n.id] {
			t.Errorf("node %s holds no certificate from the new CA, or another than it recorded", n.id)
		}
	}
	if _, err := os.Stat(filepath.Join(b.dir, caNextKeyFile)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("node b, not the holder, has the new CA's key: %v", err)
	}
	connects("during the rotation", [2]*trustNode{a, b}, [2]*trustNode{b, a})
	// A node certificate from the new CA for c, which asks nothing: the
	// holder signs only for the node that asks for itself.
	if _, err := b.cr.askToSign(context.Background(), []string{a.addr()}, signRequest{Kind: "node", NodeID: "c", IPs: []string{"127.0.0.1"}, CA: nextFP}); err == nil || !strings.Contains(err.Error(), "a node asks for its own") {
		t.Errorf("b asking the holder for c's certificate from the new CA: %v, want refused", err)
	}
	// Both CAs' client certificates; QEMU's ca-cert.pem has the old CA
	// only until it is given both (client add --renew).
	nextSigner := func() *pki.CA {
		key, err := pki.ReadSecretFile(filepath.Join(a.dir, caNextKeyFile))
		if err != nil {
			t.Fatal(err)
		}
		ca, err := pki.ParseCA(next.CertPEM, key)
		if err != nil {
			t.Fatal(err)
		}
		return ca
	}()
	newClient := parse(clientCertificate(t, nextSigner, "vm"))
	for _, n := range []*trustNode{a, b} {
		nbd("during the rotation", n, oldClient, []*pki.CA{oldCA}, true)
		nbd("during the rotation", n, newClient, []*pki.CA{oldCA, next}, true)
		admin("during the rotation", n, oldFP, true)
		admin("during the rotation", n, nextFP, true)
	}

	// --finish while c, down, has no certificate: refused, nothing changes.
	before := log.CA()
	if _, err := log.FinishCARotation(false); !errors.Is(err, cluster.ErrBusy) || !strings.Contains(err.Error(), "nodes c are down") {
		t.Fatalf("--finish while c is down without a certificate: %v, want ErrBusy naming c", err)
	}
	if after := log.CA(); !slices.Equal(logTrusts(after, oldFP), logTrusts(before, oldFP)) || len(after.Rotation.Certificates) != len(before.Rotation.Certificates) {
		t.Fatalf("the refused finish changed the CA record: %+v, was %+v", after, before)
	}
	checkTrust("after a refused finish", []string{oldFP, nextFP}, a, b)

	// c starts again: its files know the old CA only, its log is the
	// one it had; it is not connected to the leader yet.
	c = startTrustNode(t, log, "c", dirs["c"], "c.2", cApplied)
	if got := c.trusts(); !slices.Equal(got, []string{oldFP}) {
		t.Fatalf("c restarted trusts %v", got)
	}
	if err := peerCall(c, a); err != nil {
		t.Fatalf("c, back with its old certificate, cannot reach a: %v", err)
	}
	// Its first question to a member (the gossip keyring) brings the
	// member's CAs: it trusts the new one before its log names it.
	if _, err := c.cr.fetchGossipKeys(context.Background(), a.addr()); err != nil {
		t.Fatal(err)
	}
	if got := c.trusts(); !slices.Equal(got, []string{oldFP, nextFP}) {
		t.Fatalf("c after asking a member: trusts %v, want both CAs", got)
	}
	if c.member.CA().Rotation != nil {
		t.Fatal("c's log should still be behind here")
	}
	// The others present their new certificates to it now: let in (they
	// are admitted), though its log does not name them yet.
	connects("c behind on the log", [2]*trustNode{a, c}, [2]*trustNode{b, c}, [2]*trustNode{c, b})
	// c catches up, gets its certificate from the holder, records it.
	if _, err := log.NodeJoin(c.record("c.2")); err != nil {
		t.Fatal(err)
	}
	c.member.SetConnected(true)
	c.follow(t, "c back", recorded("a", "b", "c"))
	waitCaughtUp(t, log, a, b, c)
	checkTrust("c back during the rotation", []string{oldFP, nextFP}, a, b, c)
	connects("c back during the rotation", [2]*trustNode{a, c}, [2]*trustNode{c, a}, [2]*trustNode{c, b})

	// The finish.
	if _, err := log.FinishCARotation(false); err != nil {
		t.Fatalf("--finish once every node recorded its certificate: %v", err)
	}
	finished := func(n *trustNode) func() bool {
		return func() bool { return slices.Equal(n.trusts(), []string{nextFP}) }
	}
	for _, n := range []*trustNode{a, b, c} {
		n.follow(t, "the finish", finished(n))
	}
	waitCaughtUp(t, log, a, b, c)
	checkTrust("after the finish", []string{nextFP}, a, b, c)
	connects("after the finish", [2]*trustNode{a, b}, [2]*trustNode{b, c}, [2]*trustNode{c, a})
	for _, n := range []*trustNode{a, b, c} {
		if err := n.log.haltedWith(); err != nil {
			t.Errorf("node %s halted: %v", n.id, err)
		}
		nbd("after the finish", n, oldClient, []*pki.CA{oldCA, next}, false)
		nbd("after the finish", n, newClient, []*pki.CA{oldCA, next}, true)
		admin("after the finish", n, oldFP, false)
		admin("after the finish", n, nextFP, true)
		_, keyErr := os.Stat(filepath.Join(n.dir, caKeyFile))
		if holder := n.id == "a"; holder != (keyErr == nil) {
			t.Errorf("after the finish node %s holds ca.key: %v (want only the holder a)", n.id, keyErr == nil)
		}
	}
	if key, err := pki.ReadSecretFile(filepath.Join(a.dir, caKeyFile)); err != nil || string(key) != string(nextSigner.KeyPEM) {
		t.Errorf("the holder's ca.key is not the new CA's: %v", err)
	}
	// b's certificate from before the rotation (a stale copy of its
	// files), presented by a dialer that trusts the new CA: refused by
	// the server, whose pool no longer has the old CA.
	stale := staleCredentials(t, staleB, next)
	for _, n := range []*trustNode{a, c} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := peer.Call(ctx, n.addr(), stale, peer.ProtocolSecrets, []byte("{}"))
		cancel()
		if err == nil {
			t.Errorf("after the finish, b's old certificate reached node %s", n.id)
		}
	}

	// A restart keeps the trust: the files are the new CA's.
	b.stop()
	b = startTrustNode(t, log, "b", dirs["b"], "b.2", log.Len())
	b.member.SetConnected(true)
	checkTrust("b restarted after the finish", []string{nextFP}, b)
	connects("b restarted after the finish", [2]*trustNode{b, a}, [2]*trustNode{a, b})
}

// staleCredentials are peer credentials with the node certificate in dir
// (from the old CA) that trust the CA trusted.
func staleCredentials(t *testing.T, dir string, trusted *pki.CA) *peer.Credentials {
	t.Helper()
	read := func(name string) []byte {
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	certificate, err := pki.NodeTLSCertificate(read(nodeCertFile), read(nodeKeyFile), read(caCertFile))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(trusted.Cert)
	return &peer.Credentials{Certificate: certificate, CA: pool}
}

// TestCARotationLeavesOutANodeThatMissedIt: a node down through a whole
// rotation finished with --force starts again on its old files: every
// member refuses it (its certificate's CA is no longer trusted) and it
// stops saying what to do (herd node remove, then join again), rather
// than run cut off.
func TestCARotationLeavesOutANodeThatMissedIt(t *testing.T) {
	log := cluster.NewLocal()
	defer log.Close()
	oldCA, err := pki.NewCA("herd cluster CA test")
	if err != nil {
		t.Fatal(err)
	}
	dirs := map[string]string{"a": t.TempDir(), "c": t.TempDir()}
	serials := map[string]string{}
	for id, dir := range dirs {
		serials[id] = writeNodeDir(t, dir, id, oldCA, id == "a")
	}
	if err := log.InitSecurity("a", serials); err != nil {
		t.Fatal(err)
	}
	a := startTrustNode(t, log, "a", dirs["a"], "a.1", 0)
	c := startTrustNode(t, log, "c", dirs["c"], "c.1", 0)
	for _, n := range []*trustNode{a, c} {
		if _, err := log.NodeJoin(n.record(n.member.Incarnation())); err != nil {
			t.Fatal(err)
		}
		n.member.SetConnected(true)
	}
	waitCaughtUp(t, log, a, c)
	cApplied := c.member.Applied()
	c.stop()
	if _, err := log.NodeLeave("c", "killed"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.cr.startCARotation(context.Background(), a.member); err != nil {
		t.Fatal(err)
	}
	a.follow(t, "the start", func() bool { r := log.CA().Rotation; return r != nil && r.Certificates["a"] != "" })
	if _, err := log.FinishCARotation(false); !errors.Is(err, cluster.ErrBusy) {
		t.Fatalf("--finish without c: %v, want ErrBusy", err)
	}
	if _, err := log.FinishCARotation(true); err != nil {
		t.Fatal(err)
	}
	nextFP := log.CA().Fingerprint
	a.follow(t, "the finish", func() bool { return slices.Equal(a.trusts(), []string{nextFP}) })

	c = startTrustNode(t, log, "c", dirs["c"], "c.2", cApplied)
	if err := peerCall(c, a); err == nil {
		t.Fatal("c, left out of the rotation, reached a with its old certificate")
	}
	if err := peerCall(a, c); err == nil {
		t.Fatal("a reached c, left out of the rotation")
	}
	if _, err := log.NodeJoin(c.record("c.2")); err != nil {
		t.Fatal(err)
	}
	c.member.SetConnected(true)
	c.follow(t, "c back after the finish", func() bool { return c.log.haltedWith() != nil })
	if err := c.log.haltedWith(); !strings.Contains(err.Error(), "herd node remove c") || !strings.Contains(err.Error(), "join token") {
		t.Errorf("c stopped with %q, want it to say to remove it and join again", err)
	}
	if got := c.trusts(); slices.Contains(got, nextFP) {
		t.Errorf("c left out trusts %v: it has no certificate from the new CA to use", got)
	}
}

// TestCARotationLeavesOutANodeBackDuringTheFinish: a node down through a
// whole rotation starts again while the finish (--force) is committed but
// not yet applied by the member it asks for the keys first, which still
// trusts both CAs: it learns the new CA from it (learnCAs), or even gets
// a certificate from the holder, too late to be recorded. Then every
// member refuses it, the leader too (its Sync fails), but it goes on
// applying the log (over a raft connection the leader opened before it
// applied the finish): it stops all the same, saying what to do.
func TestCARotationLeavesOutANodeBackDuringTheFinish(t *testing.T) {
	for _, tc := range []struct {
		name string
		late bool // c gets a certificate from the new CA after the finish
	}{{"learns the new CA", false}, {"gets a certificate too late", true}} {
		t.Run(tc.name, func(t *testing.T) {
			log := cluster.NewLocal()
			defer log.Close()
			oldCA, err := pki.NewCA("herd cluster CA test")
			if err != nil {
				t.Fatal(err)
			}
			dirs := map[string]string{"a": t.TempDir(), "c": t.TempDir()}
			serials := map[string]string{}
			for id, dir := range dirs {
				serials[id] = writeNodeDir(t, dir, id, oldCA, id == "a")
			}
			if err := log.InitSecurity("a", serials); err != nil {
				t.Fatal(err)
			}
			a := startTrustNode(t, log, "a", dirs["a"], "a.1", 0)
			c := startTrustNode(t, log, "c", dirs["c"], "c.1", 0)
			for _, n := range []*trustNode{a, c} {
				if _, err := log.NodeJoin(n.record(n.member.Incarnation())); err != nil {
					t.Fatal(err)
				}
				n.member.SetConnected(true)
			}
			waitCaughtUp(t, log, a, c)
			cApplied := c.member.Applied()
			c.stop()
			if _, err := log.NodeLeave("c", "killed"); err != nil {
				t.Fatal(err)
			}
			if _, err := a.cr.startCARotation(context.Background(), a.member); err != nil {
				t.Fatal(err)
			}
			a.follow(t, "the start", func() bool { r := log.CA().Rotation; return r != nil && r.Certificates["a"] != "" })
			rotation := log.CA().Rotation
			nextFP := rotation.Fingerprint
			// The finish is committed (and applied by a's member), but a
			// has not reloaded its trust yet: it trusts both CAs.
			if _, err := log.FinishCARotation(true); err != nil {
				t.Fatal(err)
			}
			waitCaughtUp(t, log, a)
			oldFP := oldCA.Fingerprint()
			if got := a.trusts(); !slices.Equal(got, []string{oldFP, nextFP}) {
				t.Fatalf("a before its turn: trusts %v", got)
			}

			// c starts again now: its first question goes to a.
			c = startTrustNode(t, log, "c", dirs["c"], "c.2", cApplied)
			if _, err := c.cr.fetchGossipKeys(context.Background(), a.addr()); err != nil {
				t.Fatal(err)
			}
			if got := c.trusts(); !slices.Equal(got, []string{oldFP, nextFP}) {
				t.Fatalf("c after asking a: trusts %v, want both CAs", got)
			}
			if tc.late {
				if err := c.cr.issueNext(context.Background(), c.log, rotation); err != nil {
					t.Fatalf("c asking the holder, which trusts both CAs still, for its certificate: %v", err)
				}
			}
			// a applies the finish: it trusts the new CA alone and
			// refuses c, whatever certificate c presents.
			a.follow(t, "the finish", func() bool { return slices.Equal(a.trusts(), []string{nextFP}) })
			if err := peerCall(c, a); err == nil {
				t.Fatal("c, left out of the rotation, reached a")
			}
			// c's log catches up (the leader's raft connection to it is
			// older than the finish); a new connection to the leader is
			// refused.
			c.log.mu.Lock()
			c.log.leader = func() error { return peerCall(c, a) }
			c.log.mu.Unlock()
			if _, err := log.NodeJoin(c.record("c.2")); err != nil {
				t.Fatal(err)
			}
			c.member.SetConnected(true)
			c.follow(t, "c back during the finish", func() bool { return c.log.haltedWith() != nil })
			if err := c.log.haltedWith(); !strings.Contains(err.Error(), "herd node remove c") || !strings.Contains(err.Error(), "join token") {
				t.Errorf("c stopped with %q, want it to say to remove it and join again", err)
			}
			if got := c.trusts(); slices.Equal(got, []string{nextFP}) {
				t.Errorf("c left out made the new CA its own")
			}
		})
	}
}

// TestCARotationDoesNotStopANodeBehindOnItsLog: a node that took part in
// a rotation and starts again on a log from before its finish (a snapshot
// older than its files) does not take the old CA in its log for one it
// was left out of while the leader does not answer: it waits for the log.
func TestCARotationDoesNotStopANodeBehindOnItsLog(t *testing.T) {
	log := cluster.NewLocal()
	defer log.Close()
	oldCA, err := pki.NewCA("herd cluster CA test")
	if err != nil {
		t.Fatal(err)
	}
	dirs := map[string]string{"a": t.TempDir(), "b": t.TempDir()}
	serials := map[string]string{}
	for id, dir := range dirs {
		serials[id] = writeNodeDir(t, dir, id, oldCA, id == "a")
	}
	if err := log.InitSecurity("a", serials); err != nil {
		t.Fatal(err)
	}
	a := startTrustNode(t, log, "a", dirs["a"], "a.1", 0)
	b := startTrustNode(t, log, "b", dirs["b"], "b.1", 0)
	for _, n := range []*trustNode{a, b} {
		if _, err := log.NodeJoin(n.record(n.member.Incarnation())); err != nil {
			t.Fatal(err)
		}
		n.member.SetConnected(true)
	}
	waitCaughtUp(t, log, a, b)
	// Two rotations, both nodes in them: the log's CA is then one b's
	// files no longer name.
	var fingerprints []string
	for range 2 {
		if _, err := a.cr.startCARotation(context.Background(), a.member); err != nil {
			t.Fatal(err)
		}
		for _, n := range []*trustNode{a, b} {
			n.follow(t, "the start", func() bool { r := log.CA().Rotation; return r != nil && r.Certificates[n.id] != "" })
		}
		if _, err := log.FinishCARotation(false); err != nil {
			t.Fatal(err)
		}
		fp := log.CA().Fingerprint
		fingerprints = append(fingerprints, fp)
		for _, n := range []*trustNode{a, b} {
			n.follow(t, "the finish", func() bool { return slices.Equal(n.trusts(), []string{fp}) })
		}
		if len(fingerprints) == 1 {
			waitCaughtUp(t, log, a, b)
		}
	}
	// b starts again on a log from between the rotations: its CA there is
	// the first rotation's, older than its files' (the second's).
	between := uint64(0)
	for i := uint64(1); i <= log.Len(); i++ {
		m := log.Member("probe", "probe.1", i)
		ok := m.CA().Fingerprint == fingerprints[0] && m.CA().Rotation == nil
		m.Stop()
		if ok {
			between = i
		}
		if between != 0 && !ok {
			break
		}
	}
	if between == 0 {
		t.Fatal("no entry of the log between the rotations")
	}
	b.stop()
	b = startTrustNode(t, log, "b", dirs["b"], "b.2", between)
	if got := b.member.CA().Fingerprint; got != fingerprints[0] {
		t.Fatalf("b's log names CA %s, want the first rotation's", got)
	}
	b.log.mu.Lock()
	b.log.leader = func() error { return errors.New("no leader yet") }
	b.log.mu.Unlock()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	for range 3 {
		if err := b.cr.followRotation(context.Background(), b.log, logger); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.log.haltedWith(); err != nil {
		t.Fatalf("b, behind on its log, stopped: %v", err)
	}
	if got := b.trusts(); !slices.Equal(got, []string{fingerprints[1]}) {
		t.Fatalf("b trusts %v, want %s", got, fingerprints[1])
	}
}

// nodesOf lists nodes as the log has them alive (waitFinished's view).
type nodesOf struct {
	self  string
	nodes []*trustNode
}

func (l nodesOf) ID() string { return l.self }

func (l nodesOf) Nodes() []cluster.NodeInfo {
	var out []cluster.NodeInfo
	for _, n := range l.nodes {
		node := n.record(n.member.Incarnation())
		node.State = cluster.NodeAlive
		out = append(out, cluster.NodeInfo{Node: node})
	}
	return out
}

// TestCARotationFinishWaitsForTheNodes: rotate-ca --finish returns once
// every alive node trusts the new CA alone (each asked over the peer
// port), and names those that do not when it stops waiting.
func TestCARotationFinishWaitsForTheNodes(t *testing.T) {
	log := cluster.NewLocal()
	defer log.Close()
	oldCA, err := pki.NewCA("herd cluster CA test")
	if err != nil {
		t.Fatal(err)
	}
	dirs := map[string]string{"a": t.TempDir(), "b": t.TempDir()}
	serials := map[string]string{}
	for id, dir := range dirs {
		serials[id] = writeNodeDir(t, dir, id, oldCA, id == "a")
	}
	if err := log.InitSecurity("a", serials); err != nil {
		t.Fatal(err)
	}
	a := startTrustNode(t, log, "a", dirs["a"], "a.1", 0)
	b := startTrustNode(t, log, "b", dirs["b"], "b.1", 0)
	for _, n := range []*trustNode{a, b} {
		if _, err := log.NodeJoin(n.record(n.member.Incarnation())); err != nil {
			t.Fatal(err)
		}
		n.member.SetConnected(true)
	}
	waitCaughtUp(t, log, a, b)
	if _, err := a.cr.startCARotation(context.Background(), a.member); err != nil {
		t.Fatal(err)
	}
	for _, n := range []*trustNode{a, b} {
		n.follow(t, "the start", func() bool { r := log.CA().Rotation; return r != nil && r.Certificates[n.id] != "" })
	}
	if _, err := log.FinishCARotation(false); err != nil {
		t.Fatal(err)
	}
	nextFP := log.CA().Fingerprint
	nodes := nodesOf{self: "a", nodes: []*trustNode{a, b}}
	wait := func(d time.Duration) []string {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		return a.cr.waitFinished(ctx, nodes, nextFP)
	}
	if pending := wait(300 * time.Millisecond); !slices.Equal(pending, []string{"a", "b"}) {
		t.Fatalf("before any node applied the finish: waiting for %v, want a and b", pending)
	}
	a.follow(t, "the finish", func() bool { return slices.Equal(a.trusts(), []string{nextFP}) })
	if pending := wait(300 * time.Millisecond); !slices.Equal(pending, []string{"b"}) {
		t.Fatalf("a applied the finish, b not: waiting for %v, want b", pending)
	}
	done := make(chan []string, 1)
	go func() { done <- wait(20 * time.Second) }()
	b.follow(t, "the finish", func() bool { return slices.Equal(b.trusts(), []string{nextFP}) })
	select {
	case pending := <-done:
		if len(pending) > 0 {
			t.Fatalf("every node applied the finish: still waiting for %v", pending)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the wait did not end once every node trusted the new CA alone")
	}
}
