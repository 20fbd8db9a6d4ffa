package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/testcluster"
	"github.com/herd-storage/herd/internal/testenv"
)

// dataCluster starts a formatted cluster with one VDI.
func dataCluster(t *testing.T, nodes, copies int, vdi, size string, formatArgs ...string) *testcluster.Cluster {
	t.Helper()
	return dataClusterWith(t, testcluster.Options{Nodes: nodes}, copies, vdi, size, formatArgs...)
}

// dataClusterWith is dataCluster with the cluster's options.
func dataClusterWith(t *testing.T, options testcluster.Options, copies int, vdi, size string, formatArgs ...string) *testcluster.Cluster {
	t.Helper()
	c := testcluster.Start(t, options)
	nodes := options.Nodes
	var all []int
	for i := 0; i < nodes; i++ {
		all = append(all, i)
	}
	waitAgreement(t, c, all, 30*time.Second)
	if _, stderr, err := c.Herd(ctx(t), 0, append([]string{"cluster", "format", "--copies", strconv.Itoa(copies)}, formatArgs...)...); err != nil {
		t.Fatalf("format: %v %s", err, stderr)
	}
	if _, stderr, err := c.Herd(ctx(t), 0, "vdi", "create", vdi, size); err != nil {
		t.Fatalf("create: %v %s", err, stderr)
	}
	for _, i := range all {
		testcluster.WaitFor(t, 10*time.Second, fmt.Sprintf("node %d to know vdi %s", i, vdi), func() (bool, error) {
			_, err := client(c, i).VDI(ctx(t), vdi)
			return err == nil, err
		})
	}
	return c
}

// need skips the test unless every tool is installed; under CI=true a
// missing tool fails it instead (see internal/testenv).
func need(t *testing.T, tools ...string) {
	t.Helper()
	for _, tool := range tools {
		testenv.LookPath(t, tool, "")
	}
}

// needLibnbd skips the test unless Debian's python3 has the libnbd
// bindings (fails it under CI=true).
func needLibnbd(t *testing.T) {
	t.Helper()
	need(t, "/usr/bin/python3")
	var err error
	if out, runError := exec.Command("/usr/bin/python3", "-c", "import nbd").CombinedOutput(); runError != nil {
		err = fmt.Errorf("%v: %s", runError, bytes.TrimSpace(out))
	}
	testenv.Require(t, "python3-libnbd", err)
}

// run runs a client command with a deadline and returns its output.
func run(t *testing.T, timeout time.Duration, name string, args ...string) (string, error) {
	t.Helper()
	return runCommand(t, timeout, exec.Command(name, args...))
}

// runCommand runs command (not started yet) and returns its output; it
// fails the test if the command outlives timeout.
func runCommand(t *testing.T, timeout time.Duration, command *exec.Cmd) (string, error) {
	t.Helper()
	ctx, cancel := contextWithTimeout(t, timeout)
	defer cancel()
	var out bytes.Buffer
	command.Stdout, command.Stderr = &out, &out
	if err := command.Start(); err != nil {
		return "", err
	}
	stop := context.AfterFunc(ctx, func() { command.Process.Kill() })
	err := command.Wait()
	stop()
	if ctx.Err() != nil {
		t.Fatalf("%s hung for %v:\n%s", strings.Join(command.Args, " "), timeout, out.Bytes())
	}
	return out.String(), err
}

func mustRun(t *testing.T, timeout time.Duration, name string, args ...string) string {
	t.Helper()
	out, err := run(t, timeout, name, args...)
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return out
}

// qemuIO runs qemu-io commands against uri; each command is a -c.
func qemuIO(t *testing.T, uri string, commands ...string) (string, error) {
	t.Helper()
	args := []string{"-f", "raw"}
	for _, c := range commands {
		args = append(args, "-c", c)
	}
	out, err := run(t, 2*time.Minute, "qemu-io", append(args, uri)...)
	if err == nil && (strings.Contains(out, "failed") || strings.Contains(out, "Pattern verification failed")) {
		err = fmt.Errorf("qemu-io reported a failure")
	}
	return out, err
}

// patternWrites are offsets and lengths for a 64 MiB disk of 4 MiB
// objects: unaligned, crossing object boundaries, at the very end.
var patternWrites = []struct{ offset, length int64 }{
	{0, 4096}, {5000, 3000}, {4<<20 - 1000, 5000}, {8<<20 + 17, 3 << 20},
	{20<<20 - 1, 2}, {33 << 20, 1 << 20}, {64<<20 - 512, 512}, {64<<20 - 70000, 69000},
}

func writePatterns(t *testing.T, uri string) {
	t.Helper()
	var commands []string
	for i, w := range patternWrites {
		commands = append(commands, fmt.Sprintf("write -P 0x%02x %d %d", 0x10+i, w.offset, w.length))
	}
	if out, err := qemuIO(t, uri, commands...); err != nil {
		t.Fatalf("writing patterns through %s: %v\n%s", uri, err, out)
	}
}

func verifyPatterns(t *testing.T, uri string) {
	t.Helper()
	var commands []string
	for i, w := range patternWrites {
		for _, other := range patternWrites[i+1:] {
			if w.offset < other.offset+other.length && other.offset < w.offset+w.length {
				t.Fatalf("test bug: pattern writes %v and %v overlap", w, other)
			}
		}
		commands = append(commands, fmt.Sprintf("read -P 0x%02x %d %d", 0x10+i, w.offset, w.length))
	}
	commands = append(commands, "read -P 0 16M 1M", "read -P 0 4096 904") // never written
	if out, err := qemuIO(t, uri, commands...); err != nil {
		t.Fatalf("verifying patterns through %s: %v\n%s", uri, err, out)
	}
}

// TestNBDPatternsAcrossNodes: written through node A, verified through
// node B after A's client left; reads past the end fail cleanly.
func TestNBDPatternsAcrossNodes(t *testing.T) {
	need(t, "qemu-io")
	for _, copies := range []int{3, 2, 1} {
		t.Run(fmt.Sprintf("copies=%d", copies), func(t *testing.T) {
			c := dataCluster(t, 3, copies, "disk", "64M")
			writePatterns(t, c.Node(0).NBDURI("disk"))
			verifyPatterns(t, c.Node(1).NBDURI("disk"))
			verifyPatterns(t, c.Node(2).NBDURI("disk"))
			out, _ := qemuIO(t, c.Node(1).NBDURI("disk"), "read 64M 512")
			if !strings.Contains(out, "read failed") {
				t.Errorf("read past the end did not fail cleanly:\n%s", out)
			}
			checkReplicas(t, c, copies)
		})
	}
}

// objectFiles maps object id -> node index -> digest of the copy's data
// (see digest), for the given nodes (all when none are given).
// digest stands for a copy's content in objectFiles, so that comparing
// the copies of a large disk does not hold them all in memory: empty for
// an all-zero copy, else its first byte followed by the SHA-256 of its
// data with trailing zeros trimmed.
func digest(data []byte) []byte {
	trimmed := bytes.TrimRight(data, "\x00")
	if len(trimmed) == 0 {
		return nil
	}
	sum := sha256.Sum256(trimmed)
	return append([]byte{trimmed[0]}, sum[:]...)
}

// fileDigest is the digest of an object file's data (after the header and
// the checksum table), followed by the SHA-256 of its checksum table, so
// that copies compare equal only if both agree.
func fileDigest(file []byte) []byte {
	data := digest(file[min(len(file), objectDataOffset):])
	table := bytes.TrimRight(file[4096:min(len(file), objectDataOffset)], "\x00")
	if len(data) == 0 && len(table) == 0 {
		return nil
	}
	if len(data) == 0 {
		data = []byte{0}
	}
	sum := sha256.Sum256(table)
	return append(data, sum[:]...)
}

func objectFiles(t *testing.T, c *testcluster.Cluster, only ...int) map[string]map[int][]byte {
	t.Helper()
	out := map[string]map[int][]byte{}
	for _, n := range c.Nodes() {
		if len(only) > 0 && !slices.Contains(only, n.Index()) {
			continue // e.g. a killed node: it may hold a file cut short by kill -9
		}
		root := filepath.Join(n.DataDir(), "objects")
		filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || len(d.Name()) != 16 {
				return nil
			}
			data, err := os.ReadFile(path)
			if errors.Is(err, fs.ErrNotExist) {
				// Deleted since the walk listed it: recovery removes a
				// copy the epoch places elsewhere once it is replaced.
				return nil
			}
			if err != nil {
				t.Fatalf("reading %s: %v", path, err)
			}
			if len(data) < 4096 {
				t.Fatalf("object file %s is %d bytes: shorter than its header", path, len(data))
			}
			if out[d.Name()] == nil {
				out[d.Name()] = map[int][]byte{}
			}
			out[d.Name()][n.Index()] = fileDigest(data)
			return nil
		})
	}
	return out
}

// checkReplicas: every object has exactly `copies` replicas, identical.
func checkReplicas(t *testing.T, c *testcluster.Cluster, copies int) {
	t.Helper()
	objects := objectFiles(t, c)
	if len(objects) == 0 {
		t.Fatal("no object files found on any node")
	}
	for oid, holders := range objects {
		if len(holders) != copies {
			t.Errorf("object %s has %d replicas, want %d", oid, len(holders), copies)
		}
		var first []byte
		firstNode := -1
		for node, data := range holders {
			if firstNode < 0 {
				first, firstNode = data, node
			} else if !bytes.Equal(first, data) {
				t.Errorf("object %s differs between node %d and node %d", oid, firstNode, node)
			}
		}
	}
	t.Logf("%d objects, each with %d identical replicas", len(objects), copies)
}

func randomFile(t *testing.T, size int64) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "random.img")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 1<<20)
	for written := int64(0); written < size; written += int64(len(chunk)) {
		rand.Read(chunk)
		if _, err := f.Write(chunk[:min(int64(len(chunk)), size-written)]); err != nil {
			t.Fatal(err)
		}
	}
	f.Close()
	return path
}

// TestNBDClientsRoundTrip: qemu-img info/convert/compare, nbdcopy of 1 GiB
// in through one node and out through another, nbdinfo's size and flags.
func TestNBDClientsRoundTrip(t *testing.T) {
	need(t, "qemu-img", "nbdcopy", "nbdinfo")
	c := dataCluster(t, 3, 3, "big", "1G")
	uri, other := c.Node(0).NBDURI("big"), c.Node(1).NBDURI("big")

	info := mustRun(t, time.Minute, "qemu-img", "info", "--output=json", uri)
	if !strings.Contains(info, `"virtual-size": 1073741824`) {
		t.Errorf("qemu-img info: %s", info)
	}
	source := randomFile(t, 1<<30)
	start := time.Now()
	mustRun(t, 10*time.Minute, "nbdcopy", "--flush", source, uri)
	t.Logf("nbdcopy 1 GiB in: %v", time.Since(start).Round(time.Millisecond))
	back := filepath.Join(t.TempDir(), "back.img")
	start = time.Now()
	mustRun(t, 10*time.Minute, "nbdcopy", other, back)
	t.Logf("nbdcopy 1 GiB out through another node: %v", time.Since(start).Round(time.Millisecond))
	mustRun(t, 5*time.Minute, "cmp", source, back)
	if out, err := run(t, 5*time.Minute, "qemu-img", "compare", "-f", "raw", "-F", "raw", source, other); err != nil {
		t.Fatalf("qemu-img compare: %v %s", err, out)
	}
	// qemu-img convert in, then compare: a different writer path (zeroes
	// go out as WRITE_ZEROES).
	small := randomFile(t, 48<<20)
	mustRun(t, 5*time.Minute, "qemu-img", "convert", "-n", "-f", "raw", "-O", "raw", small, uri)
	converted := filepath.Join(t.TempDir(), "converted.img")
	mustRun(t, 5*time.Minute, "qemu-img", "convert", "-f", "raw", "-O", "raw", other, converted)
	mustRun(t, time.Minute, "cmp", "-n", strconv.Itoa(48<<20), small, converted)

	size := strings.TrimSpace(mustRun(t, time.Minute, "nbdinfo", "--size", other))
	if size != "1073741824" {
		t.Errorf("nbdinfo --size = %q", size)
	}
	for _, can := range []string{"structured-reply", "multi-conn", "trim", "fua", "zero", "flush"} {
		if _, err := run(t, time.Minute, "nbdinfo", "--can", can, other); err != nil {
			t.Errorf("nbdinfo --can %s: not offered (%v)", can, err)
		}
	}
	list := mustRun(t, time.Minute, "nbdinfo", "--list", "--json", "nbd+unix:///?socket="+c.Node(2).NBDSocket())
	if !strings.Contains(list, `"export-name": "big"`) {
		t.Errorf("nbdinfo --list does not list the vdi: %s", list)
	}
	checkReplicas(t, c, 3)
}

// TestFioVerify: fio's nbd engine, 4 jobs (4 connections) at iodepth 16,
// mixed random reads and writes, crc32c verification.
func TestFioVerify(t *testing.T) {
	need(t, "fio")
	c := dataCluster(t, 3, 3, "fio", "256M")
	job := fmt.Sprintf(`[global]
ioengine=nbd
uri=%s
rw=randrw
bs=4k
bsrange=4k-64k
iodepth=16
numjobs=4
size=48M
offset_increment=64M
verify=crc32c
verify_fatal=1
verify_backlog=1024
verify_state_save=0
group_reporting=1
[job]
`, c.Node(0).NBDURI("fio"))
	path := filepath.Join(t.TempDir(), "verify.fio")
	os.WriteFile(path, []byte(job), 0o644)
	out, err := run(t, 10*time.Minute, "fio", "--output-format=normal", path)
	if err != nil || strings.Contains(out, "verify: bad") || strings.Contains(out, "error=") {
		t.Fatalf("fio verify: %v\n%s", err, out)
	}
	t.Logf("fio: %s", lastLines(out, 12))
	checkReplicas(t, c, 3)
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// TestFlushedDataSurvivesKillAll: write and flush, kill -9 every node,
// restart them all: everything flushed reads back.
func TestFlushedDataSurvivesKillAll(t *testing.T) {
	need(t, "qemu-io")
	c := dataCluster(t, 3, 3, "disk", "64M")
	var commands []string
	for i, w := range patternWrites {
		commands = append(commands, fmt.Sprintf("write -P 0x%02x %d %d", 0x10+i, w.offset, w.length))
	}
	commands = append(commands, "flush")
	args := append([]string{"-t", "writeback"}, commands...) // plain WRITEs, then FLUSH
	if out, err := qemuIOArgs(t, c.Node(1).NBDURI("disk"), args...); err != nil {
		t.Fatalf("write+flush: %v\n%s", err, out)
	}
	for _, n := range c.Nodes() {
		n.Kill()
	}
	for i := len(c.Nodes()) - 1; i >= 0; i-- {
		c.Node(i).Restart()
	}
	waitAgreement(t, c, []int{0, 1, 2}, 60*time.Second)
	// The writer's lock may have outlived qemu-io (its release was not
	// committed before the kill): it goes when the log has node 1's new
	// process, which may follow agreement on the epochs by a moment.
	testcluster.WaitFor(t, 30*time.Second, "the writer's lock to go after the restart", func() (bool, error) {
		locks, err := client(c, 2).Locks(ctx(t))
		return err == nil && len(locks) == 0, fmt.Errorf("%v, locks %+v", err, locks)
	})
	verifyPatterns(t, c.Node(2).NBDURI("disk"))
	checkReplicas(t, c, 3)
}

func qemuIOArgs(t *testing.T, uri string, args ...string) (string, error) {
	t.Helper()
	full := []string{"-f", "raw"}
	for i := 0; i < len(args); i++ {
		if args[i] == "-t" {
			full = append(full, "-t", args[i+1])
			i++
			continue
		}
		if args[i] == "-r" {
			full = append(full, "-r")
			continue
		}
		full = append(full, "-c", args[i])
	}
	out, err := run(t, 2*time.Minute, "qemu-io", append(full, uri)...)
	if err == nil && strings.Contains(out, "failed") {
		err = fmt.Errorf("qemu-io reported a failure")
	}
	return out, err
}

// TestSecondWriterRefused: while a client holds the VDI open for writing
// through node A, a writer through node B is refused with an error naming
// A; read-only opens work; once A's client leaves, B may write, at once.
// An exclusive VDI refuses a second writer, naming the holder; `herd vdi
// unlock --force` takes the lock from a holder that went quiet (a paused
// client) and fences it: its later writes fail and never land.
func TestSecondWriterRefused(t *testing.T) {
	need(t, "qemu-io")
	needLibnbd(t)
	c := dataCluster(t, 3, 3, "disk", "64M")
	herd(t, c, 0, "vdi", "set", "disk", "--exclusive")
	holder := startNBDWriter(t, "holder through node 0", c.Node(0).NBDURI("disk"))
	if _, failure := holder.write(0, 0x68); failure != "" {
		t.Fatal(failure)
	}
	holderID := nodeID(t, c, 0)
	out, err := qemuIO(t, c.Node(1).NBDURI("disk"), "write -P 0x55 0 4096")
	if err == nil || !strings.Contains(out, holderID) {
		t.Fatalf("second writer through node 1 was not refused naming node %s: %v\n%s", holderID, err, out)
	}
	readOnly := c.Node(2).NBDURI("ro/disk")
	if out, err := run(t, time.Minute, "qemu-io", "-r", "-f", "raw", "-c", "read -P 0x68 0 1", readOnly); err != nil || strings.Contains(out, "failed") { // 'h'
		t.Fatalf("read-only open while a writer holds the vdi: %v\n%s", err, out)
	}
	if out, err := run(t, time.Minute, "qemu-io", "-f", "raw", "-c", "write 0 512", readOnly); err == nil && !strings.Contains(out, "failed") {
		t.Fatalf("a write through the read-only export succeeded:\n%s", out)
	}

	// The holder is paused (SIGSTOP). Without --force nothing happens.
	if err := holder.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	if _, stderr, err := c.Herd(ctx(t), 1, "vdi", "unlock", "disk"); err == nil || !strings.Contains(stderr, "--force") {
		t.Fatalf("vdi unlock without --force: %v %s", err, stderr)
	}
	herd(t, c, 1, "vdi", "unlock", "disk", "--force")
	testcluster.WaitFor(t, 30*time.Second, "a writer through node 1 after the forced unlock", func() (bool, error) {
		out, err := qemuIO(t, c.Node(1).NBDURI("disk"), "write -P 0x77 0 4096")
		return err == nil, fmt.Errorf("%v: %s", err, lastLines(out, 3))
	})
	// The old holder wakes up and writes: refused, and nothing of it lands.
	if err := holder.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if _, failure := holder.write(0, 0x99); failure == "" {
		t.Fatal("the fenced holder's write succeeded")
	}
	if out, err := qemuIOReadOnly(t, c.Node(2).NBDURI("ro/disk"), "read -P 0x77 0 4096"); err != nil {
		t.Fatalf("after the fenced holder's write: %v\n%s", err, out)
	}
	st := vdiStatus(t, c, 2, "disk")
	fenced := 0
	for _, o := range st.Opens {
		if o.Fenced {
			fenced++
		}
	}
	if fenced != 1 || !st.VDI.Exclusive {
		t.Errorf("status after the forced unlock: %+v", st)
	}
	if events := herd(t, c, 2, "events", "--last", "20"); !strings.Contains(events, "broken") {
		t.Errorf("the forced unlock is not in the cluster's events:\n%s", events)
	}
	holder.in.Close() // the holder disconnects
	testcluster.WaitFor(t, 15*time.Second, "node 1 to get the vdi after the holder left", func() (bool, error) {
		out, err := qemuIO(t, c.Node(1).NBDURI("disk"), "write -P 0x55 0 4096", "read -P 0x55 0 4096")
		if err != nil {
			return false, fmt.Errorf("%v: %s", err, out)
		}
		return true, nil
	})

	// A VM stopped on one host and started at once on the next: the
	// writable open waits the moment the closed writer's lock needs to
	// go, instead of failing as busy.
	for i := 0; i < 6; i++ {
		from, to := c.Node(i%3), c.Node((i+1)%3)
		pattern := 0x60 + i
		if out, err := qemuIO(t, from.NBDURI("disk"), fmt.Sprintf("write -P %#x 0 4096", pattern)); err != nil {
			t.Fatalf("write %d through node %d: %v\n%s", i, i%3, err, out)
		}
		if out, err := qemuIO(t, to.NBDURI("disk"), fmt.Sprintf("read -P %#x 0 4096", pattern)); err != nil {
			t.Fatalf("writable open through node %d right after node %d's client closed: %v\n%s", (i+1)%3, i%3, err, lastLines(out, 5))
		}
	}
}
