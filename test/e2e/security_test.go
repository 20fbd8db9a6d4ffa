package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/api"
	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/nbdclient"
	"github.com/herd-storage/herd/internal/peer"
	"github.com/herd-storage/herd/internal/pki"
	"github.com/herd-storage/herd/internal/testcluster"
)

// addClient issues an NBD client certificate (herd client add) allowed to
// open the VDIs matching pattern and returns its directory.
func addClient(t *testing.T, c *testcluster.Cluster, name, pattern string, extra ...string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), name)
	args := append([]string{"client", "add", name, "--vdi", pattern, "--out", dir}, extra...)
	if _, stderr, err := c.Herd(ctx(t), 0, args...); err != nil {
		t.Fatalf("client add %s: %v %s", name, err, stderr)
	}
	for _, file := range []string{"ca-cert.pem", "client-cert.pem", "client-key.pem"} {
		info, err := os.Stat(filepath.Join(dir, file))
		if err != nil {
			t.Fatalf("client add %s: %v", name, err)
		}
		if mode := info.Mode().Perm(); mode != 0o600 {
			t.Errorf("client add %s: %s has mode %v, want 0600", name, file, mode)
		}
	}
	return dir
}

// qemuTLS runs qemu-io on export through node's TLS port with the
// certificates in dir.
func qemuTLS(t *testing.T, c *testcluster.Cluster, node int, export, dir string, readOnly bool, commands ...string) (string, error) {
	t.Helper()
	host, port, _ := net.SplitHostPort(c.Node(node).NBDAddr())
	args := []string{"--object", "tls-creds-x509,id=tls0,endpoint=client,dir=" + dir,
		"--image-opts", "driver=raw,file.driver=nbd,file.host=" + host + ",file.port=" + port + ",file.export=" + export + ",file.tls-creds=tls0"}
	if readOnly {
		args = append([]string{"-r"}, args...)
	}
	for _, command := range commands {
		args = append(args, "-c", command)
	}
	out, err := run(t, 2*time.Minute, "qemu-io", args...)
	if err == nil && strings.Contains(out, "failed") {
		err = errors.New("qemu-io reported a failure")
	}
	return out, err
}

// TestNBDNeedsAClientCertificate: NBD on the TCP port speaks only TLS
// with a certificate from the cluster CA, and a client sees and opens only
// what its certificate's record allows.
func TestNBDNeedsAClientCertificate(t *testing.T) {
	need(t, "qemu-io", "qemu-img", "nbdinfo", "nbdcopy")
	c := dataCluster(t, 2, 2, "vm1", "64M")
	for _, name := range []string{"vm2", "db1"} {
		if _, stderr, err := c.Herd(ctx(t), 0, "vdi", "create", name, "64M"); err != nil {
			t.Fatalf("create %s: %v %s", name, err, stderr)
		}
	}
	vms := addClient(t, c, "vmhost", "vm*")
	reader := addClient(t, c, "backup", "*", "--read-only")

	// Plaintext on the TCP port: refused, saying TLS is required.
	plain := "nbd://" + c.Node(0).NBDAddr() + "/vm1"
	if out, err := run(t, time.Minute, "nbdinfo", plain); err == nil || !strings.Contains(strings.ToLower(out), "tls") {
		t.Errorf("plaintext nbdinfo on the TCP port: %v, want a refusal naming TLS:\n%s", err, out)
	}
	if out, err := qemuIO(t, plain, "read 0 512"); err == nil {
		t.Errorf("plaintext qemu-io on the TCP port was served:\n%s", out)
	}

	// The allowed client writes through node 0 with QEMU, reads through
	// node 1 with libnbd.
	if out, err := qemuTLS(t, c, 0, "vm1", vms, false, "write -P 0x61 0 1M", "flush"); err != nil {
		t.Fatalf("qemu-io over TLS: %v\n%s", err, out)
	}
	if out, err := qemuTLS(t, c, 1, "vm1", vms, true, "read -P 0x61 0 1M"); err != nil {
		t.Fatalf("qemu-io over TLS through node 1: %v\n%s", err, out)
	}
	host, port, _ := net.SplitHostPort(c.Node(1).NBDAddr())
	info := mustRun(t, time.Minute, "qemu-img", "info", "--object", "tls-creds-x509,id=tls0,endpoint=client,dir="+vms,
		"--image-opts", "driver=nbd,host="+host+",port="+port+",export=vm1,tls-creds=tls0")
	if !strings.Contains(info, "67108864") {
		t.Errorf("qemu-img info over TLS does not show the size:\n%s", info)
	}
	if out := mustRun(t, time.Minute, "nbdinfo", "--size", c.Node(1).NBDTLSURI("vm1", vms)); strings.TrimSpace(out) != "67108864" {
		t.Errorf("nbdinfo --size over TLS: %q", out)
	}
	image := randomFile(t, 8<<20)
	mustRun(t, 2*time.Minute, "nbdcopy", "--flush", image, c.Node(0).NBDTLSURI("vm2", vms))
	copied := filepath.Join(t.TempDir(), "copy")
	mustRun(t, 2*time.Minute, "nbdcopy", c.Node(1).NBDTLSURI("vm2", vms), copied)
	mustRun(t, time.Minute, "cmp", "-n", "8388608", image, copied)

	// vm* sees vm1 and vm2, never db1; opening db1 is refused like a
	// name that does not exist.
	list := mustRun(t, time.Minute, "nbdinfo", "--list", "--json", "nbds://"+c.Node(0).NBDAddr()+"/?tls-certificates="+vms)
	if !strings.Contains(list, `"vm1"`) || !strings.Contains(list, `"vm2"`) || strings.Contains(list, "db1") {
		t.Errorf("vmhost's export list:\n%s", list)
	}
	if out, err := run(t, time.Minute, "nbdinfo", c.Node(0).NBDTLSURI("db1", vms)); err == nil {
		t.Errorf("vmhost opened db1:\n%s", out)
	}

	// The read-only client reads everything and writes nothing.
	if out, err := qemuTLS(t, c, 0, "vm1", reader, true, "read -P 0x61 0 1M"); err != nil {
		t.Errorf("read-only client reading: %v\n%s", err, out)
	}
	if out, err := qemuTLS(t, c, 0, "db1", reader, false, "write -P 0x62 0 4096"); err == nil {
		t.Errorf("read-only client wrote:\n%s", out)
	}
	if out, err := qemuIO(t, c.Node(0).NBDURI("db1"), "read -P 0 0 4096"); err != nil {
		t.Errorf("db1 after the read-only client's write attempt: %v\n%s", err, out)
	}

	// No client certificate, or one from another CA: refused.
	bare := filepath.Join(t.TempDir(), "bare")
	os.MkdirAll(bare, 0o700)
	caCert, _ := os.ReadFile(filepath.Join(vms, "ca-cert.pem"))
	os.WriteFile(filepath.Join(bare, "ca-cert.pem"), caCert, 0o600)
	if out, err := run(t, time.Minute, "nbdinfo", c.Node(0).NBDTLSURI("vm1", bare)); err == nil {
		t.Errorf("a client without a certificate was served:\n%s", out)
	}
	foreign := foreignClient(t, caCert)
	if out, err := run(t, time.Minute, "nbdinfo", c.Node(0).NBDTLSURI("vm1", foreign)); err == nil {
		t.Errorf("a client certificate from another CA was accepted:\n%s", out)
	}

	// Revoked: refused from then on, on every node, and a connection it
	// has open (writable, through node 1) is cut.
	held := dialWithClient(t, c.Node(1).NBDAddr(), "vm1", vms)
	defer held.Close()
	block := make([]byte, 4096)
	if err := held.ReadAt(ctx(t), block, 0); err != nil || block[0] != 0x61 {
		t.Fatalf("read through the open connection before the revocation: %v (%#x)", err, block[0])
	}
	if _, stderr, err := c.Herd(ctx(t), 0, "client", "revoke", "vmhost"); err != nil {
		t.Fatalf("client revoke: %v %s", err, stderr)
	}
	revoked := time.Now()
	testcluster.WaitFor(t, 15*time.Second, "the revoked client's open connection to be cut", func() (bool, error) {
		err := held.WriteAt(ctx(t), block, 0, 0)
		return err != nil, errors.New("its writes still succeed")
	})
	t.Logf("the revoked client's open connection was cut %v after the revocation", time.Since(revoked).Round(time.Millisecond))
	for node := range 2 {
		testcluster.WaitFor(t, 10*time.Second, "node to refuse the revoked client", func() (bool, error) {
			out, err := run(t, time.Minute, "nbdinfo", c.Node(node).NBDTLSURI("vm1", vms))
			return err != nil, errors.New(out)
		})
	}
	var clients []cluster.Client
	if err := c.HerdJSON(ctx(t), 1, &clients, "client", "list"); err != nil {
		t.Fatal(err)
	}
	if len(clients) != 2 || clients[1].Name != "vmhost" || !clients[1].Revoked || clients[0].Name != "backup" || !clients[0].ReadOnly {
		t.Errorf("client list: %+v", clients)
	}
}

// dialWithClient opens export on a node's TLS port with the client
// certificate in dir (herd client add's layout), verifying the node
// against the CA there.
func dialWithClient(t *testing.T, address, export, dir string) *nbdclient.Conn {
	t.Helper()
	certificate, err := tls.LoadX509KeyPair(filepath.Join(dir, "client-cert.pem"), filepath.Join(dir, "client-key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	caPEM, err := os.ReadFile(filepath.Join(dir, "ca-cert.pem"))
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caPEM) {
		t.Fatal("no CA certificate in ca-cert.pem")
	}
	host, _, _ := net.SplitHostPort(address)
	dialer := &nbdclient.Dialer{TLSConfig: &tls.Config{Certificates: []tls.Certificate{certificate}, RootCAs: roots, ServerName: host}}
	conn, err := dialer.Dial(ctx(t), address, export)
	if err != nil {
		t.Fatalf("NBD over TLS to %s with the client certificate in %s: %v", address, dir, err)
	}
	return conn
}

// foreignClient writes a CA and client certificate that have nothing to
// do with the cluster (but trusts the cluster's CA, so the server is
// verified and only the client certificate is wrong).
func foreignClient(t *testing.T, clusterCA []byte) string {
	t.Helper()
	ca, err := pki.NewCA("another cluster")
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, _, err := ca.IssueClient("vmhost")
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "foreign")
	os.MkdirAll(dir, 0o700)
	for name, data := range map[string][]byte{"ca-cert.pem": clusterCA, "client-cert.pem": certPEM, "client-key.pem": keyPEM} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestAdminAPINeedsAToken: HTTPS only; no token, a wrong or revoked one
// refused; a read-only token reads and cannot write; secrets never show
// on a command line or as a flag default; secret files are 0600.
func TestAdminAPINeedsAToken(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Nodes: 1})
	admin := c.Node(0).AdminAddr()

	// Plain HTTP is refused.
	response, err := (&http.Client{Timeout: 5 * time.Second}).Get("http://" + admin + "/v1/vdis")
	if err == nil {
		body, _ := io.ReadAll(response.Body)
		response.Body.Close()
		if response.StatusCode == http.StatusOK || !strings.Contains(string(body), "HTTPS") {
			t.Errorf("plain HTTP: %s %q", response.Status, body)
		}
	}

	// Health says ok and nothing else, without a token.
	insecure := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	response, err = insecure.Get("https://" + admin + "/v1/health")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(response.Body)
	response.Body.Close()
	if strings.TrimSpace(string(body)) != `{"status":"ok"}` {
		t.Errorf("health: %q", body)
	}
	// Everything else needs a token, pprof included.
	for _, path := range []string{"/v1/vdis", "/v1/cluster", "/debug/pprof/"} {
		response, err := insecure.Get("https://" + admin + path)
		if err != nil {
			t.Fatal(err)
		}
		response.Body.Close()
		if response.StatusCode != http.StatusUnauthorized {
			t.Errorf("GET %s without a token: %s", path, response.Status)
		}
	}

	// The CLI: no token, a wrong token, a token for another cluster.
	herd := func(env []string, args ...string) (string, error) {
		command := exec.Command(testcluster.Binary(t), append([]string{"--addr", admin, "--timeout", "10s"}, args...)...)
		command.Env = append(os.Environ(), env...)
		out, err := command.CombinedOutput()
		return string(out), err
	}
	if out, err := herd([]string{"HERD_TOKEN="}, "vdi", "list"); err == nil || !strings.Contains(out, "admin.token") {
		t.Errorf("no token: %v %q", err, out)
	}
	token, _ := pki.ParseAdminToken(c.Token())
	wrong := pki.AdminToken{Fingerprint: token.Fingerprint, ID: token.ID, Secret: pki.NewSecret()}
	if out, err := herd([]string{"HERD_TOKEN=" + wrong.String()}, "vdi", "list"); err == nil || !strings.Contains(out, "unknown token") {
		t.Errorf("wrong secret: %v %q", err, out)
	}
	// A token naming another CA: the CLI refuses the server before
	// sending the token.
	other := pki.AdminToken{Fingerprint: strings.Repeat("ab", 32), ID: token.ID, Secret: token.Secret}
	if out, err := herd([]string{"HERD_TOKEN=" + other.String()}, "vdi", "list"); err == nil || !strings.Contains(strings.ToLower(out), "fingerprint") {
		t.Errorf("token of another cluster: %v %q", err, out)
	}
	// The secret never shows as a flag default.
	if out, err := herd([]string{"HERD_TOKEN=" + c.Token()}, "vdi", "list", "--help"); err != nil || strings.Contains(out, token.Secret) {
		t.Errorf("--help with HERD_TOKEN set shows the token: %v\n%s", err, out)
	}

	// A read-only token reads and cannot write; --token-file works.
	var created api.CreatedToken
	if err := c.HerdJSON(ctx(t), 0, &created, "token", "create", "monitor", "--read-only"); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "monitor.token")
	os.WriteFile(file, []byte(created.Secret+"\n"), 0o600)
	if out, err := herd(nil, "--token-file", file, "vdi", "list"); err != nil {
		t.Errorf("read-only token listing: %v %q", err, out)
	}
	if out, err := herd(nil, "--token-file", file, "vdi", "create", "x", "1M"); err == nil || !strings.Contains(out, "read-only") {
		t.Errorf("read-only token creating a vdi: %v %q", err, out)
	}
	os.Chmod(file, 0o644)
	if out, err := herd(nil, "--token-file", file, "vdi", "list"); err == nil || !strings.Contains(out, "0600") {
		t.Errorf("a token file readable by others: %v %q", err, out)
	}
	os.Chmod(file, 0o600)
	// Revoked: refused.
	if _, stderr, err := c.Herd(ctx(t), 0, "token", "revoke", "monitor"); err != nil {
		t.Fatalf("token revoke: %v %s", err, stderr)
	}
	if out, err := herd(nil, "--token-file", file, "vdi", "list"); err == nil || !strings.Contains(out, "revoked") {
		t.Errorf("revoked token: %v %q", err, out)
	}
	// Token list shows no secret and no hash.
	out, _, err := c.Herd(ctx(t), 0, "--json", "token", "list")
	if err != nil || strings.Contains(out, token.Secret) || strings.Contains(out, created.Secret) || strings.Contains(out, pki.HashSecret(token.Secret)) {
		t.Errorf("token list leaks a secret: %v\n%s", err, out)
	}

	// Secret files are 0600 in a 0700 directory.
	data := c.Node(0).DataDir()
	for _, name := range []string{"admin.token", "join.token", "ca.key", "node.key", "gossip.key"} {
		info, err := os.Stat(filepath.Join(data, name))
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if mode := info.Mode().Perm(); mode != 0o600 {
			t.Errorf("%s has mode %v, want 0600", name, mode)
		}
	}
	if info, err := os.Stat(filepath.Join(data, "nbd.sock")); err != nil || info.Mode().Perm() != 0o660 {
		t.Errorf("nbd.sock: %v %v, want mode 0660", info, err)
	}
}

// TestPeersNeedTheClusterCA: a node without the join secret cannot join;
// without a node certificate, or with one from another cluster, nothing
// but the join protocol is reachable on the peer port; a node removed for
// good is refused when it comes back.
func TestPeersNeedTheClusterCA(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Nodes: 3})
	waitAgreement(t, c, []int{0, 1, 2}, 30*time.Second)
	peerAddr := c.Node(0).PeerAddr()

	// A wrong join secret: refused, and logged by the member.
	joinToken, err := pki.ParseJoinToken(c.JoinToken())
	if err != nil {
		t.Fatal(err)
	}
	wrong := pki.JoinToken{Fingerprint: joinToken.Fingerprint, Secret: pki.NewSecret()}
	dial, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	_, err = peer.RequestJoin(dial, peerAddr, wrong, peer.JoinRequest{NodeID: "0123456789abcdef", IPs: []string{"127.0.0.1"}, Secret: wrong.Secret})
	if err == nil || !strings.Contains(err.Error(), "wrong join secret") {
		t.Errorf("join with a wrong secret: %v", err)
	}
	// A member that is not the token's cluster: refused before the secret
	// leaves the joiner.
	otherCA := pki.JoinToken{Fingerprint: strings.Repeat("cd", 32), Secret: joinToken.Secret}
	if _, err := peer.RequestJoin(dial, peerAddr, otherCA, peer.JoinRequest{NodeID: "0123456789abcdef", IPs: []string{"127.0.0.1"}, Secret: otherCA.Secret}); err == nil || !strings.Contains(strings.ToLower(err.Error()), "fingerprint") {
		t.Errorf("join to a member of another CA: %v", err)
	}

	// Another cluster's node certificate: no raft, no object protocol.
	foreign, err := pki.NewCA("another cluster")
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err := foreign.IssueNode("0123456789abcdef", []net.IP{net.ParseIP("127.0.0.1")})
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := pki.NodeTLSCertificate(certPEM, keyPEM, foreign.CertPEM)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(foreign.Cert)
	for _, protocol := range []peer.Protocol{peer.ProtocolRaft, peer.ProtocolObject, peer.ProtocolForward} {
		if conn, err := peer.Dial(dial, peerAddr, &peer.Credentials{Certificate: leaf, CA: pool}, protocol); err == nil {
			conn.Close()
			t.Errorf("protocol %d with another cluster's certificate was accepted", protocol)
		}
	}
	// A raw TLS client without a certificate asking for raft.
	conn, err := tls.Dial("tcp", peerAddr, &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13})
	if err == nil {
		conn.Write([]byte("HERDPEER\x02\x01"))
		conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		status := make([]byte, 1)
		if _, err := io.ReadFull(conn, status); err == nil && status[0] == 0 {
			t.Errorf("raft without a client certificate was accepted")
		}
		conn.Close()
	}

	// herd node remove: the node is refused when it comes back.
	removed := nodeID(t, c, 2)
	c.Node(2).Kill()
	testcluster.WaitFor(t, 30*time.Second, "node 2 to be dead", func() (bool, error) {
		nodes, err := client(c, 0).Nodes(ctx(t))
		if err != nil {
			return false, err
		}
		for _, n := range nodes {
			if n.ID == removed {
				return n.State != cluster.NodeAlive, errors.New(string(n.State))
			}
		}
		return false, errors.New("node 2 is not in the list")
	})
	if _, stderr, err := c.Herd(ctx(t), 0, "node", "remove", removed); err != nil {
		t.Fatalf("node remove: %v %s", err, stderr)
	}
	if _, stderr, err := c.Herd(ctx(t), 0, "node", "remove", nodeID(t, c, 1)); err == nil || !strings.Contains(stderr, "alive") {
		t.Errorf("removing an alive node: %v %s", err, stderr)
	}
	logBefore, _ := os.ReadFile(c.Node(0).LogPath())
	c.Node(2).Restart()
	testcluster.WaitFor(t, 30*time.Second, "node 0 to refuse the removed node", func() (bool, error) {
		log, err := os.ReadFile(c.Node(0).LogPath())
		return strings.Contains(string(log[len(logBefore):]), "removed from the cluster for good"), err
	})
	nodes, err := client(c, 0).Nodes(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if n.ID == removed && n.State == cluster.NodeAlive {
			t.Errorf("the removed node is alive again: %+v", n)
		}
	}
	c.Node(2).Kill()
}
