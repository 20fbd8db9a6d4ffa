package e2e

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/object"
	"github.com/herd-storage/herd/internal/testcluster"
)

// TestVDIsOwnCopies: `vdi create --copies N` on a 4-node cluster
// formatted with 3 copies (a new cluster is at the feature level that
// allows it: finalize-upgrade has nothing to do). A VDI of 2
// copies and one of 4 are created and written through qemu-io, and each
// object file of theirs is on exactly 2 (resp. 4) nodes. Then a node is
// killed -9: recovery on the 3 survivors gives the VDI of 2 exactly 2
// copies (never the format's 3) and the VDI of 4 one copy on each of
// the 3 (copies beyond the nodes there are cannot be placed: writes and
// recovery place as many as there are nodes, and no copy of it is
// deleted as surplus). Both read back through another node. The node
// returns: the VDI of 4 has its 4 copies again, the VDI of 2 still 2.
func TestVDIsOwnCopies(t *testing.T) {
	need(t, "qemu-io")
	c := testcluster.Start(t, testcluster.Options{Nodes: 4})
	all := []int{0, 1, 2, 3}
	waitAgreement(t, c, all, 30*time.Second)
	if _, stderr, err := c.Herd(ctx(t), 0, "cluster", "format", "--copies", "3"); err != nil {
		t.Fatalf("format: %v %s", err, stderr)
	}
	// A new cluster starts at the highest feature level (the refusal
	// below it is TestRollingUpgradeFromOlderBuild's); finalize-upgrade
	// has nothing to do.
	if out, stderr, err := c.Herd(ctx(t), 0, "cluster", "finalize-upgrade"); err != nil || !strings.Contains(out, fmt.Sprintf("feature level %d", cluster.SupportedLevel)) {
		t.Fatalf("finalize-upgrade on a new cluster: %v %s%s", err, out, stderr)
	}
	ids := map[string]uint32{}
	for name, copies := range map[string]string{"two": "2", "four": "4"} {
		if _, stderr, err := c.Herd(ctx(t), 0, "vdi", "create", name, "64M", "--copies", copies); err != nil {
			t.Fatalf("vdi create %s --copies %s: %v %s", name, copies, err, stderr)
		}
		for _, i := range all {
			testcluster.WaitFor(t, 10*time.Second, fmt.Sprintf("node %d to know vdi %s", i, name), func() (bool, error) {
				v, err := client(c, i).VDI(ctx(t), name)
				ids[name] = v.ID
				return err == nil && strconv.Itoa(v.Copies) == copies, fmt.Errorf("%+v %v", v, err)
			})
		}
	}
	for _, name := range []string{"two", "four"} {
		writePatterns(t, c.Node(0).NBDURI(name))
	}
	want := map[string]int{"two": 2, "four": 4}
	waitVDICopies(t, c, ids, want, all)

	c.Node(2).Kill()
	survivors := []int{0, 1, 3}
	testcluster.WaitFor(t, time.Minute, "an epoch without node 2", func() (bool, error) {
		info, err := client(c, 0).Info(ctx(t))
		return err == nil && info.NodesAlive == 3, fmt.Errorf("%+v %v", info, err)
	})
	waitRecovered(t, c, 3)
	// Three nodes place at most 3 copies: the VDI of 4 has one on each.
	want = map[string]int{"two": 2, "four": 3}
	waitVDICopies(t, c, ids, want, survivors)
	for _, name := range []string{"two", "four"} {
		verifyPatterns(t, c.Node(1).NBDURI(name))
	}

	c.Node(2).Restart()
	waitAgreement(t, c, all, time.Minute)
	waitRecovered(t, c, 4)
	want = map[string]int{"two": 2, "four": 4}
	waitVDICopies(t, c, ids, want, all)
	for _, name := range []string{"two", "four"} {
		verifyPatterns(t, c.Node(3).NBDURI(name))
	}
}

// waitVDICopies waits until every object file of each VDI (by name, with
// its id) is on exactly want[name] of the given nodes, every copy
// identical, and fails the test if that does not happen within 2 minutes.
func waitVDICopies(t *testing.T, c *testcluster.Cluster, ids map[string]uint32, want map[string]int, nodes []int) {
	t.Helper()
	names := map[uint32]string{}
	for name, id := range ids {
		names[id] = name
	}
	var summary string
	testcluster.WaitFor(t, 2*time.Minute, fmt.Sprintf("exactly %v copies of the VDIs' objects on nodes %v", want, nodes), func() (bool, error) {
		objects := objectFiles(t, c, nodes...)
		counts := map[string]int{}
		for file, holders := range objects {
			oid, err := strconv.ParseUint(file, 16, 64)
			if err != nil {
				return false, fmt.Errorf("object file %s: %v", file, err)
			}
			name, ok := names[uint32(object.VDI(object.OID(oid)))]
			if !ok {
				return false, fmt.Errorf("object %s of vdi %d, which is neither of %v", file, object.VDI(object.OID(oid)), ids)
			}
			if len(holders) != want[name] {
				var on []int
				for node := range holders {
					on = append(on, node)
				}
				slices.Sort(on)
				return false, fmt.Errorf("object %s of vdi %s is on nodes %v, want %d copies", file, name, on, want[name])
			}
			var first []byte
			n := 0
			for node, data := range holders {
				if n == 0 {
					first = data
				} else if string(first) != string(data) {
					return false, fmt.Errorf("object %s of vdi %s differs on node %d", file, name, node)
				}
				n++
			}
			counts[name]++
		}
		for name := range want {
			if counts[name] == 0 {
				return false, fmt.Errorf("no object of vdi %s on nodes %v", name, nodes)
			}
		}
		summary = fmt.Sprint(counts)
		return true, nil
	})
	t.Logf("objects per vdi %s, each with exactly %v identical copies on nodes %v", summary, want, nodes)
}
