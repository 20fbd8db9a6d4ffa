package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestImportExportRoundTrip: `herd vdi import` and `herd vdi export` of a
// 2 GiB random raw image through different nodes compare equal; a qcow2
// image made by qemu-img imports and compares equal too; the export of a
// sparse VDI stays sparse.
func TestImportExportRoundTrip(t *testing.T) {
	need(t, "qemu-img")
	c := dataCluster(t, 3, 3, "disk", "2G")
	raw := randomFile(t, 2<<30)
	start := time.Now()
	out := herd(t, c, 0, "vdi", "import", "disk", raw)
	t.Logf("import of 2 GiB random: %v %s", time.Since(start).Round(time.Millisecond), strings.TrimSpace(out))
	back := filepath.Join(t.TempDir(), "back.img")
	start = time.Now()
	herd(t, c, 1, "vdi", "export", "disk", back)
	t.Logf("export of 2 GiB: %v", time.Since(start).Round(time.Millisecond))
	mustRun(t, 5*time.Minute, "cmp", raw, back)

	// qcow2 made by qemu-img, with data at both ends and a hole between.
	qcow := filepath.Join(t.TempDir(), "image.qcow2")
	mustRun(t, time.Minute, "qemu-img", "create", "-f", "qcow2", qcow, "256M")
	mustRun(t, time.Minute, "qemu-io", "-f", "qcow2", "-c", "write -P 0x5a 0 3M", "-c", "write -P 0xa5 250M 6M", qcow)
	herd(t, c, 0, "vdi", "create", "fromqcow", "256M")
	herd(t, c, 2, "vdi", "import", "fromqcow", qcow)
	exported := filepath.Join(t.TempDir(), "fromqcow.img")
	herd(t, c, 1, "vdi", "export", "fromqcow", exported)
	if out, err := run(t, 2*time.Minute, "qemu-img", "compare", "-f", "qcow2", "-F", "raw", qcow, exported); err != nil {
		t.Fatalf("qcow2 round trip: %v %s", err, out)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(exported, &st); err != nil {
		t.Fatal(err)
	}
	if st.Blocks*512 > 32<<20 {
		t.Fatalf("export of a vdi holding 9 MiB allocated %d bytes: not sparse", st.Blocks*512)
	}
	if _, stderr, err := c.Herd(ctx(t), 0, "vdi", "import", "fromqcow", raw); err == nil || !strings.Contains(stderr, "resize") {
		t.Fatalf("import of a 2 GiB image into a 256 MiB vdi: %v %q", err, stderr)
	}
	if _, err := os.Stat(back); err != nil {
		t.Fatal(err)
	}
}

// TestExportOfThinTerabyte: `herd vdi export` of a 1 TiB VDI holding
// 64 MiB takes seconds and writes a sparse file.
func TestExportOfThinTerabyte(t *testing.T) {
	need(t, "qemu-io", "qemu-img")
	c := dataCluster(t, 3, 3, "huge", "1T")
	if out, err := qemuIO(t, c.Node(0).NBDURI("huge"), "write -P 0x31 0 32M", "write -P 0x32 700G 32M"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	path := filepath.Join(t.TempDir(), "huge.img")
	start := time.Now()
	herd(t, c, 2, "vdi", "export", "huge", path)
	took := time.Since(start)
	t.Logf("herd vdi export of a 1 TiB vdi holding 64 MiB: %v", took.Round(time.Millisecond))
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	if st.Size != 1<<40 || st.Blocks*512 > 256<<20 {
		t.Fatalf("export: size %d, %d bytes allocated", st.Size, st.Blocks*512)
	}
	if out, err := run(t, 5*time.Minute, "qemu-img", "compare", "-f", "raw", "-F", "raw", path, c.Node(1).NBDURI("huge")); err != nil {
		t.Fatalf("compare: %v %s", err, out)
	}
}
