package cluster

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"
)

// A member applies the committed log while connected, lags while it is
// not, catches up when connected again, and says it has no quorum once
// it has been cut off for quorumContactTimeout.
func TestLocalMembersApplyAPrefix(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := NewLocal()
		defer l.Close()
		a := l.Member("a", "a.1", 0)
		b := l.Member("b", "b.1", 0)
		a.SetConnected(true)
		b.SetConnected(true)
		for _, id := range []string{"a", "b", "c"} {
			if _, err := l.NodeJoin(Node{ID: id, Incarnation: id + ".1"}); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := l.Format(2, MinObjectSize); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if a.Epoch() != 3 || b.Epoch() != 3 || l.Epoch() != 3 {
			t.Fatalf("epochs a %d, b %d, leader %d; want 3", a.Epoch(), b.Epoch(), l.Epoch())
		}

		b.SetConnected(false)
		if _, err := l.NodeLeave("c", "test"); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if a.Epoch() != 4 || b.Epoch() != 3 {
			t.Fatalf("after c left: a at epoch %d (want 4), cut-off b at %d (want 3)", a.Epoch(), b.Epoch())
		}
		if ok, _ := b.QuorumStatus(); !ok {
			t.Fatal("b lost quorum at once; a follower keeps it for quorumContactTimeout")
		}
		if _, err := b.AcquireLock(context.Background(), "k", "s"); !errors.Is(err, ErrNoQuorum) {
			t.Fatalf("a cut-off member committed a lock: %v", err)
		}
		time.Sleep(quorumContactTimeout + time.Second)
		if ok, _ := b.QuorumStatus(); ok {
			t.Fatal("b still claims quorum after quorumContactTimeout without the leader")
		}
		b.SetConnected(true)
		synctest.Wait()
		if b.Epoch() != 4 || b.Applied() != l.Len() {
			t.Fatalf("b did not catch up: epoch %d, applied %d of %d", b.Epoch(), b.Applied(), l.Len())
		}
	})
}

// Proposals through a member go through the production FSM: the first
// claim of a lock wins, and a restarted process (new incarnation) loses
// its predecessor's locks when the leader commits it.
func TestLocalMemberLocks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := NewLocal()
		defer l.Close()
		a := l.Member("a", "a.1", 0)
		b := l.Member("b", "b.1", 0)
		a.SetConnected(true)
		b.SetConnected(true)
		l.NodeJoin(Node{ID: "a", Incarnation: "a.1"})
		l.NodeJoin(Node{ID: "b", Incarnation: "b.1"})
		ctx := context.Background()
		if _, err := a.AcquireLock(ctx, "vdi/x", "s"); err != nil {
			t.Fatal(err)
		}
		var held *LockHeldError
		if _, err := b.AcquireLock(ctx, "vdi/x", "s"); !errors.As(err, &held) || held.Lock.Node != "a" {
			t.Fatalf("second claim: %v, want held by a", err)
		}
		// a restarts: the new process replays what the old one applied.
		from := a.Applied()
		a.Stop()
		a2 := l.Member("a", "a.2", from)
		a2.SetConnected(true)
		if _, ok := a2.Lock("vdi/x"); !ok {
			t.Fatal("the restarted member lost the log it had applied")
		}
		l.NodeJoin(Node{ID: "a", Incarnation: "a.2"})
		synctest.Wait()
		if _, ok := b.Lock("vdi/x"); ok {
			t.Fatal("the lock of a's previous process survived its restart")
		}
		if _, err := b.AcquireLock(ctx, "vdi/x", "s"); err != nil {
			t.Fatal(err)
		}
	})
}
