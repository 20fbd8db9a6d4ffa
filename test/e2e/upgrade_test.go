package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/api"
	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/testcluster"
)

// upgradeFrom is the older herd the rolling upgrade starts from: the
// first commit after the clean stop landed (SIGTERM hands leadership
// over and the quorum stays) and before feature levels, so its nodes
// report no version, no level and know no command type 30.
const upgradeFrom = "add0e1488400b16174fc8ff11331a95eb54f492a"

// buildOlderHerd builds herd as of commit from this repository's history
// (git archive of the commit, built with the same module cache).
func buildOlderHerd(t *testing.T, commit string) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	archive := exec.Command("git", "-C", root, "archive", "--format=tar", commit)
	extract := exec.Command("tar", "-x", "-C", dir)
	pipe, err := archive.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	extract.Stdin = pipe
	var archiveErr strings.Builder
	archive.Stderr = &archiveErr
	if err := extract.Start(); err != nil {
		t.Fatal(err)
	}
	if err := archive.Run(); err != nil {
		extract.Wait()
		t.Fatalf("git archive %s: %v: %s (the upgrade test builds an older herd from this repository's history: it needs a clone with its history, not a shallow one)", commit, err, archiveErr.String())
	}
	if err := extract.Wait(); err != nil {
		t.Fatalf("extracting %s: %v", commit, err)
	}
	binary := filepath.Join(dir, "herd-"+commit[:12])
	build := exec.Command("go", "build", "-trimpath", "-ldflags", "-X github.com/herd-storage/herd/internal/version.Version=0.9.0-dev-"+commit[:12], "-o", binary, "./cmd/herd")
	build.Dir = dir
	build.Env = append(os.Environ(), "GOFLAGS=-buildvcs=false", "GOWORK=off")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building herd %s: %v\n%s", commit, err, out)
	}
	return binary
}

// TestRollingUpgradeFromOlderBuild follows docs/UPGRADE.md: a 3-node
// cluster of an older herd holds VDIs, a snapshot and data; each node in
// turn is stopped with SIGTERM, its binary replaced by this build and
// started again, while fio verifies writes through a node not being
// replaced. Then: zero verify errors, every VDI and snapshot identical to
// the copy taken before, a feature new since the older build (a VDI's own
// copies) refused until the last node is upgraded and the cluster
// finalized, and working after.
func TestRollingUpgradeFromOlderBuild(t *testing.T) {
	need(t, "fio", "qemu-io", "qemu-img", "git", "tar")
	older := buildOlderHerd(t, upgradeFrom)
	current := testcluster.Binary(t)
	c := testcluster.Start(t, testcluster.Options{Nodes: 3, Binary: older})
	all := []int{0, 1, 2}
	waitAgreement(t, c, all, 30*time.Second)
	herd(t, c, 0, "cluster", "format", "--copies", "3")
	for _, v := range [][2]string{{"vm1", "64M"}, {"vm2", "32M"}, {"fio", "192M"}} {
		herd(t, c, 0, "vdi", "create", v[0], v[1])
	}
	write := func(node int, export string, commands ...string) {
		t.Helper()
		if out, err := qemuIO(t, c.Node(node).NBDURI(export), append(commands, "flush")...); err != nil {
			t.Fatalf("qemu-io %s through node %d: %v\n%s", export, node, err, lastLines(out, 5))
		}
	}
	write(0, "vm1", "write -P 0x11 0 24M", "write -P 0x12 40M 4M")
	herd(t, c, 1, "vdi", "snapshot", "vm1", "--tag", "before")
	write(1, "vm1", "write -P 0x13 8M 8M", "write -z 40M 1M")
	write(2, "vm2", "write -P 0x21 0 32M")

	// Copies of every VDI and snapshot, taken before the upgrade.
	saved := t.TempDir()
	exports := []string{"vm1", "vm1@before", "vm2"}
	for i, export := range exports {
		mustRun(t, 2*time.Minute, "qemu-img", "convert", "-f", "raw", "-O", "raw", c.Node(i%3).NBDURI(export), filepath.Join(saved, export+".raw"))
	}

	// The new CLI refuses the new feature against a node that does not
	// know it rather than let the node drop the field.
	c.SetBinary(current)
	if _, stderr, err := c.Herd(ctx(t), 0, "vdi", "create", "early", "32M", "--copies", "2"); err == nil || !strings.Contains(stderr, "does not know a VDI's own copies") {
		t.Fatalf("vdi create --copies through a node of the older build: err %v, stderr %q; want a refusal", err, stderr)
	}

	for step, upgraded := range all {
		through := (upgraded + 1) % 3
		fio, fioOut := startFio(t, fmt.Sprintf("step%d", step), c.Node(through).NBDURI("fio"),
			fmt.Sprintf("rw=randwrite\nbs=16k\niodepth=8\nsize=64M\noffset=%dM\ntime_based=1\nruntime=20\nverify=crc32c\nverify_fatal=1\nverify_backlog=256\n", step*64))
		fioDone := make(chan error, 1)
		go func() { fioDone <- fio.Wait() }()
		testcluster.WaitFor(t, 30*time.Second, "fio to start writing", func() (bool, error) {
			return strings.Contains(fioOut.String(), "Starting") || strings.Contains(fioOut.String(), "Jobs:"), fmt.Errorf("fio printed %q", lastLines(fioOut.String(), 3))
		})

		c.Node(upgraded).Stop()
		c.Node(upgraded).SetBinary(current)
		c.Node(upgraded).Restart()

		select {
		case err := <-fioDone:
			if err != nil || strings.Contains(fioOut.String(), "verify: bad") || !strings.Contains(fioOut.String(), "err= 0") {
				t.Fatalf("step %d: fio through node %d while node %d was upgraded: %v\n%s", step, through, upgraded, err, lastLines(fioOut.String(), 15))
			}
		case <-time.After(5 * time.Minute):
			t.Fatalf("step %d: fio through node %d did not finish", step, through)
		}
		t.Logf("step %d: node %d upgraded; fio through node %d: %s", step, upgraded, through, grepLines(fioOut.String(), "err="))
		waitAgreement(t, c, all, time.Minute)
		waitRecovered(t, c, 3)
		waitHealth(t, c, upgraded, api.HealthOK, 0, "")

		if step == len(all)-1 {
			break
		}
		// Not every node runs the new herd yet: the feature is refused
		// naming the nodes to upgrade, and so is the finalize.
		_, stderr, err := c.Herd(ctx(t), upgraded, "vdi", "create", "early", "32M", "--copies", "2")
		if err == nil || !strings.Contains(stderr, "upgrade herd on") || !strings.Contains(stderr, nodeID(t, c, all[step+1])) {
			t.Fatalf("step %d: vdi create --copies 2 through upgraded node %d: err %v, stderr %q; want a refusal naming node %d", step, upgraded, err, stderr, all[step+1])
		}
		_, stderr, err = c.Herd(ctx(t), upgraded, "cluster", "finalize-upgrade")
		if err == nil || !strings.Contains(stderr, nodeID(t, c, all[step+1])) {
			t.Fatalf("step %d: finalize-upgrade with node %d not upgraded: err %v, stderr %q; want a refusal naming it", step, all[step+1], err, stderr)
		}
	}

	// Every node runs this build: node list says so.
	var nodes []api.NodeEntry
	if err := c.HerdJSON(ctx(t), 0, &nodes, "node", "list"); err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if n.Build == nil || n.Build.Level != cluster.SupportedLevel || n.Build.Commit == "" {
			t.Fatalf("node %s reports build %+v after the upgrade; want level %d and a commit", n.ID, n.Build, cluster.SupportedLevel)
		}
	}
	// The data written by the older build, unchanged.
	for i, export := range exports {
		node := (i + 1) % 3
		mustRun(t, 2*time.Minute, "qemu-img", "compare", "-f", "raw", "-F", "raw", filepath.Join(saved, export+".raw"), c.Node(node).NBDURI(export))
	}
	checkVDIClean(t, c, 0, "vm1")
	checkVDIClean(t, c, 1, "fio")
	waitExactCopies(t, c, 3, all)

	// Before the finalize the feature is still refused; it says so.
	if _, stderr, err := c.Herd(ctx(t), 2, "vdi", "create", "early", "32M", "--copies", "2"); err == nil || !strings.Contains(stderr, "finalize-upgrade") {
		t.Fatalf("vdi create --copies before the finalize: err %v, stderr %q", err, stderr)
	}
	if out := herd(t, c, 1, "cluster", "finalize-upgrade"); !strings.Contains(out, fmt.Sprintf("feature level %d", cluster.SupportedLevel)) {
		t.Fatalf("finalize-upgrade printed %q", out)
	}
	var v cluster.VDI
	if err := c.HerdJSON(ctx(t), 2, &v, "vdi", "create", "two", "32M", "--copies", "2"); err != nil {
		t.Fatalf("vdi create --copies 2 after the finalize: %v", err)
	}
	if v.Copies != 2 {
		t.Fatalf("vdi two has %d copies, want 2", v.Copies)
	}
	// No way back after the finalize: the older build, started on a
	// member's data, stops at the first log entry it does not know rather
	// than serve a state that differs from the others'.
	c.Node(2).Stop()
	c.Node(2).SetBinary(older)
	if err := c.Node(2).RestartUntilExit(90 * time.Second); err == nil {
		t.Fatal("the older build exited with status 0 on a finalized cluster's log")
	}
	logged, err := os.ReadFile(c.Node(2).LogPath())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(logged), "which this herd binary does not know") {
		t.Fatalf("the older build's log does not say why it stopped:\n%s", lastLines(string(logged), 10))
	}
	c.Node(2).SetBinary(current)
	c.Node(2).Restart()
	waitAgreement(t, c, all, time.Minute)

	write(0, "two", "write -P 0x31 0 8M")
	if out, err := qemuIO(t, c.Node(1).NBDURI("two"), "read -P 0x31 0 8M"); err != nil || strings.Contains(out, "fail") {
		t.Fatalf("reading vdi two through node 1: %v\n%s", err, lastLines(out, 5))
	}

}
