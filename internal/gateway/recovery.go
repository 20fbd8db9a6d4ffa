package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/herd-storage/herd/internal/cluster"
)

// Recovery makes this node hold, after every epoch change, every object
// it must hold in the new epoch (DESIGN.md "Recovery"): it lists the
// objects of every node of the epoch, and pulls each object placed on
// this node that it lacks, or holds only an older copy of, from the node
// with the newest copy. A newer epoch arriving mid-way cancels the run and
// starts the next one, which skips what is already current.
//
// Not done yet (issue 5): removing copies no longer needed once the whole
// cluster has recovered an epoch, throttling by bandwidth, and proving a
// copy current before serving a read.
type Recovery struct {
	gateway     *Gateway
	local       *Replica
	lister      Lister
	self        string
	logger      *slog.Logger
	concurrency int

	mu     sync.Mutex // guards status
	status RecoveryStatus
}

// Lister lists a node's object copies with their epoch stamps.
type Lister interface {
	List(ctx context.Context, node cluster.Node, epoch uint64) (map[uint64]uint64, error)
}

// RecoveryStatus is what `herd node recovery` shows for one node.
type RecoveryStatus struct {
	Epoch     uint64    `json:"epoch"`
	State     string    `json:"state"` // idle, listing, pulling, done, retrying
	Objects   int       `json:"objects"`
	Copied    int       `json:"copied"`
	Remaining int       `json:"remaining"`
	Bytes     uint64    `json:"bytes"`
	Started   time.Time `json:"started,omitzero"`
	Finished  time.Time `json:"finished,omitzero"`
	LastError string    `json:"last_error,omitempty"`
}

// NewRecovery returns the recovery of this node.
func NewRecovery(g *Gateway, local *Replica, lister Lister, self string, logger *slog.Logger) *Recovery {
	return &Recovery{gateway: g, local: local, lister: lister, self: self, logger: logger, concurrency: 4, status: RecoveryStatus{State: "idle"}}
}

// Status returns the current recovery state.
func (r *Recovery) Status() RecoveryStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.status
}

func (r *Recovery) update(fn func(s *RecoveryStatus)) {
	r.mu.Lock()
	fn(&r.status)
	r.mu.Unlock()
}

// Run recovers every epoch until ctx ends.
func (r *Recovery) Run(ctx context.Context) {
	var epoch uint64
	for ctx.Err() == nil {
		view, err := r.gateway.cluster.WaitEpoch(ctx, epoch)
		if err != nil {
			return
		}
		epoch = view.Number
		run, cancel := context.WithCancel(ctx)
		go func() {
			// A newer epoch ends this run; the next one continues.
			r.gateway.cluster.WaitEpoch(run, epoch)
			cancel()
		}()
		for attempt := 0; run.Err() == nil; attempt++ {
			err := r.recover(run, epoch)
			if err == nil || run.Err() != nil {
				break
			}
			r.update(func(s *RecoveryStatus) { s.State, s.LastError = "retrying", err.Error() })
			r.logger.Warn("recovery: will retry", "epoch", epoch, "err", err)
			select {
			case <-run.Done():
			case <-time.After(time.Duration(min(attempt+1, 10)) * time.Second):
			}
		}
		cancel()
	}
}

func (r *Recovery) recover(ctx context.Context, epoch uint64) error {
	rv, err := r.gateway.current()
	if errors.Is(err, ErrNotFormatted) {
		return nil
	}
	if err != nil {
		return err
	}
	if rv.epoch != epoch {
		return nil // a newer epoch is already here; its run follows
	}
	if _, member := rv.nodes[r.self]; !member {
		return nil
	}
	started := time.Now()
	r.update(func(s *RecoveryStatus) {
		*s = RecoveryStatus{Epoch: epoch, State: "listing", Started: started}
	})
	// Every node's objects, and the newest stamp and holder of each.
	type best struct {
		stamp  uint64
		holder cluster.Node
	}
	newest := map[uint64]best{}
	ids := make([]string, 0, len(rv.nodes))
	for id := range rv.nodes {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		node := rv.nodes[id]
		objects, err := r.lister.List(ctx, node, epoch)
		if err != nil {
			return fmt.Errorf("listing node %s: %w", id, err)
		}
		for oid, stamp := range objects {
			if b, ok := newest[oid]; !ok || stamp > b.stamp {
				newest[oid] = best{stamp: stamp, holder: node}
			}
		}
	}
	copies := rv.format.Copies
	var mine []uint64
	for oid := range newest {
		for _, n := range rv.replicasOf(oid, copies) {
			if n.ID == r.self {
				mine = append(mine, oid)
				break
			}
		}
	}
	sort.Slice(mine, func(i, j int) bool { return mine[i] < mine[j] })
	r.update(func(s *RecoveryStatus) { s.State, s.Objects, s.Remaining = "pulling", len(mine), len(mine) })
	work := make(chan uint64)
	var failed error
	var failedOnce sync.Once
	var wg sync.WaitGroup
	for w := 0; w < r.concurrency; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for oid := range work {
				b := newest[oid]
				copied, err := r.local.Recover(oid, b.stamp, epoch, func() ([]byte, error) {
					if b.holder.ID == r.self {
						return nil, fmt.Errorf("object %016x: the newest copy is this node's own", oid)
					}
					data := make([]byte, rv.format.ObjectSize)
					_, err := r.gateway.replicas.Read(ctx, b.holder, epoch, oid, data, 0)
					return data, err
				})
				if err != nil {
					failedOnce.Do(func() { failed = fmt.Errorf("object %016x: %w", oid, err) })
				}
				r.update(func(s *RecoveryStatus) {
					s.Remaining--
					if copied {
						s.Copied++
						s.Bytes += rv.format.ObjectSize
					}
				})
			}
		}()
	}
	for _, oid := range mine {
		select {
		case work <- oid:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
	}
	close(work)
	wg.Wait()
	if failed != nil {
		return failed
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	status := r.Status()
	r.update(func(s *RecoveryStatus) { s.State, s.Finished = "done", time.Now() })
	if status.Copied > 0 {
		r.logger.Info("recovery: done", "epoch", epoch, "objects", status.Objects, "copied", status.Copied, "took", time.Since(started).Round(time.Millisecond))
	}
	return nil
}
