package api

import (
	"strings"
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/cluster"
)

const gib = 1 << 30

// node is a NodeEntry as the nodes' usage reports make it.
func node(id, zone string, state cluster.NodeState, used, free uint64, usageError string) NodeEntry {
	var n NodeEntry
	n.ID, n.Zone, n.State = id, zone, state
	n.UsedBytes, n.FreeBytes, n.UsageError = used, free, usageError
	return n
}

func vdi(name string, size uint64, copies int) cluster.VDI {
	return cluster.VDI{Name: name, Size: size, Copies: copies}
}

// healthOf is what capacityHealth says of c.
func healthOf(c Capacity) Health {
	h := Health{Status: HealthOK, Reasons: []HealthReason{}}
	capacityHealth(&h, c)
	return h
}

// TestCapacity: the capacity computation and its health rules on
// made-up node lists: raw, usable (by the size-weighted copies),
// provisioned, the failure domains (nodes, or zones) against the copies,
// the largest share against the free space of the others, and nodes that
// do not count (down) or do not report (a usage error).
func TestCapacity(t *testing.T) {
	t.Run("3 nodes 3 copies", func(t *testing.T) {
		nodes := []NodeEntry{
			node("a", "", cluster.NodeAlive, 10*gib, 90*gib, ""),
			node("b", "", cluster.NodeAlive, 10*gib, 90*gib, ""),
			node("c", "", cluster.NodeAlive, 10*gib, 90*gib, ""),
		}
		c := computeCapacity(nodes, []cluster.VDI{vdi("vm1", 60*gib, 3)}, 3, 1)
		if c.RawBytes != 300*gib || c.UsedBytes != 30*gib || c.FreeBytes != 270*gib || c.Copies != 3 || c.UsableBytes != 100*gib ||
			c.ProvisionedBytes != 60*gib || c.Overcommit != 0.6 || c.Domains != 3 {
			t.Fatalf("%+v", c)
		}
		if c.Recoverable || c.RecoveryShort || !strings.Contains(c.Note, "3 alive nodes for 3 copies") {
			t.Fatalf("3 nodes for 3 copies: recoverable %v, short %v, note %q; want neither, and a note that a lost share cannot be re-created", c.Recoverable, c.RecoveryShort, c.Note)
		}
		if h := healthOf(c); h.Status != HealthOK || len(h.Reasons) != 0 {
			t.Fatalf("health %+v; want OK (the note is cluster info's, not a warning)", h)
		}
		// 200 GiB more: 2.6 times the usable space, above a limit of 1
		// and under one of 3.
		c = computeCapacity(nodes, []cluster.VDI{vdi("vm1", 60*gib, 3), vdi("vm2", 200*gib, 3)}, 3, 1)
		if h := healthOf(c); h.Status != HealthWarn || len(h.Reasons) != 1 || !strings.Contains(h.Reasons[0].What, "overcommitted") ||
			!strings.Contains(h.Reasons[0].What, "2.60 times") || !strings.Contains(h.Reasons[0].What, "limit 1.00") {
			t.Fatalf("260 GiB on 100 GiB usable, limit 1: %+v", h)
		}
		if h := healthOf(computeCapacity(nodes, []cluster.VDI{vdi("vm1", 60*gib, 3), vdi("vm2", 200*gib, 3)}, 3, 3)); h.Status != HealthOK {
			t.Fatalf("260 GiB on 100 GiB usable, limit 3: %+v", h)
		}
	})

	t.Run("copies weighted by size", func(t *testing.T) {
		nodes := []NodeEntry{
			node("a", "", cluster.NodeAlive, 0, 100*gib, ""),
			node("b", "", cluster.NodeAlive, 0, 100*gib, ""),
			node("c", "", cluster.NodeAlive, 0, 100*gib, ""),
			node("d", "", cluster.NodeAlive, 0, 100*gib, ""),
		}
		c := computeCapacity(nodes, []cluster.VDI{vdi("big", 30*gib, 3), vdi("small", 10*gib, 1)}, 2, 1)
		if c.Copies != 2.5 || c.UsableBytes != 160*gib || c.ProvisionedBytes != 40*gib || c.Domains != 4 || !c.Recoverable {
			t.Fatalf("%+v; want 2.5 copies, 160 GiB usable, recoverable", c)
		}
		// No VDI: the format's copies.
		if c := computeCapacity(nodes, nil, 2, 1); c.Copies != 2 || c.UsableBytes != 200*gib || c.Overcommit != 0 {
			t.Fatalf("no VDI: %+v", c)
		}
	})

	t.Run("4 nodes one full", func(t *testing.T) {
		nodes := []NodeEntry{
			node("a", "", cluster.NodeAlive, 40*gib, 50*gib, ""),
			node("b", "", cluster.NodeAlive, 40*gib, 50*gib, ""),
			node("c", "", cluster.NodeAlive, 40*gib, 50*gib, ""),
			node("d", "", cluster.NodeAlive, 200*gib, 0, ""),
		}
		nodes[3].Full = true
		c := computeCapacity(nodes, []cluster.VDI{vdi("vm1", 100*gib, 3)}, 3, 10)
		if c.Domains != 4 || c.LargestShare != "d" || c.LargestShareBytes != 200*gib || c.FreeElsewhere != 150*gib {
			t.Fatalf("%+v; want d's 200 GiB the largest share, 150 GiB free elsewhere", c)
		}
		if c.Recoverable || !c.RecoveryShort || !strings.Contains(c.Note, "could not hold a recovery of d's share") {
			t.Fatalf("recoverable %v, short %v, note %q", c.Recoverable, c.RecoveryShort, c.Note)
		}
		if h := healthOf(c); h.Status != HealthWarn || len(h.Reasons) != 1 || h.Reasons[0].What != c.Note {
			t.Fatalf("health %+v; want the note as a WARN", h)
		}
		// With room on the others, the share is recoverable.
		for i := range 3 {
			nodes[i].FreeBytes = 100 * gib
		}
		if c := computeCapacity(nodes, []cluster.VDI{vdi("vm1", 100*gib, 3)}, 3, 10); !c.Recoverable || c.RecoveryShort || c.Note != "" || c.FreeElsewhere != 300*gib {
			t.Fatalf("300 GiB free elsewhere for a 200 GiB share: %+v", c)
		}
	})

	t.Run("zones", func(t *testing.T) {
		nodes := []NodeEntry{
			node("a1", "a", cluster.NodeAlive, 10*gib, 90*gib, ""),
			node("a2", "a", cluster.NodeAlive, 30*gib, 70*gib, ""),
			node("b1", "b", cluster.NodeAlive, 20*gib, 80*gib, ""),
			node("b2", "b", cluster.NodeAlive, 0, 100*gib, ""),
		}
		// Two zones for two copies: a lost zone's share has nowhere to go,
		// however many nodes there are.
		c := computeCapacity(nodes, []cluster.VDI{vdi("vm1", 20*gib, 2)}, 2, 1)
		if c.Domains != 2 || c.Recoverable || !strings.Contains(c.Note, "2 alive zones for 2 copies") {
			t.Fatalf("2 zones, 2 copies: %+v", c)
		}
		if c.LargestShare != "zone a" || c.LargestShareBytes != 40*gib || c.FreeElsewhere != 180*gib {
			t.Fatalf("largest share %q %d, free elsewhere %d; want zone a's 40 GiB, 180 GiB", c.LargestShare, c.LargestShareBytes, c.FreeElsewhere)
		}
		// A third zone, small and full: zone a's 40 GiB fits in the other
		// zones' 180 GiB free.
		nodes = append(nodes, node("c1", "c", cluster.NodeAlive, 5*gib, 0, ""))
		if c := computeCapacity(nodes, []cluster.VDI{vdi("vm1", 20*gib, 2)}, 2, 1); c.Domains != 3 || !c.Recoverable || c.LargestShare != "zone a" {
			t.Fatalf("3 zones, 2 copies: %+v", c)
		}
		// A node without a zone among zoned ones is a zone of its own ("").
		nodes = append(nodes, node("x", "", cluster.NodeAlive, 0, 10*gib, ""))
		if c := computeCapacity(nodes, nil, 2, 1); c.Domains != 4 {
			t.Fatalf("a node without a zone: %d domains, want 4", c.Domains)
		}
	})

	t.Run("erasure coding", func(t *testing.T) {
		var nodes []NodeEntry
		for _, id := range []string{"a", "b", "c", "d", "e", "f"} {
			nodes = append(nodes, node(id, "", cluster.NodeAlive, 0, 100*gib, ""))
		}
		// 4+2 takes 1.5 times its size (its 3 copies of maps are left
		// out), weighted with a VDI of 3 copies: (30*1.5 + 10*3) / 40.
		ec := cluster.VDI{Name: "ec", Size: 30 * gib, Copies: 3, EC: "4+2"}
		c := computeCapacity(nodes, []cluster.VDI{ec, vdi("vm", 10*gib, 3)}, 3, 1)
		if c.Copies != 1.875 || c.UsableBytes != 320*gib {
			t.Fatalf("%+v; want 1.875 raw bytes per byte, 320 GiB usable", c)
		}
		// 6 nodes for 6 chunks: a lost node's chunks have nowhere to go.
		if c.Recoverable || !strings.Contains(c.Note, "6 alive nodes for erasure coding 4+2") || !strings.Contains(c.Note, "one copy or chunk fewer") {
			t.Fatalf("6 nodes for 4+2: recoverable %v, note %q", c.Recoverable, c.Note)
		}
		nodes = append(nodes, node("g", "", cluster.NodeAlive, 0, 100*gib, ""))
		if c := computeCapacity(nodes, []cluster.VDI{ec}, 3, 1); !c.Recoverable {
			t.Fatalf("7 nodes for 4+2: %+v", c)
		}
		// Zones: 4+2 needs 3 zones of 2 (at most M a zone), as its maps'
		// 3 copies do, so a lost zone of 3 cannot be re-created; of 4 it
		// can. 2+1 needs 3 zones of 1, which 2 copies would not.
		for i := range nodes {
			nodes[i].Zone = []string{"z1", "z2", "z3", "z4"}[i%4]
		}
		if c := computeCapacity(nodes, []cluster.VDI{ec}, 3, 1); !c.Recoverable || c.Domains != 4 {
			t.Fatalf("4 zones for 4+2: %+v", c)
		}
		if c := computeCapacity(nodes[:3], []cluster.VDI{ec}, 3, 1); c.Recoverable || !strings.Contains(c.Note, "3 alive zones for 3 copies") {
			t.Fatalf("3 zones for 4+2: %+v", c)
		}
		small := cluster.VDI{Name: "small", Size: gib, Copies: 2, EC: "2+1"}
		if c := computeCapacity(nodes[:3], []cluster.VDI{small}, 2, 1); c.Recoverable || !strings.Contains(c.Note, "3 alive zones for erasure coding 2+1") {
			t.Fatalf("3 zones for 2+1: %+v", c)
		}
	})

	t.Run("a node with a usage error", func(t *testing.T) {
		nodes := []NodeEntry{
			node("a", "", cluster.NodeAlive, 10*gib, 90*gib, ""),
			node("b", "", cluster.NodeAlive, 10*gib, 90*gib, ""),
			node("c", "", cluster.NodeAlive, 0, 0, "context deadline exceeded"),
			node("d", "", cluster.NodeDead, 50*gib, 50*gib, ""), // down: not counted
		}
		c := computeCapacity(nodes, []cluster.VDI{vdi("vm1", 1000*gib, 2)}, 2, 1)
		if !c.Incomplete || c.RawBytes != 200*gib || c.Domains != 2 || c.UsableBytes != 100*gib {
			t.Fatalf("%+v; want incomplete, a and b counted only", c)
		}
		// Overcommitted on what is known, but the figures lack a node:
		// health says nothing of capacity (it names the node that did not
		// answer), and the metrics do not keep it.
		if h := healthOf(c); h.Status != HealthOK || len(h.Reasons) != 0 {
			t.Fatalf("health of an incomplete capacity: %+v", h)
		}
		var cache capacityCache
		now := time.Now()
		cache.remember(c, now)
		if _, ok := cache.get(now, capacityStale); ok {
			t.Fatal("an incomplete capacity was kept for the metrics")
		}
		nodes[2].UsageError, nodes[2].FreeBytes = "", 100*gib
		complete := computeCapacity(nodes, []cluster.VDI{vdi("vm1", 1000*gib, 2)}, 2, 1)
		cache.remember(complete, now)
		cache.remember(c, now.Add(time.Minute))
		if got, ok := cache.get(now.Add(time.Minute), capacityStale); !ok || got.Incomplete || got.RawBytes != 300*gib {
			t.Fatalf("cached %+v, %v; want the complete capacity", got, ok)
		}
		if _, ok := cache.get(now.Add(capacityStale+time.Second), capacityStale); ok {
			t.Fatal("a capacity older than capacityStale is still exported")
		}
	})
}
