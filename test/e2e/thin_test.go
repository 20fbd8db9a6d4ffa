package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/testcluster"
)

// TestThinTerabyteDisk: a 1 TiB VDI with 64 MiB written: maps show only
// the written extents; nbdcopy of it takes seconds; the copy is sparse and
// compares equal.
func TestThinTerabyteDisk(t *testing.T) {
	need(t, "qemu-io", "qemu-img", "nbdinfo", "nbdcopy")
	c := dataCluster(t, 3, 3, "huge", "1T")
	uri := c.Node(0).NBDURI("huge")
	// 64 MiB in four 16 MiB extents spread over the disk.
	var writes []string
	for i, at := range []int64{0, 100 << 30, 512 << 30, 1<<40 - 16<<20} {
		writes = append(writes, fmt.Sprintf("write -P 0x%02x %d 16M", 0x41+i, at))
	}
	if out, err := qemuIO(t, uri, writes...); err != nil {
		t.Fatalf("writes: %v\n%s", err, out)
	}
	other := c.Node(1).NBDURI("huge")
	var extents []struct {
		Start  int64 `json:"start"`
		Length int64 `json:"length"`
		Data   bool  `json:"data"`
	}
	out := mustRun(t, time.Minute, "qemu-img", "map", "--output=json", "-f", "raw", other)
	if err := json.Unmarshal([]byte(out), &extents); err != nil {
		t.Fatalf("qemu-img map: %v\n%s", err, out)
	}
	var data int64
	for _, e := range extents {
		if e.Data {
			data += e.Length
		}
	}
	if data != 64<<20 {
		t.Fatalf("qemu-img map shows %d bytes of data, want 64 MiB:\n%s", data, out)
	}
	nbdMap := mustRun(t, time.Minute, "nbdinfo", "--map", other)
	if !strings.Contains(nbdMap, "hole,zero") || !strings.Contains(nbdMap, "data") {
		t.Fatalf("nbdinfo --map:\n%s", nbdMap)
	}
	copyPath := filepath.Join(t.TempDir(), "huge.img")
	start := time.Now()
	mustRun(t, 5*time.Minute, "nbdcopy", other, copyPath)
	took := time.Since(start)
	t.Logf("nbdcopy of a 1 TiB vdi holding 64 MiB: %v", took.Round(time.Millisecond))
	var st syscall.Stat_t
	if err := syscall.Stat(copyPath, &st); err != nil {
		t.Fatal(err)
	}
	if st.Size != 1<<40 || st.Blocks*512 > 256<<20 {
		t.Fatalf("copy: size %d, %d bytes allocated: not sparse", st.Size, st.Blocks*512)
	}
	if out, err := run(t, 5*time.Minute, "qemu-img", "compare", "-f", "raw", "-F", "raw", copyPath, other); err != nil {
		t.Fatalf("qemu-img compare: %v\n%s", err, out)
	}
}

// countObjects counts object files of vdi id on every node.
func countObjects(t *testing.T, c *testcluster.Cluster) int {
	t.Helper()
	n := 0
	for _, node := range c.Nodes() {
		filepath.WalkDir(filepath.Join(node.DataDir(), "objects"), func(path string, d os.DirEntry, err error) error {
			if err == nil && !d.IsDir() && len(d.Name()) == 16 {
				n++
			}
			return nil
		})
	}
	return n
}

// TestTrimZeroAndDelete: a whole-object TRIM removes the object from every
// replica; WRITE_ZEROES with NO_HOLE keeps it; deleting every VDI of a tree
// leaves no object files and the used space at its starting figure.
func TestTrimZeroAndDelete(t *testing.T) {
	need(t, "qemu-io")
	c := dataCluster(t, 3, 3, "disk", "64M")
	startNodes, err := client(c, 0).Nodes(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	var usedBefore uint64
	for _, n := range startNodes {
		usedBefore += n.UsedBytes
	}
	uri := c.Node(0).NBDURI("disk")
	if out, err := qemuIO(t, uri, "write -P 0x11 0 16M", "flush"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	full := countObjects(t, c)
	// TRIM of objects 0 and 1 (4 MiB each) removes them everywhere.
	if out, err := qemuIO(t, uri, "discard 0 8M", "read -P 0 0 8M", "read -P 0x11 8M 8M"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if got := countObjects(t, c); got != full-2*3 {
		t.Fatalf("%d object files after trimming 2 objects, want %d", got, full-2*3)
	}
	// WRITE_ZEROES with NO_HOLE keeps object 2 allocated and zeroed.
	if out, err := qemuIO(t, uri, "write -z 8M 4M", "read -P 0 8M 4M"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if got := countObjects(t, c); got != full-2*3 {
		t.Fatalf("%d object files after write-zeroes, want %d (still allocated)", got, full-2*3)
	}
	herd(t, c, 0, "vdi", "snapshot", "disk", "--tag", "s")
	herd(t, c, 0, "vdi", "clone", "disk@s", "copy")
	if out, err := qemuIO(t, c.Node(1).NBDURI("copy"), "write -P 0x22 12M 4M"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, name := range []string{"disk", "copy", "disk@s"} {
		herd(t, c, 1, "vdi", "delete", name)
	}
	testcluster.WaitFor(t, 30*time.Second, "every object file to be freed", func() (bool, error) {
		n := countObjects(t, c)
		return n == 0, fmt.Errorf("%d object files left", n)
	})
	testcluster.WaitFor(t, 10*time.Second, "used space back to the start", func() (bool, error) {
		nodes, err := client(c, 2).Nodes(ctx(t))
		if err != nil {
			return false, err
		}
		var used uint64
		for _, n := range nodes {
			used += n.UsedBytes
		}
		return used == usedBefore, fmt.Errorf("used %d, started at %d", used, usedBefore)
	})
}
