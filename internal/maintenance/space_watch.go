package maintenance

import (
	"context"
	"log/slog"
	"time"

	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/store"
)

// Space thresholds, in multiples of the disks' reserve (the free space
// below which the store takes no new object: 5% of a disk, at most 1 GiB).
// Below fullAt this node asks the cluster to give it no objects; it takes
// them again above clearAt, and no sooner than fullFor after it became
// full, so that a node whose share does not fit does not flap.
const (
	fullAt  = 2
	clearAt = 4
	fullFor = 5 * time.Minute
)

// WatchSpace marks this node full when its disks are nearly full: the
// placement then gives it no objects, its copies are re-created on other
// nodes and only then deleted here ("never fills a disk").
func WatchSpace(ctx context.Context, c *cluster.Cluster, objects *store.Store, logger *slog.Logger) {
	ticker := time.NewTicker(2 * time.Second)
	defer ticker.Stop()
	var since time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		free, total, reserve, err := objects.Pressure()
		if err != nil {
			logger.Warn("cannot read disk space", "err", err)
			continue
		}
		if reserve == 0 {
			reserve = total / 20
		}
		self, ok := c.Node(c.ID())
		if !ok || self.State != cluster.NodeAlive {
			continue
		}
		want := self.Full
		switch {
		case !self.Full && free < fullAt*reserve:
			want = true
		case self.Full && free > clearAt*reserve && time.Since(since) > fullFor:
			want = false
		}
		if want == self.Full {
			continue
		}
		work, cancel := context.WithTimeout(ctx, 10*time.Second)
		err = c.SetFull(work, want)
		cancel()
		switch {
		case err != nil:
			logger.Warn("cannot tell the cluster about this node's disk space", "full", want, "err", err)
		case want:
			since = time.Now()
			logger.Warn("this node's disks are nearly full: it takes no new objects, and its copies move to other nodes",
				"free", free, "total", total, "reserve", reserve)
		default:
			logger.Info("this node has space again: it takes objects again", "free", free, "total", total)
		}
	}
}
