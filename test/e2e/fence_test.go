package e2e

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/object"
	"github.com/herd-storage/herd/internal/testcluster"
)

// TestStaleCopyNeverServed is the paper's Fig. 4 on real processes, with
// copies=2: every object is written (pattern 0x11) on six nodes; B is
// killed and keeps its copies as they are; every object is written again
// (0x22) on the five others; then two of them, P, are killed together, so
// the objects the five-node epoch placed on P hold their newest data only
// on dead nodes, and B returns with an older copy of some of them.
// Reading such an object must fail with an I/O error, never return B's
// 0x11, through B or another node, and `herd vdi check` must report it
// unavailable; objects with a surviving current copy read 0x22. When one
// of P returns, the object is served again, with 0x22.
//
// The stale copies are B's because B is down while the others move on: a
// live node deletes a copy the epoch places elsewhere as soon as every
// replica holds a current one (recovery's removeSurplus), so an older
// copy on a live node lasts only moments, and a test that counted on
// one would race with its deletion. Five nodes are left when B is down
// so that all five are voters: whichever two P are, three voters of five
// keep the quorum (of four nodes, three voters, the two killed would
// have to be the non-voter and a voter, and a leader that notices the
// voter first promotes the non-voter, dead too, and loses its quorum).
func TestStaleCopyNeverServed(t *testing.T) {
	need(t, "qemu-io")
	const vdis, size = 6, 64 << 20
	const b = 1 // the node that returns with stale copies
	c := dataCluster(t, 6, 2, "fig0", "64M")
	for v := 1; v < vdis; v++ {
		herd(t, c, 0, "vdi", "create", fmt.Sprintf("fig%d", v), "64M")
	}
	writeAll := func(node int, value byte) {
		t.Helper()
		for v := 0; v < vdis; v++ {
			if out, err := qemuIO(t, c.Node(node).NBDURI(fmt.Sprintf("fig%d", v)), fmt.Sprintf("write -P %#x 0 %d", value, size), "flush"); err != nil {
				t.Fatalf("writing %#x on fig%d through node %d: %v\n%s", value, v, node, err, out)
			}
		}
	}
	writeAll(0, 0x11)
	ids := map[string]uint32{}
	for v := 0; v < vdis; v++ {
		vdi, err := client(c, 0).VDI(ctx(t), fmt.Sprintf("fig%d", v))
		if err != nil {
			t.Fatal(err)
		}
		ids[vdi.Name] = vdi.ID
	}

	c.Node(b).Kill()
	five := []int{0, 2, 3, 4, 5}
	waitAgreement(t, c, five, time.Minute)
	waitRecovered(t, c, 5)
	// The placement of the five-node epoch and nothing else: every copy
	// B's leaving moved is in place, every copy placed elsewhere deleted.
	waitExactCopies(t, c, 2, five)

	// P is chosen from the placement (every copy on the five is where the
	// epoch puts it; B's are as it left them): the pair that holds the
	// most objects of which B holds a copy too, in VDIs whose map object
	// has a copy outside P (else the whole VDI is unavailable and its
	// objects prove nothing one by one). The rewrite goes through a node
	// outside P, so that no VDI's writer dies with P.
	type objectRef struct {
		vdi   string
		index int
		oid   uint64
	}
	vdiOf := func(oid uint64) string {
		for name, id := range ids {
			if uint32(oid>>32)&0xffffff == id {
				return name
			}
		}
		return ""
	}
	var files map[string]map[int][]byte
	holdersOf := func(oid uint64, value byte) []int {
		var out []int
		for node, data := range files[fmt.Sprintf("%016x", oid)] {
			if value == 0 || len(data) > 0 && data[0] == value {
				out = append(out, node)
			}
		}
		sort.Ints(out)
		return out
	}
	usable := func(vdi string, p []int) bool {
		for _, node := range holdersOf(uint64(object.MapOID(object.VDIID(ids[vdi]), 0)), 0) {
			if node != b && !slices.Contains(p, node) {
				return true
			}
		}
		return false
	}
	dataObjects := func() []objectRef {
		var out []objectRef
		for name := range files {
			oid, err := strconv.ParseUint(name, 16, 64)
			if err == nil && object.Type(object.OID(oid)) == object.TypeData && vdiOf(oid) != "" {
				out = append(out, objectRef{vdiOf(oid), int(uint32(oid)), oid})
			}
		}
		return out
	}
	files = objectFiles(t, c)
	var stale []objectRef
	var p []int
	for i, first := range five {
		for _, second := range five[i+1:] {
			pair := []int{first, second}
			var onlyP []objectRef
			for _, o := range dataObjects() {
				placed := slices.DeleteFunc(holdersOf(o.oid, 0), func(n int) bool { return n == b })
				if usable(o.vdi, pair) && slices.Equal(placed, pair) && slices.Contains(holdersOf(o.oid, 0x11), b) {
					onlyP = append(onlyP, o)
				}
			}
			if len(onlyP) > len(stale) {
				stale, p = onlyP, pair
			}
		}
	}
	if len(stale) == 0 {
		t.Fatal("no object placed on two nodes of which B holds a copy too, in a VDI whose map survives them: the scenario needs one")
	}
	var left []int
	for _, i := range five {
		if !slices.Contains(p, i) {
			left = append(left, i)
		}
	}
	writeAll(left[0], 0x22)

	// Now the objects of P hold 0x22 there only and B's 0x11; the others
	// have a 0x22 copy on a node left.
	files = objectFiles(t, c)
	for _, o := range stale {
		if newer := holdersOf(o.oid, 0x22); !slices.Equal(newer, p) || !slices.Contains(holdersOf(o.oid, 0x11), b) {
			t.Fatalf("%s object %d after the rewrite: 0x22 on nodes %v (want P = %v), 0x11 on %v (want node %d among them)\n%s", o.vdi, o.index, newer, p, holdersOf(o.oid, 0x11), b, describeObject(t, c, ids[o.vdi], o.index))
		}
	}
	var survives []objectRef
	for _, o := range dataObjects() {
		if usable(o.vdi, p) && slices.ContainsFunc(holdersOf(o.oid, 0x22), func(n int) bool { return slices.Contains(left, n) }) {
			survives = append(survives, o)
		}
	}
	t.Logf("P = nodes %v; %d data objects newest only on P with an older copy on node %d, %d with a newest copy on nodes %v", p, len(stale), b, len(survives), left)

	for _, i := range p {
		c.Node(i).Kill()
	}
	testcluster.WaitFor(t, 2*failoverDeadline, "an epoch without P", func() (bool, error) {
		info, err := client(c, left[0]).Info(ctx(t))
		return err == nil && info.NodesAlive == 3, fmt.Errorf("%+v %v", info, err)
	})
	waitRecovered(t, c, 3)
	c.Node(b).Restart()
	back := append([]int{b}, left...)
	waitAgreement(t, c, back, time.Minute)
	waitRecovered(t, c, 4)

	// B, alive again, still holds its older copy of each: the copies
	// that would be served if the fence let them.
	onB := objectFiles(t, c, b)
	for _, o := range stale {
		if data := onB[fmt.Sprintf("%016x", o.oid)][b]; len(data) == 0 || data[0] != 0x11 {
			t.Fatalf("node %d no longer holds its older copy of %s object %d, which no live node can replace\n%s", b, o.vdi, o.index, describeObject(t, c, ids[o.vdi], o.index))
		}
	}
	objectRange := func(o objectRef) string { return fmt.Sprintf("%d %d", o.index<<22, 4<<20) }
	read := map[string]bool{}
	for _, o := range survives {
		if read[o.vdi] {
			continue
		}
		if out, err := qemuIO(t, c.Node(left[0]).NBDURI(o.vdi), "read -P 0x22 "+objectRange(o)); err != nil {
			t.Fatalf("%s, object %d, which has a current copy on a survivor: %v\n%s\n%s", o.vdi, o.index, err, lastLines(out, 10), describeObject(t, c, ids[o.vdi], o.index))
		}
		read[o.vdi] = true
	}
	for _, o := range stale {
		for _, through := range []int{b, left[0]} {
			out, err := qemuIO(t, c.Node(through).NBDURI(o.vdi), fmt.Sprintf("read %d 512", o.index<<22))
			if err == nil || !strings.Contains(out, "Input/output error") {
				t.Fatalf("%s object %d, newest only on the dead P, was served through node %d: %v\n%s\n%s", o.vdi, o.index, through, err, lastLines(out, 8), describeObject(t, c, ids[o.vdi], o.index))
			}
		}
		report, _, _ := c.Herd(ctx(t), left[1], "vdi", "check", o.vdi)
		if !strings.Contains(report, "unavailable") {
			t.Fatalf("vdi check does not report %s object %d unavailable:\n%s", o.vdi, o.index, report)
		}
	}
	t.Logf("%d objects refused while P was down", len(stale))

	c.Node(p[0]).Restart()
	waitAgreement(t, c, append(back, p[0]), time.Minute)
	for _, o := range stale {
		testcluster.WaitFor(t, time.Minute, fmt.Sprintf("%s object %d to be served again", o.vdi, o.index), func() (bool, error) {
			out, err := qemuIO(t, c.Node(b).NBDURI(o.vdi), "read -P 0x22 "+objectRange(o))
			return err == nil, fmt.Errorf("%v: %s", err, lastLines(out, 3))
		})
	}
	vdisRead := map[string]bool{}
	for _, o := range stale {
		if vdisRead[o.vdi] {
			continue
		}
		vdisRead[o.vdi] = true
		if out, err := qemuIO(t, c.Node(left[1]).NBDURI(o.vdi), fmt.Sprintf("read -P 0x22 0 %d", size)); err != nil {
			t.Fatalf("%s after node %d returned: %v\n%s", o.vdi, p[0], err, lastLines(out, 5))
		}
	}
}

// describeObject says, for failure reports, what every node holds of an
// object: its epoch stamp and how many bytes hold each value.
func describeObject(t *testing.T, c *testcluster.Cluster, vdi uint32, index int) string {
	name := fmt.Sprintf("%016x", uint64(vdi)<<32|uint64(uint32(index)))
	var b strings.Builder
	for _, n := range c.Nodes() {
		matches, _ := filepath.Glob(filepath.Join(n.DataDir(), "objects", "*", name))
		for _, path := range matches {
			data, err := os.ReadFile(path)
			if err != nil || len(data) < 4096 {
				fmt.Fprintf(&b, "node %d: %v (%d bytes)\n", n.Index(), err, len(data))
				continue
			}
			counts := map[byte]int{}
			for _, x := range data[4096:] {
				counts[x]++
			}
			fmt.Fprintf(&b, "node %d: stamp %d, bytes by value %v\n", n.Index(), binary.LittleEndian.Uint64(data[24:]), counts)
		}
	}
	return b.String()
}
