package statemachine

import (
	"fmt"
	"sort"
	"time"
)

// Space that comes back: a deleted snapshot that has exactly
// one child is merged into it, and a clone can be flattened (made
// independent of its parent). The copy itself is the gateway's
// (gateway/merge.go): every object of the layer is copied into the child
// where the child has no entry of its own, through the copy-on-write
// path. The log only records the request (flatten) and the end (merged,
// flattened), when the child holds everything it read through the layer:
// the chain is then shortened in one entry and the layer goes to the
// garbage list. Everything in between is derived from the log
// (LayerJobs), so a restart or a new leader resumes a merge from the
// start, skipping the objects already copied.

// commandVDILayer is the one command type of merges and flattens (Op).
const commandVDILayer commandType = 35

// Layer operations (vdiLayerCommand.Op).
const (
	layerMerged    = "merged"
	layerFlatten   = "flatten"
	layerFlattened = "flattened"
)

// FeatureLayerMerge gates commandVDILayer: a binary below LevelSecurity
// does not know it and would stop applying the log.
var FeatureLayerMerge = Feature{Name: "merging deleted snapshots and vdi flatten", Level: LevelSecurity}

func init() {
	if commands[commandVDILayer] != nil {
		panic("cluster: command type 35 registered twice")
	}
	commands[commandVDILayer] = applyVDILayer
}

type vdiLayerCommand struct {
	Op string `json:"op"`
	// ID is the layer merged away (merged) or the parent the child no
	// longer needs (flattened).
	ID uint32 `json:"id,omitempty"`
	// Child is the VDI that now holds the layer's objects.
	Child uint32 `json:"child,omitempty"`
	// Name is the writable VDI to flatten (flatten).
	Name string `json:"name,omitempty"`
	// Parent (merged) is the layer's parent when the job began: the
	// merge is refused if another merge into the layer has changed it
	// since, because the layer then holds objects the job did not copy
	// (LayerJob.LayerParent). Absent from entries of builds before it:
	// not checked.
	Parent *uint32   `json:"parent,omitempty"`
	Time   time.Time `json:"time"`
}

func (c vdiLayerCommand) check() error {
	return checkLengths(lengthCheck{"layer operation", c.Op, 32}, lengthCheck{"vdi name", c.Name, MaxNameLength})
}

// LayerJob is one copy into a child that a merge or flatten needs.
type LayerJob struct {
	// Child receives the objects.
	Child VDI `json:"child"`
	// Layer is the deleted layer merged into Child (0 for a flatten).
	Layer uint32 `json:"layer,omitempty"`
	// Flatten: every ancestor's objects are copied (Child.Flatten).
	Flatten bool `json:"flatten,omitempty"`
	// Sources are the chain members whose objects the job copies,
	// nearest first: the layer alone, or every ancestor.
	Sources []uint32 `json:"sources"`
	// LayerParent is the layer's parent (merges): the job's `merged`
	// entry carries it, and is refused if the layer's parent changed
	// meanwhile (its own deleted parent merged into it, adding objects
	// the job may have passed over).
	LayerParent uint32 `json:"layer_parent,omitempty"`
	// Holder is the node holding Child's writer lock ("" for none, or a
	// snapshot): it runs the job, through its open of the VDI, so the
	// copies and the guest's writes share the allocation locks. Jobs
	// without a holder run on the leader.
	Holder string `json:"holder,omitempty"`
}

// children returns the VDIs whose parent is id, by id.
func (s *State) children(id uint32) []*VDI {
	var out []*VDI
	for _, v := range s.VDIs {
		if v.Parent == id {
			out = append(out, v)
		}
	}
	for _, v := range s.Snapshots {
		if v.Parent == id {
			out = append(out, v)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// LayerJobs lists the merges and flattens the tree waits for, by child
// id: a flatten asked for, and every deleted layer with exactly one child
// (unless that child is being flattened, which frees the layer anyway).
func (s *State) LayerJobs() []LayerJob {
	var jobs []LayerJob
	holder := func(v *VDI) string {
		if v.Snapshot {
			return ""
		}
		if l, ok := s.Locks[vdiLockKey(v.Name)]; ok {
			return l.Node
		}
		return ""
	}
	for _, v := range s.Snapshots {
		if !v.Deleted {
			continue
		}
		kids := s.children(v.ID)
		if len(kids) != 1 || kids[0].Flatten {
			continue
		}
		jobs = append(jobs, LayerJob{Child: *kids[0], Layer: v.ID, Sources: []uint32{v.ID}, LayerParent: v.Parent, Holder: holder(kids[0])})
	}
	for _, v := range s.VDIs {
		if v.Flatten && v.Parent != 0 {
			jobs = append(jobs, LayerJob{Child: *v, Flatten: true, Sources: s.Chain(v.ID)[1:], Holder: holder(v)})
		}
	}
	for _, v := range s.Snapshots {
		if v.Flatten && v.Parent != 0 && !v.Deleted {
			jobs = append(jobs, LayerJob{Child: *v, Flatten: true, Sources: s.Chain(v.ID)[1:]})
		}
	}
	sort.Slice(jobs, func(i, j int) bool { return jobs[i].Child.ID < jobs[j].Child.ID })
	return jobs
}

// KeptBecause says why a deleted layer is still in the tree: "" when it
// is being merged (one child), otherwise the children that read it.
func (s *State) KeptBecause(id uint32) []VDI {
	var out []VDI
	for _, v := range s.children(id) {
		out = append(out, *v)
	}
	return out
}

func applyVDILayer(s *State, data []byte) (any, error) {
	var c vdiLayerCommand
	if err := decode(data, &c); err != nil {
		return nil, err
	}
	if err := c.check(); err != nil {
		return nil, err
	}
	if s.Level() < FeatureLayerMerge.Level {
		return nil, fmt.Errorf("%w: %s needs cluster feature level %d", ErrUpgradeRequired, FeatureLayerMerge.Name, FeatureLayerMerge.Level)
	}
	switch c.Op {
	case layerMerged:
		layer, ok := s.Snapshots[c.ID]
		if !ok || !layer.Deleted {
			return nil, fmt.Errorf("%w: vdi %d is not a deleted layer", ErrInvalid, c.ID)
		}
		kids := s.children(layer.ID)
		if len(kids) != 1 || kids[0].ID != c.Child {
			return nil, fmt.Errorf("%w: deleted layer %d no longer has vdi %d as its only child", ErrInvalid, c.ID, c.Child)
		}
		if c.Parent != nil && layer.Parent != *c.Parent {
			// A merge into the layer committed while this job copied
			// from it: the layer now holds objects the job may have
			// passed over, which the child would lose with the layer.
			return nil, fmt.Errorf("%w: deleted layer %d has parent %d, not %d as when its merge into vdi %d began (merged into meanwhile): the merge runs again", ErrInvalid, c.ID, layer.Parent, *c.Parent, c.Child)
		}
		child := kids[0]
		child.Parent = layer.Parent
		delete(s.Snapshots, layer.ID)
		s.Garbage = append(s.Garbage, Garbage{ID: layer.ID, Size: layer.Size, ObjectSize: layer.ObjectSize, Copies: layer.Copies, EC: layer.EC})
		s.note("vdi", "deleted snapshot %s (vdi %d) merged into %s (vdi %d): the chain is one shorter, its objects are freed", layer.FullName(), layer.ID, child.FullName(), child.ID)
		return *child, nil
	case layerFlatten:
		v, ok := s.VDIs[c.Name]
		if !ok {
			return nil, fmt.Errorf("vdi %q %w", c.Name, ErrNotFound)
		}
		if v.Parent == 0 {
			return *v, nil // nothing to do
		}
		if !v.Flatten {
			v.Flatten = true
			s.note("vdi", "vdi %s (vdi %d) is being flattened: it copies what it reads from its parents", v.Name, v.ID)
		}
		return *v, nil
	case layerFlattened:
		v := s.byID(c.Child)
		if v == nil || !v.Flatten || v.Parent != c.ID {
			return nil, fmt.Errorf("%w: vdi %d is not being flattened from parent %d", ErrInvalid, c.Child, c.ID)
		}
		v.Parent, v.Flatten = 0, false
		s.note("vdi", "vdi %s (vdi %d) flattened: it no longer reads its parents' objects", v.FullName(), v.ID)
		if parent, ok := s.Snapshots[c.ID]; ok && parent.Deleted && !s.hasChildren(parent.ID) {
			removeVDI(s, parent)
		}
		return *v, nil
	}
	return nil, fmt.Errorf("%w: unknown layer operation %q", ErrInvalid, c.Op)
}

// LayerJobs returns the merges and flattens the tree waits for.
func (c *Reads) LayerJobs() []LayerJob {
	var out []LayerJob
	c.fsm.View(func(s *State) { out = s.LayerJobs() })
	return out
}
