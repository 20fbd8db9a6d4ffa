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
// first commit after the clean stop landed. The clean stop came in four
// commits: a86b96c (a stopping node announces its stop and hands
// leadership over), f55e9ca (a stopping voter is demoted only while a
// healthy one stays; the node departs first, while NBD drains), cb5f05a
// (a node stopped cleanly is down, not out: no background copies of its
// objects) and this one, b47068a, the last: on SIGTERM a node's NBD
// connections answer the requests they read and flush before closing.
// Before it, the SIGTERM of each step dropped replies a client was owed,
// and the fio of this test would see errors. It is before feature levels,
// so its nodes report no version, no level and know no command type 30.
const upgradeFrom = "b47068a4c2ef7b5e2f8b5452c66978741342c2c6"

// buildOlderHerd builds herd as of commit from this repository's history
// (git archive of the commit; `go mod download` in the extracted tree
// fetches the modules its go.mod needs that the cache lacks, so a fresh
// machine can build it).
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
	env := append(os.Environ(), "GOFLAGS=-buildvcs=false", "GOWORK=off")
	download := exec.Command("go", "mod", "download")
	download.Dir = dir
	download.Env = env
	if out, err := download.CombinedOutput(); err != nil {
		t.Fatalf("go mod download for herd %s: %v\n%s", commit, err, out)
	}
	binary := filepath.Join(dir, "herd-"+commit[:12])
	build := exec.Command("go", "build", "-trimpath", "-ldflags", "-X github.com/herd-storage/herd/internal/version.Version=0.9.0-dev-"+commit[:12], "-o", binary, "./cmd/herd")
	build.Dir = dir
	build.Env = env
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building herd %s: %v\n%s", commit, err, out)
	}
	return binary
}

// TestRollingUpgradeFromOlderBuild follows docs/UPGRADE.md: a 3-node
// cluster of an older herd holds VDIs, a snapshot and data; each node in
// turn is stopped with SIGTERM, its binary replaced by this build and
// started again, while two fio jobs verify writes, each to a VDI of its
// own, through the two nodes not being replaced. After each step node
// list shows which nodes run which build. Then: zero verify errors from
// both jobs, every VDI and snapshot identical to the copy taken before,
// a feature new since the older build (a VDI's own copies) refused until
// the last node is upgraded and the cluster finalized, and working
// after; a snapshot deleted before the finalize is not merged into its
// child (merges need a level the cluster is not yet at) and is merged
// after it.
func TestRollingUpgradeFromOlderBuild(t *testing.T) {
	need(t, "fio", "qemu-io", "qemu-img", "git", "tar")
	older := buildOlderHerd(t, upgradeFrom)
	current := testcluster.Binary(t)
	c := testcluster.Start(t, testcluster.Options{Nodes: 3, Binary: older})
	all := []int{0, 1, 2}
	waitAgreement(t, c, all, 30*time.Second)
	herd(t, c, 0, "cluster", "format", "--copies", "3")
	for _, v := range [][2]string{{"vm1", "64M"}, {"vm2", "32M"}, {"fio", "192M"}, {"fio2", "192M"}} {
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
		// fio through each node not being replaced, a VDI each.
		type fioJob struct {
			through int
			vdi     string
			cmd     *exec.Cmd
			out     *syncBuffer
			done    chan error
		}
		var jobs []*fioJob
		for k, vdi := range []string{"fio", "fio2"} {
			j := &fioJob{through: (upgraded + 1 + k) % 3, vdi: vdi, done: make(chan error, 1)}
			j.cmd, j.out = startFio(t, fmt.Sprintf("step%d-%s", step, vdi), c.Node(j.through).NBDURI(vdi),
				fmt.Sprintf("rw=randwrite\nbs=16k\niodepth=8\nsize=64M\noffset=%dM\ntime_based=1\nruntime=20\nverify=crc32c\nverify_fatal=1\nverify_backlog=256\n", step*64))
			go func() { j.done <- j.cmd.Wait() }()
			jobs = append(jobs, j)
		}
		for _, j := range jobs {
			testcluster.WaitFor(t, 30*time.Second, "fio to start writing "+j.vdi, func() (bool, error) {
				return strings.Contains(j.out.String(), "Starting") || strings.Contains(j.out.String(), "Jobs:"), fmt.Errorf("fio printed %q", lastLines(j.out.String(), 3))
			})
		}

		c.Node(upgraded).Stop()
		c.Node(upgraded).SetBinary(current)
		c.Node(upgraded).Restart()

		for _, j := range jobs {
			select {
			case err := <-j.done:
				if err != nil || strings.Contains(j.out.String(), "verify: bad") || !strings.Contains(j.out.String(), "err= 0") {
					t.Fatalf("step %d: fio on %s through node %d while node %d was upgraded: %v\n%s", step, j.vdi, j.through, upgraded, err, lastLines(j.out.String(), 15))
				}
			case <-time.After(5 * time.Minute):
				t.Fatalf("step %d: fio on %s through node %d did not finish", step, j.vdi, j.through)
			}
			t.Logf("step %d: node %d upgraded; fio on %s through node %d: %s", step, upgraded, j.vdi, j.through, grepLines(j.out.String(), "err="))
		}
		waitAgreement(t, c, all, time.Minute)
		waitRecovered(t, c, 3)
		waitHealth(t, c, upgraded, api.HealthOK, 0, "")
		checkBuilds(t, c, upgraded, all[:step+1], all[step+1:])

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

	// The data written by the older build, unchanged.
	for i, export := range exports {
		node := (i + 1) % 3
		mustRun(t, 2*time.Minute, "qemu-img", "compare", "-f", "raw", "-F", "raw", filepath.Join(saved, export+".raw"), c.Node(node).NBDURI(export))
	}
	checkVDIClean(t, c, 0, "vm1")
	checkVDIClean(t, c, 1, "fio")
	checkVDIClean(t, c, 2, "fio2")
	waitExactCopies(t, c, 3, all)

	// A snapshot deleted before the finalize stays in its child's chain:
	// the nodes, all on this build, do not merge it while the cluster's
	// level is below the merges'.
	herd(t, c, 0, "vdi", "snapshot", "vm2", "--tag", "gone")
	write(1, "vm2", "write -P 0x22 4M 4M")
	herd(t, c, 2, "vdi", "delete", "vm2@gone")
	time.Sleep(4 * time.Second) // the merge runners look each second
	tree, err := client(c, 0).Tree(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if chain := chainOf(tree, "vm2"); len(chain) != 2 || !chain[1].Deleted {
		t.Fatalf("vm2's chain before the finalize: %s; want vm2 and its deleted snapshot, not merged", describeChain(chain))
	}
	for _, i := range all {
		logged, err := os.ReadFile(c.Node(i).LogPath())
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(logged), "merge of a vdi layer failed") {
			t.Fatalf("node %d tried a merge below the merges' level:\n%s", i, grepLines(string(logged), "merge of a vdi layer"))
		}
	}

	// Before the finalize the feature is still refused; it says so.
	if _, stderr, err := c.Herd(ctx(t), 2, "vdi", "create", "early", "32M", "--copies", "2"); err == nil || !strings.Contains(stderr, "finalize-upgrade") {
		t.Fatalf("vdi create --copies before the finalize: err %v, stderr %q", err, stderr)
	}
	if out := herd(t, c, 1, "cluster", "finalize-upgrade"); !strings.Contains(out, fmt.Sprintf("feature level %d", cluster.SupportedLevel)) {
		t.Fatalf("finalize-upgrade printed %q", out)
	}
	// Now the deleted snapshot is merged into vm2, which reads as before.
	testcluster.WaitFor(t, time.Minute, "vm2@gone merged into vm2 after the finalize", func() (bool, error) {
		tree, err := client(c, 0).Tree(ctx(t))
		if err != nil {
			return false, err
		}
		chain := chainOf(tree, "vm2")
		return len(chain) == 1, fmt.Errorf("vm2's chain is %s", describeChain(chain))
	})
	if out, err := qemuIO(t, c.Node(0).NBDURI("vm2"), "read -P 0x21 0 4M", "read -P 0x22 4M 4M", "read -P 0x21 8M 24M"); err != nil || strings.Contains(out, "fail") {
		t.Fatalf("reading vm2 after its snapshot was merged: %v\n%s", err, lastLines(out, 5))
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

// checkBuilds waits until node list, through node through, shows the
// nodes of upgraded on this build (its commit and supported level) and
// the others on a build older than feature levels (no version, level
// %d).
func checkBuilds(t *testing.T, c *testcluster.Cluster, through int, upgraded, older []int) {
	t.Helper()
	want := map[string]bool{}
	for _, i := range upgraded {
		want[nodeID(t, c, i)] = true
	}
	for _, i := range older {
		want[nodeID(t, c, i)] = false
	}
	testcluster.WaitFor(t, 30*time.Second, "node list to show each node's build", func() (bool, error) {
		var nodes []api.NodeEntry
		if err := c.HerdJSON(ctx(t), through, &nodes, "node", "list"); err != nil {
			return false, err
		}
		seen := 0
		for _, n := range nodes {
			isNew, ok := want[n.ID]
			if !ok {
				continue
			}
			seen++
			switch {
			case n.Build == nil:
				return false, fmt.Errorf("node %s reports no build", n.ID)
			case isNew && (n.Build.Level != cluster.SupportedLevel || n.Build.Commit == "" || n.Build.Version == ""):
				return false, fmt.Errorf("node %s reports build %+v; want this build: level %d, a version and a commit", n.ID, *n.Build, cluster.SupportedLevel)
			case !isNew && (n.Build.Level != cluster.LevelBase || n.Build.Version != ""):
				return false, fmt.Errorf("node %s reports build %+v; want the older build: level %d, no version", n.ID, *n.Build, cluster.LevelBase)
			}
		}
		return seen == len(want), fmt.Errorf("node list shows %d of the %d nodes", seen, len(want))
	})
}
