package replica

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/object"
	"github.com/herd-storage/herd/internal/objproto"
	"github.com/herd-storage/herd/internal/store"
)

// epochs is the cluster as a replica sees it: an epoch number the test
// sets, and always the right to serve.
type epochs struct {
	mu      sync.Mutex
	number  uint64
	changed chan struct{}
}

func newEpochs(number uint64) *epochs { return &epochs{number: number, changed: make(chan struct{})} }

// set moves the node to epoch number, backwards too: a node restarted
// replays its log from an older epoch than its copies' stamps.
func (e *epochs) set(number uint64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.number = number
	close(e.changed)
	e.changed = make(chan struct{})
}

func (e *epochs) Epoch() uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.number
}

func (e *epochs) View() cluster.EpochView { return cluster.EpochView{Number: e.Epoch()} }

func (e *epochs) WaitEpoch(ctx context.Context, after uint64) (cluster.EpochView, error) {
	for {
		e.mu.Lock()
		number, changed := e.number, e.changed
		e.mu.Unlock()
		if number > after {
			return cluster.EpochView{Number: number}, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return cluster.EpochView{Number: number}, ctx.Err()
		}
	}
}

// The node always holds a lease and every epoch is active.
func (e *epochs) LeaseValid() bool                                   { return true }
func (e *epochs) LeaseValidMonotonic() bool                          { return true }
func (e *epochs) WaitLease(ctx context.Context) error                { return nil }
func (e *epochs) WaitActive(ctx context.Context, epoch uint64) error { return nil }

func newTestReplica(t *testing.T, c *epochs) (*Replica, *store.Store) {
	t.Helper()
	s, err := store.Open(store.Options{Disks: []store.Disk{{Path: t.TempDir(), Weight: 1}}, ReserveBytes: -1, OpenFiles: 16})
	if err != nil {
		t.Fatal(err)
	}
	return New(c, LocalStore{Store: s}), s
}

// TestCopyStampedAheadIsStaleEpoch: a request in epoch 7 meets a copy
// stamped 10 (written in 10, then the node restarted and replays its log
// from 7, so it admits the request as from its own epoch). The requester
// is behind: every change and every read is refused as from a stale
// epoch naming 10, so that it catches up and retries; never an invalid
// argument (which reached NBD clients as EIO), never served, and the copy
// keeps its data and stamp.
func TestCopyStampedAheadIsStaleEpoch(t *testing.T) {
	c := newEpochs(10)
	r, s := newTestReplica(t, c)
	ctx := context.Background()
	const oid = 0x0000000100000003
	newer := bytes.Repeat([]byte{0x22}, 4096)
	if err := r.Write(ctx, 10, oid, newer, 0, object.FlagCreate); err != nil {
		t.Fatal(err)
	}
	c.set(7)

	stale := func(what string, err error) {
		t.Helper()
		var staleError *object.StaleEpochError
		if !errors.Is(err, object.ErrStaleEpoch) || !errors.As(err, &staleError) || staleError.Current != 10 || errors.Is(err, object.ErrInvalid) {
			t.Errorf("%s in epoch 7 of a copy stamped 10: %v; want a stale epoch error naming epoch 10", what, err)
		}
	}
	stale("write", r.Write(ctx, 7, oid, bytes.Repeat([]byte{0x11}, 4096), 0, 0))
	stale("write with CREATE", r.Write(ctx, 7, oid, bytes.Repeat([]byte{0x11}, 4096), 0, object.FlagCreate|object.FlagFresh))
	stale("WRITE_ZEROES", r.Zero(ctx, 7, oid, 0, 4096, object.FlagNoHole))
	stale("TRIM", r.Zero(ctx, 7, oid, 0, 4096, 0))
	stale("remove", r.Remove(ctx, 7, oid))
	buffer := make([]byte, 4096)
	_, err := r.Read(ctx, 7, oid, buffer, 0)
	stale("read", err)

	// Through the object protocol: STALE_EPOCH with the stamp as the
	// epoch, which the requester's client turns back into the error.
	response, _ := r.ServeObject(ctx, &objproto.ObjectRequest{Opcode: objproto.ObjectWrite, Epoch: 7, OID: oid, Length: 4096}, bytes.Repeat([]byte{0x11}, 4096))
	if response.Status != objproto.ObjectStatusStaleEpoch || response.Epoch != 10 {
		t.Errorf("WRITE in epoch 7 over the object protocol: %+v; want STALE_EPOCH at epoch 10", response)
	}

	// The copy is untouched, and serves its epoch once the node is back.
	if stamp, err := s.Epoch(oid); err != nil || stamp != 10 {
		t.Fatalf("the copy's stamp after the refusals: %d, %v; want 10", stamp, err)
	}
	c.set(10)
	if _, err := r.Read(ctx, 10, oid, buffer, 0); err != nil || !bytes.Equal(buffer, newer) {
		t.Fatalf("read in epoch 10: %v, data changed: %v", err, !bytes.Equal(buffer, newer))
	}
	if err := r.Write(ctx, 10, oid, bytes.Repeat([]byte{0x33}, 4096), 0, 0); err != nil {
		t.Fatalf("write in epoch 10: %v", err)
	}
}

// TestCopyStampedBehindIsNotRecovered: the other side of the fence, for
// contrast: a copy from an older epoch answers NOT_RECOVERED, and may be
// removed (by a gateway replacing a damaged or deleted object).
func TestCopyStampedBehindIsNotRecovered(t *testing.T) {
	c := newEpochs(7)
	r, s := newTestReplica(t, c)
	ctx := context.Background()
	const oid = 0x0000000100000003
	if err := r.Write(ctx, 7, oid, []byte{1}, 0, object.FlagCreate); err != nil {
		t.Fatal(err)
	}
	c.set(10)
	if err := r.Write(ctx, 10, oid, []byte{2}, 0, 0); !errors.Is(err, object.ErrNotRecovered) {
		t.Errorf("write in epoch 10 of a copy stamped 7: %v; want not recovered", err)
	}
	if _, err := r.Read(ctx, 10, oid, make([]byte, 1), 0); !errors.Is(err, object.ErrNotRecovered) {
		t.Errorf("read in epoch 10 of a copy stamped 7: %v; want not recovered", err)
	}
	if err := r.Remove(ctx, 10, oid); err != nil {
		t.Errorf("remove in epoch 10 of a copy stamped 7: %v", err)
	}
	if _, err := s.Epoch(oid); !errors.Is(err, object.ErrNotFound) {
		t.Errorf("after the remove: %v; want not found", err)
	}
}

// TestServedRoutesRecoverToRecovery: RECOVER is the node's recovery's
// (Served), admitted in the request's epoch; the replica alone refuses
// it as unavailable, and Served answers everything else as the replica
// does.
func TestServedRoutesRecoverToRecovery(t *testing.T) {
	c := newEpochs(5)
	r, _ := newTestReplica(t, c)
	ctx := context.Background()
	oid := object.DataOID(1, 0)
	var recovered []uint64
	served := Served{Replica: r, Recoverer: func(ctx context.Context, epoch object.Epoch, oid object.OID) error {
		recovered = append(recovered, uint64(epoch))
		return nil
	}}
	request := &objproto.ObjectRequest{Opcode: objproto.ObjectRecover, Epoch: 5, OID: oid}
	if response, _ := served.ServeObject(ctx, request, nil); response.Status != objproto.ObjectStatusOK || len(recovered) != 1 || recovered[0] != 5 {
		t.Fatalf("RECOVER through Served: %+v, recovered in epochs %v; want OK, recovered in epoch 5", response, recovered)
	}
	if response, _ := r.ServeObject(ctx, request, nil); response.Status == objproto.ObjectStatusOK {
		t.Fatalf("RECOVER through the replica alone: %+v; want a refusal", response)
	}
	if err := served.Recover(ctx, 4, oid); !errors.Is(err, object.ErrStaleEpoch) || len(recovered) != 1 {
		t.Fatalf("RECOVER in epoch 4 of 5: %v (recovered in epochs %v); want a stale epoch, no recovery", err, recovered)
	}
	write := &objproto.ObjectRequest{Opcode: objproto.ObjectWrite, Flags: object.FlagCreate, Epoch: 5, OID: oid, Length: 4096}
	if response, _ := served.ServeObject(ctx, write, bytes.Repeat([]byte{0x44}, 4096)); response.Status != objproto.ObjectStatusOK {
		t.Fatalf("WRITE through Served: %+v", response)
	}
}

// TestChunkServedWhateverItsStamp: a chunk of an erasure-coded object has
// one copy, never recovered, checked by its gateway against its object's
// head: stamped with an older epoch it is still read, written (and so
// restamped with the epoch), zeroed, stat'ed and removed, and RECOVER of
// it is done at once without the node's recovery. A data object stamped
// the same way is refused as not recovered, as ever.
func TestChunkServedWhateverItsStamp(t *testing.T) {
	c := newEpochs(7)
	r, s := newTestReplica(t, c)
	ctx := context.Background()
	data := object.DataOID(1, 3)
	chunk := object.ChunkOID(data, 2, 1)
	old := bytes.Repeat([]byte{0x55}, 4096)
	for _, oid := range []object.OID{data, chunk} {
		if err := r.Write(ctx, 7, oid, old, 0, object.FlagCreate); err != nil {
			t.Fatal(err)
		}
	}
	c.set(10)

	buffer := make([]byte, 4096)
	if _, err := r.Read(ctx, 10, data, buffer, 0); !errors.Is(err, object.ErrNotRecovered) {
		t.Errorf("read in epoch 10 of a data object stamped 7: %v; want not recovered", err)
	}
	if err := r.Write(ctx, 10, data, old, 0, 0); !errors.Is(err, object.ErrNotRecovered) {
		t.Errorf("write in epoch 10 of a data object stamped 7: %v; want not recovered", err)
	}
	if err := r.Zero(ctx, 10, data, 0, 4096, object.FlagNoHole); !errors.Is(err, object.ErrNotRecovered) {
		t.Errorf("WRITE_ZEROES in epoch 10 of a data object stamped 7: %v; want not recovered", err)
	}
	response, _ := r.ServeObject(ctx, &objproto.ObjectRequest{Opcode: objproto.ObjectRead, Epoch: 10, OID: data, Length: 4096}, nil)
	if response.Status != objproto.ObjectStatusNotRecovered {
		t.Errorf("READ in epoch 10 of a data object stamped 7 over the object protocol: %+v; want NOT_RECOVERED", response)
	}

	stamp, err := r.Read(ctx, 10, chunk, buffer, 0)
	if err != nil || stamp != 7 || !bytes.Equal(buffer, old) {
		t.Fatalf("read in epoch 10 of a chunk stamped 7: stamp %d, %v, same data: %v; want its data, stamp 7", stamp, err, bytes.Equal(buffer, old))
	}
	response, body := r.ServeObject(ctx, &objproto.ObjectRequest{Opcode: objproto.ObjectRead, Epoch: 10, OID: chunk, Length: 4096}, nil)
	if response.Status != objproto.ObjectStatusOK || response.ObjectEpoch != 7 || !bytes.Equal(body, old) {
		t.Errorf("READ in epoch 10 of a chunk stamped 7 over the object protocol: %+v; want OK with its data, stamp 7", response)
	}
	if response.Release != nil {
		response.Release.Release()
	}
	if stamp, _, err := r.Stat(ctx, 10, chunk); err != nil || stamp != 7 {
		t.Errorf("stat in epoch 10 of a chunk stamped 7: %d, %v", stamp, err)
	}
	recovered := 0
	served := Served{Replica: r, Recoverer: func(context.Context, object.Epoch, object.OID) error { recovered++; return nil }}
	if err := served.Recover(ctx, 10, chunk); err != nil || recovered != 0 {
		t.Errorf("RECOVER of a chunk: %v, recovery called %d times; want done, never called", err, recovered)
	}
	if err := served.Recover(ctx, 9, chunk); !errors.Is(err, object.ErrStaleEpoch) {
		t.Errorf("RECOVER of a chunk in epoch 9 of 10: %v; want a stale epoch (every request's check)", err)
	}
	newer := bytes.Repeat([]byte{0x66}, 4096)
	if err := r.Write(ctx, 10, chunk, newer, 4096, 0); err != nil {
		t.Fatalf("write in epoch 10 of a chunk stamped 7: %v", err)
	}
	if stamp, err := s.Epoch(chunk); err != nil || stamp != 10 {
		t.Errorf("the chunk's stamp after a write in epoch 10: %d, %v; want 10", stamp, err)
	}
	if err := r.Zero(ctx, 10, chunk, 0, 4096, object.FlagNoHole); err != nil {
		t.Errorf("WRITE_ZEROES in epoch 10 of a chunk: %v", err)
	}
	two := make([]byte, 8192)
	if _, err := r.Read(ctx, 10, chunk, two, 0); err != nil || !bytes.Equal(two[:4096], make([]byte, 4096)) || !bytes.Equal(two[4096:], newer) {
		t.Errorf("read back of the chunk: %v; want zeros then the write", err)
	}

	// Written in epoch 10, read by a node back at epoch 9 (replaying its
	// log): served; a change is refused as stale, the stamp never goes
	// back.
	c.set(9)
	if _, err := r.Read(ctx, 9, chunk, buffer, 4096); err != nil || !bytes.Equal(buffer, newer) {
		t.Errorf("read in epoch 9 of a chunk stamped 10: %v", err)
	}
	if err := r.Write(ctx, 9, chunk, old, 0, 0); !errors.Is(err, object.ErrStaleEpoch) {
		t.Errorf("write in epoch 9 of a chunk stamped 10: %v; want a stale epoch", err)
	}
	c.set(11)

	// Every request still passes the request epoch's check.
	if _, err := r.Read(ctx, 10, chunk, buffer, 0); !errors.Is(err, object.ErrStaleEpoch) {
		t.Errorf("read in epoch 10 of 11 of a chunk: %v; want a stale epoch", err)
	}
	// A missing chunk reads as not found, at once.
	missing := object.ChunkOID(data, 0, 0)
	if _, err := r.Read(ctx, 11, missing, buffer, 0); !errors.Is(err, object.ErrNotFound) {
		t.Errorf("read of a missing chunk: %v; want not found", err)
	}
	response, _ = r.ServeObject(ctx, &objproto.ObjectRequest{Opcode: objproto.ObjectRead, Epoch: 11, OID: missing, Length: 4096}, nil)
	if response.Status != objproto.ObjectStatusNotFound {
		t.Errorf("READ of a missing chunk over the object protocol: %+v; want NOT_FOUND", response)
	}
	if err := r.Remove(ctx, 11, chunk); err != nil {
		t.Errorf("remove in epoch 11 of a chunk stamped 10: %v", err)
	}
	if _, err := s.Epoch(chunk); !errors.Is(err, object.ErrNotFound) {
		t.Errorf("after the remove: %v; want not found", err)
	}
}
