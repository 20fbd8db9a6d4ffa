package placement

import (
	"fmt"
	"testing"
)

// BenchmarkReplicas measures one lookup of three replicas, reusing dst.
func BenchmarkReplicas(b *testing.B) {
	for _, count := range []int{3, 100, 1000} {
		for _, zones := range []int{0, 5} {
			if zones > count {
				continue
			}
			name := fmt.Sprintf("nodes=%d", count)
			if zones > 0 {
				name += fmt.Sprintf("/zones=%d", zones)
			}
			b.Run(name, func(b *testing.B) {
				ring := mustNew(b, testNodes(count, mixedWeights, zones, 1))
				dst := make([]string, 0, 3)
				b.ReportAllocs()
				oid := uint64(0)
				for b.Loop() {
					dst = ring.AppendReplicas(dst[:0], oid, 3)
					oid++
				}
			})
		}
	}
}

// BenchmarkNew measures building a ring, done once per epoch.
func BenchmarkNew(b *testing.B) {
	for _, count := range []int{3, 100, 1000} {
		nodes := testNodes(count, mixedWeights, 0, 1)
		b.Run(fmt.Sprintf("nodes=%d", count), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := New(nodes); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkChunks measures placing a 4+2 stripe (6 chunks, at most 2 per
// zone).
func BenchmarkChunks(b *testing.B) {
	for _, shape := range []struct{ count, zones int }{{12, 0}, {12, 3}, {100, 0}, {1000, 5}} {
		name := fmt.Sprintf("nodes=%d", shape.count)
		if shape.zones > 0 {
			name += fmt.Sprintf("/zones=%d", shape.zones)
		}
		b.Run(name, func(b *testing.B) {
			ring := mustNew(b, testNodes(shape.count, mixedWeights, shape.zones, 1))
			b.ReportAllocs()
			key := uint64(0)
			for b.Loop() {
				if _, err := ring.Chunks(key, 6, 2); err != nil {
					b.Fatal(err)
				}
				key++
			}
		})
	}
}
