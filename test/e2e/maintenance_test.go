package e2e

import (
	"fmt"
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
	id := nodeID(t, c, 3)
	for _, e := range entries {
		if e.Node == id {
			t.Logf("node 3 back: recovery %+v", e.Status)
			if e.Status.Copied == 0 || e.Status.Copied > 4 {
				t.Errorf("node 3 copied %d objects on its return; want the 1 to 4 written while it was away", e.Status.Copied)
			}
		}
	}
	checkReplicas(t, c, 3)
	if out, err := qemuIOReadOnly(t, c.Node(3).NBDURI("ro/vm1"), "read -P 0x22 0 8M", "read -P 0x11 8M 120M"); err != nil {
		t.Fatalf("read through node 3: %v\n%s", err, lastLines(out, 5))
	}

	// A window that closes before the node returns: recovery as usual.
	if _, stderr, err := c.Herd(ctx(t), 0, "node", "maintenance", nodeID(t, c, 2), "--for", "5s"); err != nil {
		t.Fatalf("node maintenance: %v %s", err, stderr)
	}
	c.Node(2).Stop()
	waitAgreement(t, c, []int{0, 1, 3}, time.Minute)
	waitRecovered(t, c, 3)
	checkReplicasOn(t, c, 3, []int{0, 1, 3})

	events, _, err := c.Herd(ctx(t), 0, "events")
	if err != nil || !strings.Contains(events, "in maintenance until") {
		t.Errorf("herd events lacks the maintenance windows: %v\n%s", err, events)
	}
}
