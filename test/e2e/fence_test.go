package e2e

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/testcluster"
)

// TestStaleCopyNeverServed is the paper's Fig. 4 on real processes, with
// copies=2: objects written (pattern 0x11) on A, B, C; D and E join and
// take over some objects; everything is written again (0x22), so objects
// placed on D and E only are newer there than the copies B and C still
// hold; D and E are killed together. Reading such an object must fail
// with an I/O error, never return 0x11, and `herd vdi check` must report
// it unavailable; objects with a surviving current copy read 0x22. When D
// returns, the object is served again, with 0x22.
func TestStaleCopyNeverServed(t *testing.T) {
	need(t, "qemu-io")
	const vdis, size = 6, 64 << 20
	c := dataCluster(t, 3, 2, "fig0", "64M")
	for v := 1; v < vdis; v++ {
		herd(t, c, 0, "vdi", "create", fmt.Sprintf("fig%d", v), "64M")
	}
	for v := 0; v < vdis; v++ {
		if out, err := qemuIO(t, c.Node(0).NBDURI(fmt.Sprintf("fig%d", v)), fmt.Sprintf("write -P 0x11 0 %d", size), "flush"); err != nil {
			t.Fatalf("writing fig%d: %v\n%s", v, err, out)
		}
	}
	d, e := c.AddNode(), c.AddNode()
	waitAgreement(t, c, []int{0, 1, 2, 3, 4}, time.Minute)
	waitRecovered(t, c, 5)
	for v := 0; v < vdis; v++ {
		if out, err := qemuIO(t, c.Node(0).NBDURI(fmt.Sprintf("fig%d", v)), fmt.Sprintf("write -P 0x22 0 %d", size), "flush"); err != nil {
			t.Fatalf("rewriting fig%d: %v\n%s", v, err, out)
		}
	}
	// Which data objects hold 0x22 on D and E only, and which have a
	// 0x22 copy on A, B or C?
	ids := map[string]uint32{}
	for v := 0; v < vdis; v++ {
		vdi, err := client(c, 0).VDI(ctx(t), fmt.Sprintf("fig%d", v))
		if err != nil {
			t.Fatal(err)
		}
		ids[vdi.Name] = vdi.ID
	}
	type object struct {
		vdi   string
		index int
	}
	var onlyDE, survives []object
	for name, holders := range objectFiles(t, c) {
		oid, err := strconv.ParseUint(name, 16, 64)
		if err != nil || oid>>56 != 0 {
			continue // map objects
		}
		var vdi string
		for n, id := range ids {
			if uint32(oid>>32)&0xffffff == id {
				vdi = n
			}
		}
		newer := map[int]bool{}
		for node, data := range holders {
			if len(data) > 0 && data[0] == 0x22 {
				newer[node] = true
			}
		}
		o := object{vdi, int(uint32(oid))}
		switch {
		case len(newer) == 2 && newer[d.Index()] && newer[e.Index()]:
			onlyDE = append(onlyDE, o)
		case newer[0] || newer[1] || newer[2]:
			survives = append(survives, o)
		}
	}
	t.Logf("%d data objects newest only on D and E, %d with a newest copy on A, B or C", len(onlyDE), len(survives))
	if len(onlyDE) == 0 {
		t.Fatal("no object moved to D and E: the scenario needs one")
	}

	before, err := client(c, 0).Info(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	d.Kill()
	e.Kill()
	testcluster.WaitFor(t, 2*failoverDeadline, "an epoch without D and E", func() (bool, error) {
		info, err := client(c, 0).Info(ctx(t))
		return err == nil && info.Epoch > before.Epoch && info.NodesAlive == 3, fmt.Errorf("%+v %v", info, err)
	})
	waitRecovered(t, c, 3)
	objectRange := func(o object) string { return fmt.Sprintf("%d %d", o.index<<22, 4<<20) }

	// A VDI is usable for the check when its map object has a current
	// copy on A, B or C: an object of it with a surviving copy reads.
	usable := map[string]bool{}
	for _, o := range survives {
		if usable[o.vdi] {
			continue
		}
		out, err := qemuIO(t, c.Node(0).NBDURI(o.vdi), "read -P 0x22 "+objectRange(o))
		switch {
		case err == nil:
			usable[o.vdi] = true
		case strings.Contains(out, "Input/output error"):
			t.Logf("%s: unreadable (its map object lived on D and E): %s", o.vdi, strings.TrimSpace(out))
		default:
			t.Fatalf("%s, object %d, which has a current copy on a survivor: %v\n%s\n%s", o.vdi, o.index, err, lastLines(out, 10), describeObject(t, c, ids[o.vdi], o.index))
		}
	}
	checked := 0
	for _, o := range onlyDE {
		if !usable[o.vdi] {
			continue
		}
		out, err := qemuIO(t, c.Node(1).NBDURI(o.vdi), fmt.Sprintf("read %d 512", o.index<<22))
		if err == nil || !strings.Contains(out, "Input/output error") {
			t.Fatalf("%s object %d, newest only on the dead D and E, was served: %v\n%s\n%s", o.vdi, o.index, err, lastLines(out, 8), describeObject(t, c, ids[o.vdi], o.index))
		}
		report, _, _ := c.Herd(ctx(t), 2, "vdi", "check", o.vdi)
		if !strings.Contains(report, "unavailable") {
			t.Fatalf("vdi check does not report %s object %d unavailable:\n%s", o.vdi, o.index, report)
		}
		checked++
	}
	if checked == 0 {
		t.Fatal("no VDI with an object only on D and E had a readable map")
	}
	t.Logf("%d objects refused while D and E were down", checked)

	d.Restart()
	waitAgreement(t, c, []int{0, 1, 2, 3}, time.Minute)
	for _, o := range onlyDE {
		if !usable[o.vdi] {
			continue
		}
		testcluster.WaitFor(t, time.Minute, fmt.Sprintf("%s object %d to be served again", o.vdi, o.index), func() (bool, error) {
			out, err := qemuIO(t, c.Node(0).NBDURI(o.vdi), "read -P 0x22 "+objectRange(o))
			return err == nil, fmt.Errorf("%v: %s", err, lastLines(out, 3))
		})
	}
	for v := range usable {
		if out, err := qemuIO(t, c.Node(2).NBDURI(v), fmt.Sprintf("read -P 0x22 0 %d", size)); err != nil {
			t.Fatalf("%s after D returned: %v\n%s", v, err, lastLines(out, 5))
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
