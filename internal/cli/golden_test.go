package cli

import (
	"bytes"
	"crypto/tls"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/pki"
)

// The golden files hold what every command prints for --help, and what
// a set of command lines send to a node and print (tables, --json, error
// messages, exit statuses). A change to the command line shows as a
// change to them: go test ./internal/cli -run Golden -update rewrites
// them, and the diff is reviewed like code.
var update = flag.Bool("update", false, "rewrite the golden files in testdata")

func checkGolden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got == string(want) {
		return
	}
	gotLines, wantLines := strings.Split(got, "\n"), strings.Split(string(want), "\n")
	for i := range max(len(gotLines), len(wantLines)) {
		var g, w string
		if i < len(gotLines) {
			g = gotLines[i]
		}
		if i < len(wantLines) {
			w = wantLines[i]
		}
		if g != w {
			t.Fatalf("%s differs from line %d:\n got: %q\nwant: %q\n(go test ./internal/cli -run Golden -update rewrites it)", path, i+1, g, w)
		}
	}
}

// run is one command line through Main.
func run(args ...string) (stdout, stderr string, code int) {
	var out, errs bytes.Buffer
	code = Main(args, &out, &errs)
	return out.String(), errs.String(), code
}

// commandPaths walks the command tree through --help: every command's
// path, the root's first.
func commandPaths(t *testing.T) [][]string {
	var paths [][]string
	var walk func(path []string)
	walk = func(path []string) {
		paths = append(paths, path)
		stdout, stderr, code := run(append(append([]string{}, path...), "--help")...)
		if code != 0 {
			t.Fatalf("herd %v --help: exit %d: %s", path, code, stderr)
		}
		_, commands, ok := strings.Cut(stdout, "\nAvailable Commands:\n")
		if !ok {
			return
		}
		commands, _, _ = strings.Cut(commands, "\n\n")
		for _, line := range strings.Split(commands, "\n") {
			name := strings.Fields(line)[0]
			if name == "help" || name == "completion" && len(path) == 0 {
				continue
			}
			walk(append(append([]string{}, path...), name))
		}
	}
	walk(nil)
	return paths
}

// The tables print local times: the golden files have UTC's. Set before
// any test starts goroutines that read it.
func init() { time.Local = time.UTC }

// goldenEnvironment makes the output independent of the caller's.
func goldenEnvironment(t *testing.T) {
	t.Setenv("HERD_ADDR", "")
	t.Setenv("HERD_TOKEN", "")
}

// TestHelpGolden: the --help of every command, and what each says to a
// wrong number of arguments.
func TestHelpGolden(t *testing.T) {
	goldenEnvironment(t)
	var b strings.Builder
	for _, path := range append(commandPaths(t), []string{"help"}, []string{"completion"}) {
		stdout, stderr, code := run(append(append([]string{}, path...), "--help")...)
		fmt.Fprintf(&b, "=== herd %s --help (exit %d)\n%s", strings.Join(path, " "), code, stdout)
		if stderr != "" {
			fmt.Fprintf(&b, "--- stderr\n%s", stderr)
		}
	}
	checkGolden(t, "help.golden", b.String())
}

// fakeNode is an admin API that answers every request with canned JSON
// (null where it has none) and records the requests. answers, if set,
// are its own, in place of fakeAnswers' for the same request.
type fakeNode struct {
	mu       sync.Mutex
	requests []string
	answers  map[string]string
}

var fakeAnswers = map[string]string{
	"GET /v1/vdis":                         `[{"id":1,"name":"vm1","size":10737418240,"copies":3,"object_size":4194304,"created":"2026-01-02T03:04:05Z"},{"id":2,"name":"db","size":1073741824,"copies":2,"object_size":4194304,"created":"2026-01-03T03:04:05Z","exclusive":true},{"id":10,"name":"ec1","size":1073741824,"copies":3,"ec":"4+2","object_size":4194304,"created":"2026-01-06T03:04:05Z"}]`,
	"GET /v1/vdis/ec1":                     `{"id":10,"name":"ec1","size":1073741824,"copies":3,"ec":"4+2","object_size":4194304,"created":"2026-01-06T03:04:05Z","parent":9}`,
	"GET /v1/vdis/ec1@s1":                  `{"id":9,"name":"ec1","size":1073741824,"copies":3,"ec":"4+2","object_size":4194304,"created":"2026-01-06T03:04:05Z","snapshot":true,"tag":"s1","snapshot_time":"2026-01-07T03:04:05Z"}`,
	"PUT /v1/vdis/ec1/settings":            `!400 {"error":"invalid argument: vdi \"ec1\" is erasure-coded (4+2): --ack zone needs copies","code":"invalid"}`,
	"GET /v1/vdis/vm1":                     `{"id":1,"name":"vm1","size":10737418240,"copies":3,"object_size":4194304,"created":"2026-01-02T03:04:05Z","unclean":true,"ack":"zone","parent":7}`,
	"GET /v1/vdis/vm1@s1":                  `{"id":7,"name":"vm1","size":10737418240,"copies":3,"object_size":4194304,"created":"2026-01-02T03:04:05Z","snapshot":true,"tag":"s1","snapshot_time":"2026-01-04T03:04:05Z"}`,
	"GET /v1/vdis/gone":                    `!404 {"error":"vdi gone: not found","code":"not_found"}`,
	"GET /v1/locks":                        `[{"key":"vdi/vm1","node":"node-a","session":"s-1","acquired":"2026-01-05T03:04:05Z","generation":3}]`,
	"GET /v1/nodes":                        `[{"id":"node-a","address":"10.0.0.1","zone":"z1","capacity":1099511627776,"state":"alive","used_bytes":1048576,"free_bytes":2097152,"objects":12,"checksum_errors":1,"blocks_repaired":1},{"id":"node-b","address":"10.0.0.2","capacity":1099511627776,"state":"dead","draining":true}]`,
	"GET /v1/cluster":                      `{"node_id":"node-a","formatted":true,"format":{"copies":3,"object_size":4194304,"created":"2026-01-01T00:00:00Z"},"epoch":5,"leader":"node-a","leader_address":"10.0.0.1","voters":["node-a","node-b"],"quorum":true,"quorum_detail":"2 of 2 voters","nodes_alive":1,"nodes_total":2,"vdis":2,"feature_level":2,"supported_feature_level":3}`,
	"GET /v1/cluster/epochs":               `[{"epoch":1,"nodes":["node-a"],"time":"2026-01-01T00:00:00Z","reason":"format"},{"epoch":2,"nodes":["node-a","node-b"],"time":"2026-01-01T00:01:00Z","reason":"node-b joined"}]`,
	"GET /v1/cluster/health":               `{"status":"WARN","reasons":[{"level":"WARN","what":"node-b is dead"}]}`,
	"GET /v1/recovery":                     `[{"node":"node-a","address":"10.0.0.1","status":{"epoch":5,"state":"pulling","objects":10,"copied":4,"remaining":6,"bytes":100,"rate_bytes_per_second":1048576,"bytes_remaining":6291456,"eta_seconds":6,"limits":{}}},{"node":"node-b","address":"10.0.0.2","status":{"state":"idle"},"error":"unreachable"},{"node":"node-c","address":"10.0.0.3","status":{"state":"idle","limits":{}}}]`,
	"GET /v1/scrub":                        `[{"node":"node-a","address":"10.0.0.1","status":{"state":"running","objects":10,"done":3,"bytes_verified":12582912,"deep":true,"max_rate_bytes_per_second":52428800,"last_complete":"2026-01-01T00:00:00Z"}}]`,
	"GET /v1/tree":                         `[{"id":1,"name":"vm1","size":10737418240,"created":"2026-01-02T03:04:05Z","parent":7},{"id":7,"name":"vm1","size":10737418240,"created":"2026-01-02T03:04:05Z","snapshot":true,"tag":"s1","snapshot_time":"2026-01-04T03:04:05Z"},{"id":8,"name":"clone","size":10737418240,"created":"2026-01-02T03:04:05Z","parent":7,"flatten":true},{"id":9,"name":"ec1","size":1073741824,"copies":3,"ec":"4+2","created":"2026-01-06T03:04:05Z","snapshot":true,"tag":"s1","snapshot_time":"2026-01-07T03:04:05Z"},{"id":10,"name":"ec1","size":1073741824,"copies":3,"ec":"4+2","created":"2026-01-06T03:04:05Z","parent":9}]`,
	"GET /v1/events?after=0":               `[{"index":1,"time":"2026-01-01T00:00:00Z","kind":"epoch","text":"epoch 1"},{"index":2,"kind":"vdi","text":"vdi vm1 created"}]`,
	"POST /v1/vdis/vm1/check":              `{"vdi":"vm1","objects":4,"consistent":3,"mismatched":1,"problems":["object 3: replicas differ"]}`,
	"GET /v1/vdis/vm1/diff?since=vm1%40s1": `{"vdi":"vm1","since":"vm1@s1","size":10737418240,"object_size":4194304,"changed_bytes":4194304,"extents":[{"offset":0,"length":4194304}]}`,
}

func (f *fakeNode) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	key := r.Method + " " + r.URL.RequestURI()
	f.mu.Lock()
	f.requests = append(f.requests, strings.TrimSpace(key+" "+string(body)))
	f.mu.Unlock()
	answer, ok := f.answers[key]
	if !ok {
		answer, ok = fakeAnswers[key]
	}
	if !ok {
		answer = "null"
	}
	// "!NNN " answers with status NNN.
	if len(answer) > 5 && answer[0] == '!' && answer[4] == ' ' {
		var status int
		if _, err := fmt.Sscanf(answer[1:4], "%d", &status); err == nil {
			w.WriteHeader(status)
			answer = answer[5:]
		}
	}
	io.WriteString(w, answer)
}

func (f *fakeNode) take() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	r := f.requests
	f.requests = nil
	return r
}

// TestCommandsGolden runs command lines against a fake node: what each
// sends, prints (as a table and with --json) and exits with.
func TestCommandsGolden(t *testing.T) {
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
	fake := &fakeNode{}
	node := httptest.NewUnstartedServer(fake)
	node.TLS = &tls.Config{Certificates: []tls.Certificate{certificate}}
	node.StartTLS()
	defer node.Close()
	token := pki.AdminToken{Fingerprint: pki.Fingerprint(ca.Cert), ID: "0011223344556677", Secret: pki.NewSecret()}.String()
	t.Setenv("HERD_TOKEN", token)
	address := strings.TrimPrefix(node.URL, "https://")
	dir := t.TempDir()
	// A node whose herd knows erasure-coded VDIs (the first's supports
	// feature level 3), for the command lines that give --addr UPGRADED.
	upgraded := &fakeNode{answers: map[string]string{
		"GET /v1/cluster": `{"node_id":"node-a","formatted":true,"format":{"copies":3,"object_size":4194304,"created":"2026-01-01T00:00:00Z"},"epoch":5,"leader":"node-a","leader_address":"10.0.0.1","voters":["node-a"],"quorum":true,"quorum_detail":"1 of 1 voters","nodes_alive":6,"nodes_total":6,"vdis":2,"feature_level":6,"supported_feature_level":6}`,
		"POST /v1/vdis":   `{"id":11,"name":"a","size":10737418240,"copies":2,"ec":"3+1","object_size":4194304,"created":"2026-01-08T03:04:05Z"}`,
	}}
	upgradedNode := httptest.NewUnstartedServer(upgraded)
	upgradedNode.TLS = &tls.Config{Certificates: []tls.Certificate{certificate}}
	upgradedNode.StartTLS()
	defer upgradedNode.Close()
	upgradedAddress := strings.TrimPrefix(upgradedNode.URL, "https://")

	// Every command with no arguments and with too many, then the
	// command lines below.
	var lines [][]string
	for _, path := range commandPaths(t) {
		if len(path) == 0 || path[0] == "server" || path[0] == "completion" || path[0] == "version" {
			continue
		}
		lines = append(lines, path, append(append([]string{}, path...), "x1", "x2", "x3", "x4"))
	}
	lines = append(lines, [][]string{
		{"cluster", "format", "--copies", "3"},
		{"cluster", "format", "--copies", "3", "--object-size", "1MiB"},
		{"cluster", "format", "--copies", "3", "--object-size", "lots"},
		{"cluster", "join-token", "create", "--ttl", "7d", "--uses", "2"},
		{"cluster", "join-token", "create", "--ttl", "1ms"},
		{"cluster", "join-token", "create", "--uses", "-1"},
		{"cluster", "join-token", "create", "--out", filepath.Join(dir, "join")},
		{"cluster", "join-token", "revoke", "abc"},
		{"cluster", "rotate-join-token", "--out", filepath.Join(dir, "join2")},
		{"cluster", "rotate-ca", "--finish", "--cancel"},
		{"cluster", "rotate-ca", "--force"},
		{"cluster", "rotate-ca", "--cancel"},
		{"cluster", "rotate-ca", "--finish", "--force"},
		{"cluster", "rotate-ca", "--finish", "--token-out", filepath.Join(dir, "token")},
		{"cluster", "rotate-ca", "--no-wait"},
		{"cluster", "rotate-gossip-key", "--no-wait"},
		{"node", "recovery", "--max-rate", "100MiB/s", "--concurrency", "4"},
		{"node", "recovery", "--max-rate", "fast"},
		{"node", "recovery", "--max-rate", "0"},
		{"node", "remove", "node-b"},
		{"node", "maintenance", "node-a", "--for", "30m"},
		{"node", "maintenance", "10.0.0.2", "--end"},
		{"node", "maintenance", "node-a"},
		{"node", "maintenance", "node-a", "--for", "-1m"},
		{"node", "maintenance", "node-z", "--for", "1m"},
		{"node", "drain", "node-a"},
		{"node", "drain", "node-a", "--cancel"},
		{"node", "set", "node-a", "--capacity", "500G", "--zone", "z2"},
		{"node", "set", "node-a", "--reset"},
		{"node", "set", "node-a", "--capacity", "big"},
		{"events", "--last", "1"},
		{"events", "--last", "-1"},
		{"vdi", "create", "a", "10G"},
		{"vdi", "create", "a", "10G", "--exclusive"},
		{"vdi", "create", "a", "10G", "--handover"},
		{"vdi", "create", "a", "10G", "--handover", "--exclusive"},
		{"vdi", "create", "a", "10G", "--copies", "2"},
		{"vdi", "create", "a", "10G", "--copies", "0"},
		{"vdi", "create", "a", "ten"},
		{"vdi", "create", "a", "10G", "--ec", "4+2"},
		{"vdi", "create", "a", "10G", "--ec", "3+1", "--addr", upgradedAddress},
		{"vdi", "create", "a", "10G", "--ec", "3+2", "--copies", "3"},
		{"vdi", "create", "a", "10G", "--ec", "4+0"},
		{"vdi", "create", "a", "10G", "--ec", "9+1"},
		{"vdi", "create", "a", "10G", "--ec", "x"},
		{"vdi", "create", "a", "10G", "--ec", "04+2"},
		{"vdi", "info", "vm1"},
		{"vdi", "info", "vm1@s1"},
		{"vdi", "info", "gone"},
		{"vdi", "info", "ec1"},
		{"vdi", "info", "ec1@s1"},
		{"vdi", "set", "ec1", "--ack", "zone"},
		{"vdi", "delete", "vm1@s1"},
		{"vdi", "resize", "vm1", "20G"},
		{"vdi", "resize", "vm1", "-1"},
		{"vdi", "snapshot", "vm1", "--tag", "s2"},
		{"vdi", "snapshot", "vm1"},
		{"vdi", "clone", "vm1@s1", "c1"},
		{"vdi", "rollback", "vm1", "--to", "s1"},
		{"vdi", "rollback", "vm1"},
		{"vdi", "flatten", "vm1", "--no-wait"},
		{"vdi", "flatten", "c1"},
		{"vdi", "check", "vm1"},
		{"vdi", "check", "vm1", "--repair"},
		{"vdi", "check", "db"},
		{"vdi", "set", "vm1"},
		{"vdi", "set", "vm1", "--exclusive=false", "--ack", "zone"},
		{"vdi", "set", "vm1", "--iops-limit", "500", "--read-iops-limit", "500/s", "--write-iops-limit", "unlimited", "--bps-limit", "100MiB", "--read-bps-limit", "1G/s", "--write-bps-limit", "0"},
		{"vdi", "set", "vm1", "--iops-limit", "lots"},
		{"vdi", "set", "vm1", "--bps-limit", "1"},
		{"vdi", "set", "vm1", "--bps-limit", "-5M"},
		{"vdi", "status", "vm1"},
		{"vdi", "unlock", "vm1", "--force"},
		{"vdi", "diff", "vm1@s1", "vm1"},
		{"vdi", "diff", "vm1", "vm1"},
		{"vdi", "export", "vm1", "-", "--json"},
		{"vdi", "export", "vm1", "out.qcow2"},
		{"vdi", "export", "vm1", filepath.Join(dir, "out"), "--format", "tar"},
		{"vdi", "export", "vm1", filepath.Join(dir, "out"), "--nbd-port", "0"},
		{"vdi", "import", "vm1", "--diff", "-"},
		{"vdi", "import", "vm1", filepath.Join(dir, "in"), "--connections", "99"},
		{"scrub", "start", "--max-rate", "10MiB"},
		{"scrub", "pause", "--max-rate", "0"},
		{"scrub", "resume"},
		{"token", "create", "ops", "--read-only", "--data"},
		{"token", "create", "ops", "--data"},
		{"token", "create", "ops", "--out", filepath.Join(dir, "ops.token")},
		{"token", "revoke", "ops"},
		{"token", "refresh", "--out", filepath.Join(dir, "refreshed.token")},
		{"client", "add", "kvm1"},
		{"client", "add", "kvm1", "--vdi", "vm*"},
		{"client", "add", "kvm1", "--renew", "--vdi", "vm*", "--out", filepath.Join(dir, "c")},
		{"client", "add", "kvm1", "--vdi", "vm*", "--read-only", "--out", filepath.Join(dir, "c")},
		{"client", "add", "kvm2", "--renew", "--out", filepath.Join(dir, "c")},
		{"client", "add", "kvm3", "--vdi", "*", "--out", filepath.Join(dir, "d"), "--owner", "no-such-user-here"},
		{"client", "revoke", "kvm1"},
		{"backup", "list", filepath.Join(dir, "nostore")},
		{"backup", "verify", filepath.Join(dir, "nostore")},
		{"backup", "prune", filepath.Join(dir, "nostore"), "--keep-last", "-1"},
		{"backup", "prune", filepath.Join(dir, "nostore"), "--keep-last", "2"},
		{"backup", "create", "vm1", filepath.Join(dir, "store"), "--chunk-size", "huge"},
		{"backup", "restore", filepath.Join(dir, "nostore"), "id", "new"},
		{"lock", "list"},
	}...)
	// The longer address first: one may start with the other.
	addresses := []string{regexp.QuoteMeta(address), regexp.QuoteMeta(upgradedAddress)}
	if len(upgradedAddress) > len(address) {
		addresses[0], addresses[1] = addresses[1], addresses[0]
	}
	placeholders := regexp.MustCompile(strings.Join(addresses, "|") + "|" + regexp.QuoteMeta(dir) + "|herd-admin\\.[^\\s\"]+|[0-9a-f]{16}\\.[0-9a-f]+")
	clean := func(s string) string {
		return placeholders.ReplaceAllStringFunc(s, func(m string) string {
			switch {
			case m == upgradedAddress:
				return "UPGRADED"
			case m == address:
				return "ADDRESS"
			case m == dir:
				return "DIR"
			}
			return "TOKEN"
		})
	}
	var b strings.Builder
	for _, line := range lines {
		for _, json := range []bool{false, true} {
			args := append([]string{"--addr", address}, line...)
			if json {
				args = append([]string{"--json"}, args...)
			}
			stdout, stderr, code := run(args...)
			requests := append(fake.take(), upgraded.take()...)
			header := strings.Join(line, " ")
			if json {
				header = "--json " + header
			}
			fmt.Fprintf(&b, "=== herd %s (exit %d)\n", clean(header), code)
			for _, r := range requests {
				fmt.Fprintf(&b, "> %s\n", clean(r))
			}
			if stdout != "" {
				fmt.Fprintf(&b, "--- stdout\n%s", clean(stdout))
			}
			if stderr != "" {
				fmt.Fprintf(&b, "--- stderr\n%s", clean(stderr))
			}
		}
	}
	// Files the commands wrote, by name: the secrets written with --out.
	var written []string
	filepath.Walk(dir, func(path string, info os.FileInfo, err error) error {
		if err == nil && !info.IsDir() {
			data, _ := os.ReadFile(path)
			written = append(written, fmt.Sprintf("%s %v %q", clean(path), info.Mode(), clean(string(data))))
		}
		return nil
	})
	sort.Strings(written)
	fmt.Fprintf(&b, "=== files\n%s\n", strings.Join(written, "\n"))
	checkGolden(t, "commands.golden", b.String())
}
