package gateway

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"time"

	"github.com/herd-storage/herd/internal/cluster"
)

// CheckReport is what `herd vdi check` prints.
type CheckReport struct {
	VDI        string `json:"vdi"`
	Objects    int    `json:"objects"`
	Consistent int    `json:"consistent"`
	Mismatched int    `json:"mismatched"` // replicas with different content
	Missing    int    `json:"missing"`    // replicas without the object
	// Unavailable objects have no provably current copy reachable: the
	// newest may be on nodes that are down (never served old).
	Unavailable int      `json:"unavailable"`
	Repaired    int      `json:"repaired"`
	Problems    []string `json:"problems,omitempty"`
}

// Check compares every replica of every object a VDI owns (its data
// objects and its map objects) byte for byte. With repair, a VDI that
// nobody has open for writing gets every differing or missing replica
// replaced by the copy with the newest epoch stamp (ties: the content
// most replicas agree on).
func (g *Gateway) Check(ctx context.Context, name string, repair bool) (CheckReport, error) {
	report := CheckReport{VDI: name}
	vdi, err := g.cluster.LookupVDI(ctx, name)
	if err != nil {
		return report, err
	}
	if repair && !vdi.Snapshot {
		if holder, held := g.lockHolder(vdi.Name); held {
			return report, fmt.Errorf("%w: vdi %q is open for writing through node %s; repair it once it is closed", cluster.ErrBusy, vdi.Name, holder)
		}
	}
	report, err = g.checkVDI(ctx, vdi, repair)
	if err == nil && repair && vdi.Unclean && report.Unavailable == 0 {
		err = g.cluster.MarkVDIRepaired(ctx, vdi.Name)
	}
	return report, err
}

// checkVDI is Check without the lock test: the caller is the next writer
// of an unclean VDI, holding its lock, or nobody holds it.
func (g *Gateway) checkVDI(ctx context.Context, vdi cluster.VDI, repair bool) (CheckReport, error) {
	report := CheckReport{VDI: vdi.FullName()}
	entries, err := g.loadMap(ctx, vdi)
	if err != nil {
		return report, err
	}
	var oids []uint64
	perMap := vdi.ObjectSize / mapEntryBytes
	for k := uint64(0); k*perMap < uint64(len(entries)); k++ {
		oids = append(oids, MapOID(vdi.ID, uint32(k)))
	}
	for i, e := range entries {
		if e == vdi.ID {
			oids = append(oids, DataOID(vdi.ID, uint32(i)))
		}
	}
	for _, oid := range oids {
		if err := g.checkObject(ctx, oid, vdi, repair, &report); err != nil {
			return report, err
		}
	}
	return report, nil
}

func (g *Gateway) lockHolder(name string) (string, bool) {
	type locker interface {
		Lock(key string) (cluster.Lock, bool)
	}
	if l, ok := g.cluster.(locker); ok {
		if lock, held := l.Lock(cluster.VDILockKey(name)); held {
			return lock.Node, true
		}
	}
	return "", false
}

type replicaCopy struct {
	node   cluster.Node
	stamp  uint64
	data   []byte
	sum    [32]byte
	found  bool
	damage error // the copy cannot be read: bad header, EIO
}

func (g *Gateway) checkObject(ctx context.Context, oid uint64, vdi cluster.VDI, repair bool, report *CheckReport) error {
	rv, err := g.current()
	if err != nil {
		return err
	}
	var copies []replicaCopy
	for _, node := range rv.replicasOf(oid, vdi.Copies) {
		c := replicaCopy{node: node, data: make([]byte, vdi.ObjectSize)}
		c.stamp, err = g.replicas.Fetch(ctx, node, rv.epoch, oid, c.data)
		switch {
		case err == nil:
			c.found, c.sum = true, sha256.Sum256(c.data)
		case errors.Is(err, ErrNotFound):
		case isDamaged(err):
			c.damage = err
		default:
			return fmt.Errorf("object %016x on node %s: %w", oid, node.ID, err)
		}
		copies = append(copies, c)
	}
	var present []replicaCopy
	for _, c := range copies {
		if c.found {
			present = append(present, c)
		}
	}
	if len(present) == 0 {
		if ObjectType(oid) == objectTypeMap {
			return nil // a map object never written: nothing to compare
		}
		report.Objects++
		report.Problems = append(report.Problems, fmt.Sprintf("object %016x: no replica has it", oid))
		report.Missing += len(copies)
		return nil
	}
	report.Objects++
	stamps, answered := g.survey(ctx, rv, oid)
	var newest uint64
	for _, stamp := range stamps {
		newest = max(newest, stamp)
	}
	if err := g.proveCurrent(oid, vdi.Copies, rv.epoch, newest, answered); err != nil {
		report.Unavailable++
		report.Problems = append(report.Problems, err.Error())
		return nil
	}
	// The reference: newest stamp, then the content most replicas share.
	best := present[0]
	votes := map[[32]byte]int{}
	for _, c := range present {
		votes[c.sum]++
	}
	for _, c := range present[1:] {
		if c.stamp > best.stamp || (c.stamp == best.stamp && votes[c.sum] > votes[best.sum]) {
			best = c
		}
	}
	bad := 0
	for _, c := range copies {
		switch {
		case c.damage != nil:
			report.Missing++
			report.Problems = append(report.Problems, fmt.Sprintf("object %016x: damaged on node %s: %v", oid, c.node.ID, c.damage))
		case !c.found:
			report.Missing++
			report.Problems = append(report.Problems, fmt.Sprintf("object %016x: missing on node %s", oid, c.node.ID))
		case !bytes.Equal(c.data, best.data):
			report.Mismatched++
			report.Problems = append(report.Problems, fmt.Sprintf("object %016x: node %s (stamp %d) differs from node %s (stamp %d)", oid, c.node.ID, c.stamp, best.node.ID, best.stamp))
		default:
			continue
		}
		bad++
		if repair {
			// Made current first (restamped, or fetched if missing or
			// damaged), so that the replica admits the write.
			if c.damage != nil {
				if err := g.replicas.Remove(ctx, c.node, rv.epoch, oid); err != nil && !errors.Is(err, ErrNotFound) {
					return fmt.Errorf("removing damaged object %016x on node %s: %w", oid, c.node.ID, err)
				}
			}
			if err := g.replicas.Recover(ctx, c.node, rv.epoch, oid); err != nil {
				return fmt.Errorf("repairing object %016x on node %s: %w", oid, c.node.ID, err)
			}
			if err := g.replicas.Write(ctx, c.node, rv.epoch, oid, best.data, 0, WriteFlags{Create: true, Sync: true}); err != nil {
				return fmt.Errorf("repairing object %016x on node %s: %w", oid, c.node.ID, err)
			}
			report.Repaired++
		}
	}
	if bad == 0 {
		report.Consistent++
	}
	return nil
}

// repairUnclean makes every replica of an unclean VDI identical before
// its new writer serves it: its previous writer's node died, perhaps in
// the middle of writes that reached some replicas only. Old or new data
// wins per object, but the same on every replica.
func (g *Gateway) repairUnclean(ctx context.Context, vdi cluster.VDI) error {
	started := time.Now()
	report, err := g.checkVDI(ctx, vdi, true)
	if err != nil {
		return err
	}
	if report.Unavailable > 0 {
		return fmt.Errorf("%d objects are unavailable (their newest copies may be on nodes that are down)", report.Unavailable)
	}
	if err := g.cluster.MarkVDIRepaired(ctx, vdi.Name); err != nil {
		return err
	}
	g.logger.Info("gateway: repaired vdi whose writer died", "vdi", vdi.Name, "objects", report.Objects, "repaired", report.Repaired, "took", time.Since(started).Round(time.Millisecond))
	return nil
}
