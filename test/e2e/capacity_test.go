package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/api"
	"github.com/herd-storage/herd/internal/cluster"
)

// TestCapacityAndOvercommit: cluster info shows raw, usable (divided by
// the copies), provisioned and used space; a VDI far larger than the
// disks is accepted (thin) but health WARNs that the cluster is
// overcommitted, unless the node answering was started with a larger
// --overcommit-ratio; with no more nodes than copies, info says a lost
// node's share cannot be re-created, and with one more it can.
func TestCapacityAndOvercommit(t *testing.T) {
	c := dataCluster(t, 3, 3, "disk", "64M")
	capacity := func(node int) api.Capacity {
		t.Helper()
		var info struct {
			cluster.Info
			Capacity *api.Capacity `json:"capacity"`
		}
		if err := c.HerdJSON(ctx(t), node, &info, "cluster", "info"); err != nil {
			t.Fatal(err)
		}
		if info.Capacity == nil {
			t.Fatal("cluster info --json has no capacity")
		}
		return *info.Capacity
	}
	got := capacity(0)
	if got.RawBytes == 0 || got.RawBytes != got.UsedBytes+got.FreeBytes || got.Copies != 3 || got.ProvisionedBytes != 64<<20 {
		t.Fatalf("capacity %+v: want raw = used + free > 0, 3 copies, 64 MiB provisioned", got)
	}
	if want := got.RawBytes / 3; got.UsableBytes < want-1 || got.UsableBytes > want+1 {
		t.Fatalf("usable %d, want raw/3 = %d", got.UsableBytes, want)
	}
	if got.Recoverable || !strings.Contains(got.Note, "3 alive nodes for 3 copies") {
		t.Fatalf("3 nodes, 3 copies: recoverable %v, note %q; want a note that a lost node's share cannot be re-created", got.Recoverable, got.Note)
	}
	if out := herd(t, c, 1, "cluster", "info"); !strings.Contains(out, "usable at 3.0 copies") || !strings.Contains(out, "Losing a node:") {
		t.Fatalf("cluster info:\n%s", out)
	}
	waitHealth(t, c, 0, api.HealthOK, 0, "")

	herd(t, c, 0, "vdi", "create", "huge", "10P")
	waitHealth(t, c, 2, api.HealthWarn, 1, "overcommitted")
	if got := capacity(1); got.Overcommit <= 1 || got.ProvisionedBytes != 64<<20+10<<50 {
		t.Fatalf("after a 10 PiB VDI: %+v", got)
	}
	// The alert's metrics agree with health: node 2 computed the capacity
	// for its health answer.
	overcommit := func(node int) (ratio, limit float64) {
		t.Helper()
		families, status := scrape(t, c.Node(node).AdminAddr(), c.Token())
		if status != 200 {
			t.Fatalf("node %d: /metrics: HTTP %d", node, status)
		}
		ratio, limit = value(families, "herd_cluster_overcommit_ratio", nil), value(families, "herd_cluster_overcommit_limit", nil)
		if usable := value(families, "herd_cluster_usable_bytes", nil); usable <= 0 || value(families, "herd_cluster_recovery_headroom_short", nil) != 0 {
			t.Fatalf("node %d: herd_cluster_usable_bytes %v, herd_cluster_recovery_headroom_short %v; want usable > 0, headroom not short", node, usable,
				value(families, "herd_cluster_recovery_headroom_short", nil))
		}
		return ratio, limit
	}
	if ratio, limit := overcommit(2); limit != 1 || ratio <= limit {
		t.Fatalf("node 2: herd_cluster_overcommit_ratio %v, _limit %v; want a ratio above the limit 1 (HerdOvercommitted fires)", ratio, limit)
	}

	lenient := c.AddNodeWith("--overcommit-ratio", "1000000")
	waitAgreement(t, c, []int{0, 1, 2, 3}, time.Minute)
	waitRecovered(t, c, 4)
	h := waitHealth(t, c, lenient.Index(), api.HealthOK, 0, "")
	for _, r := range h.Reasons {
		if strings.Contains(r.What, "overcommitted") {
			t.Fatalf("a node started with --overcommit-ratio 1000000 warns: %s", r.What)
		}
	}
	if got := capacity(lenient.Index()); !got.Recoverable || got.Domains != 4 || got.Note != "" {
		t.Fatalf("4 nodes, 3 copies: %+v; want recoverable (the test's disks have room)", got)
	}
	if ratio, limit := overcommit(lenient.Index()); limit != 1000000 || ratio <= 1 || ratio > limit {
		t.Fatalf("node started with --overcommit-ratio 1000000: herd_cluster_overcommit_ratio %v, _limit %v; want 1 < ratio <= limit (HerdOvercommitted quiet)", ratio, limit)
	}
}
