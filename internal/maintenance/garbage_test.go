package maintenance

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"

	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/layout"
	"github.com/herd-storage/herd/internal/object"
	"github.com/herd-storage/herd/internal/recovery"
)

// garbageData is the gateway as garbage collection uses it: it reads a
// VDI's map objects and removes objects from every node of the fake
// cluster, as the gateway removes them from their replicas. Safe for
// concurrent use, as collection removes objects from several goroutines.
type garbageData struct {
	replicas *fakeReplicas
	nodes    []string

	mu   sync.Mutex
	maps map[object.OID][]uint32
}

func (d *garbageData) Map(ctx context.Context, vdi cluster.VDI) ([]uint32, error) {
	return nil, fmt.Errorf("not used")
}

func (d *garbageData) ReadObject(ctx context.Context, oid object.OID, copies int, p []byte, offset uint32) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	entries, ok := d.maps[oid]
	if !ok {
		return object.ErrNoObject
	}
	clear(p)
	for i, e := range entries {
		if 4*i+4 <= len(p) {
			binary.BigEndian.PutUint32(p[4*i:], e)
		}
	}
	return nil
}

func (d *garbageData) RemoveObject(ctx context.Context, oid object.OID, copies int) error {
	d.mu.Lock()
	delete(d.maps, oid)
	d.mu.Unlock()
	for _, n := range d.nodes {
		d.replicas.Remove(ctx, cluster.Node{ID: n}, 0, oid)
	}
	return nil
}

// TestGarbageRemovesChunks: freeing a deleted VDI removes the chunks of
// its erasure-coded data objects from every node, wherever they are
// (their object's head placed them, not the epoch's placement of their
// ids), besides its data and map objects; another VDI's chunks stay.
func TestGarbageRemovesChunks(t *testing.T) {
	l := &fakeLog{nodes: map[string]cluster.Node{}, vdis: map[uint32]cluster.VDI{}, copies: 2}
	nodes := []string{"n0", "n1", "n2"}
	l.setNodes(nodes...)
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	layouts := layout.NewHistory(l, logger)
	f := &fakeReplicas{nodes: map[string]map[uint64]fakeCopy{}}
	const freed, kept = 7, 8
	copyOf := fakeCopy{stamp: 1, data: []byte{1}}
	d0, d1 := object.DataOID(freed, 0), object.DataOID(freed, 1)
	gone := []struct {
		node string
		oid  object.OID
	}{
		{"n0", d0}, {"n1", d0},
		{"n1", object.ChunkOID(d0, 0, 0)}, {"n2", object.ChunkOID(d0, 1, 0)}, {"n0", object.ChunkOID(d0, 2, 1)},
		{"n2", object.ChunkOID(d1, 0, 1)}, {"n2", object.ChunkOID(d1, 10, 1)},
	}
	for _, c := range gone {
		f.put(c.node, c.oid, copyOf)
	}
	other := object.DataOID(kept, 0)
	stay := []struct {
		node string
		oid  object.OID
	}{{"n0", other}, {"n1", object.ChunkOID(other, 0, 0)}, {"n2", object.ChunkOID(other, 1, 1)}}
	for _, c := range stay {
		f.put(c.node, c.oid, copyOf)
	}
	data := &garbageData{replicas: f, nodes: nodes, maps: map[object.OID][]uint32{
		object.MapOID(freed, 0): {freed, freed},
		object.MapOID(kept, 0):  {kept},
	}}
	m := New(l, layouts, f, recovery.NewProof(l, layouts, f), logger)
	garbage := cluster.Garbage{ID: freed, Size: 2 << 16, ObjectSize: 1 << 16, Copies: 2}
	if err := m.CollectGarbage(context.Background(), data, garbage); err != nil {
		t.Fatalf("collecting vdi %d: %v", freed, err)
	}
	for _, c := range gone {
		if _, ok := f.get(c.node, c.oid); ok {
			t.Errorf("object %016x of freed vdi %d is still on %s", c.oid, freed, c.node)
		}
	}
	for _, c := range stay {
		if _, ok := f.get(c.node, c.oid); !ok {
			t.Errorf("object %016x of vdi %d was removed from %s", c.oid, kept, c.node)
		}
	}
	data.mu.Lock()
	defer data.mu.Unlock()
	if _, ok := data.maps[object.MapOID(freed, 0)]; ok {
		t.Errorf("the freed vdi's map object is left")
	}
}
