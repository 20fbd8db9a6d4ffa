package gateway

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/exportname"
	"github.com/herd-storage/herd/internal/objmap"
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
	self := "this vdi"
	if len(chain) > 0 {
		if v, ok := byID[chain[0]]; ok {
			self = v.FullName()
		}
	}
	var tags []string
	for depth := 2; depth <= len(chain); depth++ {
		v, ok := byID[chain[depth-1]]
		if !ok || !v.Snapshot || v.Deleted {
			continue // a deleted snapshot kept for its descendants is no longer a name to compare with
		}
		if v.Tag == name || v.FullName() == name {
			return v, depth, nil
		}
		tags = append(tags, v.FullName())
	}
	if len(tags) == 0 {
		return cluster.VDI{}, 0, fmt.Errorf("snapshot %q %w: %s has no snapshot before it", name, cluster.ErrNotFound, self)
	}
	return cluster.VDI{}, 0, fmt.Errorf("snapshot %q %w among the ancestors of %s (%s)", name, cluster.ErrNotFound, self, strings.Join(tags, ", "))
}

// layers is what the gateway knows of a VDI's chain beyond reading it:
// each object's layer (Layers, Disk.Layers), what changed since an
// ancestor snapshot (Diff), and the merge and flatten jobs that shorten
// chains (merge.go). It reads and changes object maps through path.
type layers struct {
	cluster interface {
		ID() string
		Tree() []cluster.VDI
		Chain(id uint32) []uint32
		LookupVDI(ctx context.Context, name string) (cluster.VDI, error)
	}
	logger *slog.Logger
	path   layerPath
	// writer fences a merge's changes to a VDI open for writing
	// (writerLock.withFence).
	writer interface {
		withFence(ctx context.Context, state *vdiState) context.Context
	}

	// merges and mergeStats: the merge and flatten jobs under way here
	// (merge.go).
	merges     mergeState
	mergeStats MergeStats
}

// layerPath is what layers and merges need of the data path.
type layerPath interface {
	// Map reads a VDI's whole object map.
	Map(ctx context.Context, v cluster.VDI) ([]uint32, error)
	// entry and setEntry read and change one map entry through an open
	// state's cache.
	entry(ctx context.Context, state *vdiState, vdi cluster.VDI, id, index uint32, refresh bool) (uint32, error)
	setEntry(ctx context.Context, state *vdiState, vdi cluster.VDI, id, index, value uint32, sync bool) error
	// copyObject copies an owner's object whole into vdi's own.
	copyObject(ctx context.Context, vdi cluster.VDI, owner, index uint32, fua bool, change func(data []byte)) error
	// Open opens a VDI for writing (a merge's own open).
	Open(ctx context.Context, name string) (*Disk, error)
	// openStates returns the VDIs open here.
	openStates() []*vdiState
}

// Layers reads the maps of v's chain (from the replicas, not a cache) and
// returns every object's Layer, down to depth limit (0: the whole chain;
// objects defined only deeper have depth 0 then).
func (g *Gateway) Layers(ctx context.Context, v cluster.VDI, limit int) ([]Layer, error) {
	return g.layers.of(ctx, v, limit)
}

// of is Gateway.Layers.
func (ls *layers) of(ctx context.Context, v cluster.VDI, limit int) ([]Layer, error) {
	objects := (v.Size + v.ObjectSize - 1) / v.ObjectSize
	layers := make([]Layer, objects)
	chain := ls.cluster.Chain(v.ID)
	if limit > 0 && limit < len(chain) {
		chain = chain[:limit]
	}
	undefined := int(objects)
	for i, id := range chain {
		member := v
		member.ID = id
		entries, err := ls.path.Map(ctx, member)
		if err != nil {
			return nil, fmt.Errorf("reading the object map of vdi %d (depth %d of %s): %w", id, i+1, v.FullName(), err)
		}
		for index, e := range entries {
			if index >= len(layers) || e == 0 || layers[index].Depth != 0 {
				continue
			}
			layers[index] = Layer{Depth: i + 1, Zero: e == objmap.Tombstone}
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
		if err := d.gateway.writer.ensureWriter(ctx, d.state, d.takeoverCheck); err != nil {
			return nil, err
		}
	}
	vdi, chain := d.state.current()
	refresh := d.readOnly && !vdi.Snapshot
	extents := make([]LayerExtent, 0, min(pieces.count(), 64))
	for i := range pieces.count() {
		pc := pieces.piece(i)
		layer, err := d.gateway.layers.layer(ctx, d.state, vdi, chain, pc.index, refresh)
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
	vdi, err := g.cluster.LookupVDI(ctx, exportname.Parse(name).Full())
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %v", ErrUnknownVDI, err)
	}
	return g.cluster.Tree(), g.cluster.Chain(vdi.ID), nil
}

// layer is resolve's walk, reporting where it stopped.
func (ls *layers) layer(ctx context.Context, state *vdiState, vdi cluster.VDI, chain []uint32, index uint32, refresh bool) (Layer, error) {
	for depth, id := range chain {
		e, err := ls.path.entry(ctx, state, vdi, id, index, refresh && depth == 0)
		if err != nil {
			return Layer{}, err
		}
		if e != 0 {
			return Layer{Depth: depth + 1, Zero: e == objmap.Tombstone}, nil
		}
	}
	return Layer{}, nil
}

// Diff is what changed in a VDI (or snapshot) since an ancestor snapshot,
// at object granularity: `herd vdi diff` and `vdi export --since`.
type Diff struct {
	VDI        string `json:"vdi"`   // NAME or NAME@TAG
	Since      string `json:"since"` // NAME@TAG of the ancestor
	Size       uint64 `json:"size"`  // of VDI now
	SinceSize  uint64 `json:"since_size"`
	ObjectSize uint64 `json:"object_size"`
	// Extents are the changed runs, in order; Zero runs read as zeros
	// now (trimmed or zeroed after Since), the others hold data.
	Extents      []DiffExtent `json:"extents"`
	ChangedBytes uint64       `json:"changed_bytes"`
	ZeroBytes    uint64       `json:"zero_bytes"` // of ChangedBytes
}

// DiffExtent is one changed run.
type DiffExtent struct {
	Offset uint64 `json:"offset"`
	Length uint64 `json:"length"`
	Zero   bool   `json:"zero,omitempty"`
}

// Diff compares the VDI or snapshot name with its ancestor snapshot since
// ("TAG" or "NAME@TAG", see Ancestor) through the object maps: no data is
// read.
func (g *Gateway) Diff(ctx context.Context, name, since string) (Diff, error) {
	return g.layers.diff(ctx, name, since)
}

// diff is Gateway.Diff.
func (ls *layers) diff(ctx context.Context, name, since string) (Diff, error) {
	v, err := ls.cluster.LookupVDI(ctx, name)
	if err != nil {
		return Diff{}, err
	}
	tree := ls.cluster.Tree()
	s, depth, err := Ancestor(tree, ls.cluster.Chain(v.ID), since)
	if err != nil {
		return Diff{}, err
	}
	// Only the members above the ancestor: every object they define
	// changed since it.
	layers, err := ls.of(ctx, v, depth-1)
	if err != nil {
		return Diff{}, err
	}
	d := Diff{VDI: v.FullName(), Since: s.FullName(), Size: v.Size, SinceSize: s.Size, ObjectSize: v.ObjectSize, Extents: []DiffExtent{}}
	for index, l := range layers {
		if l.Depth == 0 {
			continue
		}
		offset := uint64(index) * v.ObjectSize
		length := min(v.ObjectSize, v.Size-offset)
		d.ChangedBytes += length
		if l.Zero {
			d.ZeroBytes += length
		}
		if n := len(d.Extents); n > 0 && d.Extents[n-1].Zero == l.Zero && d.Extents[n-1].Offset+d.Extents[n-1].Length == offset {
			d.Extents[n-1].Length += length
			continue
		}
		d.Extents = append(d.Extents, DiffExtent{Offset: offset, Length: length, Zero: l.Zero})
	}
	return d, nil
}
