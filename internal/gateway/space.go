package gateway

import (
	"context"
	"encoding/binary"
	"errors"

	"github.com/herd-storage/herd/internal/cluster"
)

// Space is a VDI's space accounting, in bytes (whole objects).
type Space struct {
	// AllocatedBytes is what the VDI reads as data: its own objects and
	// those it inherits from ancestors.
	AllocatedBytes uint64 `json:"allocated_bytes"`
	// SharedBytes is the part of it inherited from ancestors.
	SharedBytes uint64 `json:"shared_bytes"`
	// UniqueBytes is what deleting the VDI would free: its own objects
	// that no descendant reads.
	UniqueBytes uint64 `json:"unique_bytes"`
}

// loadMap reads a VDI's whole object map.
func (g *Gateway) loadMap(ctx context.Context, v cluster.VDI) ([]uint32, error) {
	objects := (v.Size + v.ObjectSize - 1) / v.ObjectSize
	perMap := v.ObjectSize / mapEntryBytes
	entries := make([]uint32, objects)
	for k := uint64(0); k*perMap < objects; k++ {
		count := min(perMap, objects-k*perMap)
		raw := make([]byte, count*mapEntryBytes)
		err := g.read(ctx, MapOID(v.ID, uint32(k)), v.Copies, raw, 0)
		if errors.Is(err, ErrNoObject) {
			continue
		}
		if err != nil {
			return nil, err
		}
		for i := uint64(0); i < count; i++ {
			entries[k*perMap+i] = binary.BigEndian.Uint32(raw[i*mapEntryBytes:])
		}
	}
	return entries, nil
}

// Space computes every VDI's space accounting from the object maps.
func (g *Gateway) Space(ctx context.Context) (map[uint32]Space, error) {
	tree := g.cluster.Tree()
	maps := map[uint32][]uint32{}
	for _, v := range tree {
		entries, err := g.loadMap(ctx, v)
		if err != nil {
			return nil, err
		}
		maps[v.ID] = entries
	}
	chains := map[uint32][]uint32{}
	for _, v := range tree {
		chains[v.ID] = g.cluster.Chain(v.ID)
	}
	resolve := func(chain []uint32, index int) uint32 {
		for _, id := range chain {
			entries := maps[id]
			if index >= len(entries) {
				continue // an ancestor smaller than a resized child
			}
			switch e := entries[index]; e {
			case 0:
				continue
			case tombstone:
				return 0
			default:
				return e
			}
		}
		return 0
	}
	out := map[uint32]Space{}
	for _, v := range tree {
		var s Space
		chain := chains[v.ID]
		var descendants [][]uint32
		for _, other := range tree {
			c := chains[other.ID]
			for _, id := range c[1:] {
				if id == v.ID {
					descendants = append(descendants, c)
					break
				}
			}
		}
		for i := range maps[v.ID] {
			owner := resolve(chain, i)
			if owner == 0 {
				continue
			}
			s.AllocatedBytes += v.ObjectSize
			if owner != v.ID {
				s.SharedBytes += v.ObjectSize
				continue
			}
			unique := true
			for _, d := range descendants {
				if resolve(d, i) == v.ID {
					unique = false
					break
				}
			}
			if unique {
				s.UniqueBytes += v.ObjectSize
			}
		}
		out[v.ID] = s
	}
	return out, nil
}
