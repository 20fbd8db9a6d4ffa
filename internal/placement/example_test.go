package placement_test

import (
	"fmt"

	"github.com/herd-storage/herd/internal/placement"
)

func Example() {
	ring, err := placement.New([]placement.Node{
		{ID: "a1b2c3d4e5f60718", Zone: "rack-1", Weight: 4 << 40},
		{ID: "0f1e2d3c4b5a6978", Zone: "rack-2", Weight: 8 << 40},
		{ID: "1122334455667788", Zone: "rack-3", Weight: 4 << 40},
		{ID: "99aabbccddeeff00", Zone: "rack-3", Weight: 4 << 40},
	})
	if err != nil {
		panic(err)
	}
	const copies = 3
	if copies > ring.MaxCopies() {
		panic("not enough zones for 3 copies")
	}
	replicas := ring.Replicas(0x00abcdef00000001, copies)
	fmt.Println(len(replicas), "replicas in", ring.MaxCopies(), "zones")
	// Output: 3 replicas in 3 zones
}
