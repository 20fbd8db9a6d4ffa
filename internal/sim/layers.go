package sim

import (
	"context"
	"encoding/binary"
	"fmt"
	"time"

	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/gateway"
	"github.com/herd-storage/herd/internal/object"
)

// The VDI tree in the simulator (Config.Layers): snapshots of the
// clients' VDIs taken through the node holding the writer lock, as the
// admin API forwards them, deletes of those snapshots, which the
// gateway's merge runner merges into their only child, and flattens.
// The runner is the production one (gateway.RunMerges) on the node's
// member of the log; the leader, which runs the jobs nobody holds a lock
// for, is the lowest running node connected to the majority. The
// garbage collector does not run: a merged layer's objects stay on the
// garbage list, where recovery keeps their copies like any other (the
// final convergence check covers them).

// layerLog is what the merge runner needs of the cluster: the member's
// log, and whether its node leads.
type layerLog struct {
	*cluster.LocalMember
	w *World
	p *process
}

// Level is the log's feature level (the simulator finalizes to the
// merges' level at the start when it runs layers).
func (l layerLog) Level() int { return l.w.log.Level() }

// IsLeader: p is the current process of the lowest node that runs, is
// not paused and reaches the majority.
func (l layerLog) IsLeader() bool {
	l.w.mu.Lock()
	defer l.w.mu.Unlock()
	for _, n := range l.w.nodes {
		if n.killed || n.paused || !l.w.connectedLocked(n) {
			continue
		}
		return n.proc == l.p && !l.p.dead
	}
	return false
}

// startLayerRunners starts p's merge runner.
func (w *World) startLayerRunners(p *process) {
	w.mu.Lock()
	w.layerProcs = append(w.layerProcs, p)
	w.mu.Unlock()
	log := layerLog{LocalMember: p.member, w: w, p: p}
	rate := &gateway.MergeRate{}
	rate.Set(int64(8 * w.cfg.ObjectSize))
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		p.gateway.RunMerges(p.ctx, log, rate)
	}()
}

// applyLayer carries out a Snapshot, DeleteSnapshot or Flatten event.
// The operator's command may fail under the faults (no process to take
// the snapshot, the log unreachable): the step log says so, and the
// schedule goes on.
func (w *World) applyLayer(e Event) error {
	if !w.cfg.Layers {
		return fmt.Errorf("%s needs Config.Layers", e.Kind)
	}
	c := w.clients[e.Client]
	switch e.Kind {
	case Snapshot:
		// Through the node holding the writer lock: the client's own
		// when it has one open, else any running node (the lock's
		// holder, if another, is then told by the log's refusal).
		c.mu.Lock()
		p := c.proc
		c.mu.Unlock()
		w.mu.Lock()
		if p == nil || p.dead {
			p = nil
			for _, n := range w.nodes {
				if !n.killed {
					p = n.proc
					break
				}
			}
		}
		w.mu.Unlock()
		tag := fmt.Sprintf("s%d", len(c.tags)+c.deleted+1)
		ctx, cancel := context.WithTimeout(p.ctx, 30*time.Second)
		result, err := p.gateway.Snapshot(ctx, c.vdi, tag)
		cancel()
		if err != nil {
			w.note("snapshot %s@%s through %s failed: %v", c.vdi, tag, p.incarnation, err)
			return nil
		}
		c.tags = append(c.tags, tag)
		c.vdiID = result.VDI.ID
		w.note("snapshot %s@%s (vdi %d) through %s; %s is vdi %d", c.vdi, tag, result.Snapshot.ID, p.incarnation, c.vdi, c.vdiID)
	case DeleteSnapshot:
		if len(c.tags) == 0 {
			w.note("no snapshot of %s to delete", c.vdi)
			return nil
		}
		name := c.vdi + "@" + c.tags[0]
		if err := w.log.DeleteVDI(name); err != nil {
			w.note("delete %s failed: %v", name, err)
			return nil
		}
		c.tags, c.deleted = c.tags[1:], c.deleted+1
		w.note("deleted %s: chain %v", name, w.log.Chain(c.vdiID))
	case Flatten:
		if _, err := w.log.FlattenVDI(c.vdi); err != nil {
			w.note("flatten %s failed: %v", c.vdi, err)
			return nil
		}
		w.note("flatten %s asked for: chain %v", c.vdi, w.log.Chain(c.vdiID))
	}
	return nil
}

// chainOf is the chain of c's VDI as the log has it, c's VDI first.
func (w *World) chainOf(c *client) []uint32 {
	if !w.cfg.Layers {
		return []uint32{c.vdiID}
	}
	chain := w.log.Chain(c.vdiID)
	if len(chain) == 0 {
		return []uint32{c.vdiID}
	}
	return chain
}

// ownerOf is the member of chain whose object index a read of c's VDI
// finds: the first whose map has an entry for it (on some node's copy;
// an entry of a member is its own id); 0 if none.
func (w *World) ownerOf(chain []uint32, index uint32) uint32 {
	entry := make([]byte, 4)
	perMap := w.cfg.ObjectSize / 4
	for _, id := range chain {
		mapOID := object.MapOID(object.VDIID(id), uint32(uint64(index)/perMap))
		for _, n := range w.nodes {
			if _, err := n.proc.store.Read(mapOID, entry, uint32(uint64(index)%perMap*4)); err == nil && binary.BigEndian.Uint32(entry) == id {
				return id
			}
		}
	}
	return 0
}

// layerResult fills in what the merge runners did and where the
// clients' chains ended.
func (w *World) layerResult(r *Result) {
	if !w.cfg.Layers {
		return
	}
	w.mu.Lock()
	procs := append([]*process(nil), w.layerProcs...)
	w.mu.Unlock()
	for _, p := range procs {
		stats := p.gateway.Merges()
		r.Merged += int(stats.Merged.Load())
		r.Flattened += int(stats.Flattens.Load())
		r.Copied += int(stats.Copied.Load())
	}
	for _, c := range w.clients {
		r.Chains = append(r.Chains, w.chainOf(c))
	}
	r.LayerJobs = len(w.log.LayerJobs())
}
