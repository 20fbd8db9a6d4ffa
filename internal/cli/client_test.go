package cli

import (
	"bytes"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/herd-storage/herd/internal/pki"
)

// TestClientRenewKeepsOwner (as root): client add --renew without --owner
// gives the new files the owner and group of the old ones, so that the
// files given to QEMU's user (libvirt-qemu) stay readable by it after a
// renewal (the CA rotation's step); --owner still decides when given.
func TestClientRenewKeepsOwner(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("needs root (the files belong to another user); CI runs as root")
		}
		t.Skip("needs root: the files belong to another user")
	}
	goldenEnvironment(t)
	ca, err := pki.NewCA("test")
	if err != nil {
		t.Fatal(err)
	}
	nodeCert, nodeKey, err := ca.IssueNode("0123456789abcdef", []net.IP{net.ParseIP("127.0.0.1")})
	if err != nil {
		t.Fatal(err)
	}
	certificate, err := pki.NodeTLSCertificate(nodeCert, nodeKey, ca.CertPEM)
	if err != nil {
		t.Fatal(err)
	}
	node := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/v1/clients" {
			http.NotFound(w, r)
			return
		}
		io.WriteString(w, `{"name":"kvm1","pattern":"vm*","ca_cert":"new ca","client_cert":"new cert","client_key":"new key"}`)
	}))
	node.TLS = &tls.Config{Certificates: []tls.Certificate{certificate}}
	node.StartTLS()
	defer node.Close()
	t.Setenv("HERD_TOKEN", pki.AdminToken{Fingerprint: pki.Fingerprint(ca.Cert), ID: "0011223344556677", Secret: pki.NewSecret()}.String())
	address := strings.TrimPrefix(node.URL, "https://")

	// DIR as client add --owner 64123:64124 left it (ids no user has:
	// the owner is kept by number).
	const uid, gid = 64123, 64124
	dir := filepath.Join(t.TempDir(), "kvm1")
	for d := filepath.Dir(dir); d != "/"; d = filepath.Dir(d) {
		if strings.HasPrefix(d, os.TempDir()+"/") {
			if err := os.Chmod(d, 0o755); err != nil { // QEMU's user must get through
				t.Fatal(err)
			}
		}
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{dir, filepath.Join(dir, "ca-cert.pem"), filepath.Join(dir, "client-cert.pem"), filepath.Join(dir, "client-key.pem")} {
		if path != dir {
			if err := os.WriteFile(path, []byte("old"), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Chown(path, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	owners := func() {
		t.Helper()
		for _, name := range []string{"ca-cert.pem", "client-cert.pem", "client-key.pem"} {
			info, err := os.Stat(filepath.Join(dir, name))
			if err != nil {
				t.Fatal(err)
			}
			stat := info.Sys().(*syscall.Stat_t)
			if data, _ := os.ReadFile(filepath.Join(dir, name)); !strings.HasPrefix(string(data), "new") ||
				stat.Uid != uid || stat.Gid != gid || info.Mode().Perm() != 0o600 {
				t.Errorf("%s after the renewal: %q, owner %d:%d, mode %v; want the new file, %d:%d, 0600", name, data, stat.Uid, stat.Gid, info.Mode().Perm(), uid, gid)
			}
		}
	}

	var stdout, stderr bytes.Buffer
	if code := Main([]string{"--addr", address, "client", "add", "kvm1", "--renew", "--out", dir}, &stdout, &stderr); code != 0 {
		t.Fatalf("client add --renew: exit %d: %s", code, stderr.String())
	}
	owners()
	if !strings.Contains(stdout.String(), "readable by uid 64123") {
		t.Errorf("client add --renew said %q; want it to name the kept owner", stdout.String())
	}

	// --owner given: it decides.
	stdout.Reset()
	stderr.Reset()
	if code := Main([]string{"--addr", address, "client", "add", "kvm1", "--renew", "--out", dir, "--owner", "root"}, &stdout, &stderr); code != 0 {
		t.Fatalf("client add --renew --owner root: exit %d: %s", code, stderr.String())
	}
	if info, err := os.Stat(filepath.Join(dir, "client-key.pem")); err != nil || info.Sys().(*syscall.Stat_t).Uid != 0 {
		t.Errorf("client add --renew --owner root: the key is not root's (%v)", err)
	}
}
