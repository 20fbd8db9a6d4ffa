package e2e

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/api"
	"github.com/herd-storage/herd/internal/maintenance"
	"github.com/herd-storage/herd/internal/object"
	"github.com/herd-storage/herd/internal/testcluster"
)

// objectPath is the file of object oid on node i (failing the test when
// the node has none).
func objectPath(t *testing.T, c *testcluster.Cluster, i int, oid uint64) string {
	t.Helper()
	matches, _ := filepath.Glob(filepath.Join(c.Node(i).DataDir(), "objects", "*", fmt.Sprintf("%016x", oid)))
	if len(matches) != 1 {
		t.Fatalf("node %d holds %d files of object %016x", i, len(matches), oid)
	}
	return matches[0]
}

// rot flips one bit of the data byte at object offset in node i's copy,
// behind herd's back; it returns the byte's good value.
func rot(t *testing.T, c *testcluster.Cluster, i int, oid uint64, offset int64) byte {
	t.Helper()
	f, err := os.OpenFile(objectPath(t, c, i, oid), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var b [1]byte
	if _, err := f.ReadAt(b[:], objectDataOffset+offset); err != nil {
		t.Fatal(err)
	}
	good := b[0]
	b[0] ^= 0x04
	if _, err := f.WriteAt(b[:], objectDataOffset+offset); err != nil {
		t.Fatal(err)
	}
	return good
}

// byteAt reads the data byte at object offset in node i's copy.
func byteAt(t *testing.T, c *testcluster.Cluster, i int, oid uint64, offset int64) (byte, error) {
	f, err := os.Open(objectPath(t, c, i, oid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	var b [1]byte
	_, err = f.ReadAt(b[:], objectDataOffset+offset)
	return b[0], err
}

// qemuIOReadOnly runs qemu-io read-only: reads through the "ro/" export
// need no writer lock, so one node's reads never wait for the lock a
// client just closed on another to be released.
func qemuIOReadOnly(t *testing.T, uri string, commands ...string) (string, error) {
	t.Helper()
	return qemuIOArgs(t, uri, append([]string{"-r"}, commands...)...)
}

// waitRestored waits until node i's copy has good at offset again.
func waitRestored(t *testing.T, c *testcluster.Cluster, i int, oid uint64, offset int64, good byte) {
	t.Helper()
	testcluster.WaitFor(t, time.Minute, fmt.Sprintf("node %d's copy of %016x at %d to be repaired", i, oid, offset), func() (bool, error) {
		b, err := byteAt(t, c, i, oid, offset)
		return err == nil && b == good, fmt.Errorf("byte %#x, want %#x (%v)", b, good, err)
	})
}

// Data checksums: rot in one replica's object file (header intact) is never
// served: reads through every node return the right bytes, the copy is
// repaired block by block and the counters move; with two of three
// replicas damaged in different blocks the same; with every replica
// damaged in one block only that block fails, and the log names it; the
// scrub finds rot in data nobody reads and repairs it.
func TestChecksumsCatchAndRepairRot(t *testing.T) {
	need(t, "qemu-io")
	c := dataCluster(t, 3, 3, "vm1", "64M")
	if out, err := qemuIO(t, c.Node(0).NBDURI("vm1"), "write -P 0xa5 0 16M", "flush"); err != nil {
		t.Fatalf("write: %v\n%s", err, out)
	}
	vdi, err := client(c, 0).VDI(ctx(t), "vm1")
	if err != nil {
		t.Fatal(err)
	}
	data := func(index uint32) uint64 { return uint64(object.DataOID(object.VDIID(vdi.ID), index)) }
	const block = 4096

	// A hot object, one replica: node 1 has just read it.
	if out, err := qemuIOReadOnly(t, c.Node(1).NBDURI("ro/vm1"), "read -P 0xa5 4M 4M"); err != nil {
		t.Fatalf("read: %v\n%s", err, out)
	}
	good := rot(t, c, 1, data(1), 3*block+17)
	for i := 0; i < 3; i++ {
		if out, err := qemuIOReadOnly(t, c.Node(i).NBDURI("ro/vm1"), "read -P 0xa5 4M 4M"); err != nil {
			t.Fatalf("read through node %d with rot on node 1: %v\n%s", i, err, lastLines(out, 5))
		}
	}
	waitRestored(t, c, 1, data(1), 3*block+17, good)

	// Two of three replicas damaged, in different blocks of a cold
	// object.
	rot(t, c, 0, data(2), 5*block)
	rot(t, c, 1, data(2), 6*block+4095)
	for _, i := range []int{0, 1} {
		if out, err := qemuIOReadOnly(t, c.Node(i).NBDURI("ro/vm1"), "read -P 0xa5 8M 4M"); err != nil {
			t.Fatalf("read through node %d with rot on nodes 0 and 1: %v\n%s", i, err, lastLines(out, 5))
		}
	}
	waitRestored(t, c, 0, data(2), 5*block, good)
	waitRestored(t, c, 1, data(2), 6*block+4095, good)

	// Every replica damaged in one block: that block fails, its
	// neighbours read.
	for i := 0; i < 3; i++ {
		rot(t, c, i, data(3), 9*block+100)
	}
	offset := 12<<20 + 9*block
	if out, err := qemuIOReadOnly(t, c.Node(2).NBDURI("ro/vm1"), fmt.Sprintf("read -P 0xa5 %d 4096", offset)); err == nil || !strings.Contains(out, "Input/output error") {
		t.Fatalf("a block damaged on every replica: want an I/O error, got %v:\n%s", err, out)
	}
	if out, err := qemuIOReadOnly(t, c.Node(2).NBDURI("ro/vm1"), fmt.Sprintf("read -P 0xa5 %d 4096", offset+block), fmt.Sprintf("read -P 0xa5 %d 4096", offset-block)); err != nil {
		t.Fatalf("the blocks next to the lost one: %v\n%s", err, lastLines(out, 5))
	}
	testcluster.WaitFor(t, 10*time.Second, "node 2's log to name the lost block", func() (bool, error) {
		logged, err := os.ReadFile(c.Node(2).LogPath())
		return strings.Contains(string(logged), "fails its checksum on every replica") &&
			strings.Contains(string(logged), fmt.Sprintf("object_offset=%d", 9*block)), err
	})

	nodes, err := client(c, 0).Nodes(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	var found, repaired uint64
	for _, n := range nodes {
		found += n.ChecksumErrors
		repaired += n.BlocksRepaired
	}
	// 1 + 2 repaired blocks; the lost block was seen on all three.
	if found < 6 || repaired < 3 {
		t.Errorf("node list counts %d bad blocks and %d repaired, want at least 6 and 3", found, repaired)
	}

	// The scrub: rot in object 0, which nobody reads again, found and
	// repaired at the rate asked for.
	good = rot(t, c, 2, data(0), 7*block+1)
	before := scrubStatus(t, c, 2)
	// A client writes and verifies elsewhere on the disk meanwhile.
	fio, fioOut := startFio(t, "during-scrub", c.Node(1).NBDURI("vm1"), "rw=randwrite\nbs=4k\niodepth=4\noffset=32M\nsize=16M\nverify=crc32c\nverify_fatal=1\n")
	if _, stderr, err := c.Herd(ctx(t), 0, "scrub", "start", "--max-rate", "8MiB/s"); err != nil {
		t.Fatalf("scrub start: %v %s", err, stderr)
	}
	var after api.ScrubEntry
	testcluster.WaitFor(t, 2*time.Minute, "a complete scrub pass on node 2", func() (bool, error) {
		after = scrubStatus(t, c, 2)
		return after.Status.LastComplete.After(before.Status.LastComplete), fmt.Errorf("%+v", after.Status)
	})
	waitRestored(t, c, 2, data(0), 7*block+1, good)
	if err := fio.Wait(); err != nil {
		t.Fatalf("fio during the scrub: %v\n%s", err, lastLines(fioOut.String(), 10))
	}
	st := after.Status
	if st.ChecksumErrors <= before.Status.ChecksumErrors || st.Repaired <= before.Status.Repaired || st.Unrepairable == 0 {
		t.Errorf("scrub counts %+v: want a chunk found and repaired (object 0) and one unrepairable (object 3)", st)
	}
	seconds := st.LastComplete.Sub(st.PassStarted).Seconds()
	rate := float64(st.BytesVerified) / seconds
	t.Logf("scrub pass on node 2: %d objects, %d bytes in %.1f s: %.1f MiB/s at a limit of 8 MiB/s", st.Done, st.BytesVerified, seconds, rate/(1<<20))
	if st.BytesVerified < 16<<20 {
		t.Errorf("scrub verified %d bytes, want at least the 16 MiB written", st.BytesVerified)
	}
	if rate > 8<<20*1.25+float64(1<<20)/seconds {
		t.Errorf("scrub read %.1f MiB/s, above its 8 MiB/s limit", rate/(1<<20))
	}
	// The same in node 2's metrics.
	families, _ := scrape(t, c.Node(2).AdminAddr(), c.Token())
	if passes, lost := value(families, "herd_scrub_passes_total", nil), value(families, "herd_scrub_unrepairable_blocks_total", nil); passes < 1 || lost < 1 {
		t.Errorf("node 2's metrics: herd_scrub_passes_total %v, herd_scrub_unrepairable_blocks_total %v; want at least 1 each", passes, lost)
	}

	// vdi check decides by checksums: a bad block on one replica is
	// found and, with --repair, rewritten from a good one; the block bad
	// on every replica is named by its disk offset and left alone.
	good = rot(t, c, 0, data(1), 20*block)
	lostGood, _ := byteAt(t, c, 1, data(3), 9*block+100)
	var report maintenance.CheckReport
	out, _, err := c.Herd(ctx(t), 1, "--json", "vdi", "check", "vm1")
	if err == nil {
		t.Fatal("vdi check passed a VDI with bad and lost blocks")
	}
	if jsonErr := json.Unmarshal([]byte(out), &report); jsonErr != nil {
		t.Fatalf("vdi check --json: %v\n%s", jsonErr, out)
	}
	t.Logf("vdi check: %+v", report)
	if report.LostBlocks != 1 || report.BadBlocks != 4 || report.Objects == 0 ||
		!strings.Contains(strings.Join(report.Problems, "\n"), fmt.Sprintf("disk offset %d of vm1", offset)) {
		t.Errorf("vdi check: %+v; want 1 lost block at disk offset %d and 4 bad blocks", report, offset)
	}
	if _, _, err := c.Herd(ctx(t), 1, "vdi", "check", "vm1", "--repair"); err == nil {
		t.Error("vdi check --repair passed a VDI with a lost block")
	}
	if b, err := byteAt(t, c, 0, data(1), 20*block); err != nil || b != good {
		t.Errorf("after check --repair node 0's bad block reads %#x (%v), want %#x", b, err, good)
	}
	for i := 0; i < 3; i++ {
		if b, err := byteAt(t, c, i, data(3), 9*block+100); err != nil || b != lostGood {
			t.Errorf("check --repair rewrote the lost block on node %d: %#x, want it left as it was (%#x)", i, b, lostGood)
		}
	}
}

func scrubStatus(t *testing.T, c *testcluster.Cluster, i int) api.ScrubEntry {
	t.Helper()
	out, stderr, err := c.Herd(ctx(t), 0, "--json", "scrub", "status")
	if err != nil {
		t.Fatalf("scrub status: %v %s", err, stderr)
	}
	var entries []api.ScrubEntry
	if err := json.Unmarshal([]byte(out), &entries); err != nil {
		t.Fatal(err)
	}
	id := nodeID(t, c, i)
	for _, e := range entries {
		if e.Node == id {
			return e
		}
	}
	t.Fatalf("scrub status has no entry for node %d", i)
	return api.ScrubEntry{}
}

// A deep scrub pass compares each object's replicas across nodes: a copy
// whose blocks all verify but whose content differs from the others'
// under the same stamp (as a bug could leave) is reported.
func TestDeepScrubFindsDifferingReplicas(t *testing.T) {
	need(t, "qemu-io")
	c := testcluster.Start(t, testcluster.Options{Nodes: 3, ExtraArgs: []string{"--scrub-deep-every", "1"}})
	waitAgreement(t, c, []int{0, 1, 2}, 30*time.Second)
	for _, args := range [][]string{{"cluster", "format", "--copies", "3"}, {"vdi", "create", "vm1", "16M"}} {
		if _, stderr, err := c.Herd(ctx(t), 0, args...); err != nil {
			t.Fatalf("%v: %v %s", args, err, stderr)
		}
	}
	if out, err := qemuIO(t, c.Node(0).NBDURI("vm1"), "write -P 0x3c 0 8M", "flush"); err != nil {
		t.Fatalf("write: %v\n%s", err, out)
	}
	vdi, err := client(c, 0).VDI(ctx(t), "vm1")
	if err != nil {
		t.Fatal(err)
	}
	// Node 2's copy of object 1 gets other bytes in block 2, with the
	// checksum they need: it verifies, it just differs.
	path := objectPath(t, c, 2, uint64(object.DataOID(object.VDIID(vdi.ID), 1)))
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	other := make([]byte, 4096)
	for i := range other {
		other[i] = 0x3d
	}
	castagnoli := crc32.MakeTable(crc32.Castagnoli)
	var entry [4]byte
	binary.LittleEndian.PutUint32(entry[:], crc32.Checksum(other, castagnoli)^crc32.Checksum(make([]byte, 4096), castagnoli))
	if _, err := f.WriteAt(other, objectDataOffset+2*4096); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(entry[:], 4096+2*4); err != nil {
		t.Fatal(err)
	}
	f.Close()

	if _, stderr, err := c.Herd(ctx(t), 0, "scrub", "start"); err != nil {
		t.Fatalf("scrub start: %v %s", err, stderr)
	}
	var mismatched, compared uint64
	testcluster.WaitFor(t, 2*time.Minute, "a deep pass on every node to report the differing replica", func() (bool, error) {
		mismatched, compared = 0, 0
		done := 0
		for i := 0; i < 3; i++ {
			st := scrubStatus(t, c, i).Status
			mismatched += st.Mismatched
			compared += st.Compared
			if st.Passes > 0 {
				done++
			}
		}
		return done == 3 && mismatched > 0, fmt.Errorf("%d of 3 nodes finished a pass; %d objects compared, %d differing", done, compared, mismatched)
	})
	if mismatched != 1 || compared == 0 {
		t.Errorf("deep scrub: %d objects compared, %d differing; want 1 differing", compared, mismatched)
	}
}
