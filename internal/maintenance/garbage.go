package maintenance

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/object"
	"github.com/herd-storage/herd/internal/objmap"
)

// CollectGarbage frees the objects of VDIs nothing reads any more, then
// records that in the log. Called periodically on the leader; safe to
// repeat after a crash (removing an absent object is not an error).
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
	for k := uint64(0); k*perMap < objects; k++ {
		if err := data.RemoveObject(ctx, object.MapOID(object.VDIID(vdi.ID), uint32(k)), vdi.Copies); err != nil {
			return err
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
