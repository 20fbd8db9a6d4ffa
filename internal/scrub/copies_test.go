package scrub

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"testing"

	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/layout"
	"github.com/herd-storage/herd/internal/object"
)

// oneEpoch is a cluster log at one epoch: four nodes, formatted with 3
// copies.
type oneEpoch struct{ nodes []cluster.Node }

func newOneEpoch() *oneEpoch {
	e := &oneEpoch{}
	for i := 0; i < 4; i++ {
		id := fmt.Sprintf("n%d", i)
		e.nodes = append(e.nodes, cluster.Node{ID: id, Address: id, Capacity: 1 << 40, State: cluster.NodeAlive})
	}
	return e
}

const scrubEpoch = 7

func (e *oneEpoch) Epoch() uint64 { return scrubEpoch }

func (e *oneEpoch) View() cluster.EpochView {
	v := cluster.EpochView{Number: scrubEpoch, Nodes: e.nodes, Format: &cluster.Format{Copies: 3, ObjectSize: 64 << 10}}
	for _, n := range e.nodes {
		v.Placed = append(v.Placed, n.ID)
		v.Members = append(v.Members, cluster.MemberOf(n))
	}
	return v
}

func (e *oneEpoch) Node(id string) (cluster.Node, bool) {
	for _, n := range e.nodes {
		if n.ID == id {
			return n, true
		}
	}
	return cluster.Node{}, false
}

// copiesHeld are every node's copies, all stamped with the epoch.
type copiesHeld map[string]map[object.OID][]byte

func (c copiesHeld) Read(ctx context.Context, node cluster.Node, epoch object.Epoch, oid object.OID, p []byte, offset uint32) (object.Epoch, error) {
	data, ok := c[node.ID][oid]
	if !ok {
		return 0, fmt.Errorf("node %s: object %016x: %w", node.ID, oid, object.ErrNotFound)
	}
	copy(p, data[offset:])
	return scrubEpoch, nil
}

func (c copiesHeld) Fetch(ctx context.Context, node cluster.Node, epoch object.Epoch, oid object.OID, p []byte) (object.Epoch, error) {
	return c.Read(ctx, node, epoch, oid, p, 0)
}

// TestDeepScrubComparesTheVDIsCopies: a deep pass compares the replicas
// of an object's VDI's own copies, not the format's: a VDI of 4 copies on
// a cluster formatted with 3 has its fourth copy compared too (a copy that
// differs there is found), and a VDI of 2 copies is compared on its two
// replicas (the node that the format's third copy would be on holds none,
// which is no error). A VDI this node does not know is not compared.
func TestDeepScrubComparesTheVDIsCopies(t *testing.T) {
	source := newOneEpoch()
	layouts := layout.NewHistory(source, slog.New(slog.DiscardHandler))
	rv, err := layouts.Current()
	if err != nil {
		t.Fatal(err)
	}
	const self = "n0"
	const size = 64 << 10
	vdiCopies := map[uint32]int{1: 4, 2: 2}
	// An object of each VDI of which n0 is the first replica both by
	// the format's copies and by its VDI's, and whose format replicas
	// are among (or hold) its VDI's, so that only the count differs.
	pick := func(vdi uint32) uint64 {
		for index := uint32(0); index < 1<<16; index++ {
			oid := object.DataOID(object.VDIID(vdi), index)
			own, format := ids(rv.ReplicasOf(oid, vdiCopies[vdi])), ids(rv.ReplicasOf(oid, 3))
			if own[0] != self || format[0] != self {
				continue
			}
			small, large := own, format
			if len(small) > len(large) {
				small, large = large, small
			}
			if !slices.ContainsFunc(small, func(id string) bool { return !slices.Contains(large, id) }) {
				return uint64(oid)
			}
		}
		t.Fatalf("no object of vdi %d placed first on %s", vdi, self)
		return 0
	}
	four, two := pick(1), pick(2)
	held := copiesHeld{}
	put := func(node string, oid object.OID, data []byte) {
		if held[node] == nil {
			held[node] = map[object.OID][]byte{}
		}
		held[node][oid] = data
	}
	same := bytes.Repeat([]byte{0xab}, size)
	replicasOfFour := ids(rv.ReplicasOf(object.OID(four), 4))
	for _, node := range replicasOfFour[:3] {
		put(node, object.OID(four), same)
	}
	put(replicasOfFour[3], object.OID(four), bytes.Repeat([]byte{0xcd}, size)) // the fourth copy differs
	for _, node := range ids(rv.ReplicasOf(object.OID(two), 2)) {
		put(node, object.OID(two), same)
	}
	unknown := object.DataOID(3, 0)
	put(self, unknown, same)

	sc := New(nil, held, layouts, self, Options{
		ObjectSize: func(object.OID) (uint64, error) { return size, nil },
		Copies: func(oid object.OID) (int, bool) {
			n, ok := vdiCopies[uint32(object.VDI(oid))]
			return n, ok
		},
	})
	ctx := context.Background()
	if err := sc.compare(ctx, scrubEpoch, object.OID(four)); err != nil {
		t.Fatalf("comparing the copies of a VDI of 4: %v", err)
	}
	if st := sc.Status(); st.Mismatched != 1 {
		t.Fatalf("the fourth copy of a VDI of 4 copies differs: %d mismatched, want 1 (replicas %v)", st.Mismatched, replicasOfFour)
	}
	if err := sc.compare(ctx, scrubEpoch, object.OID(two)); err != nil {
		t.Fatalf("comparing the copies of a VDI of 2: %v", err)
	}
	if err := sc.compare(ctx, scrubEpoch, unknown); err != nil {
		t.Fatalf("an object of a VDI unknown here: %v", err)
	}
	if st := sc.Status(); st.Compared != 1 || st.Mismatched != 1 {
		t.Fatalf("after the VDI of 2 and an unknown one: %d compared, %d mismatched; want 1 and 1", st.Compared, st.Mismatched)
	}
}

func ids(nodes []cluster.Node) []string {
	var out []string
	for _, n := range nodes {
		out = append(out, n.ID)
	}
	return out
}
