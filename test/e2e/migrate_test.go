package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/testcluster"
	"github.com/herd-storage/herd/internal/testenv"
	"github.com/herd-storage/herd/internal/vmtest"
)

// migrationBlocks is how many numbered 4 KiB blocks the guest writes.
const migrationBlocks = 700

// migrationScript writes blocks 0..migrationBlocks-1 in order with
// O_DIRECT, each numbered, flushing every 10th, and prints each number.
const migrationScript = `
i=0
while [ $i -lt ` + "700" + ` ]; do
	yes "herd-migrate block=$i" | head -c 4096 > /tmp/b
	dd if=/tmp/b of=$DISK bs=4096 seek=$i count=1 conv=notrunc oflag=direct 2> /tmp/dd.log || { echo "herd-migrate FAIL block $i: $(cat /tmp/dd.log)"; exit 1; }
	if [ $((i % 10)) -eq 9 ]; then blockdev --flushbufs $DISK || { echo "herd-migrate FAIL flush at $i"; exit 1; }; fi
	echo "herd-migrate wrote $i"
	usleep 20000
	i=$((i + 1))
done
sync
echo "herd-migrate all written"
`

func migrationBlock(i int) []byte {
	return bytes.Repeat([]byte(fmt.Sprintf("herd-migrate block=%d\n", i)), 4096)[:4096]
}

// qmp is a QMP connection to one QEMU.
type qmp struct {
	t      *testing.T
	conn   net.Conn
	reader *bufio.Reader
}

func dialQMP(t *testing.T, path string) *qmp {
	t.Helper()
	var conn net.Conn
	testcluster.WaitFor(t, time.Minute, "QEMU's QMP socket "+path, func() (bool, error) {
		var err error
		conn, err = net.Dial("unix", path)
		return err == nil, err
	})
	t.Cleanup(func() { conn.Close() })
	q := &qmp{t: t, conn: conn, reader: bufio.NewReader(conn)}
	q.line() // the greeting
	q.do("qmp_capabilities", nil)
	return q
}

func (q *qmp) line() map[string]any {
	q.t.Helper()
	q.conn.SetReadDeadline(time.Now().Add(time.Minute))
	raw, err := q.reader.ReadBytes('\n')
	if err != nil {
		q.t.Fatalf("qmp: %v", err)
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		q.t.Fatalf("qmp: %v: %s", err, raw)
	}
	return m
}

// do runs a command and returns its "return" value (events are skipped).
func (q *qmp) do(command string, arguments map[string]any) any {
	q.t.Helper()
	request := map[string]any{"execute": command}
	if arguments != nil {
		request["arguments"] = arguments
	}
	data, _ := json.Marshal(request)
	if _, err := q.conn.Write(append(data, '\n')); err != nil {
		q.t.Fatalf("qmp %s: %v", command, err)
	}
	for {
		m := q.line()
		if e, ok := m["error"]; ok {
			q.t.Fatalf("qmp %s: %v", command, e)
		}
		if r, ok := m["return"]; ok {
			return r
		}
	}
}

func (q *qmp) migrationStatus() string {
	q.t.Helper()
	r, _ := q.do("query-migrate", nil).(map[string]any)
	status, _ := r["status"].(string)
	return status
}

// vm is one QEMU process of the migrating guest.
type vm struct {
	name    string
	console *syncBuffer
	qmp     *qmp
	done    chan struct{}
	result  vmtest.Result
	err     error
}

func startVM(t *testing.T, ctx context.Context, name string, c *testcluster.Cluster, node int, incoming string) *vm {
	t.Helper()
	dir := filepath.Join(t.TempDir(), name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	v := &vm{name: name, console: &syncBuffer{}, done: make(chan struct{})}
	socket := filepath.Join(dir, "qmp.sock")
	go func() {
		defer close(v.done)
		v.result, v.err = vmtest.Run(ctx, vmtest.Options{
			NBDURI:      c.Node(node).NBDURI("vm"),
			GuestScript: migrationScript,
			MemoryMiB:   192,
			Timeout:     8 * time.Minute,
			QMP:         socket,
			Incoming:    incoming,
			Console:     v.console,
			WorkDir:     dir,
		})
	}()
	v.qmp = dialQMP(t, socket)
	return v
}

var wroteLine = regexp.MustCompile(`herd-migrate wrote (\d+)`)

// lastBlock is the last block number this VM's console reported, or -1.
func (v *vm) lastBlock() int {
	matches := wroteLine.FindAllStringSubmatch(v.console.String(), -1)
	if len(matches) == 0 {
		return -1
	}
	n, _ := strconv.Atoi(matches[len(matches)-1][1])
	return n
}

func (v *vm) waitBlock(t *testing.T, n int) {
	t.Helper()
	testcluster.WaitFor(t, 4*time.Minute, fmt.Sprintf("%s's guest to write block %d", v.name, n), func() (bool, error) {
		if strings.Contains(v.console.String(), "herd-migrate FAIL") {
			t.Fatalf("the guest failed on %s:\n%s", v.name, lastLines(v.console.String(), 10))
		}
		return v.lastBlock() >= n, fmt.Errorf("at block %d", v.lastBlock())
	})
}

func freeTCPPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// migrate moves the guest from src to a new QEMU on node, waiting for
// the migration to complete, and stops src.
func migrate(t *testing.T, ctx context.Context, c *testcluster.Cluster, src *vm, name string, node int) *vm {
	t.Helper()
	address := fmt.Sprintf("tcp:127.0.0.1:%d", freeTCPPort(t))
	dst := startVM(t, ctx, name, c, node, address)
	started := time.Now()
	src.qmp.do("migrate", map[string]any{"uri": address})
	testcluster.WaitFor(t, 3*time.Minute, "the migration from "+src.name+" to "+name, func() (bool, error) {
		status := src.qmp.migrationStatus()
		if status == "failed" || status == "cancelled" {
			t.Fatalf("migration %s -> %s: %s", src.name, name, status)
		}
		return status == "completed", fmt.Errorf("status %s", status)
	})
	t.Logf("migrated %s -> %s (node %d) in %v, the guest at block %d", src.name, name, node, time.Since(started).Round(time.Millisecond), src.lastBlock())
	// The source QEMU stays, paused with its disk open, until the guest
	// has written on: as with libvirt, which ends it only once the
	// destination runs. The writer lock moves by a handover.
	dst.waitBlock(t, src.lastBlock()+20)
	src.qmp.do("quit", nil)
	<-src.done
	return dst
}

// TestLiveMigration moves a running VM between hosts, each using its own
// herd node, while its guest writes a numbered sequence of blocks: node 0
// to node 1, back to node 0, then a migration to node 2 cancelled half
// way (the guest goes on through node 0). Every block the guest wrote is
// then read from the host, and the writer lock followed the guest.
func TestLiveMigration(t *testing.T) {
	testenv.Require(t, "a VM (qemu-system-x86, a kernel, busybox-static)", vmtest.Available())
	need(t, "qemu-io")
	c := dataCluster(t, 3, 3, "vm", "64M") // open to handover: the default
	ctx, cancel := contextWithTimeout(t, 12*time.Minute)
	defer cancel()
	lockNode := func() string {
		st := vdiStatus(t, c, 2, "vm")
		if st.Lock == nil {
			return ""
		}
		return st.Lock.Node
	}

	a := startVM(t, ctx, "source-node0", c, 0, "")
	a.waitBlock(t, 40)
	b := migrate(t, ctx, c, a, "dest-node1", 1)
	b.waitBlock(t, b.lastBlock()+10) // it keeps writing, through node 1
	node1 := nodeID(t, c, 1)
	if got := lockNode(); got != node1 {
		t.Fatalf("after the migration to node 1 the writer lock is on %q, want node 1 (%s)", got, node1)
	}

	back := migrate(t, ctx, c, b, "back-node0", 0)
	back.waitBlock(t, back.lastBlock()+10)
	if got, node0 := lockNode(), nodeID(t, c, 0); got != node0 {
		t.Fatalf("after migrating back the writer lock is on %q, want node 0 (%s)", got, node0)
	}

	// A migration cancelled half way: slowed down so that it is still
	// copying memory when it is cancelled.
	address := fmt.Sprintf("tcp:127.0.0.1:%d", freeTCPPort(t))
	abandoned := startVM(t, ctx, "cancelled-node2", c, 2, address)
	back.qmp.do("migrate-set-parameters", map[string]any{"max-bandwidth": 2 << 20})
	back.qmp.do("migrate", map[string]any{"uri": address})
	testcluster.WaitFor(t, time.Minute, "the slowed migration to be under way", func() (bool, error) {
		status := back.qmp.migrationStatus()
		return status == "active", fmt.Errorf("status %s", status)
	})
	back.qmp.do("migrate_cancel", nil)
	testcluster.WaitFor(t, time.Minute, "the migration to be cancelled", func() (bool, error) {
		status := back.qmp.migrationStatus()
		return status == "cancelled", fmt.Errorf("status %s", status)
	})
	// The destination may already have given up on its own.
	abandoned.qmp.conn.Write([]byte(`{"execute":"quit"}` + "\n"))
	<-abandoned.done
	at := back.lastBlock()
	back.waitBlock(t, at+20) // the source goes on

	<-back.done
	if back.err != nil || back.result.ExitCode != 0 || !strings.Contains(back.result.Console, "herd-migrate all written") {
		t.Fatalf("the guest did not finish on node 0 (rc %d): %v\n%s", back.result.ExitCode, back.err, lastLines(back.console.String(), 20))
	}

	// Every block the guest wrote, read from the host through node 2.
	data, err := vmtest.ReadFromHost(ctx, c.Node(2).NBDURI("ro/vm"), 0, migrationBlocks*4096)
	if err != nil {
		t.Fatal(err)
	}
	for i := range migrationBlocks {
		if got := data[i*4096 : (i+1)*4096]; !bytes.Equal(got, migrationBlock(i)) {
			t.Fatalf("block %d reads %q..., want %q...", i, got[:40], migrationBlock(i)[:40])
		}
	}
	st := vdiStatus(t, c, 2, "vm")
	if st.VDI.Handovers < 2 {
		t.Errorf("%d handovers in the log, want at least 2 (node 0 to 1 and back)", st.VDI.Handovers)
	}
	t.Logf("all %d blocks read back; %d handovers", migrationBlocks, st.VDI.Handovers)
}
