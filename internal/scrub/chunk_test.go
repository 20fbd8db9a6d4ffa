package scrub

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"

	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/layout"
	"github.com/herd-storage/herd/internal/object"
	"github.com/herd-storage/herd/internal/store"
)

// rotten is a store whose every copy fails its checksum on every read,
// stamped with the epoch; it records the repairs it is given.
type rotten struct {
	mu       sync.Mutex
	objects  []object.OID
	length   uint64
	repaired []object.OID
}

func (s *rotten) List(fn func(oid object.OID, info store.Info) error) error {
	for _, oid := range s.objects {
		if err := fn(oid, store.Info{Epoch: scrubEpoch, LengthBytes: s.length}); err != nil {
			return err
		}
	}
	return nil
}

func (s *rotten) Read(oid object.OID, p []byte, offset uint32) (store.Info, error) {
	return store.Info{Epoch: scrubEpoch, LengthBytes: s.length}, fmt.Errorf("object %016x: %w", oid, object.ErrChecksum)
}

func (s *rotten) Repair(oid object.OID, p []byte, offset uint32) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.repaired = append(s.repaired, oid)
	return 1, nil
}

func (s *rotten) Stat(oid object.OID) (store.Info, error) {
	return store.Info{Epoch: scrubEpoch, LengthBytes: s.length}, nil
}

func (s *rotten) Upgrade(oid object.OID) (bool, error) { return false, nil }

// readsRecorded are copiesHeld whose reads are recorded.
type readsRecorded struct {
	copiesHeld
	mu   sync.Mutex
	read []object.OID
}

func (r *readsRecorded) Read(ctx context.Context, node cluster.Node, epoch object.Epoch, oid object.OID, p []byte, offset uint32) (object.Epoch, error) {
	r.mu.Lock()
	r.read = append(r.read, oid)
	r.mu.Unlock()
	return r.copiesHeld.Read(ctx, node, epoch, oid, p, offset)
}

func (r *readsRecorded) Fetch(ctx context.Context, node cluster.Node, epoch object.Epoch, oid object.OID, p []byte) (object.Epoch, error) {
	return r.Read(ctx, node, epoch, oid, p, 0)
}

// TestChunkBadBlocksAreNotRepairedFromAnotherNode: a chunk of an
// erasure-coded object has one copy. A pass that finds its blocks bad
// verifies it like any copy but reads no other node for it (whatever
// another node holds under that id, the epoch's placement of the id does
// not make it a replica): it counts the checksum error and the blocks as
// unrepairable, and repairs nothing. A data object beside it, bad the
// same way, is repaired from a replica as ever. A deep pass does not
// compare a chunk with other nodes either.
func TestChunkBadBlocksAreNotRepairedFromAnotherNode(t *testing.T) {
	layouts := layout.NewHistory(newOneEpoch(), slog.New(slog.DiscardHandler))
	rv, err := layouts.Current()
	if err != nil {
		t.Fatal(err)
	}
	const self = "n0"
	const size = 64 << 10
	// Ids of which n0 is the first replica by placement, so that a deep
	// pass would compare them if it compared chunks.
	pick := func(make func(i uint32) object.OID) object.OID {
		for i := uint32(0); i < 1<<16; i++ {
			if oid := make(i); rv.ReplicasOf(oid, 3)[0].ID == self {
				return oid
			}
		}
		t.Fatal("no object placed first on n0")
		return 0
	}
	data := pick(func(i uint32) object.OID { return object.DataOID(1, i) })
	chunk := pick(func(i uint32) object.OID { return object.ChunkOID(object.DataOID(1, 1000+i), 3, 0) })
	held := &readsRecorded{copiesHeld: copiesHeld{}}
	for _, n := range rv.Nodes {
		held.copiesHeld[n.ID] = map[object.OID][]byte{
			data:  bytes.Repeat([]byte{0xda}, size),
			chunk: bytes.Repeat([]byte{0xcc}, size),
		}
	}
	s := &rotten{objects: []object.OID{chunk, data}, length: size}
	sc := New(s, held, layouts, self, Options{})
	if err := sc.pass(context.Background()); err != nil {
		t.Fatalf("the pass: %v", err)
	}
	st := sc.Status()
	if st.ChecksumErrors != 2 || st.Repaired != 1 || st.Unrepairable != 1 {
		t.Errorf("status %+v: %d checksum errors, %d repaired, %d unrepairable; want 2, 1 (the data object), 1 (the chunk)", st, st.ChecksumErrors, st.Repaired, st.Unrepairable)
	}
	if !slices.Equal(s.repaired, []object.OID{data}) {
		t.Errorf("repaired %016x; want the data object %016x only", s.repaired, data)
	}
	if slices.Contains(held.read, chunk) || !slices.Contains(held.read, data) {
		t.Errorf("read from other nodes %016x; want the data object %016x, never the chunk %016x", held.read, data, chunk)
	}

	var checkedChunks []object.OID
	chunks := func(ctx context.Context, oid object.OID) (int, int, int, error) {
		checkedChunks = append(checkedChunks, oid)
		return 6, 1, 1, nil
	}
	deep := New(nil, held, layouts, self, Options{ObjectSize: func(object.OID) (uint64, error) { return size, nil }, Chunks: chunks})
	held.read = nil
	if err := deep.compare(context.Background(), scrubEpoch, chunk); err != nil {
		t.Fatalf("a deep pass over the chunk: %v", err)
	}
	if len(held.read) != 0 || deep.Status().Compared != 0 {
		t.Errorf("a deep pass over a chunk read %016x and compared %d; want nothing", held.read, deep.Status().Compared)
	}
	if err := deep.compare(context.Background(), scrubEpoch, data); err != nil || deep.Status().Compared != 1 {
		t.Errorf("a deep pass over the data object: %v, %d compared; want 1", err, deep.Status().Compared)
	}
	// The data object's chunks are checked against its head (by the
	// gateway: Options.Chunks) once its replicas compared, and counted;
	// a chunk itself never is.
	if st := deep.Status(); !slices.Equal(checkedChunks, []object.OID{data}) || st.ChunksChecked != 6 || st.ChunksBad != 1 || st.ChunksRepaired != 1 {
		t.Errorf("chunks checked for %016x, status %d checked, %d bad, %d repaired; want the data object's, 6, 1, 1", checkedChunks, st.ChunksChecked, st.ChunksBad, st.ChunksRepaired)
	}
}
