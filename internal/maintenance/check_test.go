package maintenance

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/layout"
	"github.com/herd-storage/herd/internal/object"
	"github.com/herd-storage/herd/internal/recovery"
)

// fakeLog is a cluster log reduced to what checks and proofs read.
type fakeLog struct {
	mu     sync.Mutex
	nodes  map[string]cluster.Node
	epochs []cluster.Epoch
	vdis   map[uint32]cluster.VDI
	copies int
}

func (l *fakeLog) setNodes(ids ...string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	sort.Strings(ids)
	var members []cluster.Member
	for _, id := range ids {
		if _, ok := l.nodes[id]; !ok {
			l.nodes[id] = cluster.Node{ID: id, Address: id, Capacity: 1 << 40, State: cluster.NodeAlive}
		}
		members = append(members, cluster.MemberOf(l.nodes[id]))
	}
	l.epochs = append(l.epochs, cluster.Epoch{Number: uint64(len(l.epochs) + 1), Nodes: ids, Members: members})
}

func (l *fakeLog) Epoch() uint64 { return l.View().Number }

func (l *fakeLog) View() cluster.EpochView {
	l.mu.Lock()
	defer l.mu.Unlock()
	last := l.epochs[len(l.epochs)-1]
	v := cluster.EpochView{Number: last.Number, Placed: last.Placed(), Format: &cluster.Format{Copies: l.copies, ObjectSize: 1 << 16}}
	for _, id := range last.Nodes {
		v.Nodes = append(v.Nodes, l.nodes[id])
	}
	v.Members = last.PlacedMembers(func(id string) (cluster.Member, bool) {
		n, ok := l.nodes[id]
		return cluster.MemberOf(n), ok
	})
	return v
}

func (l *fakeLog) WaitEpoch(ctx context.Context, after uint64) (cluster.EpochView, error) {
	<-ctx.Done()
	return l.View(), ctx.Err()
}

func (l *fakeLog) Epochs() []cluster.Epoch {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]cluster.Epoch(nil), l.epochs...)
}

func (l *fakeLog) Node(id string) (cluster.Node, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n, ok := l.nodes[id]
	return n, ok
}

func (l *fakeLog) MaintenanceHold(time.Time) (time.Time, []string) { return time.Time{}, nil }

func (l *fakeLog) VDIByID(id uint32) (cluster.VDI, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	v, ok := l.vdis[id]
	return v, ok
}

func (l *fakeLog) VDICopies(id uint32) (int, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	v, ok := l.vdis[id]
	if !ok {
		return 0, false
	}
	if v.Copies == 0 {
		return l.copies, true
	}
	return v.Copies, true
}

func (l *fakeLog) LookupVDI(ctx context.Context, name string) (cluster.VDI, error) {
	panic("not used")
}
func (l *fakeLog) MarkVDIRepaired(ctx context.Context, name string) error { return nil }
func (l *fakeLog) Tree() []cluster.VDI                                    { return nil }
func (l *fakeLog) Chain(id uint32) []uint32                               { return nil }

type fakeCopy struct {
	stamp object.Epoch
	data  []byte
}

// fakeReplicas holds every node's copies. Recover does what a replica's
// RECOVER does: restamps its own copy if it has the newest stamp, else
// fetches from the first holder of it in node order (as the background
// pass, whose listing keeps the first node with the newest stamp).
type fakeReplicas struct {
	mu    sync.Mutex
	nodes map[string]map[uint64]fakeCopy
}

func (f *fakeReplicas) get(node string, oid object.OID) (fakeCopy, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, ok := f.nodes[node][uint64(oid)]
	return c, ok
}

func (f *fakeReplicas) put(node string, oid object.OID, c fakeCopy) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.nodes[node] == nil {
		f.nodes[node] = map[uint64]fakeCopy{}
	}
	f.nodes[node][uint64(oid)] = c
}

// Stat returns the copy's stamp; no digest (unknown).
func (f *fakeReplicas) Stat(ctx context.Context, node cluster.Node, epoch object.Epoch, oid object.OID) (object.Epoch, uint64, error) {
	c, ok := f.get(node.ID, oid)
	if !ok {
		return 0, 0, object.ErrNotFound
	}
	return c.stamp, 0, nil
}

func (f *fakeReplicas) Fetch(ctx context.Context, node cluster.Node, epoch object.Epoch, oid object.OID, p []byte) (object.Epoch, error) {
	c, ok := f.get(node.ID, oid)
	if !ok {
		return 0, object.ErrNotFound
	}
	copy(p, c.data)
	return c.stamp, nil
}

func (f *fakeReplicas) FetchAt(ctx context.Context, node cluster.Node, epoch object.Epoch, oid object.OID, p []byte, offset uint32) (object.Epoch, error) {
	c, ok := f.get(node.ID, oid)
	if !ok {
		return 0, object.ErrNotFound
	}
	copy(p, c.data[offset:])
	return c.stamp, nil
}

func (f *fakeReplicas) Flush(ctx context.Context, node cluster.Node, epoch object.Epoch) error {
	return nil
}

func (f *fakeReplicas) List(ctx context.Context, node cluster.Node, epoch object.Epoch) (map[object.OID]object.Epoch, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[object.OID]object.Epoch{}
	for oid, c := range f.nodes[node.ID] {
		out[object.OID(oid)] = c.stamp
	}
	return out, nil
}

func (f *fakeReplicas) Remove(ctx context.Context, node cluster.Node, epoch object.Epoch, oid object.OID) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.nodes[node.ID], uint64(oid))
	return nil
}

func (f *fakeReplicas) Recover(ctx context.Context, node cluster.Node, epoch object.Epoch, oid object.OID) error {
	own, found := f.get(node.ID, oid)
	if found && own.stamp >= epoch {
		return nil
	}
	f.mu.Lock()
	var ids []string
	for id := range f.nodes {
		ids = append(ids, id)
	}
	f.mu.Unlock()
	sort.Strings(ids)
	var newest object.Epoch
	var holder string
	for _, id := range ids {
		if c, ok := f.get(id, oid); ok && c.stamp > newest {
			newest, holder = c.stamp, id
		}
	}
	if holder == "" {
		return object.ErrNotFound
	}
	if found && own.stamp == newest {
		own.stamp = epoch
		f.put(node.ID, oid, own)
		return nil
	}
	src, _ := f.get(holder, oid)
	f.put(node.ID, oid, fakeCopy{stamp: epoch, data: bytes.Clone(src.data)})
	return nil
}

func (f *fakeReplicas) Write(ctx context.Context, node cluster.Node, epoch object.Epoch, oid object.OID, p []byte, offset uint32, flags object.Flags) error {
	c, _ := f.get(node.ID, oid)
	data := make([]byte, max(len(c.data), int(offset)+len(p)))
	copy(data, c.data)
	copy(data[offset:], p)
	f.put(node.ID, oid, fakeCopy{stamp: epoch, data: data})
	return nil
}

// pass is the background recovery of epoch on nodes, each from a listing
// of every node taken before any of them changed a copy: the newest
// stamp and its first holder in node order.
func (f *fakeReplicas) pass(nodes []cluster.Node, epoch object.Epoch, oid object.OID) {
	f.mu.Lock()
	var ids []string
	for id := range f.nodes {
		ids = append(ids, id)
	}
	f.mu.Unlock()
	sort.Strings(ids)
	var newest object.Epoch
	var holder string
	for _, id := range ids {
		if c, ok := f.get(id, oid); ok && c.stamp > newest {
			newest, holder = c.stamp, id
		}
	}
	src, _ := f.get(holder, oid)
	for _, n := range nodes {
		own, found := f.get(n.ID, oid)
		switch {
		case found && own.stamp >= epoch:
		case found && own.stamp == newest:
			f.put(n.ID, oid, fakeCopy{stamp: epoch, data: own.data})
		default:
			f.put(n.ID, oid, fakeCopy{stamp: epoch, data: bytes.Clone(src.data)})
		}
	}
}

// The writer's node died after its last write reached only its own copy
// (never acknowledged), and the next epoch places the object elsewhere:
// that unplaced copy has the same stamp as a placed replica holding the
// old data, and another placed replica holds the old data under an older
// stamp. The repair must leave every replica with the same data, and the
// background recovery that follows must not change that (before the fix
// the repair saw two identical replicas and left them, and recovery then
// copied the unplaced copy's data to the replica with the older stamp).
func TestRepairUncleanSameStampOffPlacement(t *testing.T) {
	l := &fakeLog{nodes: map[string]cluster.Node{}, vdis: map[uint32]cluster.VDI{}, copies: 2}
	l.setNodes("n0", "n1", "n2", "n3")       // epoch 1
	l.setNodes("n0", "n1", "n2", "n3")       // epoch 2: the writer's last write
	l.setNodes("n0", "n1", "n2", "n3", "n4") // epoch 3: the object moves off n0
	const vdiID = 7
	l.vdis[vdiID] = cluster.VDI{ID: vdiID, Name: "v", Since: 1, Copies: 2, ObjectSize: 1 << 16}
	vdi := l.vdis[vdiID]
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	layouts := layout.NewHistory(l, logger)
	rv, err := layouts.Current()
	if err != nil {
		t.Fatal(err)
	}
	// An object whose replicas in epoch 3 exclude n0.
	var oid object.OID
	var placed []cluster.Node
	for i := uint32(0); ; i++ {
		oid = object.DataOID(vdiID, i)
		placed = rv.ReplicasOf(oid, 2)
		if !slices.ContainsFunc(placed, func(n cluster.Node) bool { return n.ID == "n0" }) {
			break
		}
	}
	old := bytes.Repeat([]byte{0}, int(vdi.ObjectSize))
	unacked := bytes.Repeat([]byte{185}, int(vdi.ObjectSize))
	f := &fakeReplicas{nodes: map[string]map[uint64]fakeCopy{}}
	f.put("n0", oid, fakeCopy{stamp: 2, data: bytes.Clone(unacked)})
	f.put(placed[0].ID, oid, fakeCopy{stamp: 2, data: bytes.Clone(old)})
	f.put(placed[1].ID, oid, fakeCopy{stamp: 1, data: bytes.Clone(old)})
	m := New(l, layouts, f, recovery.NewProof(l, layouts, f), logger)
	var report CheckReport
	if err := m.checkObject(context.Background(), oid, vdi, true, false, &report); err != nil {
		t.Fatal(err)
	}
	// The background passes of epoch 3 on both replicas, from listings
	// taken before either changed anything.
	f.pass(placed, rv.Number, oid)
	a, _ := f.get(placed[0].ID, oid)
	b, _ := f.get(placed[1].ID, oid)
	if !bytes.Equal(a.data, b.data) {
		t.Fatalf("replicas differ after the repair and recovery: %s stamp %d begins %d, %s stamp %d begins %d (report %+v)",
			placed[0].ID, a.stamp, a.data[0], placed[1].ID, b.stamp, b.data[0], report)
	}
	if a.stamp != rv.Number || b.stamp != rv.Number {
		t.Fatalf("stamps %d and %d, want %d", a.stamp, b.stamp, rv.Number)
	}
}
