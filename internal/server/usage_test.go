package server

import (
	"testing"

	"github.com/herd-storage/herd/internal/object"
	"github.com/herd-storage/herd/internal/store"
)

// TestUsageCountsNoChunks: a node's object count, which says when a drain
// is done, counts the copies recovery moves and not the chunks of
// erasure-coded objects (moved off a drained node by the gateway's fold,
// not by recovery), whose bytes still count as used.
func TestUsageCountsNoChunks(t *testing.T) {
	s, err := store.Open(store.Options{Disks: []store.Disk{{Path: t.TempDir(), Weight: 1}}, ReserveBytes: -1, OpenFiles: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	d := dataPath{store: s}
	data := object.DataOID(3, 0)
	block := make([]byte, 4096)
	block[0] = 1
	if err := s.Write(1, data, block, 0, object.FlagCreate); err != nil {
		t.Fatal(err)
	}
	before, err := d.Usage()
	if err != nil || before.Objects != 1 {
		t.Fatalf("usage of one data object: %+v, %v", before, err)
	}
	for c := 0; c < 3; c++ {
		if err := s.Write(1, object.ChunkOID(data, c, 0), block, 0, object.FlagCreate); err != nil {
			t.Fatal(err)
		}
	}
	after, err := d.Usage()
	if err != nil {
		t.Fatal(err)
	}
	if after.Objects != 1 || after.UsedBytes <= before.UsedBytes {
		t.Errorf("usage with three chunks beside the data object: %d objects, %d bytes used (%d before); want 1 object, more bytes", after.Objects, after.UsedBytes, before.UsedBytes)
	}
	if err := s.Remove(data); err != nil {
		t.Fatal(err)
	}
	if u, err := d.Usage(); err != nil || u.Objects != 0 {
		t.Errorf("usage with chunks alone: %+v, %v; want 0 objects (a drained node)", u, err)
	}
}
