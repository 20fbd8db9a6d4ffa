package gateway

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
)

// lockedBuffer is a log destination the gateway's goroutines may write to
// while the test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestFirstWriteIsNoFailedChange: the first write of a new VDI, and of a
// clone, writes the map object, which exists nowhere yet. Its first
// attempt, without CREATE (a replica new to the placement must receive the
// whole map object, not start one), finds the object nowhere and is
// retried with CREATE: that attempt reached no replica, so it is no failed
// change that may have reached some, and neither warns nor leaves the
// object suspect (whose repair would read every replica before the
// retry).
func TestFirstWriteIsNoFailedChange(t *testing.T) {
	w := newWorld(t, 3, 3)
	w.cluster.addVDI("disk", 1, 4*objectSize)
	var log lockedBuffer
	logger := slog.New(slog.NewTextHandler(&log, nil))
	g := w.gatewayWith("node00", logger, Options{})
	ctx := context.Background()
	e := open(t, g, "disk")
	if err := e.WriteAt(ctx, []byte("first"), 4096, false); err != nil {
		t.Fatal(err)
	}
	if _, err := g.Snapshot(ctx, "disk", "s1"); err != nil {
		t.Fatal(err)
	}
	snapshot, err := w.cluster.VDI("disk@s1")
	if err != nil {
		t.Fatal(err)
	}
	w.cluster.clone(snapshot.ID, "copy")
	c := open(t, g, "copy")
	if err := c.WriteAt(ctx, []byte("clone"), objectSize+4096, false); err != nil {
		t.Fatal(err)
	}
	// And the VDI's own first write after its snapshot: a new map object
	// of the VDI that the snapshot made.
	if err := e.WriteAt(ctx, []byte("after"), 2*objectSize, false); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(log.String(), "may have reached some replicas only") {
		t.Fatalf("a first write logged a failed change:\n%s", log.String())
	}
	if n := g.heal.suspectCount.Load(); n != 0 {
		t.Fatalf("%d suspect objects after first writes that all succeeded", n)
	}
	buf := make([]byte, 5)
	if err := c.ReadAt(ctx, buf, objectSize+4096); err != nil || string(buf) != "clone" {
		t.Fatalf("read back through the clone: %q, %v", buf, err)
	}
	if err := c.ReadAt(ctx, buf, 4096); err != nil || string(buf) != "first" {
		t.Fatalf("read of the clone's inherited data: %q, %v", buf, err)
	}
	replicasIdentical(t, w, g, 3)
}
