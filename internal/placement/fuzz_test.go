package placement

import (
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
