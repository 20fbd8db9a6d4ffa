package store

import (
	"fmt"
	"sync/atomic"
	"testing"
)

// BenchmarkWrite and BenchmarkRead measure the store's own cost over the
// page cache (no fdatasync): one object per 4 MiB, writes spread over
// 64 objects, run in parallel like requests from many connections.
func BenchmarkWrite(b *testing.B) {
	for _, size := range []int{4 << 10, 1 << 20} {
		b.Run(fmt.Sprintf("%dKiB", size>>10), func(b *testing.B) {
			s := openTest(b, Options{})
			p := pattern(1, size)
			const objects = 64
			for oid := uint64(0); oid < objects; oid++ {
				mustWrite(b, s, oid, nil, 0, 1, Create)
			}
			var next atomic.Uint64
			b.SetBytes(int64(size))
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					n := next.Add(1)
					offset := uint32(n*uint64(size)) % (4 << 20)
					if err := s.Write(n%objects, p, offset, 1, 0); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

func BenchmarkRead(b *testing.B) {
	for _, size := range []int{4 << 10, 1 << 20} {
		b.Run(fmt.Sprintf("%dKiB", size>>10), func(b *testing.B) {
			s := openTest(b, Options{})
			const objects = 8
			for oid := uint64(0); oid < objects; oid++ {
				mustWrite(b, s, oid, pattern(oid, 4<<20), 0, 1, Create)
			}
			var next atomic.Uint64
			b.SetBytes(int64(size))
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				p := make([]byte, size)
				for pb.Next() {
					n := next.Add(1)
					offset := uint32(n*uint64(size)) % (4 << 20)
					if _, err := s.Read(n%objects, p, offset); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// BenchmarkWriteSync measures FUA writes of 4 KiB: dominated by the
// disk's fdatasync latency.
func BenchmarkWriteSync(b *testing.B) {
	s := openTest(b, Options{})
	p := pattern(1, 4096)
	mustWrite(b, s, 1, nil, 0, 1, Create)
	b.SetBytes(4096)
	for i := 0; b.Loop(); i++ {
		if err := s.Write(1, p, uint32(i%1024)*4096, 1, Sync); err != nil {
			b.Fatal(err)
		}
	}
}
