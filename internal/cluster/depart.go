package cluster

// A clean stop is a departure, not a failure. A node stopping (SIGTERM)
// must not take the cluster's quorum with it: it tells the others first,
// and hands over what only it holds, before it leaves gossip and stops
// raft. The steps, in order:
//
//  1. Announce: gossip metadata says "stopping" (memberlist re-advertises
//     the node; the leader hears it within a gossip interval or two). The
//     leader counts the node out of the healthy ones from then on, while
//     its raft still answers (voters.go).
//  1b. Down, not out: the node commits a maintenance window for itself
//     until --down-out-interval from now (openStopWindow), before its
//     leave can be: no node copies its objects elsewhere while it is
//     away inside it (maintenance.go). Not when the interval is 0, a
//     longer window is open, it is draining (its objects leave anyway)
//     or no other node stays (the whole cluster stopping).
//  2. Leadership: a leader hands it to a healthy voter (raft's leadership
//     transfer, thesis 3.10). A leader that is the only voter has its own
//     reconcile loop promote a reachable non-voter first.
//  3. Voter role: the leader demotes the stopping voter; the node waits
//     until its raft configuration shows it a non-voter. From then on its
//     going changes no majority.
//  4. Only then (Close): leave gossip, stop raft.
//
// Each step is bounded (departTimeout in all): a node cut off, or a
// cluster without quorum, still stops; when every other node is down or
// stopping too (the whole cluster shut down) there is no one to hand
// over to and the node stops at once, a voter still. If the announcement is lost the
// voter management is safe anyway (it never demotes a healthy voter
// around a departing one), only slower: the stopped voter stays in the
// configuration until its leave is committed.

import (
	"context"
	"time"

	"github.com/hashicorp/raft"
)

const (
	// departTimeout bounds Depart: the hand-over takes a gossip round, a
	// leadership transfer (an election timeout at most) and a
	// configuration change, well under a second on an idle cluster.
	departTimeout = 5 * time.Second
	// departPoll is how often Depart looks at its raft configuration.
	departPoll = 20 * time.Millisecond
	// announceTimeout bounds the wait for the stop's gossip broadcast.
	announceTimeout = time.Second
	// stopWindowTimeout bounds the commit of the stop's maintenance
	// window (one forwarded entry, milliseconds with a leader).
	stopWindowTimeout = 2 * time.Second
)

// Depart announces that this node is stopping and waits, for at most
// departTimeout, until it is no longer a raft voter: a leader hands its
// leadership over first. Close calls it; a caller may call it earlier
// (before it drains its clients) so that the hand-over runs meanwhile.
// It may be called concurrently and more than once; only the first call
// does anything.
func (c *Cluster) Depart() {
	c.departOnce.Do(c.depart)
}

func (c *Cluster) depart() {
	if c.raft == nil || c.gossip == nil {
		return // Start failed: this node never took part
	}
	started := time.Now()
	c.stopping.Store(true)
	if err := c.gossip.UpdateNode(announceTimeout); err != nil {
		c.logger.Warn("cluster: stopping: announcing it in gossip", "err", err)
	}
	c.poke()
	if c.raft.State() != raft.Leader && !c.quorum() {
		// Nothing to hand over to. (Checked once, before a leadership
		// transfer: right after one, this node may not know its
		// successor for a moment.)
		c.logger.Info("cluster: stopping without quorum: no leader to hand the voter role over to")
		return
	}
	c.openStopWindow()
	deadline := started.Add(departTimeout)
	ticker := time.NewTicker(departPoll)
	defer ticker.Stop()
	for {
		done, successor, why := c.departStep()
		if done {
			c.logger.Info("cluster: stopping: "+why, "after", time.Since(started).Round(time.Millisecond))
			return
		}
		if successor != nil {
			if err := c.raft.LeadershipTransferToServer(successor.ID, successor.Address).Error(); err == nil {
				c.logger.Info("cluster: stopping: handed raft leadership over", "to", successor.ID)
			}
		}
		if time.Now().After(deadline) {
			c.logger.Warn("cluster: stopping while still a raft voter: the leader did not demote this node in time", "waited", departTimeout, "for", why)
			return
		}
		<-ticker.C
	}
}

// departStep says whether Depart is done: this node is no raft voter, or
// no other node can take its role (every other one is down or stopping
// too: the whole cluster is shutting down, and the configuration stays as
// it is, voters.go). Otherwise it says what Depart waits for, and, on the
// leader, the voter to hand leadership to: a healthy one (in gossip, not
// stopping) that it reaches, or none while its own reconcile loop
// promotes one.
func (c *Cluster) departStep() (done bool, successor *raft.Server, why string) {
	future := c.raft.GetConfiguration()
	if err := future.Error(); err != nil {
		return true, nil, "raft is shut down"
	}
	members, stopping := c.gossipMembers(), c.gossipStopping()
	leader := c.raft.State() == raft.Leader
	self := raft.ServerID(c.cfg.NodeID)
	voter, takers := false, 0
	for _, s := range future.Configuration().Servers {
		if s.ID == self {
			voter = s.Suffrage == raft.Voter
			continue
		}
		if _, alive := members[string(s.ID)]; !alive || stopping[string(s.ID)] {
			continue
		}
		takers++
		if leader && successor == nil && s.Suffrage == raft.Voter && c.reachable(string(s.ID)) {
			successor = &s
		}
	}
	switch {
	case !voter:
		return true, nil, "no longer a raft voter"
	case takers == 0:
		return true, nil, "no other node to hand the voter role to (every other one is down or stopping)"
	case successor != nil:
		return false, successor, "leadership to be handed over"
	case leader:
		return false, nil, "a non-voter to be promoted"
	}
	return false, nil, "the leader to demote this node"
}

// quorum is QuorumStatus without its detail.
func (c *Cluster) quorum() bool {
	ok, _ := c.QuorumStatus()
	return ok
}

// openStopWindow commits a maintenance window for this node until
// DownOutInterval from now, marked as its own stop's (Stopped): until
// then its objects are not re-replicated in the background, and when it
// returns first, recovery restamps its unchanged copies and fetches only
// what changed (maintenance.go). It commits nothing when the interval is
// 0, when a window at least as long is open, when the node is draining,
// or when no other node stays (every other one is down or stopping: the
// whole cluster is shutting down, and no recovery can run anyway). Its
// commit precedes this node's leave, which the leader commits only once
// this node has left gossip (Close, after Depart).
func (c *Cluster) openStopWindow() {
	interval := c.cfg.DownOutInterval
	if interval <= 0 {
		return
	}
	self, ok := c.Node(c.cfg.NodeID)
	if !ok || self.State != NodeAlive || self.Draining {
		return
	}
	members, stopping := c.gossipMembers(), c.gossipStopping()
	staying := 0
	for id := range members {
		if id != c.cfg.NodeID && !stopping[id] {
			staying++
		}
	}
	if staying == 0 {
		c.logger.Info("cluster: stopping with every other node down or stopping: no down-out window (nothing to recover meanwhile)")
		return
	}
	now := time.Now().UTC()
	until := now.Add(min(interval, MaxMaintenance))
	if !self.MaintenanceUntil.Before(until) {
		c.logger.Info("cluster: stopping inside a maintenance window longer than --down-out-interval", "until", self.MaintenanceUntil)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), stopWindowTimeout)
	defer cancel()
	if err := c.cmds().StopWindow(ctx, now, until); err != nil {
		c.logger.Warn("cluster: stopping: the down-out window could not be committed: this node's objects are recovered elsewhere at once", "err", err)
		return
	}
	c.logger.Info("cluster: stopping: down, not out, until the down-out interval passes", "until", until, "down_out_interval", interval)
}
