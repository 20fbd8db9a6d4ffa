package e2e

import (
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/api"
	"github.com/herd-storage/herd/internal/testcluster"
)

// TestZonesFarApart: four nodes in two zones 50 ms apart (25 ms each way
// on every peer connection between them, internal/peer/delay.go), copies
// 2 (one per zone): the cluster forms and formats, 64 MiB written through
// a node of zone a read back intact by the writer, and its reads are
// served in zone a: node 0 sends no read to a node of zone b. A ro/
// reader beside the writer reads zone b's replica too (agreement). The
// throughput ratio is bench/wan.sh's.
func TestZonesFarApart(t *testing.T) {
	need(t, "qemu-io")
	const oneWay = 25 * time.Millisecond
	c := testcluster.Start(t, testcluster.Options{Nodes: 4, Zones: []string{"a", "b"}, ZoneDelay: oneWay})
	waitAgreement(t, c, []int{0, 1, 2, 3}, time.Minute)
	herd(t, c, 0, "cluster", "format", "--copies", "2")
	herd(t, c, 0, "vdi", "create", "wan", "256M")
	uri := c.Node(0).NBDURI("wan")
	start := time.Now()
	if out, err := qemuIO(t, uri, "write -P 0x5a 0 64M"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	t.Logf("64 MiB written through zone a with the second copies 50 ms away: %v", time.Since(start).Round(time.Millisecond))

	var created api.CreatedToken
	if err := c.HerdJSON(ctx(t), 0, &created, "token", "create", "prometheus", "--read-only"); err != nil {
		t.Fatal(err)
	}
	far := []string{nodeID(t, c, 1), nodeID(t, c, 3)}
	near := nodeID(t, c, 2)
	readsTo := func(node string) float64 {
		families, _ := scrape(t, c.Node(0).AdminAddr(), created.Secret)
		return max(0, value(families, "herd_peer_request_duration_seconds", map[string]string{"peer": node, "op": "READ"}))
	}
	// The delay is there (a herd built with -tags testknobs reads it): no
	// write to the other zone took less than the round trip.
	families, _ := scrape(t, c.Node(0).AdminAddr(), created.Secret)
	writesFar := uint64(0)
	for _, m := range families["herd_peer_request_duration_seconds"].GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		if !slices.Contains(far, labels["peer"]) || labels["op"] != "WRITE" {
			continue
		}
		writesFar += m.GetHistogram().GetSampleCount()
		for _, b := range m.GetHistogram().GetBucket() {
			if b.GetUpperBound() < (2*oneWay).Seconds() && b.GetCumulativeCount() > 0 {
				t.Fatalf("node 0 sent %d writes to node %s in zone b that took at most %gs, less than the %v round trip: is the delay in effect?", b.GetCumulativeCount(), labels["peer"], b.GetUpperBound(), 2*oneWay)
			}
		}
	}
	if writesFar == 0 {
		t.Fatalf("node 0 sent no write to zone b (herd_peer_request_duration_seconds)")
	}
	before := map[string]float64{far[0]: readsTo(far[0]), far[1]: readsTo(far[1]), near: readsTo(near)}
	start = time.Now()
	if out, err := qemuIO(t, c.Node(0).NBDURI("wan"), "read -P 0x5a 0 64M"); err != nil {
		t.Fatalf("read back through zone a: %v\n%s", err, out)
	}
	t.Logf("64 MiB read through zone a: %v", time.Since(start).Round(time.Millisecond))
	for _, node := range far {
		if n := readsTo(node) - before[node]; n != 0 {
			t.Errorf("node 0 (zone a) sent %v reads to node %s in zone b", n, node)
		}
	}
	if n := readsTo(near) - before[near]; n <= 0 {
		t.Errorf("node 0 sent no read to node %s, its zone's other node: is every object's zone-a copy on node 0? (%v)", near, n)
	}
	// A reader of ro/wan beside the writer is linearizable: it reads every
	// replica, so zone b's too (ARCHITECTURE.md, "Data path").
	before = map[string]float64{far[0]: readsTo(far[0]), far[1]: readsTo(far[1])}
	if out, err := qemuIOReadOnly(t, c.Node(0).NBDURI("ro/wan"), "read -P 0x5a 0 8M"); err != nil {
		t.Fatalf("ro/ read through zone a: %v\n%s", err, out)
	}
	if n := readsTo(far[0]) + readsTo(far[1]) - before[far[0]] - before[far[1]]; n <= 0 {
		t.Errorf("a ro/ read of the live VDI through zone a sent no read to zone b (%v): it did not check every replica", n)
	}
	// Healthy, across the delay.
	if out, stderr, err := c.Herd(ctx(t), 2, "cluster", "health"); err != nil {
		t.Fatalf("cluster health through zone b's node: %v\n%s%s", err, out, stderr)
	}
	if out, err := qemuIO(t, c.Node(1).NBDURI("wan"), "read -P 0x5a 0 64M", "write -P 0x6b 8M "+strconv.Itoa(4<<20)); err != nil {
		t.Fatalf("through zone b: %v\n%s", err, out)
	}
}
