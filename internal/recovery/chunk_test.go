package recovery

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"

	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/layout"
	"github.com/herd-storage/herd/internal/object"
	"github.com/herd-storage/herd/internal/replica"
	"github.com/herd-storage/herd/internal/store"
)

// leased is the log as this node's replica sees it: always holding a
// lease, every epoch active.
type leased struct{ *fakeLog }

func (leased) LeaseValid() bool                         { return true }
func (leased) LeaseValidMonotonic() bool                { return true }
func (leased) WaitLease(context.Context) error          { return nil }
func (leased) WaitActive(context.Context, uint64) error { return nil }
func (l leased) WaitEpoch(ctx context.Context, after uint64) (cluster.EpochView, error) {
	return l.fakeLog.WaitEpoch(ctx, after)
}

type heldCopy struct {
	stamp object.Epoch
	data  []byte
}

// peers are the other nodes' copies; this node's are its replica's
// (local), as replica.Client answers for its own node. Every Fetch is
// recorded.
type peers struct {
	self  string
	local *replica.Replica

	mu      sync.Mutex
	held    map[string]map[object.OID]heldCopy
	fetched []object.OID
}

func (p *peers) put(node string, oid object.OID, stamp object.Epoch, data []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.held[node] == nil {
		p.held[node] = map[object.OID]heldCopy{}
	}
	p.held[node][oid] = heldCopy{stamp: stamp, data: data}
}

func (p *peers) Stat(ctx context.Context, node cluster.Node, epoch object.Epoch, oid object.OID) (object.Epoch, uint64, error) {
	if node.ID == p.self {
		return p.local.Store().Stat(oid)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	c, ok := p.held[node.ID][oid]
	if !ok {
		return 0, 0, object.ErrNotFound
	}
	return c.stamp, 0, nil
}

func (p *peers) Fetch(ctx context.Context, node cluster.Node, epoch object.Epoch, oid object.OID, buffer []byte) (object.Epoch, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.fetched = append(p.fetched, oid)
	c, ok := p.held[node.ID][oid]
	if !ok {
		return 0, object.ErrNotFound
	}
	copy(buffer, c.data)
	return c.stamp, nil
}

func (p *peers) Flush(context.Context, cluster.Node, object.Epoch) error { return nil }

func (p *peers) List(ctx context.Context, node cluster.Node, epoch object.Epoch) (map[object.OID]object.Epoch, error) {
	out := map[object.OID]object.Epoch{}
	if node.ID == p.self {
		err := p.local.List(func(oid object.OID, stamp object.Epoch) error { out[oid] = stamp; return nil })
		return out, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for oid, c := range p.held[node.ID] {
		out[oid] = c.stamp
	}
	return out, nil
}

// TestPassLeavesChunksAlone: chunks of erasure-coded objects have one
// copy each, on the node their object's head names, whatever the
// epoch's placement says of their ids. A pass on node00 keeps the chunk
// it holds that placement would put elsewhere (not restamped, not
// removed as surplus, even were placement's nodes to hold the id current),
// fetches no chunk another node holds that placement would put here, and
// counts neither; RecoverObject of a chunk does nothing. The data
// objects beside them are recovered and removed as ever, so the pass
// did run.
func TestPassLeavesChunksAlone(t *testing.T) {
	log := newLog(3, 2) // epoch 1: node00..node02
	log.addVDI(7)
	log.setNodes("node00", "node01", "node02") // epoch 2: copies of epoch 1 are old
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	layouts := layout.NewHistory(log, logger)
	rv, err := layouts.Current()
	if err != nil {
		t.Fatal(err)
	}
	const self = "node00"
	here := func(oid object.OID) bool {
		return slices.ContainsFunc(rv.ReplicasOf(oid, 2), func(n cluster.Node) bool { return n.ID == self })
	}
	// pick returns the first id made by make from an index that is (or
	// is not) placed on node00.
	pick := func(placedHere bool, make func(i uint32) object.OID) object.OID {
		for i := uint32(0); i < 1<<16; i++ {
			if oid := make(i); here(oid) == placedHere {
				return oid
			}
		}
		t.Fatalf("no object placed on node00: %v", placedHere)
		return 0
	}
	chunkHere := pick(false, func(i uint32) object.OID { return object.ChunkOID(object.DataOID(7, i), 1, 0) })
	chunkThere := pick(true, func(i uint32) object.OID { return object.ChunkOID(object.DataOID(7, 100+i), 4, 1) })
	placed := pick(true, func(i uint32) object.OID { return object.DataOID(7, 200+i) })
	surplus := pick(false, func(i uint32) object.OID { return object.DataOID(7, 300+i) })

	s, err := store.Open(store.Options{Disks: []store.Disk{{Path: t.TempDir(), Weight: 1}}, ReserveBytes: -1, OpenFiles: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	local := replica.New(leased{log}, replica.LocalStore{Store: s})
	chunkData := bytes.Repeat([]byte{0xc4}, 4096)
	for _, oid := range []object.OID{chunkHere, surplus} {
		if err := s.Write(1, oid, chunkData, 0, object.FlagCreate); err != nil {
			t.Fatal(err)
		}
	}
	p := &peers{self: self, local: local, held: map[string]map[object.OID]heldCopy{}}
	for _, n := range rv.ReplicasOf(chunkHere, 2) {
		p.put(n.ID, chunkHere, rv.Number, bytes.Repeat([]byte{0x01}, 4096))
	}
	p.put("node01", chunkThere, 1, bytes.Repeat([]byte{0xc5}, 4096))
	p.put("node01", placed, 1, bytes.Repeat([]byte{0xd1}, 4096))
	for _, n := range rv.ReplicasOf(surplus, 2) {
		p.put(n.ID, surplus, rv.Number, chunkData)
	}

	r := New(log, layouts, p, local, self, logger)
	ctx := context.Background()
	if err := r.recover(ctx, rv.Number); err != nil {
		t.Fatalf("the pass: %v", err)
	}
	left, err := r.removeSurplusOnce(ctx, rv.Number)
	if err != nil || left != 0 {
		t.Fatalf("removing surplus copies: %d left, %v", left, err)
	}
	st := r.Status()
	if st.Objects != 1 || st.Copied != 1 || st.Unavailable != 0 || st.Surplus != 0 || st.Removed != 1 {
		t.Errorf("status %+v; want 1 object (the data object placed here) copied, none unavailable, 1 surplus copy removed, none left", st)
	}
	if slices.ContainsFunc(p.fetched, object.IsChunk) || !slices.Contains(p.fetched, placed) {
		t.Errorf("fetched %016x; want the data object %016x only, no chunk", p.fetched, placed)
	}
	buffer := make([]byte, 4096)
	if info, err := s.Read(chunkHere, buffer, 0); err != nil || info.Epoch != 1 || !bytes.Equal(buffer, chunkData) {
		t.Errorf("the chunk held here: stamp %d, %v, unchanged: %v; want kept as it was, stamped 1", info.Epoch, err, bytes.Equal(buffer, chunkData))
	}
	if _, err := s.Epoch(chunkThere); !errors.Is(err, object.ErrNotFound) {
		t.Errorf("the chunk held on node01: %v here; want not copied", err)
	}
	if stamp, err := s.Epoch(placed); err != nil || stamp != rv.Number {
		t.Errorf("the data object placed here: stamp %d, %v; want copied, stamped %d", stamp, err, rv.Number)
	}
	if _, err := s.Epoch(surplus); !errors.Is(err, object.ErrNotFound) {
		t.Errorf("the data object placed elsewhere: %v; want removed as surplus", err)
	}

	fetched := len(p.fetched)
	for _, oid := range []object.OID{chunkHere, chunkThere} {
		if err := r.RecoverObject(ctx, rv.Number, oid); err != nil {
			t.Errorf("RecoverObject of chunk %016x: %v; want nil (nothing to do)", oid, err)
		}
	}
	if _, err := s.Epoch(chunkThere); !errors.Is(err, object.ErrNotFound) || len(p.fetched) != fetched {
		t.Errorf("RecoverObject of a chunk held elsewhere: %v here, %d fetches; want nothing done", err, len(p.fetched)-fetched)
	}
	if stamp, _ := s.Epoch(chunkHere); stamp != 1 {
		t.Errorf("RecoverObject of the chunk held here restamped it %d", stamp)
	}
	every := func(string) bool { return true }
	if err := r.Proof().Current(chunkHere, 2, rv, 1, every); !errors.Is(err, object.ErrInvalid) {
		t.Errorf("proof of currency of a chunk: %v; want refused as invalid", err)
	}
	if err := r.Proof().Current(placed, 2, rv, 1, every); err != nil {
		t.Errorf("proof of currency of a data object stamped in the previous epoch: %v", err)
	}
}
