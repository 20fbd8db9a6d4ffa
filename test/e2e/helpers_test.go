// Package e2e drives real multi-process herd clusters (internal/testcluster)
// through the admin API, the CLI and, for the data path, real NBD clients.
package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/api"
	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/maintenance"
	"github.com/herd-storage/herd/internal/testcluster"
)

// failoverDeadline is the membership promise: a dead node is out of the epoch
// within 10 s.
const failoverDeadline = 10 * time.Second

// objectDataOffset is where an object file's data starts (internal/store,
// format version 2): a 4 KiB header, then the 256 KiB checksum table.
const objectDataOffset = 4096 + 256<<10

// client returns the admin client of node i, one per address and token
// for the whole run: a new client per call would leave a keep-alive
// connection behind on the node every time.
func client(c *testcluster.Cluster, i int) *api.Client {
	key := c.Node(i).AdminAddr() + " " + c.Token()
	clientsMu.Lock()
	defer clientsMu.Unlock()
	if cl, ok := clients[key]; ok {
		return cl
	}
	cl := api.NewClient(c.Node(i).AdminAddr(), c.Token())
	clients[key] = cl
	return cl
}

var (
	clientsMu sync.Mutex
	clients   = map[string]*api.Client{}
)

func ctx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func running(c *testcluster.Cluster) []int {
	var out []int
	for _, n := range c.Nodes() {
		if n.Running() {
			out = append(out, n.Index())
		}
	}
	return out
}

func nodeID(t *testing.T, c *testcluster.Cluster, i int) string {
	t.Helper()
	info, err := client(c, i).Info(ctx(t))
	if err != nil {
		t.Fatalf("node %d: %v", i, err)
	}
	return info.NodeID
}

func epochsJSON(t *testing.T, c *testcluster.Cluster, i int) (string, []cluster.Epoch, error) {
	epochs, err := client(c, i).Epochs(ctx(t))
	if err != nil {
		return "", nil, err
	}
	data, _ := json.Marshal(epochs)
	return string(data), epochs, nil
}

// waitAgreement waits until every listed node reports the same epoch
// history, all of `alive` alive, and a full voter set among them.
func waitAgreement(t *testing.T, c *testcluster.Cluster, nodes []int, timeout time.Duration) []cluster.Epoch {
	t.Helper()
	var history []cluster.Epoch
	want := map[string]bool{}
	for _, i := range nodes {
		want[nodeID(t, c, i)] = true
	}
	testcluster.WaitFor(t, timeout, fmt.Sprintf("nodes %v to agree on membership and epochs", nodes), func() (bool, error) {
		var first string
		for _, i := range nodes {
			text, epochs, err := epochsJSON(t, c, i)
			if err != nil {
				return false, fmt.Errorf("node %d: %v", i, err)
			}
			if len(epochs) == 0 {
				return false, fmt.Errorf("node %d has no epochs", i)
			}
			last := epochs[len(epochs)-1]
			if len(last.Nodes) != len(want) {
				return false, fmt.Errorf("node %d: epoch %d has %d nodes, want %d", i, last.Number, len(last.Nodes), len(want))
			}
			for _, id := range last.Nodes {
				if !want[id] {
					return false, fmt.Errorf("node %d: epoch %d includes %s", i, last.Number, id)
				}
			}
			if first == "" {
				first, history = text, epochs
			} else if text != first {
				return false, fmt.Errorf("node %d's epoch history differs from node %d's", i, nodes[0])
			}
			info, err := client(c, i).Info(ctx(t))
			if err != nil {
				return false, err
			}
			if !info.Quorum {
				return false, fmt.Errorf("node %d: no quorum: %s", i, info.QuorumDetail)
			}
			if wantVoters := targetVoters(len(want)); len(info.Voters) != wantVoters {
				return false, fmt.Errorf("node %d sees %d voters, want %d", i, len(info.Voters), wantVoters)
			}
			for _, v := range info.Voters {
				if !want[v] {
					return false, fmt.Errorf("node %d: voter %s is not a live node", i, v)
				}
			}
		}
		return true, nil
	})
	return history
}

func targetVoters(n int) int {
	switch {
	case n >= 5:
		return 5
	case n >= 3:
		return 3
	}
	return 1
}

// voterCount returns the number of voters node i sees.
func voterCount(t *testing.T, c *testcluster.Cluster, i int) (int, error) {
	info, err := client(c, i).Info(ctx(t))
	if err != nil {
		return 0, err
	}
	return len(info.Voters), nil
}

func leaderIndex(t *testing.T, c *testcluster.Cluster, among []int) int {
	t.Helper()
	info, err := client(c, among[0]).Info(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, i := range among {
		if nodeID(t, c, i) == info.Leader {
			return i
		}
	}
	t.Fatalf("leader %q is none of %v", info.Leader, among)
	return -1
}

func roleOf(t *testing.T, c *testcluster.Cluster, asker, i int) string {
	t.Helper()
	nodes, err := client(c, asker).Nodes(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	id := nodeID(t, c, i)
	for _, n := range nodes {
		if n.ID == id {
			return n.Role
		}
	}
	return ""
}

func without(list []int, x int) []int {
	return slices.DeleteFunc(slices.Clone(list), func(v int) bool { return v == x })
}

func contextWithTimeout(t *testing.T, timeout time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(t.Context(), timeout)
}

func splitLines(s string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		out = append(out, strings.TrimRight(l, "\r "))
	}
	return out
}

func execCommand(name string, args ...string) *exec.Cmd { return exec.Command(name, args...) }

// startFio starts fio with a job file of the given options (one "key=value"
// per line) against an NBD URI and returns the running command and its
// output (safe to read while fio writes it). The process is killed at the
// end of the test.
func startFio(t *testing.T, name, uri, options string) (*exec.Cmd, *syncBuffer) {
	t.Helper()
	job := filepath.Join(t.TempDir(), name+".fio")
	if err := os.WriteFile(job, []byte(fmt.Sprintf("[%s]\nioengine=nbd\nuri=%s\nverify_state_save=0\n%s", name, uri, options)), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("fio", job)
	var out syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill() })
	return cmd, &out
}

// syncBuffer collects a process's output; String may be called while the
// process runs.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// waitRecovered waits until every one of the alive nodes reports recovery
// done for the current epoch.
func waitRecovered(t *testing.T, c *testcluster.Cluster, alive int) {
	t.Helper()
	c.WaitRecovered(alive, 3*time.Minute)
}

// waitObjectCopies waits until the cluster holds more than n object copies.
func waitObjectCopies(t *testing.T, c *testcluster.Cluster, n uint64) {
	t.Helper()
	testcluster.WaitFor(t, 60*time.Second, "the writer to have written some data", func() (bool, error) {
		nodes, err := client(c, 1).Nodes(ctx(t))
		if err != nil {
			return false, err
		}
		var objects uint64
		for _, node := range nodes {
			objects += node.Objects
		}
		return objects > n, fmt.Errorf("%d object copies so far", objects)
	})
}

// checkVDIClean runs `herd vdi check VDI` through node and fails the test
// unless the check compared at least one object and found every replica of
// every object present and identical. A check of zero objects passes
// vacuously, so it counts as a failure: every caller wrote data first.
func checkVDIClean(t *testing.T, c *testcluster.Cluster, node int, vdi string) maintenance.CheckReport {
	t.Helper()
	// Every replica of every object is read: longer than ctx's 30 s on a
	// large disk under the race detector.
	checkContext, cancel := contextWithTimeout(t, 5*time.Minute)
	defer cancel()
	stdout, stderr, err := c.Herd(checkContext, node, "--json", "--timeout", "5m", "vdi", "check", vdi)
	var report maintenance.CheckReport
	if decodeError := json.Unmarshal([]byte(stdout), &report); err != nil || decodeError != nil {
		t.Fatalf("herd vdi check %s through node %d: %v (decoding: %v)\n%s%s", vdi, node, err, decodeError, stdout, stderr)
	}
	if report.Objects == 0 || report.Consistent != report.Objects || report.Mismatched+report.Missing+report.Unavailable+report.Repaired+report.BadChunks != 0 {
		t.Fatalf("herd vdi check %s through node %d: %+v; want at least one object, each with every replica present and identical", vdi, node, report)
	}
	t.Logf("vdi check %s: %d objects, every replica present and identical; %d chunks of erasure-coded objects, each matching its head", vdi, report.Objects, report.Chunks)
	return report
}
