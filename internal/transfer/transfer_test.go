package transfer

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/nbdclient"
	"github.com/herd-storage/herd/internal/nbdclient/nbdtest"
	"github.com/herd-storage/herd/internal/testenv"
)

const transferTestTimeout = 30 * time.Second

func transferContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), transferTestTimeout)
	t.Cleanup(cancel)
	return ctx
}

// testOptions are Options against address with small chunks, so that
// small images still make many requests on every connection.
func testOptions(address string) Options {
	return Options{Address: address, Connections: 3, Requests: 3, ChunkLength: 256 << 10, Format: "auto",
		DialTimeout: 10 * time.Second, Stdin: strings.NewReader(""), Stdout: &bytes.Buffer{}}
}

// testImage returns an image of length bytes: random data with zero areas
// (whole chunks and parts of chunks) and, when written to a file, a real
// hole.
func testImage(seed uint64, length int) []byte {
	var key [32]byte
	key[0] = byte(seed)
	image := make([]byte, length)
	rand.NewChaCha8(key).Read(image)
	clear(image[256<<10 : 1<<20])         // three whole zero chunks
	clear(image[1<<20+1000 : 1<<20+9000]) // zeroes inside a data chunk
	clear(image[2<<20 : 3<<20])           // becomes a hole in the file
	return image
}

// writeSparse writes image to a file, leaving [2 MiB, 3 MiB) as a hole.
func writeSparse(t *testing.T, path string, image []byte) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(image[:2<<20], 0); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(image[3<<20:], 3<<20); err != nil {
		t.Fatal(err)
	}
}

func allocatedBytes(t *testing.T, path string) int64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

// TestImportExportRoundTrip imports a sparse raw file into a disk that
// already holds data, exports it back, and compares.
func TestImportExportRoundTrip(t *testing.T) {
	disk := nbdtest.NewDisk("vm1", 8<<20)
	// Old data where the image has zeroes: it must be zeroed, not skipped.
	disk.WriteAt(bytes.Repeat([]byte{0xee}, 100<<10), 512<<10)
	disk.WriteAt(bytes.Repeat([]byte{0xee}, 4096), 2<<20+4096)
	disk.WriteAt(bytes.Repeat([]byte{0xdd}, 4096), 7<<20) // past the image: zeroed
	address := nbdtest.Serve(t, nbdtest.NewBackend(disk))
	dir := t.TempDir()
	image := testImage(1, 5<<20+12345)
	source := filepath.Join(dir, "in.img")
	writeSparse(t, source, image)

	tr := testOptions(address)
	summary, err := Import(transferContext(t), tr, "vm1", source)
	if err != nil {
		t.Fatal(err)
	}
	contents := disk.Contents()
	if !bytes.Equal(contents[:len(image)], image) {
		t.Fatal("the vdi does not hold the image")
	}
	if !bytes.Equal(contents[len(image):], make([]byte, len(contents)-len(image))) {
		t.Error("the vdi past the image was not zeroed")
	}
	if summary.Bytes != uint64(len(image)) || summary.DataBytes+summary.ZeroBytes != summary.Bytes {
		t.Errorf("summary %+v", summary)
	}
	// Seven zero chunks (three in the data, four in the file's hole) are
	// not sent as data; only the two that held old data are zeroed.
	if summary.ZeroBytes != 7*(256<<10) {
		t.Errorf("zero bytes %d, want %d", summary.ZeroBytes, 7*(256<<10))
	}
	if zeroes := disk.Zeroes.Load(); zeroes != 3 {
		t.Errorf("%d WRITE_ZEROES, want 3 (the chunks that held old data, the old data past the image)", zeroes)
	}
	if disk.Flushes.Load() != 1 {
		t.Errorf("%d flushes, want 1 (multi-conn)", disk.Flushes.Load())
	}
	if !strings.HasPrefix(summary.Line(), "imported 5.0 MiB into vm1 in ") || !strings.Contains(summary.Line(), "1.8 MiB skipped as zeros") {
		t.Errorf("summary line %q", summary.Line())
	}

	output := filepath.Join(dir, "out.img")
	summary, err = Export(transferContext(t), tr, "vm1", output)
	if err != nil {
		t.Fatal(err)
	}
	exported, err := os.ReadFile(output)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(exported, disk.Contents()) {
		t.Fatal("the exported file differs from the vdi")
	}
	if allocated := allocatedBytes(t, output); allocated >= int64(len(exported)) {
		t.Errorf("the exported file is not sparse: %d bytes allocated of %d", allocated, len(exported))
	}
	if summary.Bytes != 8<<20 || summary.ZeroBytes == 0 {
		t.Errorf("export summary %+v", summary)
	}
	// Holes are not read.
	if reads := disk.Reads.Load(); reads >= 32 {
		t.Errorf("%d reads for 32 chunks, some of them holes", reads)
	}

	if _, err := Export(transferContext(t), tr, "vm1", output); err == nil || !strings.Contains(err.Error(), "exists: add --force") {
		t.Errorf("export over an existing file: %v", err)
	}
	tr.Force = true
	if _, err := Export(transferContext(t), tr, "vm1", output); err != nil {
		t.Errorf("export --force: %v", err)
	}
}

func TestImportTooSmall(t *testing.T) {
	address := nbdtest.Serve(t, nbdtest.NewBackend(nbdtest.NewDisk("vm1", 1<<30)))
	source := filepath.Join(t.TempDir(), "big.img")
	if err := os.WriteFile(source, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(source, 2<<30); err != nil {
		t.Fatal(err)
	}
	_, err := Import(transferContext(t), testOptions(address), "vm1", source)
	if err == nil || err.Error() != "image is 2 GiB, vdi vm1 is 1 GiB: herd vdi resize vm1 2G first" {
		t.Errorf("too small: %v", err)
	}
}

func TestImportErrors(t *testing.T) {
	address := nbdtest.Serve(t, nbdtest.NewBackend(nbdtest.NewDisk("vm1", 1<<20)))
	source := filepath.Join(t.TempDir(), "in.img")
	if err := os.WriteFile(source, []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	tr := testOptions(address)
	for vdi, want := range map[string]string{
		"nope":    `vdi "nope" not found (via ` + address + `); create the vdi first: herd vdi create nope SIZE`,
		"vm1@tag": "vm1@tag is a snapshot",
	} {
		if _, err := Import(transferContext(t), tr, vdi, source); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("import into %s: %v, want %q", vdi, err, want)
		}
	}
	if _, err := Import(transferContext(t), tr, "vm1", filepath.Join(t.TempDir(), "missing")); err == nil || !strings.Contains(err.Error(), "no such file") {
		t.Errorf("missing file: %v", err)
	}
	// Nothing listens on port 1.
	tr.Address = "127.0.0.1:1"
	if _, err := Import(transferContext(t), tr, "vm1", source); err == nil || !strings.Contains(err.Error(), "cannot connect to the NBD port of 127.0.0.1:1") {
		t.Errorf("no server: %v", err)
	}
}

func TestStdinAndStdout(t *testing.T) {
	disk := nbdtest.NewDisk("vm1", 6<<20)
	disk.WriteAt([]byte{0xee}, 300<<10) // old data in an image zero chunk
	address := nbdtest.Serve(t, nbdtest.NewBackend(disk))
	image := testImage(2, 5<<20+3)
	tr := testOptions(address)
	tr.Stdin = bytes.NewReader(image)
	summary, err := Import(transferContext(t), tr, "vm1", "-")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(disk.Contents()[:len(image)], image) {
		t.Fatal("the vdi does not hold the image read from stdin")
	}
	if summary.Bytes != uint64(len(image)) || summary.File != "-" || summary.ZeroBytes == 0 {
		t.Errorf("summary %+v", summary)
	}

	var stdout bytes.Buffer
	tr.Stdout = &stdout
	if _, err := Export(transferContext(t), tr, "vm1", "-"); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(stdout.Bytes(), disk.Contents()) {
		t.Fatal("the image written to stdout differs from the vdi")
	}

	tr.Stdin = bytes.NewReader(make([]byte, 6<<20+1))
	if _, err := Import(transferContext(t), tr, "vm1", "-"); err == nil || !strings.Contains(err.Error(), "stdin holds more than 6 MiB") {
		t.Errorf("stdin too large: %v", err)
	}
}

// TestSnapshotExport opens NAME@TAG as it is and NAME read-only.
func TestSnapshotExport(t *testing.T) {
	snapshot := nbdtest.NewDisk("vm1@monday", 1<<20)
	snapshot.WriteAt([]byte("monday"), 0)
	live := nbdtest.NewDisk("vm1", 1<<20)
	live.WriteAt([]byte("tuesday"), 0)
	tr := testOptions(nbdtest.Serve(t, nbdtest.NewBackend(snapshot, live)))
	var stdout bytes.Buffer
	tr.Stdout = &stdout
	if _, err := Export(transferContext(t), tr, "vm1@monday", "-"); err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(stdout.Bytes(), []byte("monday")) {
		t.Error("snapshot export did not read the snapshot")
	}
	stdout.Reset()
	if _, err := Export(transferContext(t), tr, "vm1", "-"); err != nil || !bytes.HasPrefix(stdout.Bytes(), []byte("tuesday")) {
		t.Errorf("vdi export: %v", err)
	}
}

// TestQcow2Import converts a qcow2 image with qemu-img straight into the
// NBD export, exports it back and compares with qemu-img compare.
func TestQcow2Import(t *testing.T) {
	for _, tool := range []string{"qemu-img", "qemu-io"} {
		testenv.LookPath(t, tool, "qemu-utils")
	}
	disk := nbdtest.NewDisk("vm1", 8<<20)
	disk.WriteAt(bytes.Repeat([]byte{0xee}, 4096), 3<<20) // in the image's zero area
	disk.WriteAt(bytes.Repeat([]byte{0xee}, 4096), 6<<20) // past the image
	tr := testOptions(nbdtest.Serve(t, nbdtest.NewBackend(disk)))
	dir := t.TempDir()
	qcow2 := filepath.Join(dir, "in.qcow2")
	run(t, "qemu-img", "create", "-q", "-f", "qcow2", qcow2, "4M")
	run(t, "qemu-io", "-f", "qcow2", "-c", "write -P 0x5 0 1M", qcow2)
	summary, err := Import(transferContext(t), tr, "vm1", qcow2)
	if err != nil {
		t.Fatal(err)
	}
	if summary.Format != "qcow2" || summary.Bytes != 4<<20 || summary.Converter != "qemu-img" {
		t.Errorf("summary %+v", summary)
	}
	raw := filepath.Join(dir, "out.img")
	if _, err := Export(transferContext(t), tr, "vm1", raw); err != nil {
		t.Fatal(err)
	}
	// The exported 8 MiB against the 4 MiB image: equal, the rest zero
	// (qemu-img compare checks that too).
	run(t, "qemu-img", "compare", "-q", "-f", "qcow2", "-F", "raw", qcow2, raw)

	small := filepath.Join(dir, "small.qcow2")
	run(t, "qemu-img", "create", "-q", "-f", "qcow2", small, "16M")
	if _, err := Import(transferContext(t), tr, "vm1", small); err == nil || !strings.Contains(err.Error(), "image is 16 MiB, vdi vm1 is 8 MiB: herd vdi resize vm1 16M first") {
		t.Errorf("qcow2 too large: %v", err)
	}
}

func TestQcow2WithoutQemuImg(t *testing.T) {
	source := filepath.Join(t.TempDir(), "in.qcow2")
	if err := os.WriteFile(source, []byte("QFI\xfb\x00\x00\x00\x03"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", t.TempDir())
	_, err := Import(transferContext(t), testOptions("127.0.0.1:1"), "vm1", source)
	want := source + " is a qcow2 image: converting it needs qemu-img (Debian package qemu-utils)"
	if err == nil || err.Error() != want {
		t.Errorf("got %v, want %q", err, want)
	}
}

func run(t *testing.T, name string, arguments ...string) {
	t.Helper()
	output, err := exec.Command(name, arguments...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(arguments, " "), err, output)
	}
}

func TestDetectFormat(t *testing.T) {
	vdi := make([]byte, 72)
	copy(vdi[64:], "\x7f\x10\xda\xbe")
	for want, head := range map[string][]byte{
		"qcow2": []byte("QFI\xfb\x00\x00\x00\x03"),
		"vmdk":  []byte("KDMV\x01"),
		"vhdx":  []byte("vhdxfile"),
		"vdi":   vdi,
		"raw":   []byte("\xeb\x63\x90MBR"),
	} {
		if got := detectFormat(head); got != want {
			t.Errorf("detectFormat(%q) = %s, want %s", head[:8], got, want)
		}
	}
	if got := detectFormat(nil); got != "raw" {
		t.Errorf("empty file: %s", got)
	}
	if got := resizeArgument(3<<29 + 0); got != "1536M" {
		t.Errorf("resizeArgument = %s", got)
	}
}

func TestZeroMap(t *testing.T) {
	// Zero spans [100, 150) and [200, 300).
	z := zeroMapOf(100, []nbdclient.Extent{{Length: 50, Hole: true, Zero: true}, {Length: 50}, {Length: 100, Zero: true}, {Length: 10, Hole: true}})
	for _, c := range []struct {
		offset, length uint64
		want           bool
	}{{100, 50, true}, {120, 40, false}, {200, 100, true}, {99, 2, false}, {300, 1, false}, {250, 0, true}} {
		if got := z.covers(c.offset, c.length); got != c.want {
			t.Errorf("covers(%d, %d) = %v", c.offset, c.length, got)
		}
	}
	for _, c := range []struct {
		from, to uint64
		want     string
	}{{0, 400, "[{0 100} {150 200} {300 400}]"}, {120, 250, "[{150 200}]"}, {210, 290, "[]"}, {150, 200, "[{150 200}]"}, {500, 600, "[{500 600}]"}} {
		if got := fmt.Sprint(z.gaps(c.from, c.to)); got != c.want {
			t.Errorf("gaps(%d, %d) = %s, want %s", c.from, c.to, got, c.want)
		}
	}
}
