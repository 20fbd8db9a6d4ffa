package cluster

// Leader reconciliation: gossip -> log. Every change of the alive set is
// a NodeJoin or NodeLeave entry, and so a new epoch.

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/hashicorp/raft"
)

func (c *Cluster) reconcileLoop() {
	defer c.wg.Done()
	ticker := time.NewTicker(reconcileInterval)
	defer ticker.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-ticker.C:
		case <-c.nudge:
		}
		if c.raft.State() != raft.Leader {
			continue
		}
		if err := c.reconcile(); err != nil && !errors.Is(err, ErrNoQuorum) {
			c.logger.Warn("cluster: reconcile", "err", err)
		}
	}
}

func (c *Cluster) reconcile() error {
	ctx, cancel := context.WithTimeout(context.Background(), applyTimeout)
	defer cancel()
	members := c.gossipMembers()
	var logged map[string]Node
	level := LevelBase
	var admitted map[string]bool
	c.fsm.View(func(s *State) {
		level = s.Level()
		admitted = make(map[string]bool, len(s.Admitted))
		for id := range s.Admitted {
			admitted[id] = true
		}
		logged = make(map[string]Node, len(s.Nodes))
		for id, n := range s.Nodes {
			logged[id] = *n
		}
		for id := range s.Removed {
			delete(members, id) // gossip never brings a removed node back
		}
	})
	tooOld := map[string]bool{} // alive, but its binary cannot apply the log
	// Gossip -> log. Sorted so that epochs are committed in a stable order.
	ids := make([]string, 0, len(members))
	for id := range members {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		m := members[id]
		l, ok := logged[id]
		if ok && l.State == NodeAlive && sameNode(l, m) {
			continue
		}
		if err := CheckNodeLengths(m); err != nil {
			// Its join would be refused on every tick and hold back the
			// joins sorted after it: skip it, and say so once.
			if c.refuseOnce(id) {
				c.logger.Warn("cluster: not committing a gossip member whose metadata is too long", "node", truncate(id, MaxOwnerLength), "err", err)
			}
			continue
		}
		if m.Build.SupportedLevel() < level {
			tooOld[id] = true
			// Its binary does not know what the log holds: it would stop
			// at the first entry it cannot apply (features.go).
			if c.refuseOnce(id) {
				c.logger.Warn("cluster: not admitting a node whose herd is older than the cluster's feature level: upgrade herd on it", "node", id,
					"runs", m.Build.String(), "supports", m.Build.SupportedLevel(), "cluster_level", level)
			}
			continue
		}
		if level >= LevelSecurity && !admitted[id] {
			// Gossip carries a node the log never admitted (it holds a
			// gossip key, not an admission): never a member.
			if c.refuseOnce(id) {
				c.logger.Warn("cluster: not committing a gossip member that was never admitted", "node", truncate(id, MaxOwnerLength))
			}
			continue
		}
		c.mu.Lock()
		delete(c.refused, id)
		c.mu.Unlock()
		if _, err := c.cmds().NodeJoin(ctx, m); err != nil {
			return fmt.Errorf("commit join of %s: %w", id, err)
		}
		c.logger.Info("node joined", "node", id, "address", m.Address, "epoch", c.Epoch())
	}
	for id := range tooOld {
		delete(members, id) // not a voter either
	}
	for id, l := range logged {
		if l.State != NodeAlive || id == c.cfg.NodeID {
			continue
		}
		reason := "failure detected by gossip"
		switch _, alive := members[id]; {
		case tooOld[id]:
			reason = "its herd is older than the cluster's feature level"
		case alive || !c.leaveConfirmed(id, time.Now()):
			continue
		case c.gossipStopping()[id]:
			reason = "stopped"
		}
		if _, err := c.cmds().NodeLeave(ctx, id, reason); err != nil {
			return fmt.Errorf("commit leave of %s: %w", id, err)
		}
		c.logger.Info("node left", "node", id, "address", l.Address, "epoch", c.Epoch())
	}
	return c.reconcileVoters(members)
}

// leaveConfirmed says whether the leader may commit that id left: gossip
// declared it dead (confirmedDead), and either the leader's own raft does
// not reach it either or gossip has held to its verdict for
// gossipDeathVeto. Gossip alone can be wrong about a live node: a node
// cut off by a partition declares the others dead, and when the partition
// heals its "dead" messages reach the rest before the node they name
// refutes them (memberlist takes a dead message of the current
// incarnation as final); the refutation follows within a second. The
// leader adds every live node to the raft configuration (as a non-voter
// at least) and heartbeats each one several times a second, so a node
// that really failed has stopped answering (for the lease timeout, 1 s)
// well before gossip decides (2-6 s): this delays no failure. A node
// that leaves gossip on purpose (herd stopping) answers raft until it
// stops; it said so first (Depart), and that word is taken at once: no
// stale message makes a node announce its own stop.
func (c *Cluster) leaveConfirmed(id string, now time.Time) bool {
	if !c.confirmedDead(id) {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	since := c.started.Add(unseenGrace) // never seen since this process started
	if s, ok := c.seen[id]; ok {
		since = s.since
	}
	if now.Sub(since) >= gossipDeathVeto || !c.reachable(id) || (c.addresses[id].stopping && !bugDemoteHealthyVoter) {
		delete(c.vetoed, id)
		return true
	}
	if !c.vetoed[id].Equal(since) { // once per verdict
		c.vetoed[id] = since
		c.logger.Info("cluster: gossip reports a node dead that this leader's raft still reaches; waiting before committing its leave", "node", id, "for", gossipDeathVeto)
	}
	return false
}

func sameNode(a, b Node) bool {
	return a.Address == b.Address && a.PeerAddr == b.PeerAddr && a.GossipAddr == b.GossipAddr && a.AdminAddr == b.AdminAddr &&
		a.NBDAddr == b.NBDAddr && a.Zone == b.Zone && a.Capacity == b.Capacity && a.Incarnation == b.Incarnation
}

// truncate cuts s to at most n bytes, for logs.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// refuseOnce records that reconcile did not commit gossip member id, and
// says whether this is the first time (to log it once).
func (c *Cluster) refuseOnce(id string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	first := !c.refused[id]
	c.refused[id] = true
	return first
}
