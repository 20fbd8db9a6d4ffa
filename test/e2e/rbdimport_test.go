package e2e

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/cluster"
)

// TestImportCreatesExportConverts: as with rbd, `vdi import NAME FILE`
// creates NAME from a qcow2 image's virtual size when it does not exist;
// `vdi export NAME out.qcow2` without --format is refused with a hint
// (never written raw under a qcow2 name, exit 64), and with --format qcow2
// writes a qcow2 image holding the same data. A raw image whose size is
// not a multiple of 512 makes a VDI rounded up to the next sector.
func TestImportCreatesExportConverts(t *testing.T) {
	need(t, "qemu-img", "qemu-io")
	c := dataCluster(t, 3, 3, "disk", "64M")
	dir := t.TempDir()
	qcow := filepath.Join(dir, "image.qcow2")
	mustRun(t, time.Minute, "qemu-img", "create", "-f", "qcow2", qcow, "48M")
	mustRun(t, time.Minute, "qemu-io", "-f", "qcow2", "-c", "write -P 0x5a 1M 2M", "-c", "write -P 0xa5 40M 1M", qcow)

	if _, stderr, err := c.Herd(ctx(t), 0, "vdi", "import", "fresh", qcow); err != nil {
		t.Fatalf("import into a VDI that does not exist: %v\n%s", err, stderr)
	} else if !strings.Contains(stderr, "created vdi fresh of 48 MiB") {
		t.Fatalf("the import did not say it created the VDI: %q", stderr)
	}
	var v cluster.VDI
	if err := c.HerdJSON(ctx(t), 1, &v, "vdi", "info", "fresh"); err != nil {
		t.Fatal(err)
	}
	if v.Size != 48<<20 {
		t.Fatalf("vdi fresh has %d bytes, want the image's 48 MiB", v.Size)
	}
	mustRun(t, 2*time.Minute, "qemu-img", "compare", "-f", "qcow2", "-F", "raw", qcow, c.Node(2).NBDURI("fresh"))

	out := filepath.Join(dir, "out.qcow2")
	cmd := c.HerdCommand(1, "vdi", "export", "fresh", out)
	output, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 64 || !strings.Contains(string(output), "--format qcow2") {
		t.Fatalf("export to a .qcow2 name without --format: %v, %q; want exit 64 with a hint", err, output)
	}
	herd(t, c, 1, "vdi", "export", "fresh", out, "--format", "qcow2")
	info := mustRun(t, time.Minute, "qemu-img", "info", "--output=json", out)
	var parsed struct {
		Format      string `json:"format"`
		VirtualSize uint64 `json:"virtual-size"`
	}
	if err := json.Unmarshal([]byte(info), &parsed); err != nil || parsed.Format != "qcow2" || parsed.VirtualSize != 48<<20 {
		t.Fatalf("the export is %+v (%v), want a 48 MiB qcow2 image", parsed, err)
	}
	mustRun(t, 2*time.Minute, "qemu-img", "compare", "-f", "qcow2", "-F", "qcow2", qcow, out)

	// From stdin the size is not known: the VDI must exist first.
	if _, stderr, err := c.Herd(ctx(t), 0, "vdi", "import", "piped", "-"); err == nil || !strings.Contains(stderr, "create the VDI first") {
		t.Fatalf("import from stdin into a missing VDI: %v %q", err, stderr)
	}

	// A raw image of 1,000,000 bytes, not a whole number of sectors: the
	// VDI is made 1,000,448 bytes (rounded up to 512), and reads back as
	// the image followed by zeroes.
	raw := filepath.Join(dir, "odd.raw")
	image := bytes.Repeat([]byte("herd"), 250000)
	if err := os.WriteFile(raw, image, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, stderr, err := c.Herd(ctx(t), 0, "vdi", "import", "odd", raw); err != nil || !strings.Contains(stderr, "created vdi odd") || !strings.Contains(stderr, "raw image") {
		t.Fatalf("raw import into a VDI that does not exist: %v %q", err, stderr)
	}
	if err := c.HerdJSON(ctx(t), 1, &v, "vdi", "info", "odd"); err != nil {
		t.Fatal(err)
	}
	if v.Size != 1000448 {
		t.Fatalf("vdi odd has %d bytes, want 1,000,000 rounded up to 1,000,448", v.Size)
	}
	back := filepath.Join(dir, "odd.out")
	herd(t, c, 2, "vdi", "export", "odd", back)
	exported, err := os.ReadFile(back)
	if err != nil {
		t.Fatal(err)
	}
	if len(exported) != 1000448 || !bytes.Equal(exported[:len(image)], image) || !bytes.Equal(exported[len(image):], make([]byte, 448)) {
		t.Fatalf("the export of odd (%d bytes) is not the raw image followed by 448 zero bytes", len(exported))
	}
}
