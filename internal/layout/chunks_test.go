package layout

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/object"
	"github.com/herd-storage/herd/internal/placement"
)

// testEpoch is the layout of an epoch whose members are nodes n0 … n(count-1),
// in zones z0 … z(zones-1) round robin when zones > 0.
func testEpoch(t *testing.T, count, zones int) *Epoch {
	t.Helper()
	members := make([]cluster.Member, count)
	for i := range members {
		members[i] = cluster.Member{ID: fmt.Sprintf("n%02d", i), Weight: uint64(1+i%3) << 40}
		if zones > 0 {
			members[i].Zone = fmt.Sprintf("z%d", i%zones)
		}
	}
	ring, err := ringFor(members)
	if err != nil {
		t.Fatal(err)
	}
	e := &Epoch{Number: 7, ring: ring, Nodes: map[string]cluster.Node{}}
	for _, m := range members {
		e.Nodes[m.ID] = cluster.Node{ID: m.ID, Zone: m.Zone, Capacity: m.Weight}
	}
	return e
}

func TestChunkHomes(t *testing.T) {
	for _, shape := range []struct{ count, zones, k, m int }{
		{12, 0, 4, 2}, {11, 0, 8, 3}, {9, 3, 4, 2}, {20, 4, 8, 3}, {3, 0, 2, 1},
	} {
		e := testEpoch(t, shape.count, shape.zones)
		used := map[string]bool{}
		for index := range uint32(500) {
			oid := object.DataOID(0x1234, index)
			homes, err := e.ChunkHomes(oid, shape.k, shape.m)
			if err != nil {
				t.Fatalf("%+v object %016x: %v", shape, oid, err)
			}
			ids, err := e.ring.Chunks(uint64(oid), shape.k+shape.m, shape.m)
			if err != nil {
				t.Fatal(err)
			}
			if len(homes) != len(ids) {
				t.Fatalf("%+v: %d homes for %d chunks", shape, len(homes), len(ids))
			}
			perZone := map[string]int{}
			for c, home := range homes {
				if home.ID != ids[c] || e.Nodes[home.ID] != home {
					t.Fatalf("%+v object %016x chunk %d: home %+v, placement says %s", shape, oid, c, home, ids[c])
				}
				perZone[home.Zone]++
				used[home.ID] = true
			}
			if shape.zones > 0 {
				for zone, chunks := range perZone {
					if chunks > shape.m {
						t.Fatalf("%+v object %016x: zone %s holds %d chunks, more than m", shape, oid, zone, chunks)
					}
				}
			}
			again, _ := e.ChunkHomes(oid, shape.k, shape.m)
			if !slices.Equal(homes, again) {
				t.Fatalf("%+v object %016x: %v, then %v", shape, oid, homes, again)
			}
		}
		if len(used) != shape.count {
			t.Errorf("%+v: only %d of %d nodes ever hold a chunk", shape, len(used), shape.count)
		}
	}
}

func TestChunkHomesRefuses(t *testing.T) {
	e := testEpoch(t, 12, 0)
	data := object.DataOID(3, 9)
	for _, test := range []struct {
		name    string
		oid     object.OID
		k, m    int
		message string
	}{
		{"no data chunks", data, 0, 2, "0 data and 2 parity chunks"},
		{"no parity", data, 4, 0, "4 data and 0 parity chunks"},
		{"too many", data, 9, 3, "at most 11 in all"},
		{"map object", object.MapOID(3, 0), 4, 2, "type 1 is not a data object"},
		{"chunk", object.ChunkOID(data, 1, 0), 4, 2, "type 17 is not a data object"},
	} {
		homes, err := e.ChunkHomes(test.oid, test.k, test.m)
		if err == nil || homes != nil || !strings.Contains(err.Error(), test.message) {
			t.Errorf("%s: %v, %v; want an error saying %q", test.name, homes, err, test.message)
		}
	}
	for _, test := range []struct {
		name               string
		count, zones, k, m int
	}{
		{"fewer nodes than chunks", 5, 0, 4, 2},
		{"zones too few", 6, 2, 4, 2}, // 2 per zone in 2 zones: 4 places
	} {
		e := testEpoch(t, test.count, test.zones)
		homes, err := e.ChunkHomes(data, test.k, test.m)
		if !errors.Is(err, placement.ErrTooFewNodes) || homes != nil || !strings.Contains(err.Error(), "epoch 7") {
			t.Errorf("%s: %v, %v; want placement.ErrTooFewNodes naming the epoch", test.name, homes, err)
		}
	}
}

// A home outside the epoch's nodes would be a stripe on a node nobody
// addresses: ChunkHomes fails loudly, in every build.
func TestChunkHomesChecksMembership(t *testing.T) {
	e := testEpoch(t, 8, 0)
	oid := object.DataOID(1, 1)
	homes, err := e.ChunkHomes(oid, 4, 2)
	if err != nil {
		t.Fatal(err)
	}
	delete(e.Nodes, homes[3].ID)
	defer func() {
		if recover() == nil {
			t.Fatal("a home outside the epoch's nodes went unnoticed")
		}
	}()
	e.ChunkHomes(oid, 4, 2)
}
