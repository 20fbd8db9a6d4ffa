package gateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/layout"
)

// Two writers through two nodes alternate: the lock moves to whichever
// writes, each side reads the other's writes (including objects the other
// allocated after this side cached the map page), and nothing is lost.
func TestWriterHandover(t *testing.T) {
	w := newWorld(t, 3, 3)
	w.cluster.addVDI("disk", 1, 4*objectSize)
	a, b := w.gateway("node00"), w.gateway("node01")
	ctx := context.Background()
	da := open(t, a, "disk")
	db := open(t, b, "disk") // the destination of a migration opens early
	holder := func() cluster.Lock {
		l, _ := w.cluster.Lock(cluster.VDILockKey("disk"))
		return l
	}
	if l := holder(); l.Node != "node00" {
		t.Fatalf("lock after the first open: %+v", l)
	}
	m := make(model, 4*objectSize)
	write := func(d *Disk, p []byte, off uint64) {
		t.Helper()
		if err := d.WriteAt(ctx, p, off, false); err != nil {
			t.Fatal(err)
		}
		m.write(p, off)
	}
	write(da, []byte("AAAA"), 0)
	first := holder().Generation
	// The standby's first request, a read, takes the lock over and sees
	// what the holder wrote.
	verify(t, db, m)
	if l := holder(); l.Node != "node01" || l.Generation <= first {
		t.Fatalf("lock after the standby's read: %+v", l)
	}
	// a cached every map page (holes past object 0); b allocates an
	// object; a takes the lock back and sees it, never a stale hole.
	write(db, []byte("allocated by b"), objectSize+5)
	verify(t, da, m)
	first = holder().Generation
	// b writes: a hands the lock over; b allocates an object that a's map
	// cache says is a hole.
	write(db, []byte("BBBB"), 0)
	write(db, []byte("new object"), 2*objectSize+7)
	if l := holder(); l.Node != "node01" || l.Generation <= first {
		t.Fatalf("lock after b's write: %+v (first generation %d)", l, first)
	}
	verify(t, da, m)
	// And back: a's write asks for it again.
	write(da, []byte("again A"), 3*objectSize-3) // across two objects
	if l := holder(); l.Node != "node00" {
		t.Fatalf("lock after a wrote again: %+v", l)
	}
	verify(t, db, m)
	if v, _ := w.cluster.VDI("disk"); v.Handovers < 4 {
		t.Fatalf("handovers: %d, want at least 4", v.Handovers)
	}

	// Both write at once, each its own blocks: every write lands.
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for i, d := range []*Disk{da, db} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range 20 {
				p := []byte(fmt.Sprintf("side %d write %02d", i, k))
				off := uint64(i)*objectSize + uint64(k)*64
				if err := d.WriteAt(ctx, p, off, false); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for i := range 2 {
		for k := range 20 {
			m.write([]byte(fmt.Sprintf("side %d write %02d", i, k)), uint64(i)*objectSize+uint64(k)*64)
		}
	}
	verify(t, da, m)
	verify(t, db, m)
	replicasIdentical(t, w, a, 4)

	da.Close()
	db.Close()
	if _, held := w.cluster.Lock(cluster.VDILockKey("disk")); held {
		t.Fatal("the lock outlived every open")
	}
}

// A lock taken away without a handover fences the holder: its later
// changes fail and never land, and the next writer takes it.
func TestBrokenLockFencesTheHolder(t *testing.T) {
	w := newWorld(t, 3, 3)
	w.cluster.addVDI("disk", 1, objectSize)
	a := w.gateway("node00")
	b := w.gatewayWith("node01", slog.New(slog.NewTextHandler(io.Discard, nil)), Options{Repair: func(context.Context, *Gateway, cluster.VDI) error { return nil }})
	ctx := context.Background()
	da := open(t, a, "disk")
	if err := da.WriteAt(ctx, []byte("before"), 0, false); err != nil {
		t.Fatal(err)
	}
	w.cluster.breakLock(cluster.VDILockKey("disk"))
	err := da.WriteAt(ctx, []byte("AFTER!"), 0, false)
	if !errors.Is(err, ErrFenced) {
		t.Fatalf("write by the fenced holder: %v, want ErrFenced", err)
	}
	db := open(t, b, "disk")
	buf := make([]byte, 6)
	if err := db.ReadAt(ctx, buf, 0); err != nil || string(buf) != "before" {
		t.Fatalf("after the break: %q %v", buf, err)
	}
	if err := db.WriteAt(ctx, []byte("writer"), 0, false); err != nil {
		t.Fatal(err)
	}
	// The fenced open stays fenced: it does not take the lock back.
	if err := da.WriteAt(ctx, []byte("AFTER!"), 0, false); !errors.Is(err, ErrFenced) {
		t.Fatalf("second write by the fenced holder: %v, want ErrFenced", err)
	}
	// Nor does it read: it must be reopened.
	if err := da.ReadAt(ctx, buf, 0); !errors.Is(err, ErrFenced) {
		t.Fatalf("read by the fenced holder: %v, want ErrFenced", err)
	}
	if err := db.ReadAt(ctx, buf, 0); err != nil || !bytes.Equal(buf, []byte("writer")) {
		t.Fatalf("the new writer reads %q %v", buf, err)
	}
	if l, _ := w.cluster.Lock(cluster.VDILockKey("disk")); l.Node != "node01" {
		t.Fatalf("lock: %+v", l)
	}
	opens := a.Opens()
	if len(opens) != 1 || !opens[0].Fenced || opens[0].Writer {
		t.Fatalf("a's opens: %+v", opens)
	}
	da.Close()
	db.Close()
}

// An exclusive VDI refuses the second writer at open.
func TestExclusiveRefusesSecondWriter(t *testing.T) {
	w := newWorld(t, 3, 3)
	w.cluster.addVDI("disk", 1, objectSize)
	w.cluster.setExclusive("disk", true)
	a, b := w.gateway("node00"), w.gateway("node01")
	da := open(t, a, "disk")
	defer da.Close()
	if _, err := b.Open(context.Background(), "disk"); !errors.Is(err, ErrBusy) {
		t.Fatalf("second writer of an exclusive vdi: %v", err)
	}
}

// A lock lost without an operator (this node was dropped from the cluster
// for a while and came back) is taken again by the next request, with a
// fresh view: the open is not fenced for good.
func TestLostLockIsTakenAgain(t *testing.T) {
	t.Parallel() // it waits 2.5 s for a node's leave (world.leave)
	w := newWorld(t, 3, 3)
	w.cluster.addVDI("disk", 1, objectSize)
	w.cluster.setExclusive("disk", true)
	repaired := 0
	a := w.gatewayWith("node00", slog.New(slog.NewTextHandler(io.Discard, nil)), Options{Repair: func(context.Context, *Gateway, cluster.VDI) error { repaired++; return nil }})
	ctx := context.Background()
	da := open(t, a, "disk")
	defer da.Close()
	if err := da.WriteAt(ctx, []byte("before"), 0, false); err != nil {
		t.Fatal(err)
	}
	first, _ := w.cluster.Lock(cluster.VDILockKey("disk"))
	w.cluster.dropLock(cluster.VDILockKey("disk"))
	if err := da.WriteAt(ctx, []byte("after!"), 0, false); err != nil {
		t.Fatalf("write after the lock was lost: %v", err)
	}
	l, held := w.cluster.Lock(cluster.VDILockKey("disk"))
	if !held || l.Node != "node00" || l.Generation <= first.Generation || repaired != 1 {
		t.Fatalf("lock after the write: %+v held %v (was %+v), repairs %d", l, held, first, repaired)
	}
	buf := make([]byte, 6)
	if err := da.ReadAt(ctx, buf, 0); err != nil || string(buf) != "after!" {
		t.Fatalf("read: %q %v", buf, err)
	}
}

// A writable open through a node that had not yet applied another node's
// grant of the lock is refused by the leader, and the refusal reaches it
// as an error code, not a cluster.LockHeldError (two opens through two
// nodes a few milliseconds apart). It is on standby all the same, and its
// first request takes the lock over; an exclusive VDI refuses it, naming
// the holder.
func TestForwardedLockRefusal(t *testing.T) {
	w := newWorld(t, 3, 3)
	w.cluster.addVDI("disk", 1, objectSize)
	w.cluster.addVDI("only", 2, objectSize)
	w.cluster.setExclusive("only", true)
	a := w.gateway("node00")
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	follower := forwarded{w.cluster.member("node01")}
	b := New(follower, layout.NewHistory(follower, logger), w.replicas, logger, Options{})
	ctx := context.Background()

	da := open(t, a, "disk")
	defer da.Close()
	db, err := b.Open(ctx, "disk")
	if err != nil {
		t.Fatalf("second writer, refused by the leader: %v", err)
	}
	defer db.Close()
	if opens := b.Opens(); len(opens) != 1 || !opens[0].Standby {
		t.Fatalf("b's opens: %+v", opens)
	}
	if err := db.WriteAt(ctx, []byte("moved"), 0, false); err != nil {
		t.Fatalf("the standby's first write: %v", err)
	}
	if l, _ := w.cluster.Lock(cluster.VDILockKey("disk")); l.Node != "node01" {
		t.Fatalf("lock after the standby's write: %+v", l)
	}
	buf := make([]byte, 5)
	if err := da.ReadAt(ctx, buf, 0); err != nil || string(buf) != "moved" {
		t.Fatalf("the first writer reads %q %v", buf, err)
	}

	do := open(t, a, "only")
	defer do.Close()
	_, err = b.Open(ctx, "only")
	if !errors.Is(err, ErrBusy) || !strings.Contains(err.Error(), "node00") {
		t.Fatalf("second writer of an exclusive vdi, refused by the leader: %v", err)
	}
}
