// Package layout is the placement of every epoch, current and past: which
// nodes hold each object. An epoch fixes its placement by itself (the
// cluster log records, in every epoch, each member's weight, zone and
// fullness: cluster.Epoch.Members), so a past epoch's layout, which the
// proof of currency asks for, is what it was during that epoch, whatever
// the node table says now. Layouts are computed from the log (no I/O)
// and cached; the data path, recovery and maintenance share one History.
package layout

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/invariants"
	"github.com/herd-storage/herd/internal/object"
	"github.com/herd-storage/herd/internal/placement"
)

// ErrNotFormatted: the cluster has no format yet, so no object has a
// place.
var ErrNotFormatted = errors.New("cluster is not formatted")

// Epoch is one epoch's layout.
type Epoch struct {
	Number object.Epoch
	// Nodes are the epoch's nodes by id (every member, full ones too),
	// with their addresses from the node table.
	Nodes  map[string]cluster.Node
	Format cluster.Format // zero in past epochs' layouts
	ring   *placement.Ring
}

// ReplicasOf returns the nodes that hold oid in this epoch: copies of
// them, or all there are when fewer nodes (or zones) are alive, so that a
// cluster that lost nodes keeps serving with reduced redundancy until
// they return.
func (e *Epoch) ReplicasOf(oid object.OID, copies int) []cluster.Node {
	copies = max(1, min(copies, e.ring.MaxCopies()))
	ids := e.ring.Replicas(uint64(oid), copies)
	out := make([]cluster.Node, 0, len(ids))
	for i, id := range ids {
		// Checked in every build (copies is at most cluster.MaxCopies):
		// a replica outside the epoch, or one placed twice, would take
		// writes acknowledged with a copy fewer than the VDI's.
		n, ok := e.Nodes[id]
		if !ok || slices.Contains(ids[:i], id) {
			invariants.Fail("layout: epoch %d places object %016x on %v: node %s is not a member or is placed twice", e.Number, oid, ids, id)
		}
		out = append(out, n)
	}
	return out
}

// ChunkHomes returns the nodes that hold the k+m chunks of data object
// oid, erasure-coded with k data and m parity chunks, if its chunks are
// placed in this epoch: element c is chunk c's home, all distinct, and no
// zone holds more than m of them when the epoch has zones (placement's
// Ring.Chunks keyed by the data object's id). Unlike ReplicasOf it does
// not settle for fewer: it returns an error when the epoch has too few
// nodes, or zones, for k+m chunks (wrapping placement.ErrTooFewNodes),
// and for counts out of range or an oid that is not a data object.
func (e *Epoch) ChunkHomes(oid object.OID, k, m int) ([]cluster.Node, error) {
	switch {
	case k < 1 || m < 1 || k+m > object.MaxChunks:
		return nil, fmt.Errorf("layout: chunks of object %016x: %d data and %d parity chunks, want at least 1 of each and at most %d in all", oid, k, m, object.MaxChunks)
	case object.Type(oid) != object.TypeData:
		return nil, fmt.Errorf("layout: chunks of object %016x: type %d is not a data object", oid, object.Type(oid))
	}
	ids, err := e.ring.Chunks(uint64(oid), k+m, m)
	if err != nil {
		return nil, fmt.Errorf("layout: epoch %d: %d+%d chunks of object %016x: %w", e.Number, k, m, oid, err)
	}
	if len(ids) != k+m {
		invariants.Fail("layout: epoch %d places the %d+%d chunks of object %016x on %v", e.Number, k, m, oid, ids)
	}
	out := make([]cluster.Node, 0, len(ids))
	for i, id := range ids {
		// Checked in every build (at most object.MaxChunks homes): a
		// chunk outside the epoch, or two on one node, would make a
		// stripe that survives fewer losses than its scheme says.
		n, ok := e.Nodes[id]
		if !ok || slices.Contains(ids[:i], id) {
			invariants.Fail("layout: epoch %d places the chunks of object %016x on %v: node %s is not a member or is placed twice", e.Number, oid, ids, id)
		}
		out = append(out, n)
	}
	return out, nil
}

// Member says whether node id is one of the epoch's nodes.
func (e *Epoch) Member(id string) bool {
	_, ok := e.Nodes[id]
	return ok
}

// MaxCopies is how many distinct failure domains the epoch places on.
func (e *Epoch) MaxCopies() int { return e.ring.MaxCopies() }

// Source is the cluster log as layouts need it.
type Source interface {
	Epoch() uint64
	View() cluster.EpochView
	Node(id string) (cluster.Node, bool)
}

// History computes and caches layouts. Safe for concurrent use.
type History struct {
	source Source
	logger *slog.Logger

	mu      sync.Mutex // guards current and past
	current *Epoch
	past    map[object.Epoch]*Epoch
}

// NewHistory returns the layouts of source's epochs.
func NewHistory(source Source, logger *slog.Logger) *History {
	return &History{source: source, logger: logger, past: map[object.Epoch]*Epoch{}}
}

// ringFor is the placement of an epoch's placed members: a function of
// what the epoch recorded and nothing else.
func ringFor(members []cluster.Member) (*placement.Ring, error) {
	nodes := make([]placement.Node, 0, len(members))
	for _, m := range members {
		nodes = append(nodes, placement.Node{ID: m.ID, Zone: m.Zone, Weight: max(m.Weight, 1)})
	}
	ring, err := placement.New(nodes)
	if invariants.Enabled && err == nil {
		if err := ring.Check(); err != nil {
			invariants.Fail("placement of members %+v: %v", members, err)
		}
	}
	return ring, err
}

// Current returns the layout of the latest epoch this node applied.
func (h *History) Current() (*Epoch, error) {
	// The hot path: the epoch number is cheap, the view copies the node
	// list, so build the layout only when the epoch changed.
	number := h.source.Epoch()
	h.mu.Lock()
	if h.current != nil && h.current.Number == object.Epoch(number) {
		e := h.current
		h.mu.Unlock()
		return e, nil
	}
	h.mu.Unlock()
	view := h.source.View()
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.current != nil && h.current.Number == object.Epoch(view.Number) {
		return h.current, nil
	}
	if view.Format == nil {
		return nil, ErrNotFormatted
	}
	if len(view.Nodes) == 0 {
		return nil, fmt.Errorf("%w: no nodes in epoch %d", object.ErrUnavailable, view.Number)
	}
	ring, err := ringFor(view.Members)
	if err != nil {
		return nil, err
	}
	e := &Epoch{Number: object.Epoch(view.Number), ring: ring, Nodes: map[string]cluster.Node{}, Format: *view.Format}
	for _, n := range view.Nodes {
		e.Nodes[n.ID] = n
	}
	if h.current != nil && e.Number < h.current.Number {
		// A node applies the log in order, so epochs only rise.
		invariants.Fail("layout: epoch went back from %d to %d", h.current.Number, e.Number)
	}
	h.current = e
	if e.ring.MaxCopies() < e.Format.Copies {
		// Reported once per epoch: writes go to every node (or zone) there
		// is, until nodes return or recovery restores redundancy.
		h.logger.Warn("layout: fewer failure domains than copies; writing with reduced redundancy", "epoch", e.Number, "copies", e.Format.Copies, "available", e.ring.MaxCopies())
	}
	return e, nil
}

// At returns the layout of a past (or the current) epoch, or nil if the
// epoch has no nodes that hold objects.
func (h *History) At(epoch cluster.Epoch) *Epoch {
	h.mu.Lock()
	if e, ok := h.past[object.Epoch(epoch.Number)]; ok {
		h.mu.Unlock()
		return e
	}
	h.mu.Unlock()
	// The placement is the epoch's own record; the node table only
	// supplies addresses (and the members of an epoch an older binary
	// committed without recording them).
	members := epoch.PlacedMembers(func(id string) (cluster.Member, bool) {
		n, ok := h.source.Node(id)
		return cluster.MemberOf(n), ok
	})
	var e *Epoch
	if ring, err := ringFor(members); err == nil && len(members) > 0 {
		e = &Epoch{Number: object.Epoch(epoch.Number), ring: ring, Nodes: map[string]cluster.Node{}}
		for _, id := range epoch.Nodes {
			n, _ := h.source.Node(id)
			n.ID = id
			e.Nodes[id] = n
		}
	}
	h.mu.Lock()
	if len(h.past) >= 1024 {
		clear(h.past)
	}
	h.past[object.Epoch(epoch.Number)] = e
	h.mu.Unlock()
	return e
}

// Waiter is what Scoped needs of the cluster log.
type Waiter interface {
	WaitEpoch(ctx context.Context, after uint64) (cluster.EpochView, error)
}

// EpochContexter is what lets Scoped end a round with its epoch without
// a goroutine per round (cluster's applied log has it).
type EpochContexter interface {
	// EpochContext returns an epoch and a context that ends once the
	// node moves to another.
	EpochContext() (context.Context, uint64)
}

// Scoped returns a context for one round of requests in epoch: it ends
// when a newer epoch arrives (the requests go again on the new layout)
// or after limit.
//
// Every replicated request runs one round or more, so this is on the
// data path: with an EpochContexter, the round's end is a callback on
// the epoch's context (no goroutine, no view of the log built per
// round); only a round for an epoch the node has not signalled yet, or
// a Waiter without EpochContext, waits on a goroutine of its own.
func Scoped(ctx context.Context, c Waiter, epoch object.Epoch, limit time.Duration) (context.Context, context.CancelFunc) {
	scope, cancel := context.WithTimeout(ctx, limit)
	if e, ok := c.(EpochContexter); ok {
		epochCtx, current := e.EpochContext()
		switch {
		case object.Epoch(current) > epoch:
			cancel() // already over
			return scope, cancel
		case object.Epoch(current) == epoch:
			stop := context.AfterFunc(epochCtx, cancel)
			return scope, func() {
				stop()
				cancel()
			}
		}
	}
	go func() {
		c.WaitEpoch(scope, uint64(epoch))
		cancel()
	}()
	return scope, cancel
}
