package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// prefixWriter writes 64 KiB blocks in order (block i filled with a
// pattern derived from i), prints each acknowledged block number, and on
// "check" verifies a snapshot is a prefix: blocks 0..k-1 hold their
// pattern, k.. are zeros.
const prefixWriter = `
import nbd, sys
mode, uri, base, count = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
B = 65536
def block(i):
    return (b"herd-block-%08d:" % i) * (B // 20) + b"." * (B % 20)
h = nbd.NBD()
h.connect_uri(uri)
if mode == "write":
    for i in range(count):
        h.pwrite(block(i), base + i * B)
        print(i, flush=True)
    h.flush()
else:
    k = None
    for i in range(count):
        data = h.pread(B, base + i * B)
        if data == block(i):
            if k is not None:
                print("block %d written after a hole at %d" % (i, k)); sys.exit(1)
        elif data == bytes(B):
            if k is None:
                k = i
        else:
            print("block %d torn or foreign" % i); sys.exit(1)
    print("prefix", count if k is None else k)
h.shutdown()
`

// TestSnapshotUnderLoad takes snapshots while fio (verify=crc32c) and a
// sequential writer run through the same node: fio's verification passes
// and each snapshot is an exact prefix of the sequential writes that
// includes every write acknowledged before the snapshot was asked for.
func TestSnapshotUnderLoad(t *testing.T) {
	need(t, "fio")
	needLibnbd(t)
	c := dataCluster(t, 3, 3, "live", "128M")
	uri := c.Node(0).NBDURI("live")
	script := filepath.Join(t.TempDir(), "prefix.py")
	os.WriteFile(script, []byte(prefixWriter), 0o644)
	const blocks, base = 512, 64 << 20 // 32 MiB of sequential writes at 64 MiB

	job := filepath.Join(t.TempDir(), "live.fio")
	os.WriteFile(job, []byte(fmt.Sprintf(`[live]
ioengine=nbd
uri=%s
rw=randwrite
bs=4k
iodepth=8
size=32M
verify=crc32c
verify_fatal=1
verify_state_save=0
`, uri)), 0o644)
	fio := exec.Command("fio", job)
	var fioOut strings.Builder
	fio.Stdout, fio.Stderr = &fioOut, &fioOut
	if err := fio.Start(); err != nil {
		t.Fatal(err)
	}
	writer := exec.Command("/usr/bin/python3", script, "write", uri, strconv.Itoa(base), strconv.Itoa(blocks))
	acks, _ := writer.StdoutPipe()
	var writerErr strings.Builder
	writer.Stderr = &writerErr
	if err := writer.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fio.Process.Kill(); writer.Process.Kill(); fio.Wait(); writer.Wait() })

	// Snapshot three times as the acknowledgements pass 100, 250, 400.
	var acked int
	lines := make([]byte, 0, 64)
	buffer := make([]byte, 1)
	readAck := func() bool {
		lines = lines[:0]
		for {
			if _, err := acks.Read(buffer); err != nil {
				return false
			}
			if buffer[0] == '\n' {
				acked, _ = strconv.Atoi(string(lines))
				acked++
				return true
			}
			lines = append(lines, buffer[0])
		}
	}
	type taken struct {
		tag   string
		acked int
	}
	var snapshots []taken
	for _, at := range []int{100, 250, 400} {
		for acked < at {
			if !readAck() {
				t.Fatalf("writer stopped at %d acknowledged blocks: %s", acked, writerErr.String())
			}
		}
		tag := fmt.Sprintf("at%d", at)
		start := time.Now()
		herd(t, c, 1, "vdi", "snapshot", "live", "--tag", tag) // through another node: forwarded to the writer's
		t.Logf("snapshot %s with %d blocks acknowledged, under load, took %v", tag, acked, time.Since(start).Round(time.Millisecond))
		snapshots = append(snapshots, taken{tag, acked})
	}
	for readAck() {
	}
	if err := writer.Wait(); err != nil {
		t.Fatalf("sequential writer: %v %s", err, writerErr.String())
	}
	if err := fio.Wait(); err != nil || strings.Contains(fioOut.String(), "verify: bad") {
		t.Fatalf("fio verify during snapshots: %v\n%s", err, fioOut.String())
	}
	for _, s := range snapshots {
		out, err := run(t, time.Minute, "/usr/bin/python3", script, "check", c.Node(2).NBDURI("live@"+s.tag), strconv.Itoa(base), strconv.Itoa(blocks))
		if err != nil {
			t.Fatalf("snapshot %s: %v %s", s.tag, err, out)
		}
		k, _ := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(out), "prefix")))
		if k < s.acked {
			t.Fatalf("snapshot %s holds %d blocks, but %d were acknowledged before it was asked for", s.tag, k, s.acked)
		}
		t.Logf("snapshot %s: a prefix of %d blocks (%d acknowledged before it)", s.tag, k, s.acked)
	}
}
