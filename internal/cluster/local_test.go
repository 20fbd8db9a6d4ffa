package cluster

import (
	"context"
	"errors"
	"strings"
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

// A member's lease is the real one on the simulation's clock: a member
// holds none until it renewed through the leader; cut off, it keeps it
// until t0 + leaseDuration of its last renewal and not a moment longer;
// connected again with a catch-up delay, it has quorum at once (a
// heartbeat) but a lease only once it applied what it missed.
func TestLocalMemberLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := NewLocal()
		defer l.Close()
		a := l.Member("a", "a.1", 0)
		b := l.Member("b", "b.1", 0)
		if a.LeaseValid() {
			t.Fatal("a member holds a lease before it ever reached the leader")
		}
		a.SetConnected(true)
		b.SetConnected(true)
		for _, id := range []string{"a", "b", "c"} {
			if _, err := l.NodeJoin(Node{ID: id, Incarnation: id + ".1"}); err != nil {
				t.Fatal(err)
			}
		}
		if err := a.WaitLease(context.Background()); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()

		// b is paused: its last renewal began at most leaseRenewEvery ago.
		b.SetCatchUp(time.Second)
		b.SetConnected(false)
		cut := time.Now()
		time.Sleep(leaseDuration - leaseRenewEvery - time.Millisecond)
		if !b.LeaseValid() {
			t.Fatal("b's lease ended before leaseDuration - leaseRenewEvery")
		}
		time.Sleep(leaseRenewEvery + 2*time.Millisecond)
		if b.LeaseValid() {
			t.Fatalf("b still holds a lease %v after it was cut off", time.Since(cut))
		}
		// The leader drops b only once any lease it granted b ran out.
		if _, err := l.NodeLeave("b", "test"); err != nil {
			t.Fatal(err)
		}
		if b.LeaseValid() {
			t.Fatal("b was dropped while it held a lease")
		}

		// b resumes: quorum at once, the old epoch still applied, no
		// lease until it caught up.
		b.SetConnected(true)
		if !b.HasQuorum() || b.Epoch() != 3 {
			t.Fatalf("resumed b: quorum %v, epoch %d; want quorum in epoch 3", b.HasQuorum(), b.Epoch())
		}
		time.Sleep(time.Second - time.Millisecond)
		if b.LeaseValid() || b.Epoch() != 3 {
			t.Fatalf("b holds a lease (%v) or applied epoch %d before its catch-up delay ended", b.LeaseValid(), b.Epoch())
		}
		if err := b.WaitLease(context.Background()); err != nil {
			t.Fatal(err)
		}
		if b.Epoch() != 4 {
			t.Fatalf("b holds a lease in epoch %d; the leader's epoch is 4", b.Epoch())
		}
	})
}

// A write in a new epoch waits until every member that may still hold a
// lease reported the entry that began it, or its lease ran out.
func TestLocalMemberWaitActive(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := NewLocal()
		defer l.Close()
		a := l.Member("a", "a.1", 0)
		b := l.Member("b", "b.1", 0)
		a.SetConnected(true)
		b.SetConnected(true)
		l.NodeJoin(Node{ID: "a", Incarnation: "a.1"})
		l.NodeJoin(Node{ID: "b", Incarnation: "b.1"})
		time.Sleep(leaseDuration + leaseMargin) // the leader's first term period
		ctx := context.Background()
		if err := a.WaitActive(ctx, a.Epoch()); err != nil {
			t.Fatal(err)
		}

		// b applies late: a write in the new epoch waits for it.
		b.SetLag(300 * time.Millisecond)
		epoch, _ := l.NodeJoin(Node{ID: "c", Incarnation: "c.1"})
		synctest.Wait()
		started := time.Now()
		if err := a.WaitActive(ctx, epoch); err != nil {
			t.Fatal(err)
		}
		if waited := time.Since(started); waited < 300*time.Millisecond || b.Epoch() != epoch {
			t.Fatalf("a write in epoch %d was admitted after %v, b at epoch %d", epoch, waited, b.Epoch())
		}

		// b is cut off with a valid lease: writes wait for it to run out.
		b.SetConnected(false)
		epoch, _ = l.NodeJoin(Node{ID: "d", Incarnation: "d.1"})
		synctest.Wait()
		started = time.Now()
		err := a.WaitActive(ctx, epoch)
		for errors.Is(err, ErrNoQuorum) && time.Since(started) < 2*leaseDuration {
			err = a.WaitActive(ctx, epoch) // the gateway retries
		}
		if err != nil {
			t.Fatal(err)
		}
		if waited := time.Since(started); waited < leaseDuration-leaseRenewEvery {
			t.Fatalf("a write in epoch %d was admitted %v after it began, while cut-off b could still serve epoch %d", epoch, waited, b.Epoch())
		}
	})
}

// The leader commits a NodeLeave only once any lease it granted the node
// has run out, as Cluster.awaitDrop does.
func TestLocalNodeLeaveWaitsForLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := NewLocal()
		defer l.Close()
		a := l.Member("a", "a.1", 0)
		a.SetConnected(true)
		l.NodeJoin(Node{ID: "a", Incarnation: "a.1"})
		l.NodeJoin(Node{ID: "b", Incarnation: "b.1"})
		time.Sleep(leaseDuration + leaseMargin) // past the leader's first term period
		if !a.LeaseValid() {
			t.Fatal("a connected member holds no lease")
		}
		a.SetConnected(false)
		started := time.Now()
		if _, err := l.NodeLeave("a", "test"); err != nil {
			t.Fatal(err)
		}
		if waited := time.Since(started); waited < leaseDuration+leaseMargin-leaseRenewEvery || a.LeaseValid() {
			t.Fatalf("a was dropped %v after it was cut off, its lease valid: %v", waited, a.LeaseValid())
		}
		// A node never granted a lease is dropped at once.
		started = time.Now()
		if _, err := l.NodeLeave("b", "test"); err != nil {
			t.Fatal(err)
		}
		if waited := time.Since(started); waited != 0 {
			t.Fatalf("dropping b, which never held a lease, waited %v", waited)
		}
	})
}

// Local's finalize is Cluster.FinalizeUpgrade's: refused while a member
// of the log runs a binary below the level (SetBuild) or is down,
// naming it; a VDI of its own copies is refused until then, naming the
// command; afterwards both work, and the level stays.
func TestLocalFinalizeUpgrade(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := NewLocal()
		defer l.Close()
		for _, id := range []string{"a", "b", "c"} {
			if _, err := l.NodeJoin(Node{ID: id, Incarnation: id + ".1"}); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := l.Format(3, MinObjectSize); err != nil {
			t.Fatal(err)
		}
		l.SetBuild("b", Build{Version: "0.8", Level: LevelBase})
		if level, err := l.FinalizeUpgrade(LevelVDICopies); !errors.Is(err, ErrUpgradeRequired) || level != LevelBase || !strings.Contains(err.Error(), "b (runs herd 0.8, level 1)") {
			t.Fatalf("finalize with b at level 1: level %d, %v", level, err)
		}
		if _, err := l.CreateVDIWithCopies("two", 1<<20, false, 2); !errors.Is(err, ErrUpgradeRequired) || !strings.Contains(err.Error(), "finalize-upgrade") || !strings.Contains(err.Error(), "upgrade herd on b") {
			t.Fatalf("vdi create --copies 2 at level 1: %v", err)
		}
		if v, err := l.CreateVDIWithCopies("three", 1<<20, false, 3); err != nil || v.Copies != 3 {
			t.Fatalf("vdi create --copies 3 (the format's) at level 1: %+v, %v", v, err)
		}
		l.SetBuild("b", Build{Version: "0.9", Level: LevelVDICopies})
		if _, err := l.NodeLeave("c", "test"); err != nil {
			t.Fatal(err)
		}
		if _, err := l.FinalizeUpgrade(LevelVDICopies); !errors.Is(err, ErrUpgradeRequired) || !strings.Contains(err.Error(), "c (down") {
			t.Fatalf("finalize with c down: %v", err)
		}
		if _, err := l.NodeJoin(Node{ID: "c", Incarnation: "c.2"}); err != nil {
			t.Fatal(err)
		}
		if level, err := l.FinalizeUpgrade(LevelVDICopies); err != nil || level != LevelVDICopies || l.Level() != LevelVDICopies {
			t.Fatalf("finalize with every member upgraded: level %d (log %d), %v", level, l.Level(), err)
		}
		if level, err := l.FinalizeUpgrade(LevelVDICopies); err != nil || level != LevelVDICopies {
			t.Fatalf("finalize again: level %d, %v", level, err)
		}
		if v, err := l.CreateVDIWithCopies("two", 1<<20, false, 2); err != nil || v.Copies != 2 {
			t.Fatalf("vdi create --copies 2 after the finalize: %+v, %v", v, err)
		}
	})
}

// An erasure-coded VDI through the cluster layer, as `vdi create --ec`
// asks for it: refused below LevelErasureCoding naming the node to
// upgrade; then refused with too few nodes, in zones that cannot hold
// its chunks, with copies, and with a bad scheme, each saying why; then
// created with M+1 copies, its scheme read back by id (VDIScheme, as
// every layer finds it from an object id).
func TestLocalErasureCodedVDI(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := NewLocal()
		defer l.Close()
		for _, id := range []string{"a", "b", "c", "d", "e", "f"} {
			if _, err := l.NodeJoin(Node{ID: id, Incarnation: id + ".1"}); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := l.Format(3, MinObjectSize); err != nil {
			t.Fatal(err)
		}
		if _, err := l.FinalizeUpgrade(LevelSessionProof); err != nil {
			t.Fatal(err)
		}
		l.SetBuild("b", Build{Version: "0.9", Level: LevelSessionProof})
		_, err := l.CreateVDIWithScheme("db", 1<<20, false, "2+1")
		if !errors.Is(err, ErrUpgradeRequired) || !strings.Contains(err.Error(), "erasure-coded VDIs (vdi create --ec) needs cluster feature level 6, the cluster is at 5; upgrade herd on b (runs herd 0.9, level 5)") {
			t.Fatalf("vdi create --ec 2+1 at level 5: %v", err)
		}
		// Refused before it is proposed: a bad scheme, or copies with it,
		// whatever the level.
		for _, bad := range []struct{ scheme, want string }{
			{"4+0", "invalid argument: ec: invalid scheme 4+0: M (parity chunks) must be 1..3, not 0"},
			{"9+1", "invalid argument: ec: invalid scheme 9+1: K (data chunks) must be 2..8, not 9"},
			{"x", `invalid argument: ec: invalid scheme "x": want K+M data and parity chunks, as in "4+2"`},
		} {
			if _, err := l.CreateVDIWithScheme("db", 1<<20, false, bad.scheme); !errors.Is(err, ErrInvalid) || err.Error() != bad.want {
				t.Errorf("scheme %q: %v, want %q", bad.scheme, err, bad.want)
			}
		}
		if _, err := l.cmds.CreateVDI(context.Background(), "db", 1<<20, false, 3, "2+1", l.requires); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "copies 3 and erasure coding 2+1 cannot be asked for together") {
			t.Fatalf("copies with a scheme: %v", err)
		}

		l.SetBuild("b", Build{Version: "1.0", Level: LevelErasureCoding})
		if level, err := l.FinalizeUpgrade(LevelErasureCoding); err != nil || level != LevelErasureCoding {
			t.Fatalf("finalize to %d: %d, %v", LevelErasureCoding, level, err)
		}
		for _, id := range []string{"d", "e", "f"} {
			if _, err := l.NodeLeave(id, "test"); err != nil {
				t.Fatal(err)
			}
		}
		_, err = l.CreateVDIWithScheme("db", 1<<20, false, "4+2")
		if want := "not enough nodes: erasure coding 4+2 needs 6 nodes, the cluster has 3 (start more nodes, or use a scheme of fewer chunks)"; !errors.Is(err, ErrTooFewNodes) || err.Error() != want {
			t.Fatalf("4+2 on 3 nodes: %v, want %q", err, want)
		}
		for _, id := range []string{"d", "e", "f"} {
			if _, err := l.NodeJoin(Node{ID: id, Incarnation: id + ".2", Zone: "z2"}); err != nil {
				t.Fatal(err)
			}
		}
		// a, b, c without a zone, d, e, f in z2: at most 2 chunks each.
		_, err = l.CreateVDIWithScheme("db", 1<<20, false, "4+2")
		if want := "not enough nodes: erasure coding 4+2 needs 6 nodes with at most 2 in a zone, the cluster has zones that hold 4 chunks: (no zone) (3 nodes, 2 chunks), z2 (3 nodes, 2 chunks) (start more nodes, or use a scheme of fewer chunks)"; !errors.Is(err, ErrTooFewNodes) || err.Error() != want {
			t.Fatalf("4+2 in two zones of 3: %v, want %q", err, want)
		}
		for id, zone := range map[string]string{"a": "z1", "b": "z1", "c": "z3", "f": "z3"} {
			if _, err := l.cmds.SetNode(context.Background(), id, NodeSettings{Zone: &zone}); err != nil {
				t.Fatal(err)
			}
		}
		v, err := l.CreateVDIWithScheme("db", 1<<20, false, "4+2")
		if err != nil || v.EC != "4+2" || v.Copies != 3 {
			t.Fatalf("4+2 on 6 nodes: %+v, %v", v, err)
		}
		// Moving c out of z3 would leave f alone there: 5 chunks.
		zone := "z2"
		if _, err := l.cmds.SetNode(context.Background(), "c", NodeSettings{Zone: &zone}); !errors.Is(err, ErrTooFewNodes) || !strings.Contains(err.Error(), `vdi "db": erasure coding 4+2 needs 6 nodes with at most 2 in a zone, the change would leave zones that hold 5 chunks: z1 (2 nodes, 2 chunks), z2 (3 nodes, 2 chunks), z3 (1 node, 1 chunk)`) {
			t.Fatalf("moving c out of z3: %v", err)
		}
		if scheme, ok := l.VDIScheme(v.ID); !ok || scheme.K != 4 || scheme.M != 2 {
			t.Fatalf("VDIScheme(%d) = %v, %v", v.ID, scheme, ok)
		}
		if copies, ok := l.VDICopies(v.ID); !ok || copies != 3 {
			t.Fatalf("VDICopies(%d) = %d, %v", v.ID, copies, ok)
		}
		member := l.Member("a", "a.1", 0)
		defer member.Stop()
		member.SetConnected(true)
		synctest.Wait()
		if member.Applied() != l.Len() {
			t.Fatalf("the member applied %d of %d entries", member.Applied(), l.Len())
		}
		if scheme, ok := member.VDIScheme(v.ID); !ok || scheme.String() != "4+2" {
			t.Fatalf("a member's VDIScheme(%d) = %v, %v", v.ID, scheme, ok)
		}
		if v, err := l.CreateVDIWithCopies("plain", 1<<20, false, 0); err != nil || v.EC != "" {
			t.Fatalf("a VDI of copies: %+v, %v", v, err)
		} else if _, ok := l.VDIScheme(v.ID); ok {
			t.Fatal("a VDI of copies has a scheme")
		}
	})
}
