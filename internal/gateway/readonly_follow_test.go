package gateway

import (
	"bytes"
	"context"
	"testing"
)

// TestReadOnlyOpenFollowsTheWriter: a read-only open of a live VDI
// (ro/NAME) on another node reads what the writer wrote before each read
// began, across a snapshot taken through the writer (the name becomes a
// new VDI, the old one the snapshot) and across the writer's
// copy-on-write of an object the reader had read from the snapshot
// (its cached map page of the VDI said "inherited"). Before the fix the
// reader kept reading the snapshot: the old data, after the new was
// acknowledged.
func TestReadOnlyOpenFollowsTheWriter(t *testing.T) {
	w := newWorld(t, 3, 3)
	const size = 4 * objectSize
	w.cluster.addVDI("disk", 1, size)
	through := w.gateway("node00")
	writer := open(t, through, "disk")
	reader := open(t, w.gateway("node01"), "ro/disk")
	ctx := context.Background()
	read := func(what string, off uint64, want []byte) {
		t.Helper()
		got := make([]byte, len(want))
		if err := reader.ReadAt(ctx, got, off); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("%s: the ro/ reader on another node read other data than the writer's last acknowledged write", what)
		}
	}
	write := func(seed int64, off uint64) []byte {
		t.Helper()
		p := pattern(seed, 4096)
		if err := writer.WriteAt(ctx, p, off, false); err != nil {
			t.Fatal(err)
		}
		return p
	}
	a := write(1, 0)
	b := write(2, objectSize)
	read("before the snapshot", 0, a)
	read("before the snapshot, object 1", objectSize, b)
	if _, err := through.Snapshot(ctx, "disk", "s1"); err != nil {
		t.Fatal(err)
	}
	// Object 0 after the snapshot: the writer's copy-on-write into the
	// new VDI.
	read("object 1, inherited from the snapshot", objectSize, b)
	a2 := write(3, 0)
	read("after a write following the snapshot", 0, a2)
	// Object 1: the reader has just read it through the snapshot (its
	// page of the new VDI cached with no entry); the writer copies it on
	// its first write.
	b2 := write(4, objectSize)
	read("after the copy-on-write of an object read through the snapshot", objectSize, b2)
}
