package cli

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/herd-storage/herd/internal/api"
	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/nbdclient/nbdtest"
	"github.com/herd-storage/herd/internal/pki"
	"github.com/herd-storage/herd/internal/transfer"
)

// TestCommandLine runs `herd vdi import` and `herd vdi export` through Main.
func TestCommandLine(t *testing.T) {
	// A node as the CLI sees it: an admin API that hands out NBD session
	// certificates, and an NBD port that requires TLS with one.
	ca, err := pki.NewCA("test")
	if err != nil {
		t.Fatal(err)
	}
	nodeCert, nodeKey, err := ca.IssueNode("0123456789abcdef", []net.IP{net.ParseIP("127.0.0.1")})
	if err != nil {
		t.Fatal(err)
	}
	node, err := pki.NodeTLSCertificate(nodeCert, nodeKey, ca.CertPEM)
	if err != nil {
		t.Fatal(err)
	}
	var sessions atomic.Int32
	admin := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/vdis/vm1" { // vdi import looks the VDI up (createForImport)
			json.NewEncoder(w).Encode(cluster.VDI{Name: "vm1", Size: 2 << 20})
			return
		}
		if r.URL.Path != "/v1/nbd-session" {
			http.NotFound(w, r)
			return
		}
		sessions.Add(1)
		certPEM, keyPEM, err := ca.IssueSession("token-test", pki.NewTokenID(), false)
		if err != nil {
			t.Error(err)
		}
		json.NewEncoder(w).Encode(api.NBDSession{CACert: string(ca.CertPEM), ClientCert: string(certPEM), ClientKey: string(keyPEM)})
	}))
	admin.TLS = &tls.Config{Certificates: []tls.Certificate{node}}
	admin.StartTLS()
	defer admin.Close()
	t.Setenv("HERD_TOKEN", pki.AdminToken{Fingerprint: pki.Fingerprint(ca.Cert), ID: "0011223344556677", Secret: pki.NewSecret()}.String())
	disk := nbdtest.NewDisk("vm1", 2<<20)
	address := nbdtest.ServeTLS(t, nbdtest.NewBackend(disk), &tls.Config{
		Certificates: []tls.Certificate{node},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    ca.Pool(),
	})
	_, port, err := net.SplitHostPort(address)
	if err != nil {
		t.Fatal(err)
	}
	adminAddress := strings.TrimPrefix(admin.URL, "https://")
	dir := t.TempDir()
	source := filepath.Join(dir, "in.img")
	// Data with a zero area, so that both kinds of chunk go through.
	image := bytes.Repeat([]byte("herd"), 1<<18)
	clear(image[256<<10 : 768<<10])
	if err := os.WriteFile(source, image, 0o644); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	code := Main([]string{"--addr", adminAddress, "--json", "vdi", "import", "--nbd-port", port, "--connections", "2", "vm1", source}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("import: exit %d: %s", code, stderr.String())
	}
	var summary transfer.Summary
	if err := json.Unmarshal(stdout.Bytes(), &summary); err != nil || summary.Operation != "import" || summary.Bytes != 1<<20 {
		t.Errorf("import JSON %q: %v", stdout.String(), err)
	}
	if !strings.HasPrefix(stderr.String(), "imported 1 MiB into vm1 in ") || strings.Contains(stderr.String(), "\r") {
		t.Errorf("import stderr %q", stderr.String())
	}

	stdout.Reset()
	stderr.Reset()
	output := filepath.Join(dir, "out.img")
	if code := Main([]string{"--addr", adminAddress, "vdi", "export", "--nbd-port", port, "vm1", output}, &stdout, &stderr); code != 0 {
		t.Fatalf("export: exit %d: %s", code, stderr.String())
	}
	if exported, err := os.ReadFile(output); err != nil || !bytes.Equal(exported[:len(image)], image) {
		t.Errorf("exported file: %v", err)
	}
	if stdout.Len() != 0 || !strings.HasPrefix(stderr.String(), "exported 2 MiB of vm1 to "+output) {
		t.Errorf("export output %q, %q", stdout.String(), stderr.String())
	}

	stderr.Reset()
	if code := Main([]string{"--addr", adminAddress, "vdi", "export", "--nbd-port", port, "vm1", output}, &stdout, &stderr); code != 1 ||
		stderr.String() != "herd: "+output+" exists: add --force to overwrite it\n" {
		t.Errorf("export over a file: exit %d, %q", code, stderr.String())
	}
	stderr.Reset()
	if code := Main([]string{"--addr", adminAddress, "--json", "vdi", "export", "vm1", "-"}, &stdout, &stderr); code != exUsage ||
		!strings.Contains(stderr.String(), "--json prints to stdout") {
		t.Errorf("export --json to stdout: exit %d, %q", code, stderr.String())
	}
}

func TestNBDAddress(t *testing.T) {
	for admin, want := range map[string]string{
		"10.0.0.1":      "10.0.0.1:10809",
		"10.0.0.1:7080": "10.0.0.1:10809",
		"[::1]:7080":    "[::1]:10809",
		"::1":           "[::1]:10809",
		"[fe80::1]":     "[fe80::1]:10809",
		"node1:7080":    "node1:10809",
	} {
		if got, err := nbdAddress(admin, 10809); err != nil || got != want {
			t.Errorf("nbdAddress(%q) = %q, %v; want %q", admin, got, err, want)
		}
	}
	if _, err := nbdAddress(":7080", 10809); err == nil {
		t.Error("empty host accepted")
	}
}
