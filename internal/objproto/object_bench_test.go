package objproto

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/herd-storage/herd/internal/object"
)

// discardObjectHandler answers WRITEs without storing them and READs with
// an uninitialised pooled buffer: what is left to measure is the protocol,
// the connections and the loopback.
type discardObjectHandler struct{}

func (discardObjectHandler) ServeObject(ctx context.Context, request *ObjectRequest, payload []byte) (ObjectResponse, []byte) {
	if request.Opcode == ObjectRead {
		buffer := GetObjectBuffer(int(request.Length))
		return ObjectResponse{Status: ObjectStatusOK, Epoch: request.Epoch, Release: buffer}, buffer.Bytes
	}
	return ObjectResponse{Status: ObjectStatusOK, Epoch: request.Epoch}, nil
}

// BenchmarkObject measures WRITEs and READs of 4 KiB and 1 MiB through
// loopback TCP, with 1 and 64 calls in flight from one client (two
// connections, the default). Reports MB/s and ops/s.
//
//	go test -run '^$' -bench BenchmarkObject -benchtime 2s ./internal/peer/
func BenchmarkObject(b *testing.B) {
	for _, opcode := range []ObjectOpcode{ObjectWrite, ObjectRead} {
		for _, size := range []int{4 << 10, 1 << 20} {
			for _, inFlight := range []int{1, 64} {
				name := fmt.Sprintf("%s/size=%dKiB/inflight=%d", opcode, size>>10, inFlight)
				b.Run(name, func(b *testing.B) { benchmarkObject(b, opcode, size, inFlight) })
			}
		}
	}
}

func benchmarkObject(b *testing.B, opcode ObjectOpcode, size, inFlight int) {
	node := startObjectNode(b, discardObjectHandler{}, nil)
	client := newTestObjectClient(b, node)
	ctx := context.Background()
	// Dial both connections before timing.
	for range 2 {
		if _, _, err := client.Do(ctx, node.address, &ObjectRequest{Opcode: ObjectPing}, nil, nil); err != nil {
			b.Fatal(err)
		}
	}
	b.SetBytes(int64(size))
	b.ReportAllocs()
	b.ResetTimer()
	var next atomic.Int64
	var wait sync.WaitGroup
	var failed atomic.Value
	for worker := range inFlight {
		wait.Add(1)
		go func() {
			defer wait.Done()
			var payload, into []byte
			request := ObjectRequest{Opcode: opcode, OID: object.OID(worker), Length: uint32(size)}
			if opcode == ObjectWrite {
				payload = pattern(object.OID(worker), 0, size)
			} else {
				into = make([]byte, size)
			}
			for next.Add(1) <= int64(b.N) {
				if _, _, err := client.Do(ctx, node.address, &request, payload, into); err != nil {
					failed.Store(err)
					return
				}
			}
		}()
	}
	wait.Wait()
	b.StopTimer()
	if err := failed.Load(); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
}
