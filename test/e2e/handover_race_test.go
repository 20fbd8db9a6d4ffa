package e2e

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/nbdclient"
	"github.com/herd-storage/herd/internal/testcluster"
)

// TestSecondWriterWhileFirstTakesTheLock: a writable open through one
// node, and a moment later (0 to 500 ms) another through a second node,
// of a VDI open to handover (the default). The second open comes while
// the first one's lock acquire may still be on its way through the log:
// it must not be refused as busy. Both opens succeed (one holds the lock,
// the other is on standby), and a write through the second takes the
// lock over and lands: it reads back through it and through the third
// node's read-only export. An exclusive VDI still refuses one of two
// writable opens at once, naming the holder.
//
// Both opens go through followers: an acquire that loses the race at the
// leader comes back to its node as an error code (cluster.RemoteError),
// not the cluster.LockHeldError a node returns when it already sees the
// lock held; gateway.acquireWriter refused the open as busy on it.
func TestSecondWriterWhileFirstTakesTheLock(t *testing.T) {
	c := dataCluster(t, 3, 3, "race", "64M")
	all := []int{0, 1, 2}
	leader := leaderIndex(t, c, all)
	followers := without(all, leader)
	first, second := followers[0], followers[1]
	dial := func(node int, export string) (*nbdclient.Conn, error) {
		dialCtx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		return nbdclient.Dial(dialCtx, c.Node(node).NBDSocket(), export)
	}
	reader, err := dial(leader, "ro/race")
	if err != nil {
		t.Fatalf("read-only open through node %d: %v", leader, err)
	}
	defer reader.Close()
	secondID := nodeID(t, c, second)
	delays := []time.Duration{0, 0, 0, 0, 5 * time.Millisecond, 10 * time.Millisecond, 20 * time.Millisecond, 50 * time.Millisecond, 50 * time.Millisecond, 200 * time.Millisecond, 500 * time.Millisecond}
	waitFree := func() {
		t.Helper()
		testcluster.WaitFor(t, 30*time.Second, "the writer lock of vdi race to be free", func() (bool, error) {
			st, err := client(c, leader).VDIStatus(ctx(t), "race")
			if err != nil {
				return false, err
			}
			if st.Lock != nil {
				return false, fmt.Errorf("held by node %s", st.Lock.Node)
			}
			return true, nil
		})
	}
	type opened struct {
		node int
		conn *nbdclient.Conn
		err  error
	}
	for round, delay := range delays {
		waitFree()
		firstOpen := make(chan opened, 1)
		go func() {
			conn, err := dial(first, "race")
			firstOpen <- opened{first, conn, err}
		}()
		// The delay between the two opens is what the rounds vary.
		<-time.After(delay)
		started := time.Now()
		b, errB := dial(second, "race")
		tookB := time.Since(started)
		o := <-firstOpen
		if o.err != nil {
			t.Fatalf("round %d: writable open through node %d (the first): %v", round, first, o.err)
		}
		if errB != nil {
			o.conn.Close()
			t.Fatalf("round %d: writable open through node %d %v after one through node %d: %v", round, second, delay, first, errB)
		}
		// Blocks in a few objects, each round its own value.
		offset := uint64(round%4) * 4 << 20
		want := bytes.Repeat([]byte{byte(1 + round)}, 4096)
		opCtx, cancel := context.WithTimeout(t.Context(), time.Minute)
		started = time.Now()
		if err := b.WriteAt(opCtx, want, offset, 0); err != nil {
			t.Fatalf("round %d: write through node %d: %v", round, second, err)
		}
		if err := b.Flush(opCtx); err != nil {
			t.Fatalf("round %d: flush through node %d: %v", round, second, err)
		}
		tookWrite := time.Since(started)
		got := make([]byte, len(want))
		if err := b.ReadAt(opCtx, got, offset); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("round %d: reading back through node %d: %v, first byte %d, want %d", round, second, err, got[0], want[0])
		}
		if err := reader.ReadAt(opCtx, got, offset); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("round %d: reading through node %d's read-only export: %v, first byte %d, want %d", round, leader, err, got[0], want[0])
		}
		cancel()
		st := vdiStatus(t, c, leader, "race")
		if st.Lock == nil || st.Lock.Node != secondID {
			t.Fatalf("round %d: after the write through node %d (%s), the lock is %+v", round, second, secondID, st.Lock)
		}
		t.Logf("round %d: second open %v after the first took %v, its first write+flush %v; handovers so far %d", round, delay, tookB.Round(time.Microsecond), tookWrite.Round(time.Microsecond), st.VDI.Handovers)
		b.Close()
		o.conn.Close()
	}

	// An exclusive VDI still refuses one of two writers that come at
	// once, naming the other's node.
	herd(t, c, leader, "vdi", "set", "race", "--exclusive")
	for _, i := range followers {
		testcluster.WaitFor(t, 10*time.Second, fmt.Sprintf("node %d to see vdi race exclusive", i), func() (bool, error) {
			v, err := client(c, i).VDI(ctx(t), "race")
			return err == nil && v.Exclusive, err
		})
	}
	for round := range 3 {
		waitFree()
		results := make(chan opened, 2)
		for _, node := range followers {
			go func() {
				conn, err := dial(node, "race")
				results <- opened{node, conn, err}
			}()
		}
		var won, lost []opened
		for range followers {
			o := <-results
			if o.err == nil {
				won = append(won, o)
			} else {
				lost = append(lost, o)
			}
		}
		if len(won) != 1 {
			t.Fatalf("exclusive round %d: %d of 2 writable opens at once succeeded, want 1: refused %+v", round, len(won), lost)
		}
		holderID := nodeID(t, c, won[0].node)
		if message := lost[0].err.Error(); !strings.Contains(message, "exclusive") || !strings.Contains(message, holderID) {
			t.Fatalf("exclusive round %d: the open through node %d was refused without naming the holder, node %s: %v", round, lost[0].node, holderID, message)
		}
		won[0].conn.Close()
	}
}
