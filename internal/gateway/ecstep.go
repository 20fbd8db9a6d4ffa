package gateway

import (
	"context"

	"github.com/herd-storage/herd/internal/object"
)

// ECStep is a point inside a write or a fold of an erasure-coded object
// between two of its writes: where the simulator (internal/sim) kills
// the node whose gateway is there, to check that no crash there loses
// or changes a block (docs/ARCHITECTURE.md, "No write hole").
type ECStep int

const (
	// ECEntriesWritten: a write put its blocks' entries, not yet the
	// blocks into the overlay.
	ECEntriesWritten ECStep = iota + 1
	// ECOverlayWritten: a write put its blocks into the overlay too.
	ECOverlayWritten
	// ECChunksWritten: a fold wrote its generation's chunks, not yet its
	// head.
	ECChunksWritten
	// ECHeadWritten: a fold wrote its head, not yet trimmed the overlay.
	ECHeadWritten
	// ECTrimmed: a fold trimmed the overlay (or had none to trim), not
	// yet removed the previous generation's chunks.
	ECTrimmed
)

// ECSteps are every ECStep, in the order the data path passes them.
var ECSteps = []ECStep{ECEntriesWritten, ECOverlayWritten, ECChunksWritten, ECHeadWritten, ECTrimmed}

var ecStepNames = map[ECStep]string{
	ECEntriesWritten: "after the entries, before the overlay's blocks",
	ECOverlayWritten: "after the overlay's blocks",
	ECChunksWritten:  "after the chunks, before the head",
	ECHeadWritten:    "after the head, before the overlay's trim",
	ECTrimmed:        "after the trim, before the old chunks' removal",
}

// String says where the step is within its write or fold.
func (s ECStep) String() string {
	if name, ok := ecStepNames[s]; ok {
		return name
	}
	return "no erasure-coding step"
}

// Fold says whether the step is inside a fold (else inside a write).
func (s ECStep) Fold() bool { return s >= ECChunksWritten }

// ECStepHook is called by a gateway at every ECStep of every object it
// writes, with the request's context.
type ECStepHook func(ctx context.Context, g *Gateway, oid object.OID, step ECStep)

// ecStepHook is nil in production: only the simulator sets it.
var ecStepHook ECStepHook

// SetECStepHook sets the hook every gateway of the process calls at
// each ECStep (nil: none). For the simulator only; call it before any
// gateway runs (it is not synchronised).
func SetECStepHook(hook ECStepHook) { ecStepHook = hook }

// ecStep calls the hook, if any.
func (g *Gateway) ecStep(ctx context.Context, oid object.OID, step ECStep) {
	if hook := ecStepHook; hook != nil {
		hook(ctx, g, oid, step)
	}
}
