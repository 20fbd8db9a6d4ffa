package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/testcluster"
)

// The snapshot pattern sequence: A over the disk, s1, B over half, s2, C
// over a quarter, with offsets crossing object boundaries and unaligned.
const snapshotDisk = 32 << 20

var (
	patternA = fmt.Sprintf("write -P 0xaa 0 %d", snapshotDisk)
	patternB = fmt.Sprintf("write -P 0xbb %d %d", 4<<20-1000, snapshotDisk/2)
	patternC = fmt.Sprintf("write -P 0xcc %d %d", 9<<20+7, snapshotDisk/4)
)

func bOnly(start, end int) string { return fmt.Sprintf("read -P 0xbb %d %d", start, end-start) }

func herd(t *testing.T, c *testcluster.Cluster, node int, args ...string) string {
	t.Helper()
	stdout, stderr, err := c.Herd(ctx(t), node, args...)
	if err != nil {
		t.Fatalf("herd %s: %v\n%s%s", strings.Join(args, " "), err, stdout, stderr)
	}
	return stdout
}

func TestSnapshotsClonesRollback(t *testing.T) {
	need(t, "qemu-io")
	c := dataCluster(t, 3, 3, "vm", "32M")
	uri := func(node int, export string) string { return c.Node(node).NBDURI(export) }
	mustIO := func(target string, readOnly bool, commands ...string) {
		t.Helper()
		args := []string{"-f", "raw"}
		if readOnly {
			args = append(args, "-r")
		}
		for _, cmd := range commands {
			args = append(args, "-c", cmd)
		}
		out, err := run(t, 2*time.Minute, "qemu-io", append(args, target)...)
		if err != nil || strings.Contains(out, "failed") {
			t.Fatalf("qemu-io %v on %s: %v\n%s", commands, target, err, out)
		}
	}
	bStart, bEnd := 4<<20-1000, 4<<20-1000+snapshotDisk/2
	cStart, cEnd := 9<<20+7, 9<<20+7+snapshotDisk/4

	mustIO(uri(0, "vm"), false, patternA)
	herd(t, c, 1, "vdi", "snapshot", "vm", "--tag", "s1")
	mustIO(uri(0, "vm"), false, patternB)
	herd(t, c, 2, "vdi", "snapshot", "vm", "--tag", "s2")
	mustIO(uri(0, "vm"), false, patternC)

	// vm@s1 = A; vm@s2 = A+B; vm = A+B+C, read through other nodes.
	mustIO(uri(1, "vm@s1"), true, fmt.Sprintf("read -P 0xaa 0 %d", snapshotDisk))
	mustIO(uri(2, "vm@s2"), true, fmt.Sprintf("read -P 0xaa 0 %d", bStart), bOnly(bStart, bEnd), fmt.Sprintf("read -P 0xaa %d %d", bEnd, snapshotDisk-bEnd))
	mustIO(uri(1, "vm"), false, fmt.Sprintf("read -P 0xaa 0 %d", bStart), bOnly(bStart, cStart), fmt.Sprintf("read -P 0xcc %d %d", cStart, cEnd-cStart), bOnly(cEnd, bEnd))
	if out, _ := run(t, time.Minute, "qemu-io", "-f", "raw", "-c", "write 0 512", uri(1, "vm@s1")); !strings.Contains(out, "failed") && !strings.Contains(out, "can't open") {
		t.Fatalf("a snapshot accepted a write:\n%s", out)
	}

	// A clone of s1 diverges; a clone of the clone too.
	herd(t, c, 0, "vdi", "clone", "vm@s1", "clone1")
	mustIO(uri(2, "clone1"), false, "write -P 0xdd 100 5M")
	mustIO(uri(1, "vm@s1"), true, fmt.Sprintf("read -P 0xaa 0 %d", snapshotDisk))
	herd(t, c, 0, "vdi", "snapshot", "clone1", "--tag", "c1")
	herd(t, c, 0, "vdi", "clone", "clone1@c1", "clone2")
	mustIO(uri(0, "clone2"), false, "write -P 0xee 20M 1M", "read -P 0xdd 100 5M", "read -P 0xaa 6M 1M")
	mustIO(uri(2, "clone1"), false, "read -P 0xaa 20M 1M", "read -P 0xdd 100 5M")

	// Rollback is refused while the vdi is open for writing, naming the holder.
	holder := holdOpen(t, uri(0, "vm"))
	_, stderr, err := c.Herd(ctx(t), 1, "vdi", "rollback", "vm", "--to", "s1")
	if err == nil || !strings.Contains(stderr, nodeID(t, c, 0)) {
		t.Fatalf("rollback while open: %v %q", err, stderr)
	}
	holder()
	testcluster.WaitFor(t, 15*time.Second, "rollback once the writer left", func() (bool, error) {
		_, stderr, err := c.Herd(ctx(t), 1, "vdi", "rollback", "vm", "--to", "s1")
		return err == nil, fmt.Errorf("%v %s", err, stderr)
	})
	mustIO(uri(2, "vm"), false, fmt.Sprintf("read -P 0xaa 0 %d", snapshotDisk))

	// Delete the original and s1 while clones exist: the clones still read.
	herd(t, c, 0, "vdi", "delete", "vm")
	herd(t, c, 0, "vdi", "delete", "vm@s1")
	mustIO(uri(1, "clone2"), false, "read -P 0xee 20M 1M", "read -P 0xdd 100 5M", "read -P 0xaa 6M 1M")
	tree := herd(t, c, 2, "vdi", "tree")
	if !strings.Contains(tree, "deleted, kept for its clones") && !strings.Contains(tree, "deleted, being merged") {
		t.Fatalf("tree does not show the kept snapshot:\n%s", tree)
	}
	t.Logf("tree:\n%s", tree)
}

// holdOpen keeps a writable NBD connection open until the returned func
// is called.
func holdOpen(t *testing.T, uri string) func() {
	t.Helper()
	need(t, "/usr/bin/python3")
	script := filepath.Join(t.TempDir(), "hold.py")
	os.WriteFile(script, []byte("import nbd, sys\nh = nbd.NBD()\nh.connect_uri(sys.argv[1])\nprint('holding', flush=True)\nsys.stdin.read()\nh.shutdown()\n"), 0o644)
	cmd := execCommand("/usr/bin/python3", script, uri)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line := make([]byte, 7)
	if _, err := stdout.Read(line); err != nil || string(line) != "holding" {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("holder did not start: %q %v", line, err)
	}
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			stdin.Close()
			cmd.Wait()
		}
	}
	t.Cleanup(func() { cmd.Process.Kill(); stop() })
	return stop
}

// TestSnapshotCloneRollbackAreInstant: with 10,000 written objects,
// snapshot, clone and rollback each take well under a second (printed;
// bench/snapbench is the judge of speed), because none of them touches
// the objects.
func TestSnapshotCloneRollbackAreInstant(t *testing.T) {
	need(t, "nbdcopy", "qemu-io")
	const objects, objectSize = 10000, 64 << 10
	c := dataCluster(t, 3, 3, "big", fmt.Sprint(objects*objectSize), "--object-size", "64KiB")
	// A sparse image with 4 KiB of data in every 64 KiB object.
	image := filepath.Join(t.TempDir(), "sparse.img")
	f, err := os.Create(image)
	if err != nil {
		t.Fatal(err)
	}
	block := []byte(strings.Repeat("herd", 1024))
	for i := 0; i < objects; i++ {
		f.WriteAt(block, int64(i)*objectSize)
	}
	f.Truncate(objects * objectSize)
	f.Close()
	start := time.Now()
	mustRun(t, 10*time.Minute, "nbdcopy", "--flush", image, c.Node(0).NBDURI("big"))
	t.Logf("wrote %d objects in %v", objects, time.Since(start).Round(time.Millisecond))
	timed := func(what string, args ...string) {
		start := time.Now()
		herd(t, c, 1, args...)
		took := time.Since(start)
		t.Logf("%s of a vdi with %d written objects: %v", what, objects, took.Round(time.Microsecond))
		if took > time.Second {
			t.Errorf("%s took %v: it must not depend on the disk's size", what, took)
		}
	}
	timed("snapshot", "vdi", "snapshot", "big", "--tag", "s")
	timed("clone", "vdi", "clone", "big@s", "copy")
	if out, err := qemuIO(t, c.Node(2).NBDURI("big"), "write -P 0x77 0 1M"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	timed("rollback", "vdi", "rollback", "big", "--to", "s")
	if out, err := qemuIO(t, c.Node(2).NBDURI("big"), "read -P 0x68 0 1", "read -P 0 4096 61440"); err != nil { // 'h'
		t.Fatalf("after rollback: %v\n%s", err, out)
	}
}
