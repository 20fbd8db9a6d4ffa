package nbd

// Tests through real NBD clients (QEMU, libnbd, fio) against a sparse
// in-memory Backend. Each test skips when its client is not installed; CI
// installs them (see /work/shared/CLIENTS.md):
//
//	apt-get install qemu-utils libnbd-bin python3-libnbd fio nbdkit

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/testenv"
)

const realClientTimeout = 3 * time.Minute

// requireTool returns the path of a client program, or skips the test
// (fails it under CI=true, see internal/testenv).
func requireTool(t *testing.T, name string) string {
	t.Helper()
	return testenv.LookPath(t, name, "")
}

// runTool runs a client and returns its combined output and exit code.
func runTool(t *testing.T, name string, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), realClientTimeout)
	defer cancel()
	command := exec.CommandContext(ctx, name, args...)
	output, err := command.CombinedOutput()
	var exitError *exec.ExitError
	switch {
	case err == nil:
		return string(output), 0
	case ctx.Err() != nil:
		t.Fatalf("%s %q timed out; output:\n%s", name, args, output)
	case errors.As(err, &exitError):
		return string(output), exitError.ExitCode()
	default:
		t.Fatalf("%s %q: %v", name, args, err)
	}
	return "", -1
}

// mustRun runs a client that must succeed.
func mustRun(t *testing.T, name string, args ...string) string {
	t.Helper()
	output, code := runTool(t, name, args...)
	if code != 0 {
		t.Fatalf("%s %q exited with %d; output:\n%s", name, args, code, output)
	}
	return output
}

// realClientServer serves "disk" (64 MiB), "ro" (read-only, 1 MiB) and
// "min512" (1 MiB, minimum block size 512).
func realClientServer(t *testing.T) (*testServer, *memoryDisk, string) {
	t.Helper()
	disk := newMemoryDisk("disk", 64<<20)
	readOnly := newMemoryDisk("ro", 1<<20)
	readOnly.info.ReadOnly = true
	aligned := newMemoryDisk("min512", 1<<20)
	aligned.info.BlockSizeMinimum = 512
	server := startServer(t, newMemoryBackend(disk, readOnly, aligned))
	return server, disk, "nbd://" + server.address
}

// sparseImage writes a file of size bytes, zero except for random data at
// a few unaligned places, and returns its path and contents.
func sparseImage(t *testing.T, size int64, seed uint64) (string, []byte) {
	t.Helper()
	random := rand.New(rand.NewPCG(seed, seed))
	contents := make([]byte, size)
	for _, region := range [][2]int64{{5 << 20, 3 << 20}, {size / 2, 12345}, {size - 70000, 70000 - 3}} {
		for i := region[0]; i < region[0]+region[1]; i++ {
			contents[i] = byte(random.Uint32())
		}
	}
	path := filepath.Join(t.TempDir(), fmt.Sprintf("source-%d.img", seed))
	if err := os.WriteFile(path, contents, 0o644); err != nil {
		t.Fatal(err)
	}
	return path, contents
}

func TestQemuIO(t *testing.T) {
	qemuIO := requireTool(t, "qemu-io")
	_, disk, base := realClientServer(t)
	uri := base + "/disk"
	size := int64(64 << 20)
	output := mustRun(t, qemuIO, "-f", "raw",
		"-c", "write -P 0xab 1000 70000",
		"-c", "read -P 0xab 1000 70000",
		"-c", "read -P 0 0 1000",
		"-c", "read -P 0 71000 5000",
		"-c", "write -f -P 0x11 "+fmt.Sprint(size-864)+" 864",
		"-c", "read -P 0x11 "+fmt.Sprint(size-864)+" 864",
		"-c", "flush",
		"-c", "write -z 5000 3000",
		"-c", "read -P 0 5000 3000",
		"-c", "write -z -u 1M 1M",
		"-c", "read -P 0 1M 1M",
		"-c", "discard 4M 1M",
		uri)
	if strings.Contains(output, "Pattern verification failed") || strings.Contains(output, "failed") {
		t.Fatalf("qemu-io:\n%s", output)
	}
	// Writeback mode sends plain WRITE and an explicit FLUSH.
	mustRun(t, qemuIO, "-f", "raw", "-t", "writeback", "-c", "write -P 0x22 3 5", "-c", "flush", "-c", "read -P 0x22 3 5", uri)

	contents := disk.contents()
	want := make([]byte, size)
	for i := 1000; i < 71000; i++ {
		want[i] = 0xab
	}
	for i := 3; i < 8; i++ {
		want[i] = 0x22
	}
	clear(want[5000:8000])
	for i := size - 864; i < size; i++ {
		want[i] = 0x11
	}
	if !bytes.Equal(contents, want) {
		t.Fatalf("export contents differ from what qemu-io wrote")
	}

	// Reads and writes past the end fail cleanly, and the server goes on.
	for _, command := range []string{"read 64M 512", "read " + fmt.Sprint(size-100) + " 1000", "write " + fmt.Sprint(size-100) + " 1000"} {
		output, code := runTool(t, qemuIO, "-f", "raw", "-c", command, uri)
		if code == 0 || !strings.Contains(output, "failed") {
			t.Errorf("%q past the end: exit %d, output:\n%s", command, code, output)
		}
	}
	// The read-only export refuses writes.
	if output, code := runTool(t, qemuIO, "-f", "raw", "-c", "write 0 512", base+"/ro"); code == 0 {
		t.Errorf("write to a read-only export succeeded:\n%s", output)
	}
	mustRun(t, qemuIO, "-f", "raw", "-c", "read -P 0x11 "+fmt.Sprint(size-864)+" 864", uri)
}

func TestQemuImg(t *testing.T) {
	qemuImg := requireTool(t, "qemu-img")
	_, disk, base := realClientServer(t)
	uri := base + "/disk"

	var info struct {
		VirtualSize int64 `json:"virtual-size"`
		Format      string
	}
	if err := json.Unmarshal([]byte(mustRun(t, qemuImg, "info", "--output=json", uri)), &info); err != nil {
		t.Fatal(err)
	}
	if info.VirtualSize != 64<<20 || info.Format != "raw" {
		t.Fatalf("qemu-img info: %+v", info)
	}

	source, contents := sparseImage(t, 64<<20, 1)
	mustRun(t, qemuImg, "convert", "-n", "-f", "raw", "-O", "raw", source, uri)
	if !bytes.Equal(disk.contents(), contents) {
		t.Fatalf("export differs from the converted image")
	}
	if output, code := runTool(t, qemuImg, "compare", "-f", "raw", "-F", "raw", source, uri); code != 0 {
		t.Fatalf("qemu-img compare: exit %d:\n%s", code, output)
	}
	// The zero areas stayed holes: qemu-img writes them as WRITE_ZEROES.
	if blocks, total := disk.allocatedBlocks(), (64<<20)/memoryBlockSize; blocks > total/10 {
		t.Fatalf("%d of %d blocks allocated after converting a sparse image", blocks, total)
	}

	var entries []struct {
		Start, Length int64
		Zero, Data    bool
	}
	if err := json.Unmarshal([]byte(mustRun(t, qemuImg, "map", "--output=json", uri)), &entries); err != nil {
		t.Fatal(err)
	}
	var covered int64
	for _, entry := range entries {
		if entry.Start != covered {
			t.Fatalf("map entry at %d, want %d: %+v", entry.Start, covered, entries)
		}
		covered += entry.Length
		if !entry.Data && !bytes.Equal(contents[entry.Start:entry.Start+entry.Length], make([]byte, entry.Length)) {
			t.Fatalf("map reports %+v as a hole, but it holds data", entry)
		}
	}
	if covered != 64<<20 || len(entries) < 3 || entries[0].Data || !entries[0].Zero {
		t.Fatalf("qemu-img map: %+v", entries)
	}

	// A different image compares as different (exit 1), not as an error.
	changed := filepath.Join(t.TempDir(), "changed.img")
	contents[12345] ^= 0xff
	if err := os.WriteFile(changed, contents, 0o644); err != nil {
		t.Fatal(err)
	}
	if output, code := runTool(t, qemuImg, "compare", "-f", "raw", "-F", "raw", changed, uri); code != 1 {
		t.Fatalf("qemu-img compare of a changed image: exit %d:\n%s", code, output)
	}
}

func TestNbdinfo(t *testing.T) {
	nbdinfo := requireTool(t, "nbdinfo")
	_, disk, base := realClientServer(t)
	uri := base + "/disk"

	var report struct {
		Protocol   string
		Structured bool
		Exports    []map[string]any
	}
	if err := json.Unmarshal([]byte(mustRun(t, nbdinfo, "--json", uri)), &report); err != nil {
		t.Fatal(err)
	}
	if report.Protocol != "newstyle-fixed" || !report.Structured || len(report.Exports) != 1 {
		t.Fatalf("nbdinfo --json: %+v", report)
	}
	export := report.Exports[0]
	for key, want := range map[string]any{
		"export-name": "disk", "description": "test disk disk", "export-size": float64(64 << 20),
		"is_read_only": false, "can_flush": true, "can_fua": true, "can_trim": true, "can_zero": true,
		"can_multi_conn": true, "can_fast_zero": false, "can_df": true,
		"block_size_minimum": float64(1), "block_size_preferred": float64(4096), "block_size_maximum": float64(32 << 20),
	} {
		if export[key] != want {
			t.Errorf("nbdinfo --json: %s = %v, want %v", key, export[key], want)
		}
	}
	if contexts := fmt.Sprint(export["contexts"]); contexts != "[base:allocation]" {
		t.Errorf("contexts %s", contexts)
	}

	for _, test := range []struct {
		flag, export string
		want         int
	}{
		{"multi-conn", "disk", 0}, {"trim", "disk", 0}, {"fua", "disk", 0}, {"zero", "disk", 0},
		{"flush", "disk", 0}, {"structured-reply", "disk", 0}, {"fast-zero", "disk", 2},
		{"trim", "ro", 2}, {"zero", "ro", 2},
	} {
		if output, code := runTool(t, nbdinfo, "--can", test.flag, base+"/"+test.export); code != test.want {
			t.Errorf("nbdinfo --can %s %s: exit %d, want %d: %s", test.flag, test.export, code, test.want, output)
		}
	}
	if output, code := runTool(t, nbdinfo, "--is", "read-only", base+"/ro"); code != 0 {
		t.Errorf("nbdinfo --is read-only: exit %d: %s", code, output)
	}

	var list struct{ Exports []map[string]any }
	if err := json.Unmarshal([]byte(mustRun(t, nbdinfo, "--list", "--json", base+"/")), &list); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, export := range list.Exports {
		names = append(names, fmt.Sprint(export["export-name"]))
	}
	if fmt.Sprint(names) != "[disk min512 ro]" {
		t.Errorf("nbdinfo --list: %v", names)
	}

	// --map shows the holes around data written behind the server's back.
	writer, err := newMemoryBackend(disk).Open(context.Background(), "disk", Session{})
	if err != nil {
		t.Fatal(err)
	}
	writer.WriteAt(context.Background(), pattern(1, 8192), 1<<20, false)
	writer.Close()
	output := mustRun(t, nbdinfo, "--map", uri)
	want := []string{"0 1048576 3 hole,zero", "1048576 8192 0 data", "1056768 66052096 3 hole,zero"}
	var got []string
	for _, line := range strings.Split(strings.TrimSpace(output), "\n") {
		got = append(got, strings.Join(strings.Fields(line), " "))
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("nbdinfo --map:\n%s\nwant:\n%s", output, strings.Join(want, "\n"))
	}
}

func TestNbdcopy(t *testing.T) {
	nbdcopy := requireTool(t, "nbdcopy")
	_, disk, base := realClientServer(t)
	uri := base + "/disk"
	for _, connections := range []string{"1", "4"} {
		t.Run("connections="+connections, func(t *testing.T) {
			source, contents := sparseImage(t, 64<<20, uint64(len(connections)))
			mustRun(t, nbdcopy, "-C", connections, "-T", connections, "--flush", source, uri)
			if !bytes.Equal(disk.contents(), contents) {
				t.Fatalf("export differs from the copied image")
			}
			destination := filepath.Join(t.TempDir(), "copy.img")
			mustRun(t, nbdcopy, "-C", connections, "-T", connections, uri, destination)
			copied, err := os.ReadFile(destination)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(copied, contents) {
				t.Fatalf("round trip through nbdcopy changed the data")
			}
		})
	}
}

// libnbdScript drives every command with its flags through python3-libnbd,
// and, with libnbd's client-side checks turned off, sends requests the
// server must refuse with the right error.
const libnbdScript = `
import nbd, sys
base = sys.argv[1]

def expect_error(errno, function, *arguments):
    try:
        function(*arguments)
    except nbd.Error as error:
        assert error.errno == errno, (function.__name__, error.string, error.errno)
        return
    raise AssertionError("%s succeeded, want %s" % (function.__name__, errno))

h = nbd.NBD()
h.set_opt_mode(True)
h.add_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
h.connect_uri(base + "/disk")
listed = []
h.opt_list(lambda name, description: listed.append((name, description)))
assert listed == [("disk", "test disk disk"), ("min512", "test disk min512"), ("ro", "test disk ro")], listed
contexts = []
h.opt_list_meta_context(lambda name: contexts.append(name))
assert contexts == ["base:allocation"], contexts
h.opt_go()
assert h.get_structured_replies_negotiated()
assert h.can_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
assert h.can_trim() and h.can_zero() and h.can_fua() and h.can_flush() and h.can_multi_conn() and h.can_cache()
assert not h.can_fast_zero() and not h.is_read_only()
assert h.get_block_size(nbd.SIZE_MAXIMUM) == 32 << 20
size = h.get_size()
assert size == 64 << 20

h.pwrite(b"x" * 8192, 1 << 20, nbd.CMD_FLAG_FUA)
h.pwrite(b"y" * 100, 3 << 20)
assert h.pread(8192, 1 << 20) == b"x" * 8192
h.zero(4096, 1 << 20, nbd.CMD_FLAG_NO_HOLE | nbd.CMD_FLAG_FUA)
assert h.pread(8192, 1 << 20) == b"\0" * 4096 + b"x" * 4096
h.trim(1 << 20, 3 << 20, nbd.CMD_FLAG_FUA)
h.zero(4096, (1 << 20) + 4096)
h.cache(4096, 0)
h.flush()

extents = []
def record(metacontext, offset, entries, error):
    assert metacontext == "base:allocation"
    extents.append((offset, list(entries)))
h.block_status(4 << 20, 0, record)
assert extents == [(0, [1 << 20, 3, 4096, 0, (3 << 20) - 4096, 3])], extents
extents.clear()
h.block_status(4 << 20, 0, record, nbd.CMD_FLAG_REQ_ONE)
assert extents == [(0, [1 << 20, 3])], extents

# What a careless client may send: the server answers with errors and
# stays usable.
h.set_strict_mode(0)
expect_error("EINVAL", h.pread, 512, size)
expect_error("EINVAL", h.pread, 1024, size - 512)
expect_error("ENOSPC", h.pwrite, b"z" * 1024, size - 512)
expect_error("ENOSPC", h.zero, 1024, size - 512)
expect_error("EINVAL", h.trim, 1024, size - 512)
expect_error("EINVAL", h.zero, 512, 0, nbd.CMD_FLAG_FAST_ZERO)
expect_error("EINVAL", h.block_status, 1024, size - 512, record)
expect_error("EINVAL", h.pread, 512, 0, nbd.CMD_FLAG_REQ_ONE)
assert h.pread(8192, 1 << 20) == b"\0" * 8192
h.shutdown()

r = nbd.NBD()
r.connect_uri(base + "/ro")
assert r.is_read_only() and not r.can_trim() and not r.can_zero()
r.set_strict_mode(0)
expect_error("EPERM", r.pwrite, b"z", 0)
expect_error("EPERM", r.trim, 512, 0)
r.shutdown()

a = nbd.NBD()
a.connect_uri(base + "/min512")
assert a.get_block_size(nbd.SIZE_MINIMUM) == 512
a.set_strict_mode(0)
expect_error("EINVAL", a.pread, 100, 0)
expect_error("EINVAL", a.pwrite, b"z" * 512, 1)
assert a.pread(512, 512) == b"\0" * 512
a.shutdown()

m = nbd.NBD()
m.set_export_name("missing")
try:
    m.connect_uri(base + "/missing")
    raise AssertionError("connected to a missing export")
except nbd.Error as error:
    assert "missing" in error.string, error.string
print("OK")
`

func TestPythonLibnbd(t *testing.T) {
	// Debian's python, not a pyenv one first in PATH (CLIENTS.md).
	const python = "/usr/bin/python3"
	_, err := os.Stat(python)
	testenv.Require(t, python, err)
	if output, code := runTool(t, python, "-c", "import nbd"); code != 0 {
		testenv.Require(t, "python3-libnbd", fmt.Errorf("import nbd: exit status %d: %s", code, strings.TrimSpace(output)))
	}
	_, _, base := realClientServer(t)
	script := filepath.Join(t.TempDir(), "libnbd_test.py")
	if err := os.WriteFile(script, []byte(libnbdScript), 0o644); err != nil {
		t.Fatal(err)
	}
	if output := mustRun(t, python, script, base); strings.TrimSpace(output) != "OK" {
		t.Fatalf("libnbd script:\n%s", output)
	}
}

func TestFio(t *testing.T) {
	fio := requireTool(t, "fio")
	if output, _ := runTool(t, fio, "--enghelp=nbd"); !strings.Contains(output, "uri") {
		testenv.Require(t, "fio's nbd engine", fmt.Errorf("fio --enghelp=nbd: %s", strings.TrimSpace(output)))
	}
	_, _, base := realClientServer(t)
	// Four jobs, each its own connection (multi-conn), on disjoint
	// regions of the same export so that each can verify its own writes.
	job := fmt.Sprintf(`[global]
ioengine=nbd
uri=%s/disk
rw=randrw
bs=4k
iodepth=16
numjobs=4
size=8m
offset_increment=8m
verify=crc32c
verify_fatal=1
do_verify=1
verify_state_save=0
fsync=64
group_reporting=1

[randrw]
`, base)
	path := filepath.Join(t.TempDir(), "nbd.fio")
	if err := os.WriteFile(path, []byte(job), 0o644); err != nil {
		t.Fatal(err)
	}
	output := mustRun(t, fio, path)
	if !strings.Contains(output, "err= 0") || strings.Contains(output, "verify:") {
		t.Fatalf("fio:\n%s", output)
	}
}

// realClientTLSServer is realClientServer requiring TLS with client
// certificates; it also returns a directory of client credentials for
// QEMU and libnbd, whose certificate is named commonName, and the server's
// log.
func realClientTLSServer(t *testing.T, commonName string) (*testServer, *memoryDisk, string, *logCapture) {
	t.Helper()
	pki := testCertificates(t)
	disk := newMemoryDisk("disk", 64<<20)
	readOnly := newMemoryDisk("ro", 1<<20)
	readOnly.info.ReadOnly = true
	logs := &logCapture{}
	server := startServer(t, newMemoryBackend(disk, readOnly), withTLS(pki, true), logs.configure)
	return server, disk, pki.writeClientDirectory(t, commonName), logs
}

// expectOnlyClient checks that the Backend saw only TLS sessions of the
// client named commonName, and at least one.
func expectOnlyClient(t *testing.T, server *testServer, commonName string) {
	t.Helper()
	sessions := server.backend.recordedSessions()
	if len(sessions) == 0 {
		t.Fatalf("the Backend was never called")
	}
	for _, session := range sessions {
		if !session.TLS || session.Client != commonName {
			t.Fatalf("session %+v, want TLS from %s", session, commonName)
		}
	}
}

func TestQemuTLS(t *testing.T) {
	qemuImg := requireTool(t, "qemu-img")
	qemuIO := requireTool(t, "qemu-io")
	server, disk, directory, logs := realClientTLSServer(t, "qemu-client")
	host, port, err := net.SplitHostPort(server.address)
	if err != nil {
		t.Fatal(err)
	}
	credentials := "tls-creds-x509,id=tls0,endpoint=client,dir=" + directory
	image := fmt.Sprintf("driver=nbd,host=%s,port=%s,export=disk,tls-creds=tls0", host, port)

	var info struct {
		VirtualSize int64 `json:"virtual-size"`
	}
	if err := json.Unmarshal([]byte(mustRun(t, qemuImg, "info", "--output=json", "--object", credentials, "--image-opts", image)), &info); err != nil {
		t.Fatal(err)
	}
	if info.VirtualSize != 64<<20 {
		t.Fatalf("qemu-img info over TLS: size %d", info.VirtualSize)
	}
	output := mustRun(t, qemuIO, "--object", credentials, "--image-opts",
		"-c", "write -P 0xcd 4096 70000", "-c", "read -P 0xcd 4096 70000", "-c", "flush", image)
	if strings.Contains(output, "failed") {
		t.Fatalf("qemu-io over TLS:\n%s", output)
	}
	if contents := disk.contents(); !bytes.Equal(contents[4096:4096+70000], bytes.Repeat([]byte{0xcd}, 70000)) {
		t.Fatalf("the export does not hold what qemu-io wrote over TLS")
	}
	expectOnlyClient(t, server, "qemu-client")

	// Without TLS the server says what it wants.
	output, code := runTool(t, qemuImg, "info", "nbd://"+server.address+"/disk")
	if code == 0 || !strings.Contains(output, "requires TLS (NBD_OPT_STARTTLS) with a client certificate") {
		t.Fatalf("plaintext qemu-img info on a TLS server: exit %d:\n%s", code, output)
	}
	// A client certificate of another CA is refused.
	pki := testCertificates(t)
	_, certificatePEM, keyPEM, err := pki.otherCA.issue("qemu-client", false)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(directory, "client-cert.pem"), certificatePEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(directory, "client-key.pem"), keyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	// QEMU checks its own certificate against ca-cert.pem: trust both
	// CAs there, so that the refusal is the server's. (GnuTLS then sends
	// no certificate at all, as the server asks for one of its CA.)
	if err := os.WriteFile(filepath.Join(directory, "ca-cert.pem"), append(append([]byte(nil), pki.ca.pem...), pki.otherCA.pem...), 0o600); err != nil {
		t.Fatal(err)
	}
	if output, code := runTool(t, qemuImg, "info", "--object", credentials, "--image-opts", image); code == 0 {
		t.Fatalf("qemu-img info with a certificate of another CA succeeded:\n%s", output)
	}
	logs.waitForLine(t, "TLS handshake failed", "certificate")
	expectOnlyClient(t, server, "qemu-client")
}

func TestNbdinfoTLS(t *testing.T) {
	nbdinfo := requireTool(t, "nbdinfo")
	server, _, directory, _ := realClientTLSServer(t, "libnbd-client")
	uri := "nbds://" + server.address + "/disk?tls-certificates=" + directory

	var report struct {
		TLS     bool
		Exports []map[string]any
	}
	if err := json.Unmarshal([]byte(mustRun(t, nbdinfo, "--json", uri)), &report); err != nil {
		t.Fatal(err)
	}
	if !report.TLS || len(report.Exports) != 1 || report.Exports[0]["export-size"] != float64(64<<20) || report.Exports[0]["is_read_only"] != false {
		t.Fatalf("nbdinfo --json over TLS: %+v", report)
	}
	// --list sends NBD_OPT_LIST, then NBD_OPT_INFO for each export.
	var list struct{ Exports []map[string]any }
	listURI := "nbds://" + server.address + "/?tls-certificates=" + directory
	if err := json.Unmarshal([]byte(mustRun(t, nbdinfo, "--list", "--json", listURI)), &list); err != nil {
		t.Fatal(err)
	}
	if len(list.Exports) != 2 || list.Exports[0]["export-name"] != "disk" || list.Exports[1]["is_read_only"] != true {
		t.Fatalf("nbdinfo --list over TLS: %+v", list.Exports)
	}
	expectOnlyClient(t, server, "libnbd-client")
	infoOnly := 0
	for _, session := range server.backend.recordedSessions() {
		if session.InfoOnly {
			infoOnly++
		}
	}
	if infoOnly < 2 {
		t.Fatalf("%d NBD_OPT_INFO opens, want one per listed export at least", infoOnly)
	}

	// libnbd shows the server's message in its debug output only.
	output, code := runTool(t, "env", "LIBNBD_DEBUG=1", nbdinfo, "nbd://"+server.address+"/disk")
	if code == 0 || !strings.Contains(output, "server error message: nbd: this server requires TLS (NBD_OPT_STARTTLS) with a client certificate") {
		t.Fatalf("plaintext nbdinfo on a TLS server: exit %d:\n%s", code, output)
	}
}
