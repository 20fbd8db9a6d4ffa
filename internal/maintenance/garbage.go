package maintenance

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/object"
	"github.com/herd-storage/herd/internal/objmap"
)

// CollectGarbage frees the objects of VDIs nothing reads any more, then
// records that in the log: the data objects its map says it owns, the
// chunks of those that are erasure-coded (found by listing every node:
// removeChunks), then its map objects. Called periodically on the
// leader; safe to repeat after a crash (removing an absent object is not
// an error).
func (m *Maintenance) CollectGarbage(ctx context.Context, data Data, garbage cluster.Garbage) error {
	objects := (garbage.Size + garbage.ObjectSize - 1) / garbage.ObjectSize
	perMap := objmap.PerObject(garbage.ObjectSize)
	vdi := cluster.VDI{ID: garbage.ID, Size: garbage.Size, ObjectSize: garbage.ObjectSize, Copies: garbage.Copies, EC: garbage.EC}
	work := make(chan object.OID)
	errs := make(chan error, 16)
	var wg sync.WaitGroup
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for oid := range work {
				if err := data.RemoveObject(ctx, oid, vdi.Copies); err != nil {
					select {
					case errs <- err:
					default:
					}
				}
			}
		}()
	}
	var failed error
	for k := uint64(0); k*perMap < objects && failed == nil; k++ {
		count := min(perMap, objects-k*perMap)
		raw := make([]byte, count*objmap.EntryBytes)
		err := data.ReadObject(ctx, object.MapOID(object.VDIID(vdi.ID), uint32(k)), vdi.Copies, raw, 0)
		if errors.Is(err, object.ErrNoObject) {
			continue
		}
		if err != nil {
			failed = err
			break
		}
		for i := uint64(0); i < count; i++ {
			if objmap.Entry(raw, int(i)) == vdi.ID {
				work <- object.DataOID(object.VDIID(vdi.ID), uint32(k*perMap+i))
			}
		}
	}
	close(work)
	wg.Wait()
	select {
	case err := <-errs:
		failed = errors.Join(failed, err)
	default:
	}
	if failed != nil {
		return failed
	}
	// Before the map objects, though the chunks are found without them:
	// a failure here is retried as a whole, like any other.
	if err := m.removeChunks(ctx, vdi.ID); err != nil {
		return err
	}
	for k := uint64(0); k*perMap < objects; k++ {
		if err := data.RemoveObject(ctx, object.MapOID(object.VDIID(vdi.ID), uint32(k)), vdi.Copies); err != nil {
			return err
		}
	}
	return nil
}

// removeChunks removes the chunks of a freed VDI's erasure-coded data
// objects (object.IsChunk) from every node of the current epoch. The
// data objects' removal does not reach them: a chunk has one copy, on the
// node its object's head named when it was written, not where the
// epoch's placement puts its id, and that head is gone (or going) with
// the VDI. So every node's objects are listed, and those that are chunks
// of the VDI's objects (their ids carry its id; ids are never reused)
// removed there. A node that does not answer fails the collection, which
// is retried. A node out of the epoch keeps its chunks, as it keeps its
// copies of the VDI's other objects (orphans of a freed VDI).
func (m *Maintenance) removeChunks(ctx context.Context, id uint32) error {
	rv, err := m.layouts.Current()
	if err != nil {
		return err
	}
	ids := make([]string, 0, len(rv.Nodes))
	for nodeID := range rv.Nodes {
		ids = append(ids, nodeID)
	}
	sort.Strings(ids)
	for _, nodeID := range ids {
		node := rv.Nodes[nodeID]
		listed, err := m.replicas.List(ctx, node, rv.Number)
		if err != nil {
			return fmt.Errorf("listing node %s for the chunks of freed vdi %d: %w", nodeID, id, err)
		}
		for oid := range listed {
			if !object.IsChunk(oid) || uint32(object.VDI(oid)) != id {
				continue
			}
			if err := m.replicas.Remove(ctx, node, rv.Number, oid); err != nil && !errors.Is(err, object.ErrNotFound) {
				return fmt.Errorf("removing chunk %016x of freed vdi %d on node %s: %w", oid, id, nodeID, err)
			}
		}
	}
	return nil
}

// RunGarbageCollector frees, on the leader, the objects of VDIs nothing reads
// any more (deleted VDIs and snapshots, rolled-back VDIs), then records
// each in the log. Any node may become leader and continue the list.
func (m *Maintenance) RunGarbageCollector(ctx context.Context, c GarbageLog, data Data) {
	ticker := time.NewTicker(time.Second)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		if !c.IsLeader() {
			continue
		}
		for _, g := range c.Garbage() {
			work, cancel := context.WithTimeout(ctx, 5*time.Minute)
			err := m.CollectGarbage(work, data, g)
			if err == nil {
				err = c.GarbageDone(work, g.ID)
			}
			cancel()
			if err != nil {
				m.logger.Warn("freeing objects of a deleted vdi failed; will retry", "vdi", g.ID, "err", err)
				break
			}
			m.logger.Info("freed the objects of a deleted vdi", "vdi", g.ID)
		}
	}
}
