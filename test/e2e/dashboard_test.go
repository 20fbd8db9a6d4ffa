package e2e

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/api"
	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/testcluster"
	"github.com/herd-storage/herd/internal/testenv"
)

// chromium runs headless Chromium on url with args (--screenshot=FILE or
// --dump-dom) and returns what it printed. The node's certificate is from
// the cluster's own CA, which this browser profile does not know.
func chromium(t *testing.T, browser, url string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	full := append([]string{"--headless=new", "--no-sandbox", "--disable-gpu", "--ignore-certificate-errors", "--hide-scrollbars",
		"--user-data-dir=" + t.TempDir(), "--window-size=1280,720", "--virtual-time-budget=6000"}, args...)
	out, err := exec.CommandContext(ctx, browser, append(full, url)...).Output()
	if err != nil {
		t.Fatalf("chromium %v: %v", args, err)
	}
	return string(out)
}

// TestDashboard: every node serves the dashboard on its admin port, with
// headers that keep it from loading anything foreign; logged in with a
// read-only token (in the URL fragment, which the browser never sends),
// headless Chromium renders health, nodes, VDIs with their snapshot tree
// and events from the real cluster; without a token it shows the login;
// after a node is killed the page says so. Screenshots of each page are
// kept (their folder is in the test log).
func TestDashboard(t *testing.T) {
	need(t, "qemu-io")
	browser := testenv.LookPath(t, "chromium", "chromium")
	c := dataCluster(t, 3, 3, "vm1", "256M")
	if out, err := qemuIO(t, c.Node(0).NBDURI("vm1"), "write -P 0x61 0 24M", "flush"); err != nil {
		t.Fatalf("write: %v\n%s", err, out)
	}
	for _, args := range [][]string{{"vdi", "snapshot", "vm1", "--tag", "base"}, {"vdi", "clone", "vm1@base", "test-vm"}} {
		if _, stderr, err := c.Herd(ctx(t), 0, args...); err != nil {
			t.Fatalf("%v: %v %s", args, err, stderr)
		}
	}
	var created api.CreatedToken
	if err := c.HerdJSON(ctx(t), 0, &created, "token", "create", "viewer", "--read-only"); err != nil {
		t.Fatal(err)
	}

	// The page itself holds no data and needs no token; its headers.
	// (The CLI checks the CA by its fingerprint; this check is about the
	// page, not the certificate.)
	insecure := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}, Timeout: 10 * time.Second}
	base := "https://" + c.Node(1).AdminAddr() + "/"
	resp, err := insecure.Get(base)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), "/ui/app.js") ||
		!strings.Contains(resp.Header.Get("Content-Security-Policy"), "default-src 'self'") || resp.Header.Get("X-Content-Type-Options") != "nosniff" {
		t.Fatalf("GET / on the admin port: %d %v\n%s", resp.StatusCode, resp.Header, body)
	}

	shots := filepath.Join(os.TempDir(), fmt.Sprintf("herd-dashboard-%s", time.Now().Format("20060102-150405")))
	if err := os.MkdirAll(shots, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshots in %s", shots)
	page := func(name string) string {
		return base + "?page=" + name + "#token=" + url.QueryEscape(created.Secret)
	}
	nodes := []string{nodeID(t, c, 0), nodeID(t, c, 1), nodeID(t, c, 2)}
	for _, p := range []struct {
		name string
		want []string
	}{
		{"overview", []string{">OK<", "All well", "<th>bytes left</th>", "<th>provisioned</th>", "Losing a node:", nodes[2]}},
		{"nodes", append([]string{"alive", "leader", fmt.Sprintf(" level %d<", cluster.SupportedLevel)}, nodes...)},
		{"vdis", []string{"vm1@base", "test-vm", "snapshot", "24.0 MiB"}},
		{"events", []string{`vdi "vm1" snapshotted as vm1@base`, `vdi "test-vm" cloned from vm1@base`, "cluster formatted: 3 copies"}},
	} {
		chromium(t, browser, page(p.name), "--screenshot="+filepath.Join(shots, p.name+".png"))
		dom := chromium(t, browser, page(p.name), "--dump-dom")
		for _, w := range p.want {
			if !strings.Contains(dom, w) {
				t.Errorf("the %s page lacks %q; its DOM:\n%s", p.name, w, lastLines(dom, 40))
			}
		}
		if info, err := os.Stat(filepath.Join(shots, p.name+".png")); err != nil || info.Size() < 5000 {
			t.Errorf("screenshot of %s: %v", p.name, err)
		}
	}

	// Live I/O: the graph while fio writes through the page's node.
	fio, fioOut := startFio(t, "dashboard", c.Node(1).NBDURI("test-vm"), "rw=randwrite\nbs=64k\niodepth=8\nsize=64M\ntime_based=1\nruntime=20\n")
	testcluster.WaitFor(t, time.Minute, "the graph to show writes through node 1", func() (bool, error) {
		dom := chromium(t, browser, page("overview"), "--dump-dom")
		return strings.Contains(dom, "written: ") && !strings.Contains(dom, "written: 0 B/s"), fmt.Errorf("legend: %s", grepLines(dom, "written"))
	})
	chromium(t, browser, page("overview"), "--screenshot="+filepath.Join(shots, "overview-under-load.png"))
	if err := fio.Wait(); err != nil {
		t.Fatalf("fio: %v\n%s", err, lastLines(fioOut.String(), 5))
	}

	// No token, or a wrong one: the login form, no data.
	for _, u := range []string{base, base + "#token=wrong"} {
		dom := chromium(t, browser, u, "--dump-dom")
		if !strings.Contains(dom, `id="login-form"`) || strings.Contains(dom, nodes[0]) || !strings.Contains(dom, `<section id="login">`) {
			t.Errorf("%s: want the login form and no cluster data; DOM:\n%s", u, lastLines(dom, 30))
		}
	}

	// A node dies: the page says so.
	c.Node(2).Kill()
	waitAgreement(t, c, []int{0, 1}, time.Minute)
	testcluster.WaitFor(t, time.Minute, "the dashboard to show node 2 down", func() (bool, error) {
		dom := chromium(t, browser, page("nodes"), "--dump-dom")
		return strings.Contains(dom, ">WARN<") && strings.Contains(dom, "dead"), fmt.Errorf("DOM:\n%s", lastLines(dom, 30))
	})
	chromium(t, browser, page("nodes"), "--screenshot="+filepath.Join(shots, "nodes-after-kill.png"))
	chromium(t, browser, page("overview"), "--screenshot="+filepath.Join(shots, "overview-after-kill.png"))
}
