package gateway

import (
	"context"
	"fmt"
	"strings"

	"github.com/herd-storage/herd/internal/cluster"
)

// Layers: which member of a VDI's snapshot chain defines each object.
//
// A VDI reads object i from the first member of its chain (itself, its
// parent snapshot, that one's parent...) whose own map has an entry for i;
// an object no member defines reads as zeros. The member's depth (1: the
// VDI itself, 2: its parent, ...; 0: none) answers, without reading data:
//
//   - what changed since an ancestor snapshot S at depth k: the objects
//     defined at a depth below k (written, or zeroed with a tombstone,
//     after S was taken): `herd vdi diff`, `vdi export --since`, backups and
//     the NBD context qemu:dirty-bitmap:S;
//   - QEMU's qemu:allocation-depth: the depth itself.
//
// The granularity is the object: a write of one byte after S marks its
// whole object changed (copy-on-write copies it whole).

// Layer describes one object: the depth of the chain member that defines
// it (0: none, it reads as zeros) and whether that member's entry is a
// tombstone (it was zeroed there: zeros, not inherited data).
type Layer struct {
	Depth int
	Zero  bool
}

// Owned reports whether the object is defined at a depth above limit:
// written or zeroed after the ancestor at depth limit was taken.
func (l Layer) Owned(limit int) bool { return l.Depth > 0 && l.Depth < limit }

// LayerExtent is a run of the disk whose objects have the same Layer.
type LayerExtent struct {
	Length uint64
	Layer
}

// Ancestor finds the snapshot of v's chain that name designates, and its
// depth (2 for v's parent, ...): "TAG" is the nearest ancestor snapshot
// with that tag, "NAME@TAG" that exact snapshot. A snapshot not in the
// chain is an error naming what the chain holds.
func Ancestor(tree []cluster.VDI, chain []uint32, name string) (cluster.VDI, int, error) {
	byID := make(map[uint32]cluster.VDI, len(tree))
	for _, v := range tree {
		byID[v.ID] = v
	}
	var tags []string
	for depth := 2; depth <= len(chain); depth++ {
		v, ok := byID[chain[depth-1]]
		if !ok || !v.Snapshot {
			continue
		}
		if v.Tag == name || v.FullName() == name {
			return v, depth, nil
		}
		tags = append(tags, v.FullName())
	}
	if len(tags) == 0 {
		return cluster.VDI{}, 0, fmt.Errorf("%w: snapshot %q: this vdi has no snapshot before it (take one with herd vdi snapshot)", ErrUnknownVDI, name)
	}
	return cluster.VDI{}, 0, fmt.Errorf("%w: snapshot %q is not an ancestor of this vdi (its ancestors: %v)", ErrUnknownVDI, name, tags)
}

// Layers reads the maps of v's chain (from the replicas, not a cache) and
// returns every object's Layer, down to depth limit (0: the whole chain;
// objects defined only deeper have depth 0 then).
func (g *Gateway) Layers(ctx context.Context, v cluster.VDI, limit int) ([]Layer, error) {
	objects := (v.Size + v.ObjectSize - 1) / v.ObjectSize
	layers := make([]Layer, objects)
	chain := g.cluster.Chain(v.ID)
	if limit > 0 && limit < len(chain) {
		chain = chain[:limit]
	}
	undefined := int(objects)
	for i, id := range chain {
		member := v
		member.ID = id
		entries, err := g.Map(ctx, member)
		if err != nil {
			return nil, fmt.Errorf("reading the object map of vdi %d (depth %d of %s): %w", id, i+1, v.FullName(), err)
		}
		for index, e := range entries {
			if index >= len(layers) || e == 0 || layers[index].Depth != 0 {
				continue
			}
			layers[index] = Layer{Depth: i + 1, Zero: e == Tombstone}
			undefined--
		}
		if undefined == 0 {
			break
		}
	}
	return layers, nil
}

// Layers describes [offset, offset+length) of the open disk as runs of
// objects with the same Layer, through the open's map cache (see Extents).
func (d *Disk) Layers(ctx context.Context, offset, length uint64) ([]LayerExtent, error) {
	pieces, err := d.pieces(offset, length)
	if err != nil {
		return nil, err
	}
	if !d.readOnly {
		d.state.io.RLock()
		defer d.state.io.RUnlock()
		if err := d.gateway.ensureWriter(ctx, d.state); err != nil {
			return nil, err
		}
	}
	vdi, chain := d.state.current()
	refresh := d.readOnly && !vdi.Snapshot
	extents := make([]LayerExtent, 0, min(pieces.count(), 64))
	for i := range pieces.count() {
		pc := pieces.piece(i)
		layer, err := d.gateway.layer(ctx, d.state, vdi, chain, pc.index, refresh)
		if err != nil {
			return nil, err
		}
		if n := len(extents); n > 0 && extents[n-1].Layer == layer {
			extents[n-1].Length += pc.length
			continue
		}
		extents = append(extents, LayerExtent{Length: pc.length, Layer: layer})
	}
	return extents, nil
}

// Ancestor finds a snapshot of the open disk's chain (see the function).
func (d *Disk) Ancestor(name string) (cluster.VDI, int, error) {
	_, chain := d.state.current()
	return Ancestor(d.gateway.cluster.Tree(), chain, name)
}

// Chain returns the chain (ids, nearest first: the VDI itself, its
// parent...) of the VDI that an export name opens (NAME, ro/NAME or
// NAME@TAG) and the tree to resolve it in with Ancestor, from this node's
// copy of the log: nothing is opened, locked or read. For what an NBD
// client may select before it opens the export (qemu:dirty-bitmap:TAG).
func (g *Gateway) Chain(ctx context.Context, name string) (tree []cluster.VDI, chain []uint32, err error) {
	vdi, err := g.cluster.LookupVDI(ctx, strings.TrimPrefix(name, ReadOnlyPrefix))
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %v", ErrUnknownVDI, err)
	}
	return g.cluster.Tree(), g.cluster.Chain(vdi.ID), nil
}

// layer is resolve's walk, reporting where it stopped.
func (g *Gateway) layer(ctx context.Context, state *vdiState, vdi cluster.VDI, chain []uint32, index uint32, refresh bool) (Layer, error) {
	for depth, id := range chain {
		e, err := g.entry(ctx, state, vdi, id, index, refresh && depth == 0)
		if err != nil {
			return Layer{}, err
		}
		if e != 0 {
			return Layer{Depth: depth + 1, Zero: e == Tombstone}, nil
		}
	}
	return Layer{}, nil
}
