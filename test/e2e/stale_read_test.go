package e2e

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/blockmodel"
	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/linearize"
	"github.com/herd-storage/herd/internal/nbdclient"
	"github.com/herd-storage/herd/internal/testcluster"
)

// TestPausedNodeServesNoStaleRead: a writer through node 0 overwrites 64
// blocks in turn; readers through node 1's read-only export read them;
// node 1 is paused (SIGSTOP) for longer than failure detection, so it is
// dropped from the epoch and every write meanwhile misses its copies,
// then resumed, four times. The history of every operation must be
// linearizable (internal/linearize): a read that began after a newer
// write of its block was acknowledged never returns the older data. A
// resumed node must not serve from its old epoch (the lease,
// cluster/lease.go), however fresh a heartbeat it finds in its socket.
func TestPausedNodeServesNoStaleRead(t *testing.T) {
	const blocks, stride, pauses = 64, 1 << 20, 4
	c := dataCluster(t, 3, 3, "lin", "64M")
	history := linearize.NewHistory()
	ctx, stop := context.WithCancel(t.Context())
	defer stop()

	dial := func(node int, export string) (*nbdclient.Conn, error) {
		dialCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		return nbdclient.Dial(dialCtx, c.Node(node).NBDSocket(), export)
	}
	var wg sync.WaitGroup
	var writes, reads, readsSinceResume atomic.Int64
	var writeErrors atomic.Int64
	var firstErr sync.Once
	var clientProblem error
	problem := func(err error) { firstErr.Do(func() { clientProblem = err }) }

	// The writer, through node 0: block seq%blocks gets write seq.
	wg.Add(1)
	go func() {
		defer wg.Done()
		var conn *nbdclient.Conn
		defer func() {
			if conn != nil {
				conn.Close()
			}
		}()
		for seq := uint64(1); ctx.Err() == nil; seq++ {
			if conn == nil {
				var err error
				if conn, err = dial(0, "lin"); err != nil {
					continue
				}
			}
			block := int(seq % blocks)
			call := history.Invoke(0)
			opCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
			err := conn.WriteAt(opCtx, blockmodel.Content(1, block, seq), uint64(block)*stride, 0)
			cancel()
			history.Write(call, block, seq, err == nil)
			if err != nil {
				if ctx.Err() == nil {
					writeErrors.Add(1)
					t.Logf("write %d of block %d: %v", seq, block, err)
				}
				var commandErr *nbdclient.Error
				if !errors.As(err, &commandErr) {
					conn.Close()
					conn = nil
				}
				continue
			}
			writes.Add(1)
		}
	}()
	// Two readers through node 1's read-only export.
	for r := 1; r <= 2; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			random := rand.New(rand.NewPCG(uint64(r), 7))
			var conn *nbdclient.Conn
			defer func() {
				if conn != nil {
					conn.Close()
				}
			}()
			p := make([]byte, blockmodel.BlockSize)
			for ctx.Err() == nil {
				if conn == nil {
					var err error
					if conn, err = dial(1, "ro/lin"); err != nil {
						continue
					}
				}
				block := random.IntN(blocks)
				call := history.Invoke(r)
				opCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
				err := conn.ReadAt(opCtx, p, uint64(block)*stride)
				cancel()
				if err != nil {
					// A failed read returned nothing: dropped.
					var commandErr *nbdclient.Error
					if !errors.As(err, &commandErr) {
						conn.Close()
						conn = nil
					}
					continue
				}
				seq, err := blockmodel.Decode(1, block, p)
				if err != nil {
					problem(fmt.Errorf("reader %d: %v", r, err))
					continue
				}
				history.Read(call, block, seq)
				reads.Add(1)
				readsSinceResume.Add(1)
			}
		}()
	}

	waitProgress := func(what string, counter *atomic.Int64, from int64) {
		testcluster.WaitFor(t, time.Minute, what, func() (bool, error) {
			n := counter.Load()
			return n >= from+50, fmt.Errorf("%d operations so far", n-from)
		})
	}
	waitProgress("the writer and readers under way", &reads, 0)
	id := nodeID(t, c, 1)
	for i := 0; i < pauses; i++ {
		epochBefore := latestEpoch(t, c, 0).Number
		c.Node(1).Pause()
		// Paused until node 0 has committed an epoch without node 1: its
		// copies now miss every write, and the writer keeps writing.
		testcluster.WaitFor(t, 30*time.Second, "node 1 dropped from the epoch", func() (bool, error) {
			e := latestEpoch(t, c, 0)
			return e.Number > epochBefore && !slices.Contains(e.Nodes, id), fmt.Errorf("epoch %d", e.Number)
		})
		waitProgress("writes while node 1 is paused", &writes, writes.Load())
		readsSinceResume.Store(0)
		c.Node(1).Resume()
		testcluster.WaitFor(t, time.Minute, "node 1 back in the epoch", func() (bool, error) {
			e := latestEpoch(t, c, 0)
			return slices.Contains(e.Nodes, id), fmt.Errorf("epoch %d: %v", e.Number, e.Nodes)
		})
		waitProgress("reads through node 1 after it resumed", &readsSinceResume, 0)
	}
	stop()
	wg.Wait()
	if clientProblem != nil {
		t.Fatal(clientProblem)
	}
	visualization := filepath.Join(os.TempDir(), fmt.Sprintf("herd-%s-%d.html", t.Name(), time.Now().UnixNano()))
	if err := history.Check(2*time.Minute, visualization); err != nil {
		t.Fatalf("%d writes, %d reads through the paused node: %v", writes.Load(), reads.Load(), err)
	}
	t.Logf("%d writes (%d failed), %d reads through the paused node over %d pauses: linearizable", writes.Load(), writeErrors.Load(), reads.Load(), pauses)
}

// latestEpoch is node i's newest epoch.
func latestEpoch(t *testing.T, c *testcluster.Cluster, i int) cluster.Epoch {
	t.Helper()
	epochs, err := client(c, i).Epochs(ctx(t))
	if err != nil || len(epochs) == 0 {
		t.Fatalf("node %d's epochs: %v", i, err)
	}
	return epochs[len(epochs)-1]
}
