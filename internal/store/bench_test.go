package store

import (
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/herd-storage/herd/internal/object"
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
				mustWrite(b, s, 1, object.OID(oid), nil, 0, object.FlagCreate)
			}
			var next atomic.Uint64
			b.SetBytes(int64(size))
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					n := next.Add(1)
					offset := uint32(n*uint64(size)) % (4 << 20)
					if err := s.Write(1, object.OID(n%objects), p, offset, 0); err != nil {
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
				mustWrite(b, s, 1, object.OID(oid), pattern(oid, 4<<20), 0, object.FlagCreate)
			}
			var next atomic.Uint64
			b.SetBytes(int64(size))
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				p := make([]byte, size)
				for pb.Next() {
					n := next.Add(1)
					offset := uint32(n*uint64(size)) % (4 << 20)
					if _, err := s.Read(object.OID(n%objects), p, offset); err != nil {
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
	mustWrite(b, s, 1, 1, nil, 0, object.FlagCreate)
	b.SetBytes(4096)
	for i := 0; b.Loop(); i++ {
		if err := s.Write(1, 1, p, uint32(i%1024)*4096, object.FlagSync); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkChecksums measures what data checksums cost the store, against
// copies without them (format version 1) in the same binary: sequential
// writes and reads at iodepth 1 at the Sheepdog paper's Table 4 buffer
// sizes, over the page cache.
//
//	go test -run '^$' -bench BenchmarkChecksums -count 5 ./internal/store | tee out; benchstat -col /checksums out
func BenchmarkChecksums(b *testing.B) {
	for _, op := range []string{"write", "read"} {
		for _, size := range []int{512, 2 << 10, 4 << 10, 8 << 10, 32 << 10, 128 << 10, 512 << 10} {
			for _, checksums := range []bool{false, true} {
				b.Run(fmt.Sprintf("op=%s/size=%d/checksums=%v", op, size, checksums), func(b *testing.B) {
					createLegacy = !checksums
					defer func() { createLegacy = false }()
					s := openTest(b, Options{})
					const objectSize = 4 << 20
					p := pattern(1, size)
					mustWrite(b, s, 1, 1, pattern(2, objectSize), 0, object.FlagCreate)
					b.SetBytes(int64(size))
					b.ResetTimer()
					offset := 0
					for i := 0; i < b.N; i++ {
						var err error
						if op == "write" {
							err = s.Write(1, 1, p, uint32(offset), 0)
						} else {
							_, err = s.Read(1, p, uint32(offset))
						}
						if err != nil {
							b.Fatal(err)
						}
						offset = (offset + size) % objectSize
					}
				})
			}
		}
	}
}
