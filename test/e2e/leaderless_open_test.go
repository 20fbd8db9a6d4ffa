package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestOpenRightAfterLeaderKilled: an NBD open of an existing VDI through a
// survivor, started the moment the raft leader is killed (-9), while the
// survivors know no leader for a few seconds. The open waits for the
// cluster (bounded by the NBD handshake timeout) and succeeds, or fails
// saying the cluster has no leader; it never answers that the export does
// not exist (NBD_REP_ERR_UNKNOWN, "Requested export not available" in
// qemu, ENOENT in libnbd). Both the writable open (which needs the writer
// lock, so the log) and the read-only one are tried, through each
// survivor.
func TestOpenRightAfterLeaderKilled(t *testing.T) {
	need(t, "qemu-io")
	c := dataCluster(t, 3, 3, "w", "64M")
	all := []int{0, 1, 2}
	leader := leaderIndex(t, c, all)
	survivors := without(all, leader)
	c.Node(leader).Kill()

	type attempt struct {
		node     int
		export   string
		out      string
		err      error
		duration time.Duration
	}
	attempts := []*attempt{
		{node: survivors[0], export: "w"},
		{node: survivors[1], export: "ro/w"},
	}
	var wg sync.WaitGroup
	for _, a := range attempts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			started := time.Now()
			// run, not qemuIO: t.Fatalf belongs to the test's goroutine,
			// and the NBD handshake timeout (30 s) bounds the open.
			args := []string{"-f", "raw", "-c", "read 0 4096", c.Node(a.node).NBDURI(a.export)}
			if strings.HasPrefix(a.export, "ro/") {
				args = append([]string{"-r"}, args...)
			}
			a.out, a.err = runNoFatal(2*time.Minute, "qemu-io", args...)
			a.duration = time.Since(started)
		}()
	}
	wg.Wait()
	for _, a := range attempts {
		text := strings.ToLower(a.out)
		switch {
		case a.err == nil && !strings.Contains(text, "failed"):
			t.Logf("open of %s through node %d succeeded after %v", a.export, a.node, a.duration.Round(time.Millisecond))
		case strings.Contains(text, "not available") || strings.Contains(text, "no vdi") || strings.Contains(text, "unknown export"):
			t.Errorf("open of %s through node %d right after the leader was killed: the export is said not to exist (after %v): %v\n%s",
				a.export, a.node, a.duration.Round(time.Millisecond), a.err, a.out)
		case strings.Contains(text, "no leader") || strings.Contains(text, "quorum"):
			t.Logf("open of %s through node %d failed naming the missing leader after %v:\n%s", a.export, a.node, a.duration.Round(time.Millisecond), a.out)
		default:
			t.Errorf("open of %s through node %d right after the leader was killed failed without naming the missing leader (after %v): %v\n%s",
				a.export, a.node, a.duration.Round(time.Millisecond), a.err, a.out)
		}
	}
}

// runNoFatal runs a client command with a deadline and returns its output;
// unlike run it may be called from any goroutine.
func runNoFatal(timeout time.Duration, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if ctx.Err() != nil {
		return string(out), fmt.Errorf("%s hung for %v: %w", name, timeout, err)
	}
	return string(out), err
}
