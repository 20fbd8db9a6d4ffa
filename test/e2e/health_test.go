package e2e

import (
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/api"
	"github.com/herd-storage/herd/internal/testcluster"
)

// health runs `herd cluster health --json` through node and returns the
// report and the exit status.
func health(t *testing.T, c *testcluster.Cluster, node int) (api.Health, int) {
	t.Helper()
	stdout, stderr, err := c.Herd(ctx(t), node, "cluster", "health", "--json")
	code := 0
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		code = exit.ExitCode()
	} else if err != nil {
		t.Fatalf("cluster health: %v %s", err, stderr)
	}
	var h api.Health
	if jsonErr := json.Unmarshal([]byte(stdout), &h); jsonErr != nil {
		return api.Health{Status: "unparsable: " + stdout + stderr}, code
	}
	return h, code
}

// waitHealth waits until node reports status (with exit status code) and
// a reason containing want.
func waitHealth(t *testing.T, c *testcluster.Cluster, node int, status string, code int, want string) api.Health {
	t.Helper()
	var h api.Health
	testcluster.WaitFor(t, 90*time.Second, "cluster health "+status, func() (bool, error) {
		var got int
		h, got = health(t, c, node)
		found := want == ""
		for _, r := range h.Reasons {
			found = found || strings.Contains(r.What, want)
		}
		return h.Status == status && got == code && found, fmt.Errorf("status %s, exit %d, reasons %+v", h.Status, got, h.Reasons)
	})
	return h
}

// TestClusterHealth: OK on a healthy cluster, WARN naming a killed node,
// OK once it is back and recovered, ERR without quorum; the exit status
// follows (0, 1, 2).
func TestClusterHealth(t *testing.T) {
	need(t, "qemu-io")
	c := dataCluster(t, 3, 2, "disk", "64M")
	if out, err := qemuIO(t, c.Node(0).NBDURI("disk"), "write -P 0x5a 0 16M", "flush"); err != nil {
		t.Fatalf("qemu-io: %v\n%s", err, out)
	}
	waitHealth(t, c, 0, api.HealthOK, 0, "")

	c.Node(2).Kill()
	h := waitHealth(t, c, 0, api.HealthWarn, 1, "is down")
	t.Logf("one node killed: %+v", h.Reasons)
	c.Node(2).Restart()
	waitHealth(t, c, 0, api.HealthOK, 0, "")

	// Two of three voters at once: no quorum. (One after the other, the
	// survivors would drop the first from the voters, and one voter alone
	// keeps a quorum.)
	c.Node(1).Kill()
	c.Node(2).Kill()
	h = waitHealth(t, c, 0, api.HealthErr, 2, "no quorum")
	t.Logf("two of three killed at once: %+v", h.Reasons)

	c.Node(1).Restart()
	c.Node(2).Restart()
	waitHealth(t, c, 0, api.HealthOK, 0, "")
}
