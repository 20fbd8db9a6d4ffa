package gateway

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/herd-storage/herd/internal/cluster"
)

// TestTakeoverCheck: a standby open whose take-over check refuses (its
// NBD client was revoked) never takes the writer lock: its requests fail
// and the holder keeps the lock and writes on. Once the check allows it,
// the standby takes the lock over as usual; a check that refuses once
// the lock is handed over fails that request too.
func TestTakeoverCheck(t *testing.T) {
	w := newWorld(t, 3, 3)
	w.cluster.addVDI("disk", 1, 4*objectSize)
	a, b := w.gateway("node00"), w.gateway("node01")
	ctx := context.Background()
	da := open(t, a, "disk")
	db := open(t, b, "disk")
	revoked := errors.New("client revoked")
	var refuse atomic.Bool
	var asked atomic.Int64
	refuse.Store(true)
	db.SetTakeoverCheck(func() error {
		asked.Add(1)
		if refuse.Load() {
			return revoked
		}
		return nil
	})
	holder := func() cluster.Lock {
		l, _ := w.cluster.Lock(cluster.VDILockKey("disk"))
		return l
	}
	if err := da.WriteAt(ctx, []byte("AAAA"), 0, false); err != nil {
		t.Fatal(err)
	}
	generation := holder().Generation
	for _, request := range []func() error{
		func() error { return db.WriteAt(ctx, []byte("BBBB"), 0, false) },
		func() error { return db.ReadAt(ctx, make([]byte, 4), 0) },
		func() error { return db.WriteZeroes(ctx, 0, 4096, false, false) },
	} {
		if err := request(); !errors.Is(err, revoked) {
			t.Fatalf("a refused standby's request: %v, want the check's refusal", err)
		}
	}
	if l := holder(); l.Node != "node00" || l.Generation != generation || l.Wanted != nil {
		t.Fatalf("after the refused standby's requests the lock is %+v; want node00's, generation %d, not wanted", l, generation)
	}
	if err := da.WriteAt(ctx, []byte("CCCC"), 0, false); err != nil {
		t.Fatalf("the holder after the refused take-overs: %v", err)
	}

	refuse.Store(false)
	if err := db.WriteAt(ctx, []byte("DDDD"), 0, false); err != nil {
		t.Fatalf("an allowed standby's write: %v", err)
	}
	if l := holder(); l.Node != "node01" {
		t.Fatalf("lock after the allowed standby's write: %+v", l)
	}
	before := asked.Load()
	if err := db.WriteAt(ctx, []byte("EEEE"), 0, false); err != nil || asked.Load() != before {
		t.Fatalf("a write under the lock held: %v, check asked %d more times, want none", err, asked.Load()-before)
	}
	// The check refuses while the lock is handed over: the request that
	// took it fails and changes nothing.
	if err := da.WriteAt(ctx, []byte("FFFF"), 0, false); err != nil {
		t.Fatal(err)
	}
	db.SetTakeoverCheck(func() error {
		if _, held := w.cluster.Lock(cluster.VDILockKey("disk")); held && holder().Node == "node01" {
			return revoked
		}
		return nil
	})
	if err := db.WriteAt(ctx, []byte("GGGG"), 0, false); !errors.Is(err, revoked) {
		t.Fatalf("a write whose check refuses once the lock is handed over: %v", err)
	}
	got := make([]byte, 4)
	if err := da.ReadAt(ctx, got, 0); err != nil || string(got) != "FFFF" {
		t.Fatalf("after the refused write: %q %v, want FFFF", got, err)
	}
}
