package testcluster

import (
	"context"
	"fmt"
	"time"

	"github.com/herd-storage/herd/internal/api"
)

// WaitRecovered waits, at most timeout, until `alive` nodes report their
// recovery done for the current epoch, as the first running node sees it.
func (c *Cluster) WaitRecovered(alive int, timeout time.Duration) {
	c.t.Helper()
	WaitFor(c.t, timeout, "recovery to finish on every node", func() (bool, error) {
		var asked *Node
		for _, n := range c.Nodes() {
			if n.Running() && !n.Paused() {
				asked = n
				break
			}
		}
		if asked == nil {
			return false, fmt.Errorf("no running node to ask")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		client := api.NewClient(asked.AdminAddr(), c.Token())
		entries, err := client.Recovery(ctx)
		if err != nil {
			return false, err
		}
		info, err := client.Info(ctx)
		if err != nil {
			return false, err
		}
		for _, e := range entries {
			if e.Status.State != "done" || uint64(e.Status.Epoch) != info.Epoch {
				return false, fmt.Errorf("node %s: %+v %s", e.Node, e.Status, e.Error)
			}
		}
		return len(entries) == alive, fmt.Errorf("%d nodes report", len(entries))
	})
}
