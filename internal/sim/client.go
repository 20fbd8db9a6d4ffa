package sim

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/herd-storage/herd/internal/blockmodel"
	"github.com/herd-storage/herd/internal/linearize"
	"github.com/herd-storage/herd/internal/nbd"
)

const (
	blockSize = blockmodel.BlockSize
	// opTimeout bounds one client operation, as in test/robustness: the
	// gateway itself gives up after 30 s of retries.
	opTimeout = 2 * time.Minute
	// thinkMax is the longest pause of a lane between two operations.
	thinkMax = 150 * time.Millisecond
)

// client is one VM: lanes of operations on its own VDI through the NBD
// export of the node it runs on, with a model of every block exactly like
// test/robustness's: the last acknowledged write and the writes whose
// outcome it does not know (they failed), one of which a read must
// return. Lanes touch distinct blocks (block % lanes), so no two
// operations on a block are ever in flight at once. A lane's operations
// (which, on which block, when) are drawn from its own generator, so they
// are a function of the seed, not of how earlier operations ended.
//
// The client runs on one node; when that node's process dies the VM
// dies with it and starts again on the next node that runs (its writes in
// flight have unknown outcomes, and the VDI is unclean until its next
// writer repairs it).
type client struct {
	w     *World
	id    uint32 // 1-based: written into every block
	vdi   string
	vdiID uint32

	opening chan struct{} // one lane (re)opens the export at a time
	// started is closed once the client's VDI exists: at once, or, for
	// the client of the VDI created after a rolling upgrade (World.late),
	// when the step loop created it (start). vdiID is set before.
	started chan struct{}

	mu        sync.Mutex // guards the fields below
	node      int        // the node it runs on
	export    nbd.Export
	proc      *process // the process the export belongs to
	seq       uint64
	acked     []uint64         // per block: last acknowledged write (0: zeros)
	uncertain map[int][]uint64 // per block: writes that failed
	pending   map[int]uint64   // per block: the write in flight
	errs      []string
	// seen: per block, the newest write readers' completed reads
	// returned (checkReadFloor, reader.go).
	seen map[int][]readMark

	// history records every write and read of the client's VDI, the
	// writer's and the readers', with its invoke and return times on the
	// bubble's clock, for the linearizability check at the end of the
	// run (World.checkHistories).
	history *linearize.History

	// tags are the client's VDI's snapshots left, oldest first; deleted
	// counts those deleted (Config.Layers; only the step loop uses them).
	tags    []string
	deleted int

	ops, reads, writes, flushes, failures atomic.Int64
}

func newClient(w *World, index int) *client {
	blocks := int(w.cfg.VDISize / blockSize)
	c := &client{w: w, id: uint32(index + 1), vdi: fmt.Sprintf("vdi%d", index), node: index % w.cfg.Nodes, opening: make(chan struct{}, 1), started: make(chan struct{}),
		acked: make([]uint64, blocks), uncertain: map[int][]uint64{}, pending: map[int]uint64{}, history: linearize.NewHistory()}
	return c
}

// start lets the client's lanes run: its VDI, vdiID, exists.
func (c *client) start(vdiID uint32) {
	c.vdiID = vdiID
	close(c.started)
}

// running says whether the client's VDI exists yet (start).
func (c *client) running() bool {
	select {
	case <-c.started:
		return true
	default:
		return false
	}
}

// content and decode: the shared block model (internal/blockmodel).
func content(client uint32, block int, seq uint64) []byte {
	return blockmodel.Content(client, block, seq)
}

func decode(client uint32, block int, p []byte) (uint64, error) {
	return blockmodel.Decode(client, block, p)
}

// possible returns the writes a read of block may return now, for
// messages.
func (c *client) possible(block int) (acked uint64, uncertain []uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.acked[block], slices.Clone(c.uncertain[block])
}

// check compares a read of block with the model (invariant (a); at the
// end, (d)).
func (c *client) check(block int, p []byte, final bool) {
	got, err := decode(c.id, block, p)
	acked, uncertain := c.possible(block)
	switch {
	case err != nil:
		c.w.violation("client %d: %v (final read: %v)", c.id, err, final)
	case got == acked || slices.Contains(uncertain, got):
	case got < acked && final:
		c.w.violation("client %d: block %d holds write #%d at the end, but write #%d was acknowledged (acknowledged write lost)", c.id, block, got, acked)
	case got < acked:
		c.w.violation("client %d: block %d read write #%d, but write #%d was acknowledged (stale read)", c.id, block, got, acked)
	default:
		c.w.violation("client %d: block %d read write #%d, which was never attempted before the read (last acknowledged #%d, unknown outcomes %v)", c.id, block, got, acked, uncertain)
	}
}

func (c *client) recordError(what string, err error) {
	c.failures.Add(1)
	c.mu.Lock()
	if len(c.errs) < 20 {
		c.errs = append(c.errs, fmt.Sprintf("t=%6.2fs client %d: %s: %v", c.w.elapsed().Seconds(), c.id, what, err))
	}
	c.mu.Unlock()
}

// open returns the client's export, opening one on the node it runs on
// (moving on to the next running node when its node's process died). It
// retries every second until it succeeds or stop closes.
func (c *client) open(stop <-chan struct{}) (nbd.Export, *process, bool) {
	select {
	case c.opening <- struct{}{}:
	case <-stop:
		return nil, nil, false
	}
	defer func() { <-c.opening }()
	for {
		c.mu.Lock()
		export, proc := c.export, c.proc
		c.mu.Unlock()
		w := c.w
		w.mu.Lock()
		dead := proc != nil && proc.dead
		w.mu.Unlock()
		if export != nil && !dead {
			return export, proc, true
		}
		if export != nil {
			c.drop(export)
		}
		w.mu.Lock()
		node := c.node
		for i := 0; i < len(w.nodes) && (w.nodes[node].killed || w.nodes[node].stopping); i++ {
			node = (node + 1) % len(w.nodes)
		}
		p := w.nodes[node].proc
		w.mu.Unlock()
		c.mu.Lock()
		c.node = node
		c.mu.Unlock()
		ctx, cancel := context.WithTimeout(p.ctx, 10*time.Second)
		opened, err := p.openExport(ctx, c.vdi, nbd.Session{ID: uint64(c.id)}) // through the NBD adapter, as a client reaches it
		cancel()
		if err == nil {
			c.mu.Lock()
			c.export, c.proc = opened, p
			c.mu.Unlock()
			w.note("client %d opened %s on %s", c.id, c.vdi, p.incarnation)
			return opened, p, true
		}
		c.recordError("open on "+p.incarnation, err)
		select {
		case <-stop:
			return nil, nil, false
		case <-time.After(time.Second):
		}
	}
}

// drop closes export if it is still the client's.
func (c *client) drop(export nbd.Export) {
	c.mu.Lock()
	mine := c.export == export
	if mine {
		c.export, c.proc = nil, nil
	}
	c.mu.Unlock()
	if mine {
		export.Close()
	}
}

// lane runs one lane's operations until stop closes.
func (c *client) lane(lane int, stop <-chan struct{}) {
	lanes := c.w.cfg.Lanes
	blocks := len(c.acked)
	r := rand.New(rand.NewPCG(c.w.seed, uint64(c.id)<<8|uint64(lane)))
	select {
	case <-c.started:
	case <-stop:
		return
	}
	for {
		think := time.Duration(r.Int64N(int64(thinkMax)))
		roll := r.IntN(100)
		block := lane + lanes*r.IntN(blocks/lanes)
		select {
		case <-stop:
			return
		case <-time.After(think):
		}
		export, proc, ok := c.open(stop)
		if !ok {
			return
		}
		ctx, cancel := context.WithTimeout(proc.ctx, opTimeout)
		var err error
		switch {
		case roll < 55:
			err = c.write(ctx, export, lane, block, roll < 6)
		case roll < 95:
			err = c.read(ctx, export, lane, block)
		default:
			c.flushes.Add(1)
			if err = export.Flush(ctx); err != nil {
				c.recordError("flush", err)
			}
		}
		cancel()
		c.ops.Add(1)
		if err != nil {
			c.w.mu.Lock()
			dead := proc.dead
			c.w.mu.Unlock()
			if dead || errors.Is(err, nbd.ErrShutdown) {
				c.drop(export)
			}
		}
	}
}

func (c *client) write(ctx context.Context, export nbd.Export, lane, block int, fua bool) error {
	c.mu.Lock()
	c.seq++
	seq := c.seq
	c.pending[block] = seq
	c.mu.Unlock()
	c.writes.Add(1)
	call := c.history.Invoke(lane)
	err := export.WriteAt(ctx, content(c.id, block, seq), uint64(block)*blockSize, fua)
	c.history.Write(call, block, seq, err == nil)
	c.mu.Lock()
	delete(c.pending, block)
	if err != nil {
		c.uncertain[block] = append(c.uncertain[block], seq)
	} else {
		c.acked[block] = seq
	}
	c.mu.Unlock()
	if err != nil {
		c.recordError(fmt.Sprintf("write #%d to block %d", seq, block), err)
	}
	return err
}

func (c *client) read(ctx context.Context, export nbd.Export, lane, block int) error {
	c.reads.Add(1)
	p := make([]byte, blockSize)
	call := c.history.Invoke(lane)
	if err := export.ReadAt(ctx, p, uint64(block)*blockSize); err != nil {
		c.recordError(fmt.Sprintf("read of block %d", block), err)
		return err
	}
	c.recordRead(call, block, p)
	c.check(block, p, false)
	return nil
}

// recordRead adds a successful read of block that returned p to the
// history (a block that decodes as no write of the client's is reported
// by check, not recorded).
func (c *client) recordRead(call linearize.Call, block int, p []byte) {
	if got, err := decode(c.id, block, p); err == nil {
		c.history.Read(call, block, got)
	}
}

// finalRead reads every block through a new export and checks it against
// the model (invariant (d)). The open also repairs the VDI if its last
// writer died.
// finalReader is the history's client id of the final reads (lanes are
// 0 up, readers readerID).
const finalReader = 999

func (c *client) finalRead(limit time.Duration) error {
	deadline := time.Now().Add(limit)
	stop := make(chan struct{})
	timer := time.AfterFunc(limit, func() { close(stop) })
	defer timer.Stop()
	c.mu.Lock()
	export := c.export
	c.mu.Unlock()
	if export != nil {
		c.drop(export)
	}
	export, proc, ok := c.open(stop)
	if !ok {
		return fmt.Errorf("client %d: no export of %s could be opened within %v", c.id, c.vdi, limit)
	}
	defer c.drop(export)
	const chunk = 64 << 10
	p := make([]byte, chunk)
	for offset := uint64(0); offset < c.w.cfg.VDISize; offset += chunk {
		var call linearize.Call
		for {
			ctx, cancel := context.WithTimeout(proc.ctx, opTimeout)
			call = c.history.Invoke(finalReader)
			err := export.ReadAt(ctx, p, offset)
			cancel()
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("client %d: final read at %d failed: %v", c.id, offset, err)
			}
			c.recordError(fmt.Sprintf("final read at %d", offset), err)
			time.Sleep(time.Second)
		}
		for i := 0; i < chunk; i += blockSize {
			c.recordRead(call, int(offset+uint64(i))/blockSize, p[i:i+blockSize])
			c.check(int(offset+uint64(i))/blockSize, p[i:i+blockSize], true)
		}
	}
	return nil
}
