// Command metabench measures herd's metadata path on a running cluster:
// VDI creates per second and lock acquire+release pairs per second, with
// concurrent clients spread over every node's admin API.
//
//	HERD_TOKEN=ADMIN-TOKEN go run ./bench/metabench --addr 127.0.0.1,127.0.0.2,127.0.0.3
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/herd-storage/herd/internal/api"
)

func main() {
	addrs := flag.String("addr", "127.0.0.1,127.0.0.2,127.0.0.3", "admin addresses of the nodes, comma-separated")
	token := os.Getenv("HERD_TOKEN") // an admin token
	clients := flag.Int("clients", 64, "concurrent clients")
	creates := flag.Int("creates", 5000, "VDI creates to run")
	locks := flag.Int("locks", 20000, "lock acquire+release pairs to run")
	inNode := flag.Int("in-node-locks", 20000, "lock pairs run inside the nodes (all nodes at once), 0 to skip")
	inNodeConcurrency := flag.Int("in-node-concurrency", 128, "concurrent lock holders per node for -in-node-locks")
	prefix := flag.String("prefix", fmt.Sprintf("bench-%d-", time.Now().Unix()), "name prefix for VDIs and lock keys")
	flag.Parse()
	var nodes []*api.Client
	for _, a := range strings.Split(*addrs, ",") {
		nodes = append(nodes, api.NewClient(strings.TrimSpace(a), token))
	}
	ctx := context.Background()
	if _, err := nodes[0].Info(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "metabench:", err)
		os.Exit(1)
	}
	fmt.Printf("nodes=%d clients=%d\n", len(nodes), *clients)
	run("vdi create", *creates, *clients, nodes, func(c *api.Client, worker, i int) error {
		_, err := c.CreateVDI(ctx, fmt.Sprintf("%sv%d", *prefix, i), 1<<30)
		return err
	})
	run("lock acquire+release pair", *locks, *clients, nodes, func(c *api.Client, worker, i int) error {
		key := fmt.Sprintf("%sl%d", *prefix, worker)
		session := fmt.Sprintf("s%d", i)
		if _, err := c.AcquireLock(ctx, key, session); err != nil {
			return err
		}
		return c.ReleaseLock(ctx, key, session)
	})
	if *inNode > 0 {
		inNodeLocks(ctx, nodes, *inNode, *inNodeConcurrency, *prefix)
	}
}

// inNodeLocks asks every node at once to run its share of lock pairs from
// inside (the gateway's path: no HTTP client per operation).
func inNodeLocks(ctx context.Context, nodes []*api.Client, pairs, concurrency int, prefix string) {
	results := make([]api.LockBenchResult, len(nodes))
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	start := time.Now()
	for i, n := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = n.LockBench(ctx, api.LockBenchRequest{Pairs: pairs / len(nodes), Concurrency: concurrency, Prefix: prefix})
		}()
	}
	wg.Wait()
	elapsed := time.Since(start).Seconds()
	total, failed := 0, 0
	for i, r := range results {
		if errs[i] != nil {
			fmt.Println("  node", i, "error:", errs[i])
			continue
		}
		total += r.Pairs
		failed += r.Failed
		fmt.Printf("  node %d: %d pairs in %.2fs, p50 %dus p99 %dus %s\n", i, r.Pairs, r.Seconds, r.P50Micros, r.P99Micros, r.FirstError)
	}
	fmt.Printf("%-26s %7d ok %4d failed in %6.2fs: %9.0f pairs/s = %.0f lock operations/s\n", "in-node lock pairs", total, failed, elapsed, float64(total)/elapsed, 2*float64(total)/elapsed)
}

// run executes total operations with the given concurrency, client i
// talking to node i%len(nodes), and prints throughput and latency.
func run(name string, total, concurrency int, nodes []*api.Client, op func(client *api.Client, worker, i int) error) {
	var next, failed atomic.Int64
	latencies := make([][]time.Duration, concurrency)
	var wg sync.WaitGroup
	start := time.Now()
	var firstErr atomic.Value
	for w := 0; w < concurrency; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			client := nodes[w%len(nodes)]
			for {
				i := int(next.Add(1)) - 1
				if i >= total {
					return
				}
				t := time.Now()
				if err := op(client, w, i); err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
					continue
				}
				latencies[w] = append(latencies[w], time.Since(t))
			}
		}(w)
	}
	wg.Wait()
	elapsed := time.Since(start)
	var all []time.Duration
	for _, l := range latencies {
		all = append(all, l...)
	}
	sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
	pct := func(p float64) time.Duration {
		if len(all) == 0 {
			return 0
		}
		return all[int(float64(len(all)-1)*p)]
	}
	fmt.Printf("%-26s %7d ok %4d failed in %6.2fs: %9.0f/s  p50 %v  p99 %v\n", name, len(all), failed.Load(), elapsed.Seconds(),
		float64(len(all))/elapsed.Seconds(), pct(0.5).Round(10*time.Microsecond), pct(0.99).Round(10*time.Microsecond))
	if e := firstErr.Load(); e != nil {
		fmt.Printf("  first error: %v\n", e)
	}
}
