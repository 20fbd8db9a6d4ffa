package e2e

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/nbdclient"
)

// sigtermExitBound is how long a node given SIGTERM may take to exit: its
// NBD requests drain (at most 5 s) while it departs (at most 5 s), then
// it leaves gossip (at most 1 s) and stops raft.
const sigtermExitBound = 10 * time.Second

// TestSIGTERMAnswersNBDRequestsInFlight: 8 writers on one NBD connection
// through node 2's socket write distinct 64 KiB blocks (no FUA, no FLUSH)
// as fast as they can when node 2 gets SIGTERM. The writes in flight are
// acknowledged, every acknowledged write reads back through another node
// once node 2 is gone, each writer's next request ends with the
// connection closed by the server (the end of the stream, not a reset)
// or NBD_ESHUTDOWN, never another error, and the node exits within
// sigtermExitBound.
// Before, the node closed the connection with the client's unread
// requests in its socket: the kernel reset it, so a client could lose
// replies already written, and nothing flushed the writes acknowledged
// without FUA.
func TestSIGTERMAnswersNBDRequestsInFlight(t *testing.T) {
	const (
		writers   = 8
		blockSize = 64 << 10
		blocks    = 512 << 20 / blockSize
	)
	c := dataCluster(t, 3, 3, "vm1", "512M")
	conn, err := nbdclient.Dial(ctx(t), c.Node(2).NBDSocket(), "vm1")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()

	type write struct {
		block        int
		sent, acked  time.Time
		err          error
		acknowledged bool
	}
	var mu sync.Mutex
	var writes []write
	acked := make(chan struct{}, blocks)
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for block := w; block < blocks; block += writers {
				sent := time.Now()
				err := conn.WriteAt(context.Background(), sigtermBlock(block, blockSize), uint64(block)*blockSize, 0)
				mu.Lock()
				writes = append(writes, write{block: block, sent: sent, acked: time.Now(), err: err, acknowledged: err == nil})
				mu.Unlock()
				if err != nil {
					return
				}
				acked <- struct{}{}
			}
		}()
	}
	for range 4 * writers { // I/O is flowing
		select {
		case <-acked:
		case <-time.After(time.Minute):
			t.Fatal("the writers had no write acknowledged within a minute")
		}
	}
	sigterm := time.Now()
	c.Node(2).Stop()
	exited := time.Since(sigterm)
	wg.Wait()

	inFlight, acknowledged := 0, 0
	var failures []string
	for _, w := range writes {
		if w.acknowledged {
			acknowledged++
			if w.sent.Before(sigterm) && w.acked.After(sigterm) {
				inFlight++
			}
			continue
		}
		closed := errors.Is(w.err, nbdclient.ErrClosed) && strings.Contains(w.err.Error(), "the server closed the connection")
		if !closed && !errors.Is(w.err, syscall.ESHUTDOWN) || errors.Is(w.err, syscall.ECONNRESET) {
			failures = append(failures, fmt.Sprintf("block %d: %v", w.block, w.err))
		}
	}
	t.Logf("node 2 exited %v after SIGTERM; %d writes acknowledged, %d of them in flight at SIGTERM; %d unanswered, ended by the close", exited.Round(time.Millisecond), acknowledged, inFlight, len(writes)-acknowledged)
	if exited > sigtermExitBound {
		t.Errorf("node 2 exited %v after SIGTERM; want at most %v", exited, sigtermExitBound)
	}
	if inFlight == 0 {
		t.Errorf("no write in flight at SIGTERM was acknowledged")
	}
	if len(failures) > 0 {
		t.Errorf("requests after SIGTERM ended otherwise than by the server's close or NBD_ESHUTDOWN: %s", strings.Join(failures, "; "))
	}

	// Every acknowledged write is there, through another node.
	reader, err := nbdclient.Dial(ctx(t), c.Node(0).NBDSocket(), "ro/vm1")
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	got := make([]byte, blockSize)
	for _, w := range writes {
		if !w.acknowledged {
			continue
		}
		if err := reader.ReadAt(ctx(t), got, uint64(w.block)*blockSize); err != nil {
			t.Fatalf("reading block %d through node 0: %v", w.block, err)
		}
		if !bytes.Equal(got, sigtermBlock(w.block, blockSize)) {
			t.Fatalf("block %d, acknowledged %v after SIGTERM, does not read back through node 0", w.block, w.acked.Sub(sigterm).Round(time.Millisecond))
		}
	}
}

// sigtermBlock is the content written to block: its number, then a byte
// that depends on it.
func sigtermBlock(block, size int) []byte {
	data := bytes.Repeat([]byte{byte(block%251 + 1)}, size)
	binary.BigEndian.PutUint64(data, uint64(block))
	return data
}
