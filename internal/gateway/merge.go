package gateway

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/object"
	"github.com/herd-storage/herd/internal/objmap"
)

// Merging deleted layers and flattening (cluster/merge.go).
//
// A job copies into a child C every object C reads through its sources
// (a deleted layer D, or for a flatten every ancestor) and does not own:
// under the object's allocation lock of the open of C that serves the
// guest, exactly as a copy-on-write first write does (copyObject, then
// the map entry), so a guest's first write to the object and the merge's
// copy are serialised and each sees the other's result: the copy is
// skipped once C owns the object, and a guest write after the copy
// writes C's own object. A tombstone of D becomes a tombstone of C. The
// copies are written with FUA: when the job commits, the chain may lose
// D at once. Then the log shortens the chain (merged/flattened) and D
// goes to the garbage list.
//
// Who runs a job: the node holding C's writer lock, through its open
// (the guest's); with no holder, the leader, which opens C for writing
// itself (a guest opening C meanwhile takes the lock over by the usual
// handover, and the job stops here to continue there). A snapshot child
// is never written, so the leader copies into it without a lock. A job
// is restartable at any point: it skips what C already owns.

// MergeLog is what the merge runner needs from the cluster log.
type MergeLog interface {
	IsLeader() bool
	// Level is the cluster's feature level: below
	// cluster.FeatureLayerMerge's, no job is started (the log would
	// refuse its merged or flattened entry, and the copies would be
	// wasted).
	Level() int
	LayerJobs() []cluster.LayerJob
	LayerMerged(ctx context.Context, layer, child, parent uint32) error
	LayerFlattened(ctx context.Context, child, parent uint32) error
}

// errHandedOver stops a job whose writer lock went to another node.
var errHandedOver = errors.New("the vdi's writer lock moved to another node: the job continues there")

// MergeRate paces merge copies, in bytes per second (0: unlimited);
// settable at run time.
type MergeRate struct{ bytes atomic.Int64 }

// NewMergeRate returns a rate of bytesPerSecond (0: unlimited).
func NewMergeRate(bytesPerSecond int64) *MergeRate {
	r := &MergeRate{}
	r.bytes.Store(bytesPerSecond)
	return r
}

// Set changes the rate.
func (r *MergeRate) Set(bytesPerSecond int64) { r.bytes.Store(bytesPerSecond) }

// Get returns the rate.
func (r *MergeRate) Get() int64 { return r.bytes.Load() }

// MergeStats counts the merge work done by this node (metrics).
type MergeStats struct {
	Copied   atomic.Uint64 // objects copied into a child
	Merged   atomic.Uint64 // layers merged away
	Flattens atomic.Uint64 // VDIs flattened
	Running  atomic.Int64  // jobs under way
}

// MergeProgress is one job under way on this node.
type MergeProgress struct {
	Child   uint32 `json:"child"`
	Layer   uint32 `json:"layer,omitempty"`
	Flatten bool   `json:"flatten,omitempty"`
	Done    uint64 `json:"done"`  // objects looked at
	Total   uint64 `json:"total"` // objects of the child
}

type mergeState struct {
	mu       sync.Mutex
	progress map[uint32]*MergeProgress
}

// MergeProgress returns the jobs under way on this node.
func (g *Gateway) MergeProgress() []MergeProgress {
	ls := g.layers
	ls.merges.mu.Lock()
	defer ls.merges.mu.Unlock()
	var out []MergeProgress
	for _, p := range ls.merges.progress {
		out = append(out, *p)
	}
	return out
}

// Merges returns this node's merge counters.
func (g *Gateway) Merges() *MergeStats { return &g.layers.mergeStats }

// RunMerges runs, until ctx ends, the merge and flatten jobs this node
// owns (see above), one at a time, rate paced; none while the cluster's
// level is below cluster.FeatureLayerMerge's.
func (g *Gateway) RunMerges(ctx context.Context, log MergeLog, rate *MergeRate) {
	g.layers.runMerges(ctx, log, rate)
}

// runMerges is Gateway.RunMerges.
func (ls *layers) runMerges(ctx context.Context, log MergeLog, rate *MergeRate) {
	ticker := time.NewTicker(time.Second)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		ls.refreshChains()
		if log.Level() < cluster.FeatureLayerMerge.Level {
			// A cluster upgraded from before merges and not yet
			// finalized: a deleted snapshot stays in its child's chain
			// until the finalize.
			continue
		}
		for _, job := range log.LayerJobs() {
			mine := job.Holder == ls.cluster.ID() || (job.Holder == "" && log.IsLeader())
			if !mine {
				continue
			}
			if job.Holder == "" && !job.Child.Snapshot && job.Child.Exclusive {
				// The leader's own open would hold an exclusive VDI's
				// writer lock and refuse the VM that opens it meanwhile
				// (an exclusive VDI is never handed over): its merge
				// waits until a writer opens it, and runs there.
				continue
			}
			if err := ls.runJob(ctx, job, log, rate); err != nil {
				if ctx.Err() == nil && !errors.Is(err, errHandedOver) {
					ls.logger.Warn("merge of a vdi layer failed; will retry", "child", job.Child.FullName(), "layer", job.Layer, "flatten", job.Flatten, "err", err)
				}
				continue
			}
			ls.refreshChains()
		}
	}
}

// refreshChains gives every open VDI its chain as the log has it now (a
// merge or flatten shortened it).
func (ls *layers) refreshChains() {
	for _, s := range ls.path.openStates() {
		ls.refreshChain(s)
	}
}

// openStates returns the VDIs open here.
func (g *Gateway) openStates() []*vdiState {
	g.mu.Lock()
	defer g.mu.Unlock()
	states := make([]*vdiState, 0, len(g.open))
	for _, s := range g.open {
		states = append(states, s)
	}
	return states
}

// refreshChain gives one open VDI its chain as the log has it now, and
// forgets its cached map pages if the chain changed.
func (ls *layers) refreshChain(s *vdiState) {
	s.mu.Lock()
	id := s.vdi.ID
	s.mu.Unlock()
	chain := ls.cluster.Chain(id)
	if len(chain) == 0 {
		return
	}
	s.mu.Lock()
	if s.vdi.ID == id && !equalChain(s.chain, chain) {
		s.chain = chain
		s.dropPagesLocked()
	}
	s.mu.Unlock()
}

func equalChain(a, b []uint32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// RunLayerJob copies what job's child reads through its sources into it,
// then records the merge or flatten in the log.
func (g *Gateway) RunLayerJob(ctx context.Context, job cluster.LayerJob, log MergeLog, rate *MergeRate) error {
	return g.layers.runJob(ctx, job, log, rate)
}

// runJob is Gateway.RunLayerJob.
func (ls *layers) runJob(ctx context.Context, job cluster.LayerJob, log MergeLog, rate *MergeRate) error {
	child := job.Child
	state, done, err := ls.jobState(ctx, child)
	if err != nil {
		return err
	}
	defer done()
	objects := (child.Size + child.ObjectSize - 1) / child.ObjectSize
	progress := &MergeProgress{Child: child.ID, Layer: job.Layer, Flatten: job.Flatten, Total: objects}
	ls.merges.mu.Lock()
	if ls.merges.progress == nil {
		ls.merges.progress = map[uint32]*MergeProgress{}
	}
	ls.merges.progress[child.ID] = progress
	ls.merges.mu.Unlock()
	ls.mergeStats.Running.Add(1)
	defer func() {
		ls.mergeStats.Running.Add(-1)
		ls.merges.mu.Lock()
		delete(ls.merges.progress, child.ID)
		ls.merges.mu.Unlock()
	}()
	started := time.Now()
	var copiedBytes int64
	for index := uint64(0); index < objects; index++ {
		copied, err := ls.mergeObject(ctx, state, job, uint32(index))
		if err != nil {
			return fmt.Errorf("object %d of %s: %w", index, child.FullName(), err)
		}
		ls.merges.mu.Lock()
		progress.Done = index + 1
		ls.merges.mu.Unlock()
		if !copied {
			continue
		}
		ls.mergeStats.Copied.Add(1)
		copiedBytes += int64(child.ObjectSize)
		if r := rate.Get(); r > 0 {
			due := started.Add(time.Duration(float64(copiedBytes) / float64(r) * float64(time.Second)))
			if wait := time.Until(due); wait > 0 {
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(wait):
				}
			}
		}
	}
	if job.Flatten {
		if err := log.LayerFlattened(ctx, child.ID, child.Parent); err != nil {
			return err
		}
		ls.mergeStats.Flattens.Add(1)
		ls.logger.Info("flattened a vdi", "vdi", child.FullName(), "parent", child.Parent, "took", time.Since(started).Round(time.Millisecond))
		return nil
	}
	if err := log.LayerMerged(ctx, job.Layer, child.ID, job.LayerParent); err != nil {
		return err
	}
	ls.mergeStats.Merged.Add(1)
	ls.logger.Info("merged a deleted snapshot into its child", "layer", job.Layer, "child", child.FullName(), "took", time.Since(started).Round(time.Millisecond))
	return nil
}

// jobState returns the open state the job copies through, and what to
// call when done: the guest's open when this node holds the writer lock,
// otherwise an open of the job's own.
func (ls *layers) jobState(ctx context.Context, child cluster.VDI) (*vdiState, func(), error) {
	if child.Snapshot {
		// Never written: a state of its own, for its caches and locks.
		state := &vdiState{key: child.FullName(), vdi: child, chain: ls.cluster.Chain(child.ID), pages: map[uint64][]uint32{}, disks: map[*Disk]struct{}{}}
		return state, func() {}, nil
	}
	disk, err := ls.path.Open(ctx, child.Name)
	if err != nil {
		return nil, nil, err
	}
	return disk.state, func() { disk.Close() }, nil
}

// mergeObject copies object index into the job's child if the child
// reads it through the job's sources and does not own it; reports
// whether it copied data.
func (ls *layers) mergeObject(ctx context.Context, state *vdiState, job cluster.LayerJob, index uint32) (bool, error) {
	child := job.Child
	if !child.Snapshot {
		state.io.RLock()
		defer state.io.RUnlock()
		state.mu.Lock()
		held, fenced := state.lockHeld, state.fenced
		state.mu.Unlock()
		if fenced != nil {
			return false, fenced
		}
		if !held {
			return false, errHandedOver
		}
		ctx = ls.writer.withFence(ctx, state)
	}
	lock := &state.allocation[index%uint32(len(state.allocation))]
	lock.Lock()
	defer lock.Unlock()
	own, err := ls.path.entry(ctx, state, child, child.ID, index, false)
	if err != nil || own != 0 {
		return false, err
	}
	for _, from := range job.Sources {
		e, err := ls.path.entry(ctx, state, child, from, index, false)
		if err != nil {
			return false, err
		}
		switch e {
		case 0:
			continue
		case objmap.Tombstone:
			if job.Flatten {
				return false, nil // without a parent, no entry reads as zeros
			}
			return false, ls.path.setEntry(ctx, state, child, child.ID, index, objmap.Tombstone, true)
		}
		// The copy-on-write path: the owner's object copied whole into
		// the child's own, durable, then the entry.
		if err := ls.path.copyObject(ctx, child, e, index, true, func([]byte) {}); err != nil {
			return false, err
		}
		return true, ls.path.setEntry(ctx, state, child, child.ID, index, child.ID, true)
	}
	return false, nil
}

// isGone reports a read of an ancestor's object that a merge or flatten
// freed after this open resolved it.
func isGone(err error) bool {
	return errors.Is(err, object.ErrNoObject) || errors.Is(err, object.ErrNotFound)
}
