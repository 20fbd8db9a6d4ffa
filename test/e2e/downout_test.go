package e2e

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/api"
	"github.com/herd-storage/herd/internal/testcluster"
)

// TestStoppedNodeIsDownNotOut: a node stopped cleanly (SIGTERM) is down,
// not out, for --down-out-interval (10 minutes by default). With 2 copies
// on 3 nodes every object of the stopped node could be copied to the
// third; none is while it is away: the survivors' recovery defers them
// (held by its window) and their object files stay exactly as they were.
// `node list`, the health and the events say it is stopped and when it is
// marked out. Restarted within the interval, it comes back with its
// copies proven current: it copies nothing, no object file on any node
// changes, and every object has its 2 identical copies where they were.
// Before, the stop was a failure like any other: the survivors copied
// the stopped node's share at once.
func TestStoppedNodeIsDownNotOut(t *testing.T) {
	need(t, "qemu-io")
	c := dataCluster(t, 3, 2, "vm1", "256M")
	if out, err := qemuIO(t, c.Node(0).NBDURI("vm1"), "write -P 0x11 0 128M", "flush"); err != nil {
		t.Fatalf("write: %v\n%s", err, lastLines(out, 5))
	}
	before := objectFiles(t, c)
	share := 0
	for _, holders := range before {
		if _, ok := holders[2]; ok {
			share++
		}
	}
	if share < 10 {
		t.Fatalf("node 2 holds %d of %d objects; want a share of them", share, len(before))
	}
	survivors := []int{0, 1}
	victim := nodeID(t, c, 2)

	stopped := time.Now()
	c.Node(2).Stop()
	t.Logf("node 2 exited %v after SIGTERM", time.Since(stopped).Round(time.Millisecond))
	waitAgreement(t, c, survivors, time.Minute)

	nodes, err := client(c, 0).Nodes(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if n.ID != victim {
			continue
		}
		outAt := stopped.Add(10 * time.Minute)
		if !n.Stopped || n.MaintenanceUntil.Before(outAt.Add(-time.Minute)) || n.MaintenanceUntil.After(outAt.Add(time.Minute)) {
			t.Errorf("node 2 after its stop: %+v; want it stopped, marked out 10 minutes after its stop (%v)", n.NodeInfo, outAt)
		}
	}
	list, _, _ := c.Herd(ctx(t), 0, "node", "list")
	if !strings.Contains(list, "stopped: marked out at") {
		t.Errorf("node list does not say node 2 is stopped and when it is marked out:\n%s", list)
	}
	events, _, _ := c.Herd(ctx(t), 0, "events")
	if !strings.Contains(events, victim+" (") || !strings.Contains(events, "is stopping cleanly: down, not out, until") || !strings.Contains(events, victim+" left (stopped)") {
		t.Errorf("the events do not tell the stop:\n%s", lastLines(events, 10))
	}
	h, _ := health(t, c, 0)
	if !slices.ContainsFunc(h.Reasons, func(r api.HealthReason) bool { return strings.Contains(r.What, "is stopped: down, not out, until") }) {
		t.Errorf("cluster health does not say node 2 is stopped: %+v", h)
	}

	// The survivors' recovery must have looked at the epoch without node
	// 2 and deferred what it would have copied.
	testcluster.WaitFor(t, time.Minute, "the survivors' recovery to defer node 2's objects for its window", func() (bool, error) {
		entries, err := client(c, 0).Recovery(ctx(t))
		if err != nil {
			return false, err
		}
		deferred := 0
		for _, e := range entries {
			if e.Status.State != "held for maintenance" || !slices.Equal(e.Status.HeldBy, []string{victim}) {
				return false, fmt.Errorf("node %s: %+v %s", e.Node, e.Status, e.Error)
			}
			deferred += e.Status.Deferred
		}
		return len(entries) == 2 && deferred > 0, fmt.Errorf("%d nodes report, %d objects deferred", len(entries), deferred)
	})
	if during := objectFiles(t, c, survivors...); !sameFiles(before, during, survivors) {
		t.Fatalf("the survivors' object files changed while node 2 was stopped inside its window: %s", filesChange(before, during, survivors))
	}

	c.Node(2).Restart()
	waitAgreement(t, c, []int{0, 1, 2}, time.Minute)
	waitRecovered(t, c, 3)
	entries, err := client(c, 0).Recovery(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		t.Logf("node %s after node 2's return: recovery copied %d of the %d objects placed on it", e.Node, e.Status.Copied, e.Status.Objects)
		// The peers may fetch whole some unchanged objects they share
		// with each other: one's restamp looks newer than the other's
		// copy when that one lists it later (docs/ARCHITECTURE.md,
		// "Recovery and stale copies").
		if e.Node == victim && (e.Status.Copied != 0 || e.Status.Objects == 0) {
			t.Errorf("node 2 copied %d of its %d objects on its return; want its copies proven current, none copied", e.Status.Copied, e.Status.Objects)
		}
	}
	if after := objectFiles(t, c); !sameFiles(before, after, []int{0, 1, 2}) {
		t.Errorf("object files differ after node 2's return: %s", filesChange(before, after, []int{0, 1, 2}))
	}
	checkReplicas(t, c, 2)
	list, _, _ = c.Herd(ctx(t), 0, "node", "list")
	if strings.Contains(list, "stopped") {
		t.Errorf("node list still says a node is stopped after its return:\n%s", list)
	}
	waitHealth(t, c, 2, api.HealthOK, 0, "")
	if out, err := qemuIOReadOnly(t, c.Node(2).NBDURI("ro/vm1"), "read -P 0x11 0 128M"); err != nil {
		t.Fatalf("read through node 2: %v\n%s", err, lastLines(out, 5))
	}
}

// TestStoppedNodeMarkedOutAfterInterval: with --down-out-interval 5s a
// stopped node that does not return is marked out when its window
// closes: the survivors' recovery copies its share then (the pass that
// copies begins after the window's end), until every object has its 2
// copies on the survivors.
func TestStoppedNodeMarkedOutAfterInterval(t *testing.T) {
	need(t, "qemu-io")
	c := dataClusterWith(t, testcluster.Options{Nodes: 3, ExtraArgs: []string{"--down-out-interval", "5s"}}, 2, "vm1", "256M")
	if out, err := qemuIO(t, c.Node(0).NBDURI("vm1"), "write -P 0x22 0 128M", "flush"); err != nil {
		t.Fatalf("write: %v\n%s", err, lastLines(out, 5))
	}
	victim := nodeID(t, c, 2)
	stopped := time.Now()
	c.Node(2).Stop()
	waitAgreement(t, c, []int{0, 1}, time.Minute)
	nodes, err := client(c, 0).Nodes(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	var outAt time.Time
	for _, n := range nodes {
		if n.ID == victim {
			outAt = n.MaintenanceUntil
			if !n.Stopped || outAt.Before(stopped.Add(4*time.Second)) || outAt.After(time.Now().Add(5*time.Second)) {
				t.Fatalf("node 2 after its stop: %+v; want it stopped, marked out 5 s after its stop", n.NodeInfo)
			}
		}
	}
	waitRecovered(t, c, 2)
	entries, err := client(c, 0).Recovery(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	copied := 0
	for _, e := range entries {
		t.Logf("node %s: its pass began %v after node 2's window closed and copied %d objects", e.Node, e.Status.Started.Sub(outAt).Round(time.Millisecond), e.Status.Copied)
		if e.Status.Started.Before(outAt) {
			t.Errorf("node %s: the recovery pass that copied began at %v, before node 2 was marked out at %v", e.Node, e.Status.Started, outAt)
		}
		copied += e.Status.Copied
	}
	if copied == 0 {
		t.Errorf("the survivors copied nothing of node 2's share once it was marked out")
	}
	waitExactCopies(t, c, 2, []int{0, 1})
	checkReplicasOn(t, c, 2, []int{0, 1})
	list, _, _ := c.Herd(ctx(t), 0, "node", "list")
	if !strings.Contains(list, "stopped: out since") {
		t.Errorf("node list does not say node 2 is out:\n%s", list)
	}
}

// sameFiles says whether the object files of the given nodes are the same
// in a and b: the same objects on each, with the same data.
func sameFiles(a, b map[string]map[int][]byte, nodes []int) bool {
	return filesChange(a, b, nodes) == ""
}

// filesChange describes how the object files of nodes differ between a
// and b ("" when they do not).
func filesChange(a, b map[string]map[int][]byte, nodes []int) string {
	var added, removed, changed int
	for oid, holders := range b {
		for _, n := range nodes {
			data, now := holders[n]
			old, was := a[oid][n]
			switch {
			case now && !was:
				added++
			case now && !bytes.Equal(data, old):
				changed++
			}
		}
	}
	for oid, holders := range a {
		for _, n := range nodes {
			if _, was := holders[n]; was {
				if _, now := b[oid][n]; !now {
					removed++
				}
			}
		}
	}
	if added+removed+changed == 0 {
		return ""
	}
	return fmt.Sprintf("%d copies added, %d removed, %d changed on nodes %v", added, removed, changed, nodes)
}
