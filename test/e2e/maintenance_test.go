package e2e

import (
	"fmt"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/testcluster"
)

// TestMaintenanceWindow: a node put in maintenance and then stopped is not
// re-replicated: its objects stay where they were and the survivors take
// copies only of the objects a client writes meanwhile (counted as object
// files); when it returns it fetches only those, and every object ends
// with 3 identical copies. A node whose window closes before it returns is
// re-replicated as after any failure.
func TestMaintenanceWindow(t *testing.T) {
	need(t, "qemu-io")
	c := dataCluster(t, 4, 3, "vm1", "256M")
	if out, err := qemuIO(t, c.Node(0).NBDURI("vm1"), "write -P 0x11 0 128M", "flush"); err != nil {
		t.Fatalf("write: %v\n%s", err, lastLines(out, 5))
	}
	survivors := []int{0, 1, 2}
	before := objectFiles(t, c)
	share := 0
	for _, holders := range before {
		if _, ok := holders[3]; ok {
			share++
		}
	}
	held := 0
	for _, holders := range objectFiles(t, c, survivors...) {
		held += len(holders)
	}

	// Bad input first.
	for _, args := range [][]string{
		{"node", "maintenance", "no-such-node", "--for", "10m"},
		{"node", "maintenance", c.Node(3).Address(), "--for", "-5m"},
		{"node", "maintenance", c.Node(3).Address(), "--for", "200h"},
		{"node", "maintenance", c.Node(3).Address()},
	} {
		if _, stderr, err := c.Herd(ctx(t), 0, args...); err == nil || strings.TrimSpace(stderr) == "" {
			t.Errorf("herd %v: want a refusal with a message, got %v %q", args, err, stderr)
		}
	}

	if out, stderr, err := c.Herd(ctx(t), 0, "node", "maintenance", c.Node(3).Address(), "--for", "10m"); err != nil || !strings.Contains(out, "in maintenance until") {
		t.Fatalf("node maintenance: %v %s %s", err, out, stderr)
	}
	nodeID3 := nodeID(t, c, 3)
	c.Node(3).Stop()
	waitAgreement(t, c, survivors, time.Minute)
	// A client writes 8 MiB (two objects) while the node is away.
	if out, err := qemuIO(t, c.Node(1).NBDURI("vm1"), "write -P 0x22 0 8M", "flush"); err != nil {
		t.Fatalf("write during maintenance: %v\n%s", err, lastLines(out, 5))
	}
	testcluster.WaitFor(t, time.Minute, "the survivors' recovery to defer the copies for the maintenance window", func() (bool, error) {
		entries, err := client(c, 0).Recovery(ctx(t))
		if err != nil {
			return false, err
		}
		deferred := 0
		for _, e := range entries {
			if e.Status.State != "held for maintenance" && e.Status.State != "done" {
				return false, fmt.Errorf("node %s: %+v", e.Node, e.Status)
			}
			deferred += e.Status.Deferred
		}
		return deferred > 0, fmt.Errorf("%d copies deferred: %+v", deferred, entries)
	})
	// Forgetting it for good now would lose the copies only it holds.
	if _, stderr, err := c.Herd(ctx(t), 0, "node", "remove", nodeID3); err == nil || !strings.Contains(stderr, "still being re-created") {
		t.Errorf("node remove of a node whose copies wait for its maintenance window: %v %s", err, stderr)
	}
	health, _, _ := c.Herd(ctx(t), 0, "cluster", "health")
	if !strings.Contains(health, "maintenance window") {
		t.Errorf("cluster health does not name the maintenance window:\n%s", health)
	}
	heldDuring := 0
	for _, holders := range objectFiles(t, c, survivors...) {
		heldDuring += len(holders)
	}
	t.Logf("node 3 held %d objects; the survivors held %d copies before it stopped and %d during its maintenance", share, held, heldDuring)
	// Two data objects and the map's first page were written: at most
	// those gained a copy each.
	if heldDuring-held > 4 || share < 10 {
		t.Errorf("the survivors gained %d copies during node 3's maintenance (it holds %d objects): want only the written objects copied", heldDuring-held, share)
	}

	// Back within its window: it fetches only what changed.
	c.Node(3).Restart()
	waitAgreement(t, c, []int{0, 1, 2, 3}, time.Minute)
	waitRecovered(t, c, 4)
	entries, err := client(c, 3).Recovery(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Node == nodeID3 {
			t.Logf("node 3 back: its recovery copied %d of its %d objects", e.Status.Copied, e.Status.Objects)
			// Two data objects and the map's first page were written.
			if e.Status.Copied == 0 || e.Status.Copied > 4 {
				t.Errorf("node 3 copied %d objects on its return; want the 1 to 4 written while it was away", e.Status.Copied)
			}
		}
	}
	waitExactCopies(t, c, 3, []int{0, 1, 2, 3})
	checkReplicas(t, c, 3)
	if out, err := qemuIOReadOnly(t, c.Node(3).NBDURI("ro/vm1"), "read -P 0x22 0 8M", "read -P 0x11 8M 120M"); err != nil {
		t.Fatalf("read through node 3: %v\n%s", err, lastLines(out, 5))
	}

	// A window that closes before the node returns: recovery as usual.
	// (Killed: a clean stop would open a window of its own, of the
	// 10-minute --down-out-interval.)
	if _, stderr, err := c.Herd(ctx(t), 0, "node", "maintenance", nodeID(t, c, 2), "--for", "5s"); err != nil {
		t.Fatalf("node maintenance: %v %s", err, stderr)
	}
	c.Node(2).Kill()
	waitAgreement(t, c, []int{0, 1, 3}, time.Minute)
	waitRecovered(t, c, 3)
	waitExactCopies(t, c, 3, []int{0, 1, 3})
	checkReplicasOn(t, c, 3, []int{0, 1, 3})

	events, _, err := c.Herd(ctx(t), 0, "events")
	if err != nil || !strings.Contains(events, "in maintenance until") {
		t.Errorf("herd events lacks the maintenance windows: %v\n%s", err, events)
	}
}

// objectCopies counts each object's copies (files named by object id,
// complete: recovery installs a copy by renaming a finished file) on the
// nodes, and the copies node holds.
func objectCopies(t *testing.T, c *testcluster.Cluster, node int) (map[string]int, int) {
	t.Helper()
	count, held := map[string]int{}, 0
	for _, n := range c.Nodes() {
		filepath.WalkDir(filepath.Join(n.DataDir(), "objects"), func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || len(d.Name()) != 16 {
				return nil
			}
			if _, err := strconv.ParseUint(d.Name(), 16, 64); err != nil {
				return nil
			}
			count[d.Name()]++
			if n.Index() == node {
				held++
			}
			return nil
		})
	}
	return count, held
}

// TestDrainKeepsRedundancy: a drained node's objects move to the others
// while every object keeps 3 copies at every moment (counted every 100 ms
// while a client writes), until it holds nothing; a drain that would leave
// too few nodes is refused; the drained node is then stopped and removed.
func TestDrainKeepsRedundancy(t *testing.T) {
	need(t, "qemu-io", "fio")
	c := dataCluster(t, 4, 3, "vm1", "256M")
	if out, err := qemuIO(t, c.Node(0).NBDURI("vm1"), "write -P 0x33 0 96M", "flush"); err != nil {
		t.Fatalf("write: %v\n%s", err, lastLines(out, 5))
	}
	start, held := objectCopies(t, c, 3)
	if held < 10 {
		t.Fatalf("node 3 holds %d copies before the drain; want a share of %d objects", held, len(start))
	}
	fio, fioOut := startFio(t, "during-drain", c.Node(1).NBDURI("vm1"), "rw=randwrite\nbs=16k\niodepth=4\noffset=100M\nsize=64M\nverify=crc32c\nverify_fatal=1\n")
	if out, stderr, err := c.Herd(ctx(t), 0, "node", "drain", c.Node(3).Address()); err != nil || !strings.Contains(out, "draining") {
		t.Fatalf("node drain: %v %s %s", err, out, stderr)
	}
	if _, stderr, err := c.Herd(ctx(t), 0, "node", "drain", c.Node(2).Address()); err == nil || !strings.Contains(stderr, "add a node first") {
		t.Errorf("draining a second node of four with 3 copies: %v %s", err, stderr)
	}
	checks, least := 0, 3
	testcluster.WaitFor(t, 3*time.Minute, "node 3 to hold nothing, every object keeping 3 copies", func() (bool, error) {
		count, held := objectCopies(t, c, 3)
		checks++
		for oid := range start {
			if count[oid] < 3 {
				least = min(least, count[oid])
				t.Errorf("object %s has %d copies during the drain", oid, count[oid])
			}
		}
		return held == 0, fmt.Errorf("node 3 holds %d copies", held)
	})
	t.Logf("%d checks of every object's copies during the drain; fewest copies seen: %d", checks, least)
	if err := fio.Wait(); err != nil {
		t.Fatalf("fio during the drain: %v\n%s", err, lastLines(fioOut.String(), 5))
	}
	waitRecovered(t, c, 4)
	list, _, _ := c.Herd(ctx(t), 0, "node", "list")
	if !strings.Contains(list, "drained: holds nothing") {
		t.Errorf("node list after the drain:\n%s", list)
	}
	waitExactCopies(t, c, 3, []int{0, 1, 2})
	checkReplicasOn(t, c, 3, []int{0, 1, 2})
	id := nodeID(t, c, 3)
	c.Node(3).Stop()
	waitAgreement(t, c, []int{0, 1, 2}, time.Minute)
	waitRecovered(t, c, 3)
	if _, stderr, err := c.Herd(ctx(t), 0, "node", "remove", id); err != nil {
		t.Fatalf("node remove of the drained node: %v %s", err, stderr)
	}
	checkVDIClean(t, c, 0, "vm1")
}

// TestNodeSetCapacity: bad settings refused; a node's capacity cut at run
// time is a new epoch that moves its objects to the others (exactly 2
// copies of every object after), and the setting outlives the node's
// restart with its old flags.
func TestNodeSetCapacity(t *testing.T) {
	need(t, "qemu-io")
	c := dataCluster(t, 4, 2, "vm1", "256M")
	if out, err := qemuIO(t, c.Node(0).NBDURI("vm1"), "write -P 0x44 0 96M", "flush"); err != nil {
		t.Fatalf("write: %v\n%s", err, lastLines(out, 5))
	}
	address := c.Node(3).Address()
	for _, args := range [][]string{
		{"node", "set", address},
		{"node", "set", address, "--capacity", "0"},
		{"node", "set", address, "--capacity", "12 parsecs"},
		{"node", "set", address, "--zone", "no spaces"},
		{"node", "set", "no-such-node", "--capacity", "1G"},
	} {
		if _, stderr, err := c.Herd(ctx(t), 0, args...); err == nil || strings.TrimSpace(stderr) == "" {
			t.Errorf("herd %v: want a refusal with a message, got %v %q", args, err, stderr)
		}
	}
	_, held := objectCopies(t, c, 3)
	if out, stderr, err := c.Herd(ctx(t), 0, "node", "set", address, "--capacity", "1M"); err != nil || !strings.Contains(out, "capacity 1 MiB") {
		t.Fatalf("node set: %v %s %s", err, out, stderr)
	}
	testcluster.WaitFor(t, 2*time.Minute, "node 3's objects to move to the others", func() (bool, error) {
		_, now := objectCopies(t, c, 3)
		return now <= held/4, fmt.Errorf("node 3 holds %d copies (had %d)", now, held)
	})
	waitRecovered(t, c, 4)
	waitExactCopies(t, c, 2, []int{0, 1, 2, 3})
	_, after := objectCopies(t, c, 3)
	t.Logf("node 3 held %d copies at 252 GiB of capacity and %d at 1 MiB", held, after)
	if _, epochs, err := epochsJSON(t, c, 0); err != nil || !strings.Contains(epochs[len(epochs)-1].Reason, "set to capacity 1048576") {
		t.Errorf("the last epoch is not the capacity change: %v %+v", err, epochs[len(epochs)-1])
	}

	c.Node(3).Stop()
	waitAgreement(t, c, []int{0, 1, 2}, time.Minute)
	c.Node(3).Restart()
	waitAgreement(t, c, []int{0, 1, 2, 3}, time.Minute)
	nodes, err := client(c, 0).Nodes(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if n.Address == address && n.Capacity != 1<<20 {
			t.Errorf("after its restart node 3 has capacity %d, want the 1 MiB set at run time", n.Capacity)
		}
	}
}
