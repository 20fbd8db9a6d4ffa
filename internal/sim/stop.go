package sim

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	nbdexport "github.com/herd-storage/herd/internal/export"
	"github.com/herd-storage/herd/internal/nbd"
)

// Clean stops (SIGTERM), in the order server.Run takes them:
//
//  1. Down, not out: the node commits its stop window (cluster/depart.go
//     step 1b), until downOutInterval from now, if it reaches the leader.
//  2. Its NBD server stops taking requests (a client's next request
//     fails as its connection's end: nbd.ErrShutdown, and the client
//     opens its VDI through another node); those in flight are answered,
//     for at most nbdDrainTimeout.
//  3. Every export through it that wrote is flushed (the server's
//     shutdownFlush).
//  4. The process ends, and the leader, which hears its gossip leave,
//     commits its leave instead of waiting for a suspicion time (once
//     the node's lease has run out, as for any node it drops:
//     cluster/lease.go).
//
// A client's operation cut off by the stop is an operation of unknown
// outcome, as after a kill.

const (
	// downOutInterval is a stopping node's window (server
	// --down-out-interval, 10 min by default; shorter here, so that
	// seeds also see a window end while the node is away).
	downOutInterval = 20 * time.Second
	// nbdDrainTimeout is server.Run's: how long a stopping node waits for
	// the requests in flight.
	nbdDrainTimeout = 5 * time.Second
)

// drain is a process's NBD server as a clean stop sees it: the requests
// in flight, and whether it still takes new ones.
type drain struct {
	mu       sync.Mutex
	stopping bool
	inflight int
	idle     chan struct{} // closed when inflight drops to 0 while stopping
	exports  []*drainedExport
}

// begin admits a request; false once the node is stopping.
func (d *drain) begin() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.stopping {
		return false
	}
	d.inflight++
	return true
}

func (d *drain) end() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.inflight--
	if d.stopping && d.inflight == 0 && d.idle != nil {
		close(d.idle)
		d.idle = nil
	}
}

// stop refuses new requests and returns what is closed once those in
// flight are answered, and the exports opened through the node.
func (d *drain) stop() (<-chan struct{}, []*drainedExport) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.stopping = true
	idle := make(chan struct{})
	if d.inflight == 0 {
		close(idle)
	} else {
		d.idle = idle
	}
	return idle, d.exports
}

// errStopping is what a request sent to a stopping node gets: its
// connection ends.
var errStopping = fmt.Errorf("the node is stopping: %w", nbd.ErrShutdown)

// drainedExport is an export opened through a process: its requests are
// counted, and refused once the process stops.
type drainedExport struct {
	nbd.Export
	d     *drain
	wrote atomic.Bool
}

func (e *drainedExport) ReadAt(ctx context.Context, p []byte, off uint64) error {
	if !e.d.begin() {
		return errStopping
	}
	defer e.d.end()
	return e.Export.ReadAt(ctx, p, off)
}

func (e *drainedExport) WriteAt(ctx context.Context, p []byte, off uint64, fua bool) error {
	if !e.d.begin() {
		return errStopping
	}
	defer e.d.end()
	e.wrote.Store(true)
	return e.Export.WriteAt(ctx, p, off, fua)
}

func (e *drainedExport) Flush(ctx context.Context) error {
	if !e.d.begin() {
		return errStopping
	}
	defer e.d.end()
	return e.Export.Flush(ctx)
}

// openExport opens name through p's NBD adapter, as a client reaches it;
// a stopping process takes no new connection.
func (p *process) openExport(ctx context.Context, name string, session nbd.Session) (nbd.Export, error) {
	p.drain.mu.Lock()
	stopping := p.drain.stopping
	p.drain.mu.Unlock()
	if stopping {
		return nil, errStopping
	}
	e, err := nbdexport.Backend{Gateway: p.gateway}.Open(ctx, name, session)
	if err != nil {
		return nil, err
	}
	d := &drainedExport{Export: e, d: &p.drain}
	p.drain.mu.Lock()
	p.drain.exports = append(p.drain.exports, d)
	p.drain.mu.Unlock()
	return d, nil
}

// stop stops n's process cleanly (see above).
func (w *World) stop(n *node) {
	w.mu.Lock()
	p := n.proc
	reachable := n.reachable
	n.stopping = true
	w.mu.Unlock()
	started := time.Now()
	if reachable {
		ctx, cancel := context.WithTimeout(p.ctx, 2*time.Second)
		now := time.Now()
		if err := p.member.StopWindow(ctx, now, now.Add(downOutInterval)); err != nil {
			w.note("stop: %s could not open its down-out window: %v", n.id, err)
		}
		cancel()
	}
	windowed := time.Now()
	idle, exports := p.drain.stop()
	select {
	case <-idle:
		w.note("stop: %s opened its window in %v, answered its requests in flight in %v, flushes and ends", p.incarnation, windowed.Sub(started).Round(time.Millisecond), time.Since(windowed).Round(time.Millisecond))
	case <-time.After(nbdDrainTimeout):
		w.note("stop: requests through %s still in flight after %v are cut", p.incarnation, nbdDrainTimeout)
	}
	for _, e := range exports {
		if !e.wrote.Load() {
			continue
		}
		ctx, cancel := context.WithTimeout(p.ctx, nbdDrainTimeout)
		err := e.Export.Flush(ctx)
		cancel()
		if err != nil && !errors.Is(err, context.Canceled) {
			w.note("stop: flushing an export through %s: %v", p.incarnation, err)
		}
	}
	w.kill(n)
	w.mu.Lock()
	n.stopping = false
	w.mu.Unlock()
	if reachable {
		epoch, err := w.log.NodeLeave(n.id, "stopped cleanly")
		w.note("log: %s stopped cleanly and left: epoch %d %v", n.id, epoch, errText(err))
	}
}
