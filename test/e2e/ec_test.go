package e2e

import (
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/object"
	"github.com/herd-storage/herd/internal/testcluster"
	"github.com/herd-storage/herd/internal/testenv"
	"github.com/herd-storage/herd/internal/vmtest"
)

// ecCluster starts a cluster of n nodes formatted with 3 copies and one
// VDI of the erasure-coding scheme given, known to every node.
func ecCluster(t *testing.T, n int, vdi, size, scheme string) (*testcluster.Cluster, uint32) {
	t.Helper()
	c := testcluster.Start(t, testcluster.Options{Nodes: n})
	var all []int
	for i := range n {
		all = append(all, i)
	}
	waitAgreement(t, c, all, 30*time.Second)
	if _, stderr, err := c.Herd(ctx(t), 0, "cluster", "format", "--copies", "3"); err != nil {
		t.Fatalf("format: %v %s", err, stderr)
	}
	if _, stderr, err := c.Herd(ctx(t), 0, "vdi", "create", vdi, size, "--ec", scheme); err != nil {
		t.Fatalf("vdi create %s --ec %s: %v %s", vdi, scheme, err, stderr)
	}
	var id uint32
	for _, i := range all {
		testcluster.WaitFor(t, 10*time.Second, fmt.Sprintf("node %d to know vdi %s", i, vdi), func() (bool, error) {
			v, err := client(c, i).VDI(ctx(t), vdi)
			id = v.ID
			return err == nil && v.EC == scheme, fmt.Errorf("%+v %v", v, err)
		})
	}
	return c, id
}

// ecChunks returns, for every data object of vdi that has chunks on the
// given nodes' disks, the nodes holding each of its chunk files (by
// chunk index and slot).
func ecChunks(t *testing.T, c *testcluster.Cluster, vdi uint32, nodes ...int) map[object.OID]map[[2]int][]int {
	t.Helper()
	out := map[object.OID]map[[2]int][]int{}
	for _, node := range nodes {
		// Names only: a chunk being written by a fold may be a file
		// shorter than its header for a moment.
		files, _ := filepath.Glob(filepath.Join(c.Node(node).DataDir(), "objects", "*", "*"))
		for _, path := range files {
			raw, err := strconv.ParseUint(filepath.Base(path), 16, 64)
			if err != nil || len(filepath.Base(path)) != 16 {
				continue // a temporary file, the journal
			}
			data, chunk, slot, ok := object.ChunkOf(object.OID(raw))
			if !ok || uint32(object.VDI(data)) != vdi {
				continue
			}
			if out[data] == nil {
				out[data] = map[[2]int][]int{}
			}
			out[data][[2]int{chunk, slot}] = append(out[data][[2]int{chunk, slot}], node)
		}
	}
	return out
}

// waitFolded waits until every data object of vdi with chunks has one
// generation of k+m chunks, each on its own node, and at least want
// objects have chunks.
func waitFolded(t *testing.T, c *testcluster.Cluster, vdi uint32, chunks, want int, nodes ...int) map[object.OID]map[[2]int][]int {
	t.Helper()
	var found map[object.OID]map[[2]int][]int
	testcluster.WaitFor(t, 2*time.Minute, fmt.Sprintf("every object of vdi %d folded into %d chunks on %d nodes", vdi, chunks, chunks), func() (bool, error) {
		found = ecChunks(t, c, vdi, nodes...)
		if len(found) < want {
			return false, fmt.Errorf("%d objects have chunks, want at least %d", len(found), want)
		}
		for oid, placed := range found {
			var on []int
			for _, holders := range placed {
				on = append(on, holders...)
			}
			slices.Sort(on)
			if len(placed) != chunks || len(slices.Compact(slices.Clone(on))) != chunks || len(on) != chunks {
				return false, fmt.Errorf("object %016x: chunks %v", oid, placed)
			}
		}
		return true, nil
	})
	return found
}

// ecPatternWrites are written after the first nodes failed, beside
// patternWrites (nbd_test.go), which they do not overlap.
var ecPatternWrites = []struct{ offset, length int64 }{
	{12 << 10, 8192}, {4<<20 + 4096, 4096}, {24 << 20, 3 << 20}, {40<<20 + 100, 300000},
}

func ecPatternCommands(verb string) []string {
	var commands []string
	for i, w := range ecPatternWrites {
		commands = append(commands, fmt.Sprintf("%s -P 0x%02x %d %d", verb, 0x60+i, w.offset, w.length))
	}
	return commands
}

// TestErasureCodedVDISurvivesTwoLostNodes: a 4+2 VDI on six nodes. The
// patterns written through node 0 are folded into chunks, one per node,
// when its client closes. Node 5 is killed -9; more is written through
// node 1 (five nodes cannot place six chunks: it stays in the replicated
// overlay), and everything reads back with node 5's chunks missing. Node 4
// is killed too: with two chunks of every stripe gone, everything still
// reads back, decoded from the four left, through a writer on node 2 and
// a ro/ reader on node 3. Both return; `vdi check` finds every chunk and
// replica present and right. A block rotted in a data chunk is read
// right through a writer, and rewritten.
func TestErasureCodedVDISurvivesTwoLostNodes(t *testing.T) {
	need(t, "qemu-io")
	c, id := ecCluster(t, 6, "cold", "64M", "4+2")
	all := []int{0, 1, 2, 3, 4, 5}
	if out, stderr, err := c.Herd(ctx(t), 0, "vdi", "info", "cold"); err != nil || !strings.Contains(out, "4+2") {
		t.Fatalf("vdi info cold: %v\n%s%s", err, out, stderr)
	}
	writePatterns(t, c.Node(0).NBDURI("cold"))
	// patternWrites touch objects 0, 1, 2, 4, 5, 8 and 15.
	folded := waitFolded(t, c, id, 6, 7, all...)
	t.Logf("%d objects folded into 6 chunks each", len(folded))

	c.Node(5).Kill()
	testcluster.WaitFor(t, time.Minute, "an epoch without node 5", func() (bool, error) {
		info, err := client(c, 0).Info(ctx(t))
		return err == nil && info.NodesAlive == 5, fmt.Errorf("%+v %v", info, err)
	})
	if out, err := qemuIO(t, c.Node(1).NBDURI("cold"), ecPatternCommands("write")...); err != nil {
		t.Fatalf("writing with node 5 down: %v\n%s", err, out)
	}
	verifyPatterns(t, c.Node(1).NBDURI("cold"))

	c.Node(4).Kill()
	testcluster.WaitFor(t, time.Minute, "an epoch without nodes 4 and 5", func() (bool, error) {
		info, err := client(c, 0).Info(ctx(t))
		return err == nil && info.NodesAlive == 4, fmt.Errorf("%+v %v", info, err)
	})
	verifyPatterns(t, c.Node(2).NBDURI("cold"))
	for _, uri := range []string{c.Node(2).NBDURI("cold"), c.Node(3).NBDURI("ro/cold")} {
		verifyPatternsReadOnly(t, uri)
		if out, err := qemuIOReadOnly(t, uri, ecPatternCommands("read")...); err != nil {
			t.Fatalf("reading through %s with nodes 4 and 5 down: %v\n%s", uri, err, out)
		}
	}

	c.Node(4).Restart()
	c.Node(5).Restart()
	waitAgreement(t, c, all, time.Minute)
	waitRecovered(t, c, 6)
	verifyPatterns(t, c.Node(5).NBDURI("cold"))
	if out, err := qemuIO(t, c.Node(4).NBDURI("cold"), ecPatternCommands("read")...); err != nil {
		t.Fatalf("reading through node 4 after the restarts: %v\n%s", err, out)
	}
	// The writer on node 4 closed: the overlay written while five nodes
	// ran is folded now.
	folded = waitFolded(t, c, id, 6, 7, all...)
	checkVDIClean(t, c, 0, "cold")

	// Rot in data chunk 1 of object 2 (disk bytes 9 MiB + 4 KiB..., a
	// pattern write's): the writer's read decodes the block and rewrites
	// the chunk.
	oid := object.DataOID(object.VDIID(id), 2)
	var node, slot int = -1, 0
	for key, holders := range folded[oid] {
		if key[0] == 1 {
			node, slot = holders[0], key[1]
		}
	}
	if node < 0 {
		t.Fatalf("object %016x has no chunk 1: %v", oid, folded[oid])
	}
	chunk := uint64(object.ChunkOID(oid, 1, slot))
	const within = 5*4096 + 123 // chunk 1 of 4+2 holds object bytes [1M, 2M)
	good := rot(t, c, node, chunk, within)
	offset := 2*4<<20 + 1<<20 + within
	if out, err := qemuIO(t, c.Node(0).NBDURI("cold"), fmt.Sprintf("read -P 0x13 %d 1", offset)); err != nil {
		t.Fatalf("reading over a rotten chunk block: %v\n%s", err, out)
	}
	waitRestored(t, c, node, chunk, within, good)
}

// TestErasureCodedVMBoots: a VM boots with its disk on a 2+1 VDI of a
// three-node cluster, writes, flushes and reads back; the host verifies
// the bytes through another node, and `vdi check` finds every chunk
// right.
func TestErasureCodedVMBoots(t *testing.T) {
	testenv.Require(t, "a VM (qemu-system-x86, a kernel, busybox-static)", vmtest.Available())
	c, id := ecCluster(t, 3, "vm", "256M", "2+1")
	// 32 MiB of 4 MiB objects: 8 folded into 3 chunks each once the
	// guest's connection closes.
	runDiskCheckVM(t, c, "vm", "herd-vm-ec", 32, func() { waitFolded(t, c, id, 3, 8, 0, 1, 2) })
	checkVDIClean(t, c, 1, "vm")
}

// TestErasureCodedRebuildSnapshotsAndTrim: a 2+1 VDI on four nodes,
// written and closed (folded: three chunks per object). The node
// holding the most chunks is killed -9 while nobody has the VDI open:
// the steward (a node of the epoch) rebuilds every object whose chunk
// was there onto the three left, and the VDI reads back and checks
// clean. Then, on the rebuilt VDI: a snapshot, a write after it, a clone
// of the snapshot and a TRIM, each read back as a VDI of copies reads.
func TestErasureCodedRebuildSnapshotsAndTrim(t *testing.T) {
	need(t, "qemu-io")
	c, id := ecCluster(t, 4, "arch", "64M", "2+1")
	all := []int{0, 1, 2, 3}
	writePatterns(t, c.Node(0).NBDURI("arch"))
	folded := waitFolded(t, c, id, 3, 7, all...)
	held := map[int]int{}
	for _, placed := range folded {
		for _, holders := range placed {
			for _, node := range holders {
				held[node]++
			}
		}
	}
	victim := 1
	for node, n := range held {
		if node != 0 && n > held[victim] {
			victim = node
		}
	}
	t.Logf("chunks per node %v: killing node %d", held, victim)
	c.Node(victim).Kill()
	survivors := without(all, victim)
	testcluster.WaitFor(t, time.Minute, fmt.Sprintf("an epoch without node %d", victim), func() (bool, error) {
		info, err := client(c, survivors[0]).Info(ctx(t))
		return err == nil && info.NodesAlive == 3, fmt.Errorf("%+v %v", info, err)
	})
	// Rebuilt: every object's three chunks on the three survivors.
	waitFolded(t, c, id, 3, 7, survivors...)
	verifyPatterns(t, c.Node(survivors[1]).NBDURI("arch"))
	checkVDIClean(t, c, survivors[0], "arch")

	node := survivors[0]
	herd(t, c, node, "vdi", "snapshot", "arch", "--tag", "s1")
	if out, err := qemuIO(t, c.Node(node).NBDURI("arch"), "write -P 0x77 8M 64k", "write -z 33M 4096"); err != nil {
		t.Fatalf("writing after the snapshot: %v\n%s", err, out)
	}
	if out, err := qemuIO(t, c.Node(node).NBDURI("arch"), "read -P 0x77 8M 64k", "read -P 0 33M 4096", "read -P 0x15 34607104 4096", "discard 0 4096", "read -P 0 0 4096"); err != nil {
		t.Fatalf("reading after the snapshot, a TRIM: %v\n%s", err, out)
	}
	verifyPatternsReadOnly(t, c.Node(survivors[2]).NBDURI("arch@s1"))
	herd(t, c, node, "vdi", "clone", "arch@s1", "fork")
	if out, err := qemuIO(t, c.Node(survivors[1]).NBDURI("fork"), "read -P 0x13 8388625 65536", "write -P 0x78 8M 4096", "read -P 0x78 8M 4096", "read -P 0x13 8392704 4096"); err != nil {
		t.Fatalf("the clone: %v\n%s", err, out)
	}
	verifyPatternsReadOnly(t, c.Node(survivors[2]).NBDURI("arch@s1"))
}

// verifyPatternsReadOnly is verifyPatterns through a read-only open (a
// snapshot, ro/NAME).
func verifyPatternsReadOnly(t *testing.T, uri string) {
	t.Helper()
	var reads []string
	for i, w := range patternWrites {
		reads = append(reads, fmt.Sprintf("read -P 0x%02x %d %d", 0x10+i, w.offset, w.length))
	}
	if out, err := qemuIOReadOnly(t, uri, reads...); err != nil {
		t.Fatalf("verifying patterns through %s: %v\n%s", uri, err, out)
	}
}
