package placement

import (
	"errors"
	"fmt"
	"slices"
	"testing"
)

// FuzzReplicas builds node sets from arbitrary bytes (sizes, weights,
// zones, ids that share prefixes) and checks every lookup against the
// reference and the invariants. Run with go test -fuzz FuzzReplicas.
func FuzzReplicas(f *testing.F) {
	f.Add([]byte{3, 1, 1, 1}, uint64(0), uint8(3))
	f.Add([]byte{10, 1, 2, 4, 1, 2, 4, 1, 2, 4, 1}, uint64(42), uint8(3))
	f.Add([]byte{5, 0x81, 0x82, 0x83, 0x01, 0xff}, uint64(1<<63), uint8(2))
	f.Add([]byte{2, 0xff, 0x01}, ^uint64(0), uint8(5))
	f.Fuzz(func(t *testing.T, data []byte, oid uint64, copies uint8) {
		if len(data) == 0 {
			return
		}
		count := min(int(data[0])%40+1, len(data)-1)
		if count == 0 {
			return
		}
		nodes := make([]Node, count)
		for i := range nodes {
			b := data[1+i]
			nodes[i] = Node{
				// Short, similar ids on purpose.
				ID:     fmt.Sprintf("n%d", i*7919),
				Weight: uint64(b&0x3f+1) << (b & 0x40 >> 3), // 1 … 64, some ×256
			}
			if b&0x80 != 0 {
				nodes[i].Zone = fmt.Sprintf("z%d", b%3)
			}
		}
		ring, err := New(nodes)
		if err != nil {
			t.Fatalf("New(%v): %v", nodes, err) // ids are distinct, weights positive
		}
		if err := ring.Check(); err != nil {
			t.Fatal(err)
		}
		wanted := int(copies)%6 + 1
		got := ring.Replicas(oid, wanted)
		if len(got) != min(wanted, ring.MaxCopies()) || hasDuplicates(got) {
			t.Fatalf("%v copies=%d: %v", nodes, wanted, got)
		}
		if want := referenceReplicas(ring, oid, wanted); !slices.Equal(got, want) {
			t.Fatalf("%v copies=%d oid %d: got %v, reference %v", nodes, wanted, oid, got, want)
		}
		if again := mustNew(t, shuffled(nodes, oid)).Replicas(oid, wanted); !slices.Equal(got, again) {
			t.Fatalf("input order changed the result: %v vs %v", got, again)
		}
	})
}

// FuzzChunks builds node sets as FuzzReplicas does and checks every
// placement of chunks against the reference, the invariants and the
// up-front refusal. Run with go test -fuzz FuzzChunks.
func FuzzChunks(f *testing.F) {
	f.Add([]byte{12, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}, uint64(0), uint8(5), uint8(1))
	f.Add([]byte{10, 1, 2, 4, 1, 2, 4, 1, 2, 4, 1}, uint64(42), uint8(10), uint8(2))
	f.Add([]byte{9, 0x81, 0x82, 0x83, 0x81, 0x82, 0x83, 0x81, 0x82, 0x83}, uint64(1<<63), uint8(5), uint8(1))
	f.Add([]byte{7, 0x81, 0x82, 0x83, 0x01, 0xff, 0x80, 0x80}, ^uint64(0), uint8(6), uint8(0))
	f.Fuzz(func(t *testing.T, data []byte, key uint64, chunks, zoneLimit uint8) {
		if len(data) == 0 {
			return
		}
		count := min(int(data[0])%40+1, len(data)-1)
		if count == 0 {
			return
		}
		nodes := make([]Node, count)
		for i := range nodes {
			b := data[1+i]
			nodes[i] = Node{
				ID:     fmt.Sprintf("n%d", i*7919),
				Weight: uint64(b&0x3f+1) << (b & 0x40 >> 3),
			}
			if b&0x80 != 0 {
				nodes[i].Zone = fmt.Sprintf("z%d", b%3)
			}
		}
		ring, err := New(nodes)
		if err != nil {
			t.Fatalf("New(%v): %v", nodes, err)
		}
		n, perZone := int(chunks)%11+1, int(zoneLimit)%3+1
		// What fits, counted here from the nodes themselves.
		room := count
		if ring.zoned {
			perZoneNodes := map[string]int{}
			for _, node := range nodes {
				perZoneNodes[node.Zone]++
			}
			room = 0
			for _, size := range perZoneNodes {
				room += min(size, perZone)
			}
		}
		got, err := ring.Chunks(key, n, perZone)
		if n > room {
			if !errors.Is(err, ErrTooFewNodes) || got != nil {
				t.Fatalf("%v n=%d perZone=%d (room %d): %v, %v; want ErrTooFewNodes", nodes, n, perZone, room, got, err)
			}
			return
		}
		if err != nil {
			t.Fatalf("%v n=%d perZone=%d (room %d): %v", nodes, n, perZone, room, err)
		}
		checkChunks(t, ring, key, n, perZone, got)
		if want := referenceChunks(ring, key, n, perZone); !slices.Equal(got, want) {
			t.Fatalf("%v n=%d perZone=%d key %d: got %v, reference %v", nodes, n, perZone, key, got, want)
		}
		again, err := mustNew(t, shuffled(nodes, key)).Chunks(key, n, perZone)
		if err != nil || !slices.Equal(got, again) {
			t.Fatalf("input order changed the result: %v vs %v (%v)", got, again, err)
		}
	})
}
