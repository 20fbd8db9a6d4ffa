package api

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/size"
)

// Health levels, in increasing order of trouble. `herd cluster health`
// exits 0, 1 or 2 for them.
const (
	HealthOK   = "OK"
	HealthWarn = "WARN"
	HealthErr  = "ERR"
)

// Health is the cluster's health as one node sees it: the worst level of
// its reasons, and every reason.
type Health struct {
	Status  string         `json:"status"`
	Reasons []HealthReason `json:"reasons"`
}

// HealthReason is one thing that is not as it should be.
type HealthReason struct {
	Level string `json:"level"`
	What  string `json:"what"`
}

func healthRank(level string) int {
	switch level {
	case HealthErr:
		return 2
	case HealthWarn:
		return 1
	}
	return 0
}

func (h *Health) add(level, format string, args ...any) {
	h.Reasons = append(h.Reasons, HealthReason{Level: level, What: fmt.Sprintf(format, args...)})
	if healthRank(level) > healthRank(h.Status) {
		h.Status = level
	}
}

// health gathers the reasons: no quorum; nodes down or full; disks out of
// service; objects unavailable (their newest copies may be on nodes that
// are down: reads and writes of them fail) or still being recovered.
func (s *Server) health(ctx context.Context) Health {
	h := Health{Status: HealthOK, Reasons: []HealthReason{}}
	info := s.cluster.Info()
	if !info.Quorum {
		h.add(HealthErr, "no quorum: %s", info.QuorumDetail)
	}
	if !info.Formatted {
		h.add(HealthWarn, "the cluster is not formatted (herd cluster format --copies N)")
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	nodes := s.nodes(ctx)
	if info.Formatted {
		capacityHealth(&h, s.capacity(nodes))
	}
	for _, n := range nodes {
		switch {
		case n.State != cluster.NodeAlive && n.Stopped && n.InMaintenance(time.Now()):
			h.add(HealthWarn, "node %s (%s) is stopped: down, not out, until %s (--down-out-interval): its objects have one copy fewer and are re-replicated only if it has not returned by then",
				n.ID, n.Address, n.MaintenanceUntil.UTC().Format(time.RFC3339))
			continue
		case n.State != cluster.NodeAlive && n.Stopped:
			h.add(HealthWarn, "node %s (%s) is stopped and marked out since %s: its objects are re-replicated on the others",
				n.ID, n.Address, n.MaintenanceUntil.UTC().Format(time.RFC3339))
			continue
		case n.State != cluster.NodeAlive && n.InMaintenance(time.Now()):
			h.add(HealthWarn, "node %s (%s) is down in its maintenance window (until %s): its objects have one copy fewer and are not re-replicated meanwhile",
				n.ID, n.Address, n.MaintenanceUntil.UTC().Format(time.RFC3339))
			continue
		case n.State != cluster.NodeAlive:
			h.add(HealthWarn, "node %s (%s) is down", n.ID, n.Address)
			continue
		case n.Draining && n.Objects > 0:
			h.add(HealthWarn, "node %s (%s) is draining: %d copies left to move", n.ID, n.Address, n.Objects)
		case n.Full:
			h.add(HealthWarn, "node %s (%s) is full: it takes no new objects", n.ID, n.Address)
		}
		if n.UsageError != "" {
			h.add(HealthWarn, "node %s (%s) did not answer: %s", n.ID, n.Address, n.UsageError)
		}
		for _, disk := range n.FailedDisks {
			h.add(HealthWarn, "node %s (%s): disk %s is out of service after an I/O error; its copies are recovered elsewhere", n.ID, n.Address, disk)
		}
	}
	certificateHealth(&h, time.Now(), info.CA, nodes, s.cluster.Clients())
	for _, r := range s.recovery(ctx) {
		st := r.Status
		switch {
		case r.Error != "":
			h.add(HealthWarn, "node %s: recovery state unknown: %s", r.Node, r.Error)
			continue
		case st.Unavailable > 0:
			h.add(HealthErr, "node %s: %d objects unavailable: their newest copies may be on nodes that are down; reads and writes of them fail until one returns", r.Node, st.Unavailable)
		}
		if st.Deferred > 0 {
			h.add(HealthWarn, "node %s: %d objects wait for the maintenance window of %s to close (%s); clients recover the ones they use", r.Node, st.Deferred,
				strings.Join(st.HeldBy, ", "), st.HeldUntil.UTC().Format(time.RFC3339))
		}
		if st.Remaining > 0 {
			eta := "unknown"
			if st.ETASeconds > 0 {
				eta = (time.Duration(st.ETASeconds) * time.Second).String()
			}
			h.add(HealthWarn, "node %s: recovery of epoch %d running: %d objects (about %s) left, ETA %s", r.Node, st.Epoch, st.Remaining, size.Format(st.BytesRemaining), eta)
		}
	}
	return h
}
