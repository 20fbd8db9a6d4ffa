package vmtest

// The VM tests skip unless Available() is nil and nbdkit is installed; CI
// installs (Debian 12):
//
//	apt-get install qemu-system-x86 busybox-static linux-image-amd64 \
//	  qemu-utils nbdkit libnbd-bin

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/testenv"
)

// checkMegabytes is how much of the disk the self-test writes.
const checkMegabytes = 16

// diskSize is the size of the nbdkit memory disk.
const diskSize = 64 << 20

// requireVM skips the test unless a VM can boot here (fails it under
// CI=true, see internal/testenv).
func requireVM(t *testing.T) {
	t.Helper()
	testenv.Require(t, "a VM (qemu-system-x86, a kernel, busybox-static)", Available())
}

// requireTool returns the path of a program, or skips the test (fails it
// under CI=true).
func requireTool(t *testing.T, name string) string {
	t.Helper()
	return testenv.LookPath(t, name, "")
}

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer listener.Close()
	return listener.Addr().(*net.TCPAddr).Port
}

// startMemoryDisk serves an nbdkit memory disk of size bytes on 127.0.0.1
// and returns its URI and the path of the request log that nbdkit's log
// filter writes. nbdkit stays in the foreground as this test's child and is
// killed by its pid at cleanup.
func startMemoryDisk(t *testing.T, size int) (uri, requestLog string) {
	t.Helper()
	nbdkit := requireTool(t, "nbdkit")
	port := freePort(t)
	requestLog = filepath.Join(t.TempDir(), "nbdkit-requests.log")
	var output bytes.Buffer
	command := exec.Command(nbdkit, "--foreground", "--ipaddr", "127.0.0.1", "--port", strconv.Itoa(port),
		"--filter=log", "memory", strconv.Itoa(size), "logfile="+requestLog)
	command.Stdout = &output
	command.Stderr = &output
	command.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := command.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- command.Wait() }()
	t.Cleanup(func() {
		command.Process.Kill()
		<-exited
	})
	address := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	deadline := time.Now().Add(15 * time.Second)
	for {
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("nbdkit exited: %v: %s", err, output.String())
		default:
		}
		connection, err := net.DialTimeout("tcp", address, time.Second)
		if err == nil {
			connection.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("nbdkit does not listen on %s: %v", address, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return "nbd://" + address + "/vm1", requestLog
}

// readWholeDisk copies the export to memory with nbdcopy, or qemu-img
// convert if nbdcopy is missing.
func readWholeDisk(t *testing.T, ctx context.Context, uri string) []byte {
	t.Helper()
	output := filepath.Join(t.TempDir(), "disk.raw")
	var command *exec.Cmd
	if nbdcopy, err := exec.LookPath("nbdcopy"); err == nil {
		command = exec.CommandContext(ctx, nbdcopy, uri, output)
	} else {
		qemuImage := requireTool(t, "qemu-img")
		command = exec.CommandContext(ctx, qemuImage, "convert", "-f", "raw", "-O", "raw", uri, output)
	}
	if messages, err := command.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v: %s", command, err, messages)
	}
	contents, err := os.ReadFile(output)
	if err != nil {
		t.Fatal(err)
	}
	return contents
}

// TestDiskCheckInVM boots a VM on an nbdkit memory disk, runs the disk check
// and verifies the result from the host.
func TestDiskCheckInVM(t *testing.T) {
	requireVM(t)
	uri, requestLog := startMemoryDisk(t, diskSize)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const seed = "self-test 'quoted' $seed"

	result, err := Run(ctx, Options{
		NBDURI:      uri,
		GuestScript: DiskCheckScript(seed, checkMegabytes),
		WorkDir:     t.TempDir(),
		Timeout:     150 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("boot took %v (QEMU start to guest script start); the whole run %v", result.BootDuration.Round(time.Millisecond), result.Duration.Round(time.Millisecond))
	if testing.Verbose() {
		t.Logf("console:\n%s", result.Console)
	}
	if !strings.Contains(result.Console, CheckOK) || result.ExitMarker != "HERD-VM-DONE rc=0" || result.ExitCode != 0 {
		t.Fatalf("the disk check failed (exit marker %q); console:\n%s", result.ExitMarker, result.Console)
	}
	if !strings.Contains(result.Console, DoneMarker+" rc=0") {
		t.Fatalf("no %q on the console:\n%s", DoneMarker+" rc=0", result.Console)
	}

	requests, err := os.ReadFile(requestLog)
	if err != nil {
		t.Fatal(err)
	}
	checkRequests(t, string(requests))

	disk := readWholeDisk(t, ctx, uri)
	if len(disk) != diskSize {
		t.Fatalf("read %d bytes from the host, want %d", len(disk), diskSize)
	}
	checkedEnd := checkMegabytes * Mebibyte
	if err := compareBytes("the pattern read by nbdcopy", disk[:checkedEnd], ExpectedPattern(seed, checkMegabytes)); err != nil {
		t.Error(err)
	}
	if err := compareBytes("the end marker read by nbdcopy", disk[diskSize-EndMarkerSize:], ExpectedEndMarker(seed)); err != nil {
		t.Error(err)
	}
	if index := bytes.IndexFunc(disk[checkedEnd:diskSize-EndMarkerSize], func(r rune) bool { return r != 0 }); index >= 0 {
		t.Errorf("byte %d, between the pattern and the end marker, is not zero", checkedEnd+index)
	}
	// VerifyFromHost needs qemu-img: without it the check is left out,
	// except under CI=true, where it then fails saying so.
	if _, err := exec.LookPath("qemu-img"); err == nil || testenv.CI() {
		if err := VerifyFromHost(ctx, uri, seed, checkMegabytes); err != nil {
			t.Error(err)
		}
		if err := VerifyFromHost(ctx, uri, "another seed", checkMegabytes); err == nil {
			t.Error("VerifyFromHost accepted the wrong seed")
		}
	}
}

// checkRequests checks in nbdkit's request log that the guest's writes
// reached the server and were flushed: one FLUSH per fsync'ed MiB at least,
// and a FLUSH after the last WRITE.
func checkRequests(t *testing.T, requests string) {
	t.Helper()
	writes, flushes, flushedAfterLastWrite := 0, 0, false
	for line := range strings.Lines(requests) {
		switch {
		case strings.Contains(line, " Write id="):
			writes++
			flushedAfterLastWrite = false
		case strings.Contains(line, " Flush id="):
			flushes++
			flushedAfterLastWrite = true
		}
	}
	t.Logf("nbdkit saw %d WRITE and %d FLUSH requests", writes, flushes)
	if writes < checkMegabytes || flushes < checkMegabytes/2 || !flushedAfterLastWrite {
		t.Errorf("want at least %d WRITE and %d FLUSH requests, the last WRITE followed by a FLUSH; nbdkit's log:\n%s",
			checkMegabytes, checkMegabytes/2, requests)
	}
}

// TestRunReportsScriptExitCode checks the exit code and output of a script
// whose last line lacks a newline.
func TestRunReportsScriptExitCode(t *testing.T) {
	requireVM(t)
	uri, _ := startMemoryDisk(t, 1<<20)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	result, err := Run(ctx, Options{
		NBDURI:      uri,
		GuestScript: "echo \"disk $DISK has $(blockdev --getsize64 $DISK) bytes\"\nprintf 'no newline'\nexit 3\n",
		MemoryMiB:   256,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("boot took %v", result.BootDuration.Round(time.Millisecond))
	if result.ExitCode != 3 || result.ExitMarker != DoneMarker+" rc=3" {
		t.Errorf("exit code %d, marker %q; want 3", result.ExitCode, result.ExitMarker)
	}
	if !strings.Contains(result.Console, "disk /dev/vda has 1048576 bytes\n") || !strings.Contains(result.Console, "no newline") {
		t.Errorf("the script's output is missing from the console:\n%s", result.Console)
	}
}

// TestRunTimeoutKillsQEMU checks that a run that does not finish in time is
// killed and reports the timeout.
func TestRunTimeoutKillsQEMU(t *testing.T) {
	requireVM(t)
	uri, _ := startMemoryDisk(t, 1<<20)
	started := time.Now()
	_, err := Run(context.Background(), Options{NBDURI: uri, GuestScript: "sleep 600", Timeout: 2 * time.Second})
	if err == nil || !strings.Contains(err.Error(), "did not finish within 2s") {
		t.Fatalf("Run returned %v, want a timeout", err)
	}
	t.Log(err)
	if elapsed := time.Since(started); elapsed > 30*time.Second {
		t.Fatalf("Run took %v to give up after a 2 s timeout", elapsed)
	}
}

// TestRunReportsQEMUFailure checks that QEMU's own complaint (here: no NBD
// server) is in the error.
func TestRunReportsQEMUFailure(t *testing.T) {
	requireVM(t)
	uri := fmt.Sprintf("nbd://127.0.0.1:%d/none", freePort(t))
	_, err := Run(context.Background(), Options{NBDURI: uri, GuestScript: "true", Timeout: time.Minute})
	if err == nil || !strings.Contains(err.Error(), "QEMU exited") || !strings.Contains(err.Error(), "QEMU said") {
		t.Fatalf("Run returned %v, want QEMU's failure", err)
	}
	t.Log(err)
}

func TestExpectedPattern(t *testing.T) {
	pattern := ExpectedPattern("a\nb", 3)
	if len(pattern) != 3*Mebibyte {
		t.Fatalf("pattern has %d bytes", len(pattern))
	}
	for index := range 3 {
		line := fmt.Sprintf("herd-vm-check seed=a_b mebibyte=%d\n", index)
		if !bytes.HasPrefix(pattern[index*Mebibyte:], []byte(line+line)) {
			t.Errorf("MiB %d starts with %q", index, pattern[index*Mebibyte:index*Mebibyte+80])
		}
	}
	if !bytes.Equal(ExpectedPattern("x", 0), ExpectedPattern("x", 1)) {
		t.Error("megabytes 0 does not count as 1")
	}
	marker := ExpectedEndMarker("s")
	if len(marker) != EndMarkerSize || !bytes.HasPrefix(marker, []byte("herd-vm-check seed=s end-of-disk\nherd")) {
		t.Errorf("end marker %q", marker[:64])
	}
}

// TestPatternMatchesBusybox runs the generator functions of the script
// through the host's busybox and compares with ExpectedPattern.
func TestPatternMatchesBusybox(t *testing.T) {
	busybox, err := findStaticBusybox()
	testenv.Require(t, "a static busybox", err)
	const seed = "it's $HOME `x` \\ \"q\""
	script := DiskCheckScript(seed, 2)
	// Keep the variable settings and function definitions, stop before
	// the first command that touches the disk.
	prefix, _, found := strings.Cut(script, `[ -b "$disk" ]`)
	if !found {
		t.Fatal("the script has no disk check")
	}
	output, err := exec.Command(busybox, "sh", "-c", prefix+"\npattern; end_marker").Output()
	if err != nil {
		t.Fatal(err)
	}
	want := append(ExpectedPattern(seed, 2), ExpectedEndMarker(seed)...)
	if err := compareBytes("busybox's pattern", output, want); err != nil {
		t.Fatal(err)
	}
}

func TestCompareVersions(t *testing.T) {
	for _, test := range []struct {
		a, b string
		sign int
	}{
		{"6.1.0-10-amd64", "6.1.0-9-amd64", 1},
		{"6.1.0-9-amd64", "6.1.0-10-amd64", -1},
		{"5.10.0-28-amd64", "6.1.0-1-amd64", -1},
		{"6.1.0-9-amd64", "6.1.0-9-amd64", 0},
		{"6.1.0-9-cloud-amd64", "6.1.0-9-amd64", 1},
	} {
		got := compareVersions(test.a, test.b)
		if (got > 0) != (test.sign > 0) || (got < 0) != (test.sign < 0) {
			t.Errorf("compareVersions(%q, %q) = %d, want sign %d", test.a, test.b, got, test.sign)
		}
	}
}

func TestQEMUImageOptions(t *testing.T) {
	got, err := qemuImageOptions("nbd://127.0.0.1:10810/vm,1", 4096, 512)
	want := "driver=raw,offset=4096,size=512,file.driver=nbd,file.server.type=inet,file.server.host=127.0.0.1,file.server.port=10810,file.export=vm,,1"
	if err != nil || got != want {
		t.Errorf("got %q, %v; want %q", got, err, want)
	}
	got, err = qemuImageOptions("nbd+unix:///disk?socket=/run/herd.sock", -1, -1)
	want = "driver=raw,file.driver=nbd,file.server.type=unix,file.server.path=/run/herd.sock,file.export=disk"
	if err != nil || got != want {
		t.Errorf("got %q, %v; want %q", got, err, want)
	}
	if _, err := qemuImageOptions("nbds://127.0.0.1/disk", -1, -1); err == nil {
		t.Error("nbds:// was accepted")
	}
}

// TestCPIOArchive parses what cpioWriter writes.
func TestCPIOArchive(t *testing.T) {
	var output bytes.Buffer
	archive := newCPIOWriter(&output)
	archive.directory("herd")
	archive.file("herd/a", 0o755, []byte("hello"))
	archive.symlink("bin/sh", "busybox")
	archive.characterDevice("dev/console", 0o600, 5, 1)
	if err := archive.close(); err != nil {
		t.Fatal(err)
	}
	data := output.Bytes()
	type entry struct {
		name, body               string
		mode                     uint64
		deviceMajor, deviceMinor uint64
	}
	var entries []entry
	for len(data) > 0 {
		if len(data) < 110 || string(data[:6]) != "070701" {
			t.Fatalf("bad header %q", data[:min(len(data), 110)])
		}
		field := func(index int) uint64 {
			value, err := strconv.ParseUint(string(data[6+8*index:14+8*index]), 16, 32)
			if err != nil {
				t.Fatal(err)
			}
			return value
		}
		mode, size, deviceMajor, deviceMinor, nameSize := field(1), field(6), field(9), field(10), field(11)
		nameEnd := 110 + int(nameSize)
		name := string(data[110 : nameEnd-1])
		bodyStart := (nameEnd + 3) &^ 3
		bodyEnd := bodyStart + int(size)
		entries = append(entries, entry{name, string(data[bodyStart:bodyEnd]), mode, deviceMajor, deviceMinor})
		data = data[(bodyEnd+3)&^3:]
	}
	want := []entry{
		{"herd", "", 0o040755, 0, 0},
		{"herd/a", "hello", 0o100755, 0, 0},
		{"bin/sh", "busybox", 0o120777, 0, 0},
		{"dev/console", "", 0o020600, 5, 1},
		{"TRAILER!!!", "", 0, 0, 0},
	}
	if fmt.Sprint(entries) != fmt.Sprint(want) {
		t.Fatalf("entries %v, want %v", entries, want)
	}
}

// TestAvailableNamesWhatIsMissing hides QEMU from PATH.
func TestAvailableNamesWhatIsMissing(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	err := Available()
	if err == nil || !strings.Contains(err.Error(), QEMUProgram) {
		t.Fatalf("Available() = %v, want an error naming %s", err, QEMUProgram)
	}
	t.Log(err)
}
