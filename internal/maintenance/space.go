package maintenance

import (
	"context"

	"github.com/herd-storage/herd/internal/objmap"
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

// Space computes every VDI's space accounting from the object maps.
func (m *Maintenance) Space(ctx context.Context, data Data) (map[uint32]Space, error) {
	tree := m.cluster.Tree()
	maps := map[uint32][]uint32{}
	for _, v := range tree {
		entries, err := data.Map(ctx, v)
		if err != nil {
			return nil, err
		}
		maps[v.ID] = entries
	}
	chains := map[uint32][]uint32{}
	for _, v := range tree {
		chains[v.ID] = m.cluster.Chain(v.ID)
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
			case objmap.Tombstone:
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
