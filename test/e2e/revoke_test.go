package e2e

// Security: "a revoke is final" and "scopes that mean what they say":
// each test does what the attacker did.

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
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
	"github.com/herd-storage/herd/internal/pki"
	"github.com/herd-storage/herd/internal/testcluster"
)

// dialTLS opens export on a node's TLS port with the client certificate
// and key given, verifying the node against caPEM; it returns the error
// rather than failing the test (callers expect refusals).
func dialTLS(ctx context.Context, address, export string, certPEM, keyPEM, caPEM []byte) (*nbdclient.Conn, error) {
	certificate, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, err
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caPEM) {
		return nil, errors.New("no CA certificate")
	}
	host, _, _ := net.SplitHostPort(address)
	dialer := &nbdclient.Dialer{TLSConfig: &tls.Config{Certificates: []tls.Certificate{certificate}, RootCAs: roots, ServerName: host}}
	return dialer.Dial(ctx, address, export)
}

// clientFiles reads a herd client add directory.
func clientFiles(t *testing.T, dir string) (certPEM, keyPEM, caPEM []byte) {
	t.Helper()
	read := func(name string) []byte {
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	return read("client-cert.pem"), read("client-key.pem"), read("ca-cert.pem")
}

// TestRevokeWhileWaitingForTheLock: the attack on an open still waiting for a lock. An
// exclusive VDI is held open for writing by one client through node 0;
// client C (pattern vm*) asks for it through node 1 and waits for the
// writer lock; C is revoked while it waits, and node 1 checks its
// connections (every second) before the holder lets go. When the holder
// disconnects, C's open must fail (or its connection be cut at once), and
// C must write nothing. Before the fix C's open completed after node 1's
// check and C wrote for as long as it liked.
func TestRevokeWhileWaitingForTheLock(t *testing.T) {
	c := dataCluster(t, 2, 2, "vm1", "64M")
	herd(t, c, 0, "vdi", "set", "vm1", "--exclusive")
	testcluster.WaitFor(t, 10*time.Second, "node 1 to see vm1 exclusive", func() (bool, error) {
		v, err := client(c, 1).VDI(ctx(t), "vm1")
		return err == nil && v.Exclusive, err
	})
	holderDir := addClient(t, c, "holder", "*")
	attackerDir := addClient(t, c, "attacker", "vm*")

	holder := dialWithClient(t, c.Node(0).NBDAddr(), "vm1", holderDir)
	mine := bytes.Repeat([]byte{0x68}, 4096)
	if err := holder.WriteAt(ctx(t), mine, 0, 0); err != nil {
		t.Fatalf("the holder's write: %v", err)
	}
	if err := holder.Flush(ctx(t)); err != nil {
		t.Fatal(err)
	}

	type opened struct {
		conn *nbdclient.Conn
		err  error
		at   time.Duration
	}
	certPEM, keyPEM, caPEM := clientFiles(t, attackerDir)
	result := make(chan opened, 1)
	start := time.Now()
	go func() {
		dialContext, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := dialTLS(dialContext, c.Node(1).NBDAddr(), "vm1", certPEM, keyPEM, caPEM)
		result <- opened{conn, err, time.Since(start)}
	}()

	// The open waits for the lock (up to 2 s after it asked): revoke the
	// attacker meanwhile, through the admin API.
	time.Sleep(300 * time.Millisecond)
	if _, err := client(c, 0).RevokeClient(ctx(t), "attacker"); err != nil {
		t.Fatalf("client revoke: %v", err)
	}
	revoked := time.Since(start)
	// Let node 1 apply the revocation and run its one-second check
	// while the open still waits, then the holder lets go, well inside
	// the open's wait.
	letGo := max(revoked+1100*time.Millisecond, 1400*time.Millisecond)
	if letGo > 1800*time.Millisecond {
		t.Logf("the revocation took %v: the holder lets go at %v, late in the attacker's 2 s wait", revoked.Round(time.Millisecond), letGo.Round(time.Millisecond))
	}
	time.Sleep(letGo - time.Since(start))
	var early *opened
	select {
	case r := <-result:
		early = &r // cut while it waited (the fix's pending revalidation)
	default:
	}
	if err := holder.Close(); err != nil {
		t.Logf("holder close: %v", err)
	}
	closed := time.Since(start)
	r := opened{}
	if early != nil {
		r = *early
	} else {
		select {
		case r = <-result:
		case <-time.After(30 * time.Second):
			t.Fatal("the attacker's open did not end")
		}
	}
	t.Logf("attacker's open sent at 0, revoked at %v, holder closed at %v, open ended at %v: %v",
		revoked.Round(time.Millisecond), closed.Round(time.Millisecond), r.at.Round(time.Millisecond), r.err)

	if r.err == nil {
		defer r.conn.Close()
		// The open completed: every write must fail (at the latest once
		// node 1 rechecks its connections; here at once).
		evil := bytes.Repeat([]byte{0x66}, 4096)
		deadline := time.Now().Add(3 * time.Second)
		wrote := 0
		for time.Now().Before(deadline) {
			writeContext, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			err := r.conn.WriteAt(writeContext, evil, 0, nbdclient.FUA)
			cancel()
			if err != nil {
				break
			}
			wrote++
			time.Sleep(100 * time.Millisecond)
		}
		if wrote > 0 {
			t.Errorf("the client revoked while it waited for the lock opened vm1 and wrote %d times", wrote)
		}
	}
	// What vm1 holds: the holder's bytes, nothing of the attacker's.
	reader := addClient(t, c, "reader", "*", "--read-only")
	check := dialWithClient(t, c.Node(0).NBDAddr(), "vm1", reader)
	defer check.Close()
	got := make([]byte, 4096)
	if err := check.ReadAt(ctx(t), got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, mine) {
		t.Errorf("vm1 after the attack holds %#x..., want the holder's %#x", got[:4], mine[:4])
	}
}

// herdWithToken runs the herd CLI against node with token instead of the
// admin token.
func herdWithToken(t *testing.T, c *testcluster.Cluster, node int, token string, args ...string) (string, error) {
	t.Helper()
	command := c.HerdCommand(node, args...)
	command.Env = append(command.Env, "HERD_TOKEN="+token)
	var output bytes.Buffer
	command.Stdout, command.Stderr = &output, &output
	done := make(chan error, 1)
	if err := command.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { done <- command.Wait() }()
	select {
	case err := <-done:
		return output.String(), err
	case <-time.After(2 * time.Minute):
		command.Process.Kill()
		<-done
		return output.String(), fmt.Errorf("herd %s did not finish", strings.Join(args, " "))
	}
}

// createToken makes an admin token with the CLI and returns it.
func createToken(t *testing.T, c *testcluster.Cluster, name string, flags ...string) api.CreatedToken {
	t.Helper()
	var created api.CreatedToken
	if err := c.HerdJSON(ctx(t), 0, &created, append([]string{"token", "create", name}, flags...)...); err != nil {
		t.Fatalf("token create %s %v: %v", name, flags, err)
	}
	return created
}

// TestReadOnlyTokenReadsNoData: the attack on token scopes, first
// half. A read-only (monitoring) token asks GET /v1/nbd-session for a
// certificate and reads a VDI with it: refused now (403, and herd vdi
// export says why). A token made with --read-only --data gets a
// read-only session and exports; the monitoring token still serves the
// dashboard's requests; an admin token exports as before.
func TestReadOnlyTokenReadsNoData(t *testing.T) {
	c := dataCluster(t, 1, 1, "vm1", "8M")
	writer := addClient(t, c, "writer", "*")
	conn := dialWithClient(t, c.Node(0).NBDAddr(), "vm1", writer)
	secret := bytes.Repeat([]byte("SECRET!!"), 512)
	if err := conn.WriteAt(ctx(t), secret, 0, nbdclient.FUA); err != nil {
		t.Fatal(err)
	}
	conn.Close()
	admin := c.Node(0).AdminAddr()

	// The attacker holds a monitoring token and asks for a session.
	monitor := createToken(t, c, "monitor", "--read-only")
	var session api.NBDSession
	err := api.NewClient(admin, monitor.Secret).Do(ctx(t), http.MethodGet, "/v1/nbd-session", nil, &session)
	if err == nil {
		// What the attacker does with it: read vm1.
		read := "(not tried)"
		if conn, derr := dialTLS(ctx(t), c.Node(0).NBDAddr(), "vm1", []byte(session.ClientCert), []byte(session.ClientKey), []byte(session.CACert)); derr == nil {
			got := make([]byte, len(secret))
			rerr := conn.ReadAt(ctx(t), got, 0)
			conn.Close()
			read = fmt.Sprintf("read %q... (%v)", got[:8], rerr)
		} else {
			read = derr.Error()
		}
		t.Fatalf("a read-only token got an NBD session certificate (read-only %v, until %v); with it: %s", session.ReadOnly, session.Expires, read)
	}
	if !errors.Is(err, cluster.ErrForbidden) || !strings.Contains(err.Error(), "--data") {
		t.Errorf("a read-only token asking for a session: %v, want forbidden, naming --data", err)
	}
	out, err := herdWithToken(t, c, 0, monitor.Secret, "vdi", "export", "vm1", filepath.Join(t.TempDir(), "stolen"))
	if err == nil || !strings.Contains(out, "--read-only --data") {
		t.Errorf("vdi export with a read-only token: %v\n%s", err, out)
	}
	// The dashboard's requests, with the monitoring token.
	for _, path := range []string{"/v1/cluster", "/v1/cluster/health", "/v1/nodes", "/v1/recovery", "/v1/tree", "/v1/events"} {
		var v any
		if err := api.NewClient(admin, monitor.Secret).Do(ctx(t), http.MethodGet, path, nil, &v); err != nil {
			t.Errorf("GET %s with the monitoring token: %v", path, err)
		}
	}
	metrics := httpsGet(t, c, "/metrics", monitor.Secret)
	if !strings.Contains(metrics, "herd_") {
		t.Errorf("GET /metrics with the monitoring token: %.200s", metrics)
	}

	// --read-only --data (feature level 3: a new cluster may start
	// below it): a read-only session, and vdi export works.
	herd(t, c, 0, "cluster", "finalize-upgrade")
	backup := createToken(t, c, "backup", "--read-only", "--data")
	if backup.Scope() != "read-only+data" {
		t.Errorf("token create --read-only --data: scope %q", backup.Scope())
	}
	session = api.NBDSession{}
	if err := api.NewClient(admin, backup.Secret).Do(ctx(t), http.MethodGet, "/v1/nbd-session", nil, &session); err != nil || !session.ReadOnly {
		t.Fatalf("a --data token's session: %+v %v, want a read-only one", session.ReadOnly, err)
	}
	if life := time.Until(session.Expires); life > pki.SessionValidity || pki.SessionValidity > 10*time.Minute {
		t.Errorf("session certificate valid for %v, want at most 10 minutes", life)
	}
	exported := filepath.Join(t.TempDir(), "vm1.img")
	if out, err := herdWithToken(t, c, 0, backup.Secret, "vdi", "export", "vm1", exported); err != nil {
		t.Fatalf("vdi export with a --data token: %v\n%s", err, out)
	}
	if data, err := os.ReadFile(exported); err != nil || !bytes.HasPrefix(data, secret) {
		t.Errorf("the --data token's export does not hold vm1's data: %v", err)
	}
	if conn, err := dialTLS(ctx(t), c.Node(0).NBDAddr(), "vm1", []byte(session.ClientCert), []byte(session.ClientKey), []byte(session.CACert)); err != nil {
		t.Errorf("open with the --data token's session: %v", err)
	} else {
		if !conn.ReadOnly() || conn.WriteAt(ctx(t), []byte("x"), 0, 0) == nil {
			t.Error("the --data token's session writes")
		}
		conn.Close()
	}
	if out, err := herdWithToken(t, c, 0, backup.Secret, "vdi", "create", "x", "1M"); err == nil {
		t.Errorf("a --data token created a VDI:\n%s", out)
	}
	// An admin token exports as before.
	if _, stderr, err := c.Herd(ctx(t), 0, "vdi", "export", "vm1", filepath.Join(t.TempDir(), "admin.img")); err != nil {
		t.Errorf("vdi export with the admin token: %v %s", err, stderr)
	}
	// --data alone is refused: an admin token reads data already.
	if _, stderr, err := c.Herd(ctx(t), 0, "token", "create", "both", "--data"); err == nil || !strings.Contains(stderr, "--read-only") {
		t.Errorf("token create --data without --read-only: %v %s", err, stderr)
	}
	list := herd(t, c, 0, "token", "list")
	for _, want := range []string{"monitor", "read-only", "backup", "read-only+data", "admin"} {
		if !strings.Contains(list, want) {
			t.Errorf("token list does not show %q:\n%s", want, list)
		}
	}
}

// httpsGet fetches path from node 0's admin port with token, verifying
// the node by the CA fingerprint in the admin token.
func httpsGet(t *testing.T, c *testcluster.Cluster, path, token string) string {
	t.Helper()
	parsed, err := pki.ParseAdminToken(c.Token())
	if err != nil {
		t.Fatal(err)
	}
	transport := &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true,
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			_, err := pki.VerifyServerChain(raw, parsed.Fingerprint)
			return err
		}}}
	request, _ := http.NewRequestWithContext(ctx(t), http.MethodGet, "https://"+c.Node(0).AdminAddr()+path, nil)
	request.Header.Set("Authorization", "Bearer "+token)
	response, err := (&http.Client{Transport: transport, Timeout: 30 * time.Second}).Do(request)
	if err != nil {
		t.Fatal(err)
	}
	defer response.Body.Close()
	var body bytes.Buffer
	body.ReadFrom(response.Body)
	if response.StatusCode != http.StatusOK {
		t.Errorf("GET %s: %s %.200s", path, response.Status, body.String())
	}
	return body.String()
}

// TestSessionCertificateDiesWithItsToken: the attack on session certificates,
// second half. A session certificate obtained with a token keeps reading
// after `herd token revoke`: now its open connection is cut within the
// revalidation interval and a new connection with it is refused, on
// every node.
func TestSessionCertificateDiesWithItsToken(t *testing.T) {
	c := dataCluster(t, 2, 2, "vm1", "8M")
	ops := createToken(t, c, "ops")
	var session api.NBDSession
	if err := api.NewClient(c.Node(0).AdminAddr(), ops.Secret).Do(ctx(t), http.MethodGet, "/v1/nbd-session", nil, &session); err != nil {
		t.Fatal(err)
	}
	cert, err := pki.ParseCertificate([]byte(session.ClientCert))
	if err != nil {
		t.Fatal(err)
	}
	if life := cert.NotAfter.Sub(time.Now()); life > 10*time.Minute {
		t.Errorf("the session certificate is valid for %v more, want at most 10 minutes", life.Round(time.Second))
	}
	open := func(node int) (*nbdclient.Conn, error) {
		return dialTLS(ctx(t), c.Node(node).NBDAddr(), "vm1", []byte(session.ClientCert), []byte(session.ClientKey), []byte(session.CACert))
	}
	held, err := open(1)
	if err != nil {
		t.Fatalf("open with the session certificate: %v", err)
	}
	defer held.Close()
	block := make([]byte, 4096)
	if err := held.ReadAt(ctx(t), block, 0); err != nil {
		t.Fatal(err)
	}
	if err := held.WriteAt(ctx(t), block, 0, 0); err != nil {
		t.Fatal(err)
	}

	if _, stderr, err := c.Herd(ctx(t), 0, "token", "revoke", "ops"); err != nil {
		t.Fatalf("token revoke: %v %s", err, stderr)
	}
	revoked := time.Now()
	testcluster.WaitFor(t, 10*time.Second, "the open connection of the revoked token's session to be cut", func() (bool, error) {
		err := held.ReadAt(ctx(t), block, 0)
		return err != nil, errors.New("its reads still succeed")
	})
	t.Logf("the session's open connection was cut %v after the token was revoked", time.Since(revoked).Round(time.Millisecond))
	for node := range 2 {
		testcluster.WaitFor(t, 10*time.Second, fmt.Sprintf("node %d to refuse the revoked token's session", node), func() (bool, error) {
			conn, err := open(node)
			if err == nil {
				conn.Close()
				return false, errors.New("opened")
			}
			return true, nil
		})
		// And it lists nothing: the refusal comes before any export.
		host, port, _ := net.SplitHostPort(c.Node(node).NBDAddr())
		dir := t.TempDir()
		for name, data := range map[string]string{"ca-cert.pem": session.CACert, "client-cert.pem": session.ClientCert, "client-key.pem": session.ClientKey} {
			os.WriteFile(filepath.Join(dir, name), []byte(data), 0o600)
		}
		if _, err := exec.LookPath("nbdinfo"); err == nil {
			if out, err := run(t, time.Minute, "nbdinfo", "--list", "nbds://"+net.JoinHostPort(host, port)+"/?tls-certificates="+dir); err == nil && strings.Contains(out, "vm1") {
				t.Errorf("node %d lists vm1 to the revoked token's session:\n%s", node, out)
			}
		}
	}
}
