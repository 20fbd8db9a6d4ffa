package e2e

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/nbdclient"
	"github.com/herd-storage/herd/internal/testcluster"
	"github.com/herd-storage/herd/internal/testenv"
)

// verifyingWrites is the fio workload of the failure tests: random writes
// of 4-64 KiB at depth 16, each verified by crc32c.
const verifyingWrites = "rw=randwrite\nbs=4k-64k\niodepth=16\nsize=256M\nio_size=768M\nverify=crc32c\nverify_fatal=1\nverify_backlog=512\n"

// TestNodeKilledDuringIO: kill -9 one node of 4 (not the one serving the
// client) while fio writes and verifies a 2 GiB disk through another: no I/O error,
// fio's verification passes, the survivors commit an epoch without the
// dead node, and recovery restores 3 identical replicas of every object
// on the 3 survivors.
func TestNodeKilledDuringIO(t *testing.T) {
	need(t, "fio")
	c := dataCluster(t, 4, 3, "disk", "2G")
	// Random writes over the whole 2 GiB disk, each read back and
	// verified ("while a 2 GiB VDI is being written and read").
	fio, out := startFio(t, "kill", c.Node(0).NBDURI("disk"), strings.Replace(verifyingWrites, "size=256M", "size=2G", 1))
	done := make(chan error, 1)
	go func() { done <- fio.Wait() }()
	// Kill node 2 once fio has written for a while.
	before, err := client(c, 0).Info(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	waitObjectCopies(t, c, 60)
	c.Node(2).Kill()
	killed := time.Now()
	testcluster.WaitFor(t, failoverDeadline, "an epoch without node 2", func() (bool, error) {
		info, err := client(c, 0).Info(ctx(t))
		return err == nil && info.Epoch > before.Epoch && info.NodesAlive == 3, fmt.Errorf("%+v %v", info, err)
	})
	t.Logf("epoch without the killed node after %v", time.Since(killed).Round(time.Millisecond))
	select {
	case err := <-done:
		if err != nil || strings.Contains(out.String(), "verify: bad") || strings.Contains(out.String(), "error=") {
			t.Fatalf("fio across the node failure: %v\n%s", err, lastLines(out.String(), 30))
		}
	case <-time.After(10 * time.Minute):
		t.Fatalf("fio did not finish:\n%s", lastLines(out.String(), 30))
	}
	t.Logf("fio: %s", lastLines(out.String(), 6))
	waitRecovered(t, c, 3)
	t.Logf("redundancy restored %v after the kill", time.Since(killed).Round(time.Millisecond))
	checkReplicasOn(t, c, 3, []int{0, 1, 3})
	// herd's own check agrees.
	checkVDIClean(t, c, 1, "disk")
}

// checkReplicasOn: every object found on the given nodes has `copies`
// identical replicas among them.
func checkReplicasOn(t *testing.T, c *testcluster.Cluster, copies int, nodes []int) {
	t.Helper()
	keep := map[int]bool{}
	for _, n := range nodes {
		keep[n] = true
	}
	objects := objectFiles(t, c, nodes...)
	if len(objects) == 0 {
		t.Fatalf("no object files on nodes %v: nothing to compare", nodes)
	}
	count := 0
	for oid, holders := range objects {
		var first []byte
		n := 0
		for node, data := range holders {
			if !keep[node] {
				continue
			}
			if n == 0 {
				first = data
			} else if string(first) != string(data) {
				t.Errorf("object %s differs between replicas (node %d)", oid, node)
			}
			n++
		}
		if n != copies {
			t.Errorf("object %s has %d replicas on nodes %v, want %d", oid, n, nodes, copies)
		}
		count++
	}
	t.Logf("%d objects, each with %d identical replicas on nodes %v", count, copies, nodes)
}

// TestNodeJoinRebalances: a 5th node joins a 4-node cluster holding data
// while fio writes and verifies: I/O goes on without errors, recovery
// gives the new node its share of the objects, and the copies the old
// nodes no longer need are deleted, leaving exactly 3 identical replicas
// of every object. Then the 5th node is killed: its share is re-created
// on the other four, again exactly 3 copies each.
func TestNodeJoinRebalances(t *testing.T) {
	need(t, "fio", "nbdcopy")
	c := dataCluster(t, 4, 3, "disk", "512M")
	mustRun(t, 5*time.Minute, "nbdcopy", "--flush", randomFile(t, 256<<20), c.Node(0).NBDURI("disk"))
	fio, out := startFio(t, "join", c.Node(1).NBDURI("disk"), "rw=randwrite\nbs=4k-64k\niodepth=16\noffset=256M\nsize=256M\nio_size=512M\nverify=crc32c\nverify_fatal=1\nverify_backlog=512\n")
	joined := c.AddNode()
	newID := nodeID(t, c, joined.Index())
	all := []int{0, 1, 2, 3, 4}
	waitAgreement(t, c, all, 30*time.Second)
	if err := fio.Wait(); err != nil || strings.Contains(out.String(), "verify: bad") {
		t.Fatalf("fio while a node joined: %v\n%s", err, lastLines(out.String(), 30))
	}
	waitRecovered(t, c, 5)
	waitExactCopies(t, c, 3, all)
	nodes, err := client(c, 0).Nodes(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	var mine uint64
	for _, n := range nodes {
		if n.ID == newID {
			mine = n.Objects
		}
	}
	objects := objectFiles(t, c)
	share := float64(len(objects)) * 3 / 5
	t.Logf("new node holds %d object copies; %d distinct objects, its share of 3 copies over 5 nodes is %.0f", mine, len(objects), share)
	if float64(mine) < share*0.7 || float64(mine) > share*1.3 {
		t.Fatalf("new node holds %d copies, want about %.0f", mine, share)
	}
	checkReplicasOn(t, c, 3, all)
	checkVDIClean(t, c, 4, "disk")

	// Remove it again.
	joined.Kill()
	four := []int{0, 1, 2, 3}
	waitAgreement(t, c, four, time.Minute)
	waitRecovered(t, c, 4)
	waitExactCopies(t, c, 3, four)
	checkReplicasOn(t, c, 3, four)
	if out, err := qemuIO(t, c.Node(2).NBDURI("disk"), "read 0 512M"); err != nil {
		t.Fatalf("reading the disk after the 5th node left: %v\n%s", err, out)
	}
}

// waitExactCopies waits until every object on the given nodes has
// exactly `copies` copies among them (surplus copies deleted). No object at
// all is not a success: every caller wrote data first.
func waitExactCopies(t *testing.T, c *testcluster.Cluster, copies int, nodes []int) {
	t.Helper()
	testcluster.WaitFor(t, 2*time.Minute, fmt.Sprintf("exactly %d copies of every object", copies), func() (bool, error) {
		objects := objectFiles(t, c, nodes...)
		if len(objects) == 0 {
			return false, fmt.Errorf("no object files on nodes %v", nodes)
		}
		for oid, holders := range objects {
			if len(holders) != copies {
				return false, fmt.Errorf("object %s has %d copies", oid, len(holders))
			}
		}
		return true, nil
	})
}

// TestNodePausedDuringIO: SIGSTOP one node of 4 while fio writes and
// verifies through another. The paused node keeps its connections open
// and never answers; requests to it must be abandoned when the cluster
// drops it, not hang: fio sees no error. After fio ends the node is
// resumed, rejoins, and recovery makes every replica identical.
func TestNodePausedDuringIO(t *testing.T) {
	need(t, "fio")
	c := dataCluster(t, 4, 3, "disk", "512M")
	fio, out := startFio(t, "pause", c.Node(0).NBDURI("disk"), verifyingWrites)
	waitObjectCopies(t, c, 60)
	c.Node(2).Pause()
	paused := time.Now()
	testcluster.WaitFor(t, failoverDeadline, "an epoch without the paused node", func() (bool, error) {
		info, err := client(c, 0).Info(ctx(t))
		return err == nil && info.NodesAlive == 3, fmt.Errorf("%+v %v", info, err)
	})
	t.Logf("epoch without the paused node after %v", time.Since(paused).Round(time.Millisecond))
	if err := fio.Wait(); err != nil || strings.Contains(out.String(), "verify: bad") || strings.Contains(out.String(), "error=") {
		t.Fatalf("fio across the paused node: %v\n%s", err, lastLines(out.String(), 30))
	}
	c.Node(2).Resume()
	waitAgreement(t, c, []int{0, 1, 2, 3}, 30*time.Second)
	waitRecovered(t, c, 4)
	checkVDIClean(t, c, 3, "disk")
}

// TestWriterNodeKilledMidWrite: the node serving a VDI's only writer is
// killed -9 in the middle of writes. The VDI is marked unclean; when it
// is opened for writing through another node, that node first makes
// every object's replicas identical, and `herd vdi check` is clean.
func TestWriterNodeKilledMidWrite(t *testing.T) {
	need(t, "fio", "qemu-io")
	c := dataCluster(t, 4, 3, "disk", "256M")
	fio, out := startFio(t, "writer", c.Node(1).NBDURI("disk"), "rw=randwrite\nbs=4k-256k\niodepth=32\nsize=256M\ntime_based=1\nruntime=600\n")
	waitObjectCopies(t, c, 120)
	killed := nodeID(t, c, 1)
	c.Node(1).Kill()
	fio.Wait()
	t.Logf("fio, cut off: %s", lastLines(out.String(), 2))
	three := []int{0, 2, 3}
	waitAgreement(t, c, three, time.Minute)
	testcluster.WaitFor(t, 30*time.Second, "the vdi to be marked unclean", func() (bool, error) {
		v, err := client(c, 0).VDI(ctx(t), "disk")
		return err == nil && v.Unclean, fmt.Errorf("%+v %v", v, err)
	})
	// Opening it for writing elsewhere repairs it first.
	if out, err := qemuIO(t, c.Node(2).NBDURI("disk"), "write -P 0x5a 0 4096", "flush"); err != nil {
		t.Fatalf("writing through node 2: %v\n%s", err, out)
	}
	v, err := client(c, 0).VDI(ctx(t), "disk")
	if err != nil || v.Unclean {
		t.Fatalf("vdi still unclean after a writer opened it: %+v %v", v, err)
	}
	logged, _ := os.ReadFile(c.Node(2).LogPath())
	if !strings.Contains(string(logged), "repaired vdi whose writer died") {
		t.Fatalf("node 2 did not repair the vdi before serving it; its log:\n%s", lastLines(string(logged), 20))
	}
	t.Logf("%s", lastLines(grepLines(string(logged), "repaired vdi"), 1))
	checkVDIClean(t, c, 3, "disk")

	// `herd events` tells the story, in order, the same through every node.
	want := []string{
		`vdi "disk" created`,
		`the writer lock on vdi "disk" was taken away (its node ` + killed + ` left)`,
		"node " + killed + " left",
		`vdi "disk" repaired`,
	}
	// A node may apply the last entries a moment after the others.
	var first string
	testcluster.WaitFor(t, 10*time.Second, "herd events to tell the story alike through nodes 0, 2 and 3", func() (bool, error) {
		first = ""
		for _, i := range three {
			out, stderr, err := c.Herd(ctx(t), i, "events")
			if err != nil {
				return false, fmt.Errorf("herd events through node %d: %v %s", i, err, stderr)
			}
			rest := out
			for _, w := range want {
				at := strings.Index(rest, w)
				if at < 0 {
					return false, fmt.Errorf("herd events through node %d lacks %q after the events before it:\n%s", i, w, out)
				}
				rest = rest[at+len(w):]
			}
			if first == "" {
				first = out
			} else if out != first {
				return false, fmt.Errorf("herd events differs between nodes:\n%s\n%s", first, out)
			}
		}
		return true, nil
	})
	t.Logf("herd events:\n%s", first)
}

func grepLines(text, substring string) string {
	var out []string
	for _, line := range strings.Split(text, "\n") {
		if strings.Contains(line, substring) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}

// TestNodeDiskFullDuringRecovery: a node joins with a disk far too small
// for the share its (overstated) capacity gives it. Recovery fills it to
// its reserve; the node says it is full and the cluster gives it no
// objects; recovery completes on the other nodes; no copy is lost: every
// object ends with exactly 2 identical copies and the disk reads back.
func TestNodeDiskFullDuringRecovery(t *testing.T) {
	need(t, "qemu-io", "mount", "umount")
	testenv.RequireRoot(t, "to mount a small tmpfs")
	// Mounted before the cluster starts, so that it is unmounted after
	// the nodes were killed (cleanups run in reverse order).
	small := t.TempDir()
	mustRun(t, time.Minute, "mount", "-t", "tmpfs", "-o", "size=40m,mode=0700", "tmpfs", small)
	t.Cleanup(func() {
		// t.Context() is over by now: not run().
		if out, err := exec.Command("umount", small).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v %s", small, err, out)
		}
	})
	c := dataCluster(t, 3, 2, "disk", "160M")
	if out, err := qemuIO(t, c.Node(0).NBDURI("disk"), "write -P 0x33 0 160M", "flush"); err != nil {
		t.Fatalf("writing: %v\n%s", err, out)
	}
	full := c.AddNodeWith("--disk", small, "--capacity", "1T")
	fullID := nodeID(t, c, full.Index())
	testcluster.WaitFor(t, 2*time.Minute, "the small node to say it is full", func() (bool, error) {
		nodes, err := client(c, 0).Nodes(ctx(t))
		if err != nil {
			return false, err
		}
		for _, n := range nodes {
			if n.ID == fullID {
				return n.Full, fmt.Errorf("full=%v, %d objects", n.Full, n.Objects)
			}
		}
		return false, fmt.Errorf("node %s not listed", fullID)
	})
	// The node logs it once the cluster has taken the mark, which the
	// node list may show a moment earlier.
	testcluster.WaitFor(t, 10*time.Second, "the full node to say so in its log", func() (bool, error) {
		logged, _ := os.ReadFile(full.LogPath())
		return strings.Contains(string(logged), "disks are nearly full"), fmt.Errorf("last lines:\n%s", lastLines(string(logged), 5))
	})
	list := herd(t, c, 0, "node", "list")
	if !strings.Contains(list, "FULL") {
		t.Fatalf("node list does not show the full node:\n%s", list)
	}
	t.Logf("%s", strings.TrimSpace(list))
	waitRecovered(t, c, 4)
	waitExactCopies(t, c, 2, []int{0, 1, 2, 3})
	checkReplicasOn(t, c, 2, []int{0, 1, 2, 3})
	for _, i := range []int{0, 3} {
		if out, err := qemuIO(t, c.Node(i).NBDURI("disk"), "read -P 0x33 0 160M"); err != nil {
			t.Fatalf("reading through node %d: %v\n%s", i, err, lastLines(out, 5))
		}
	}
}

// TestRecoveryLimits: `herd node recovery --max-rate --concurrency`
// changes every node's limits live, refuses bad values with a clear
// message, and bounds the copy rate: recovery after a node dies cannot
// finish sooner than its bytes at that rate allow, while a client reading
// the whole disk meanwhile is served (objects it needs are recovered on
// demand, unthrottled).
func TestRecoveryLimits(t *testing.T) {
	need(t, "qemu-io")
	c := dataCluster(t, 4, 2, "disk", "96M")
	if out, err := qemuIO(t, c.Node(0).NBDURI("disk"), "write -P 0x44 0 96M", "flush"); err != nil {
		t.Fatalf("writing: %v\n%s", err, out)
	}
	for _, bad := range [][]string{{"--max-rate", "lots"}, {"--max-rate", "100K"}, {"--concurrency", "0"}, {"--concurrency", "65"}} {
		_, stderr, err := c.Herd(ctx(t), 0, append([]string{"node", "recovery"}, bad...)...)
		if err == nil || !strings.Contains(stderr, "rate") && !strings.Contains(stderr, "concurrency") {
			t.Fatalf("node recovery %v: %v %q", bad, err, stderr)
		}
		t.Logf("node recovery %v: %s", bad, strings.TrimSpace(stderr))
	}
	const rate = 2 << 20
	out := herd(t, c, 1, "node", "recovery", "--max-rate", "2MiB/s", "--concurrency", "2")
	if strings.Count(out, "2 MiB/s x2") != 4 {
		t.Fatalf("limits not shown on all 4 nodes:\n%s", out)
	}
	before, err := client(c, 0).Info(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	c.Node(3).Kill()
	killed := time.Now()
	testcluster.WaitFor(t, failoverDeadline, "an epoch without node 3", func() (bool, error) {
		info, err := client(c, 0).Info(ctx(t))
		return err == nil && info.Epoch > before.Epoch && info.NodesAlive == 3, fmt.Errorf("%+v %v", info, err)
	})
	if out, err := qemuIO(t, c.Node(1).NBDURI("disk"), "read -P 0x44 0 96M"); err != nil {
		t.Fatalf("reading during throttled recovery: %v\n%s", err, lastLines(out, 5))
	}
	t.Logf("whole disk read during throttled recovery, %v after the kill", time.Since(killed).Round(time.Millisecond))
	waitRecovered(t, c, 3)
	elapsed := time.Since(killed)
	entries, err := client(c, 0).Recovery(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	var most uint64
	for _, e := range entries {
		most = max(most, e.Status.Bytes)
		if e.Status.Limits.MaxRate != rate || e.Status.Limits.Concurrency != 2 {
			t.Fatalf("node %s limits %+v", e.Node, e.Status.Limits)
		}
	}
	// The bucket starts with one object's worth of tokens.
	floor := time.Duration(float64(most-min(most, 4<<20)) / rate * float64(time.Second))
	t.Logf("recovery copied at most %d bytes on one node in %v; at 2 MiB/s it needs at least %v", most, elapsed.Round(time.Millisecond), floor)
	if most < 8<<20 {
		t.Fatalf("recovery copied only %d bytes on the busiest node: the test needs more", most)
	}
	if elapsed < floor {
		t.Fatalf("recovery finished in %v, faster than the rate limit allows (%v)", elapsed, floor)
	}
	herd(t, c, 0, "node", "recovery", "--max-rate", "0")
	checkReplicasOn(t, c, 2, []int{0, 1, 2})
}

// TestKillAllDuringWritesRestartReverse: a client writes 4 KiB blocks,
// each naming its sequence number, and flushes every 64 writes; every
// node is killed -9 in the middle of this, then all are restarted in
// reverse order. Every block flushed before the kill reads back as that
// write or a later one to the same block, intact, and the cluster serves
// writes again.
func TestKillAllDuringWritesRestartReverse(t *testing.T) {
	c := dataCluster(t, 4, 3, "disk", "64M")
	const blockSize, blocks = 4096, 64 << 20 / 4096
	block := func(b int, seq uint32) []byte {
		p := bytes.Repeat(binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint32(nil, uint32(b)), seq), blockSize/8)
		return p
	}
	conn, err := nbdclient.Dial(ctx(t), c.Node(1).NBDSocket(), "disk")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	flushed := make([]uint32, blocks) // per block: last write acknowledged before an acknowledged flush
	issued := make([]uint32, blocks)  // per block: last write sent
	var acked []int                   // blocks acknowledged since the last flush
	ackedSeq := map[int]uint32{}
	random := rand.New(rand.NewPCG(1, 2))
	stop := make(chan struct{})
	done := make(chan int)
	var progress atomic.Int64
	go func() {
		writes := 0
		defer func() { done <- writes }()
		for seq := uint32(1); ; seq++ {
			select {
			case <-stop:
				return
			default:
			}
			b := random.IntN(blocks)
			issued[b] = seq
			if err := conn.WriteAt(context.Background(), block(b, seq), uint64(b)*blockSize, 0); err != nil {
				return
			}
			writes++
			progress.Store(int64(writes))
			acked = append(acked, b)
			ackedSeq[b] = seq
			if seq%64 == 0 {
				if err := conn.Flush(context.Background()); err != nil {
					return
				}
				for _, b := range acked {
					flushed[b] = max(flushed[b], ackedSeq[b])
				}
				acked = acked[:0]
			}
		}
	}()
	testcluster.WaitFor(t, time.Minute, "2000 writes", func() (bool, error) {
		return progress.Load() >= 2000, fmt.Errorf("%d writes", progress.Load())
	})
	for _, n := range c.Nodes() {
		n.Kill()
	}
	close(stop)
	writes := <-done
	conn.Close()
	t.Logf("%d writes acknowledged before every node was killed", writes)
	if writes < 200 {
		t.Fatalf("only %d writes before the kill", writes)
	}
	for i := len(c.Nodes()) - 1; i >= 0; i-- {
		c.Node(i).Restart()
	}
	waitAgreement(t, c, []int{0, 1, 2, 3}, 90*time.Second)
	// The writer lock of node 1's killed process goes when the log has
	// node 1's new process (its incarnation), which may follow agreement
	// on the epochs by a moment.
	var reader *nbdclient.Conn
	testcluster.WaitFor(t, 30*time.Second, "the disk to open for writing after the restart", func() (bool, error) {
		var err error
		reader, err = nbdclient.Dial(ctx(t), c.Node(2).NBDSocket(), "disk")
		return err == nil, err
	})
	defer reader.Close()
	data := make([]byte, 64<<20)
	readCtx, cancel := contextWithTimeout(t, 2*time.Minute)
	defer cancel()
	if err := reader.ReadAt(readCtx, data, 0); err != nil {
		t.Fatalf("reading the disk after the restart: %v", err)
	}
	checked := 0
	for b := 0; b < blocks; b++ {
		if flushed[b] == 0 {
			continue
		}
		got := data[b*blockSize : (b+1)*blockSize]
		seq := binary.BigEndian.Uint32(got[4:])
		if !bytes.Equal(got, block(b, seq)) || seq < flushed[b] || seq > issued[b] {
			t.Fatalf("block %d: holds %x..., want write #%d (flushed) or a later one up to #%d", b, got[:8], flushed[b], issued[b])
		}
		checked++
	}
	t.Logf("%d flushed blocks intact after kill -9 of all nodes and a restart in reverse order", checked)
	reader.Close() // it opened the disk for writing
	if out, err := qemuIO(t, c.Node(3).NBDURI("disk"), "write -P 0x77 0 1M", "flush", "read -P 0x77 0 1M"); err != nil {
		t.Fatalf("writing after the restart: %v\n%s", err, out)
	}
}

// TestDamagedCopyRepaired: one replica's copy of an object gets a broken
// header on disk (as a failing disk would leave it). Reads through that
// node are served from another replica, with the right data, and the
// damaged copy is replaced; `herd vdi check` ends clean.
func TestDamagedCopyRepaired(t *testing.T) {
	need(t, "qemu-io")
	c := dataCluster(t, 3, 3, "disk", "16M")
	if out, err := qemuIO(t, c.Node(0).NBDURI("disk"), "write -P 0x66 0 16M", "flush"); err != nil {
		t.Fatalf("writing: %v\n%s", err, out)
	}
	victim := c.Node(1)
	matches, _ := filepath.Glob(filepath.Join(victim.DataDir(), "objects", "*", "00??????00000002"))
	if len(matches) != 1 {
		t.Fatalf("data object 2 on node 1: %v", matches)
	}
	path := matches[0]
	victim.Kill()
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("DAMAGED!"), 0); err != nil {
		t.Fatal(err)
	}
	f.Close()
	victim.Restart()
	waitAgreement(t, c, []int{0, 1, 2}, time.Minute)
	if out, err := qemuIO(t, victim.NBDURI("disk"), "read -P 0x66 0 16M"); err != nil {
		t.Fatalf("reading through the node with the damaged copy: %v\n%s", err, lastLines(out, 5))
	}
	testcluster.WaitFor(t, time.Minute, "the damaged copy to be replaced", func() (bool, error) {
		data, err := os.ReadFile(path)
		if err != nil {
			return false, err
		}
		return string(data[:8]) == "HERDOBJ1" && len(data) >= objectDataOffset && bytes.Count(data[objectDataOffset:], []byte{0x66}) == 4<<20, fmt.Errorf("header %q", data[:8])
	})
	checkVDIClean(t, c, 2, "disk")
	logged, _ := os.ReadFile(c.Node(0).LogPath())
	logged1, _ := os.ReadFile(victim.LogPath())
	t.Logf("%s", lastLines(grepLines(string(logged)+string(logged1), "damaged"), 3))
}
