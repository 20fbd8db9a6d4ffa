package api

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/herd-storage/herd/internal/cluster"
)

// LockBenchRequest asks a node to run lock acquire+release pairs from
// inside itself, the way the NBD gateway takes a VDI's lock, so that a
// benchmark measures the lock service rather than an HTTP client.
type LockBenchRequest struct {
	Pairs       int    `json:"pairs"`
	Concurrency int    `json:"concurrency"`
	Prefix      string `json:"prefix"`
}

// LockBenchResult reports what the node measured.
type LockBenchResult struct {
	Pairs      int     `json:"pairs"`
	Failed     int     `json:"failed"`
	Seconds    float64 `json:"seconds"`
	P50Micros  int64   `json:"p50_us"`
	P99Micros  int64   `json:"p99_us"`
	FirstError string  `json:"first_error,omitempty"`
}

const maxBenchPairs = 1_000_000

func lockBench(ctx context.Context, c *cluster.Cluster, req LockBenchRequest) (LockBenchResult, error) {
	var result LockBenchResult
	if req.Pairs < 1 || req.Pairs > maxBenchPairs || req.Concurrency < 1 || req.Concurrency > 4096 {
		return result, fmt.Errorf("%w: pairs must be 1..%d and concurrency 1..4096", cluster.ErrInvalid, maxBenchPairs)
	}
	var next, failed atomic.Int64
	var firstError atomic.Value
	latencies := make([][]time.Duration, req.Concurrency)
	var wg sync.WaitGroup
	start := time.Now()
	for w := 0; w < req.Concurrency; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := fmt.Sprintf("bench/%s/%s/%d", req.Prefix, c.ID(), w)
			for int(next.Add(1)) <= req.Pairs && ctx.Err() == nil {
				t := time.Now()
				session := fmt.Sprint(t.UnixNano())
				_, err := c.AcquireLock(ctx, key, session)
				if err == nil {
					err = c.ReleaseLock(ctx, key, session)
				}
				if err != nil {
					failed.Add(1)
					firstError.CompareAndSwap(nil, err.Error())
					continue
				}
				latencies[w] = append(latencies[w], time.Since(t))
			}
		}()
	}
	wg.Wait()
	result.Seconds = time.Since(start).Seconds()
	var all []time.Duration
	for _, l := range latencies {
		all = append(all, l...)
	}
	sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
	result.Pairs, result.Failed = len(all), int(failed.Load())
	if len(all) > 0 {
		result.P50Micros = all[len(all)/2].Microseconds()
		result.P99Micros = all[(len(all)-1)*99/100].Microseconds()
	}
	if e, ok := firstError.Load().(string); ok {
		result.FirstError = e
	}
	return result, nil
}

// LockBench runs LockBenchRequest on the node.
func (c *Client) LockBench(ctx context.Context, req LockBenchRequest) (LockBenchResult, error) {
	var v LockBenchResult
	return v, c.Do(ctx, "POST", "/v1/bench/locks", req, &v)
}
