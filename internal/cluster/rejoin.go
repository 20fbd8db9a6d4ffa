package cluster

// Rejoining: a node that lost contact keeps trying the members it knows
// (persisted in a peers file) until it is back.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"time"
)

// rejoinLoop keeps gossip connected to every node the log knows: after a
// partition heals or nodes restart, memberlist alone does not look for
// members it already declared dead.
func (c *Cluster) rejoinLoop() {
	defer c.wg.Done()
	ticker := time.NewTicker(rejoinInterval)
	defer ticker.Stop()
	var refreshed time.Time
	for {
		select {
		case <-c.stop:
			return
		case <-ticker.C:
		}
		members := c.gossipMembers()
		var targets []string
		c.fsm.View(func(s *State) {
			for id, n := range s.Nodes {
				if _, ok := members[id]; !ok && n.GossipAddr != "" {
					targets = append(targets, n.GossipAddr)
				}
			}
		})
		alone := len(members) <= 1
		if alone {
			targets = append(targets, c.cfg.Join...)
			targets = append(targets, c.loadPeers()...)
		}
		// Alone in gossip, or cut off from the leader: perhaps the
		// others' gossip key was rotated while this node was away
		// (gossipkeys.go), or their CA, without this node
		// (carotation.go): ask a member over mTLS.
		if (alone && len(targets) > 0 || !c.HasQuorum()) && time.Since(refreshed) > gossipRefreshInterval {
			refreshed = time.Now()
			c.wg.Add(1)
			go func() {
				defer c.wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				err := c.RefreshGossipKeys(ctx)
				switch {
				case errors.Is(err, ErrTrustLost):
					c.halt(c.trustLost(err))
				case err != nil:
					c.logger.Info("cluster: cut off; asking the members for the current keys failed", "err", err)
				}
			}()
		}
		for _, t := range dedupe(targets) {
			go func(address string) {
				if _, err := c.gossip.Join([]string{address}); err == nil {
					c.logger.Debug("gossip: reconnected", "to", address)
				}
			}(t)
		}
	}
}

// trustLost says what to do about ErrTrustLost.
func (c *Cluster) trustLost(err error) error {
	return fmt.Errorf("%w. The cluster's CA was rotated (herd cluster rotate-ca --finish) while this node was away and it has no certificate from the new CA, or this data directory belongs to another cluster: stop this node, remove it (herd node remove %s, on a member) and start it on an empty data directory with a join token (herd cluster join-token create)", err, c.cfg.NodeID)
}

// Halt stops this node, which can serve nothing, for err (Halted): the
// server exits with it.
func (c *Cluster) Halt(err error) { c.halt(err) }

// halt stops this node: it can serve nothing (Halted).
func (c *Cluster) halt(err error) {
	c.logger.Error("cluster: stopping", "err", err)
	select {
	case c.halted <- err:
	default:
	}
}

// gossipRefreshInterval is how often a node alone in gossip asks a member
// over mTLS for the current gossip keys.
const gossipRefreshInterval = 10 * time.Second

func dedupe(in []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, s := range in {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}

// peersLoop persists the gossip addresses of every known node, so a node
// restarted after the whole cluster stopped can find the others before its
// log has been replayed.
func (c *Cluster) peersLoop() {
	defer c.wg.Done()
	for {
		select {
		case <-c.stop:
			return
		case <-c.peersDirty:
		}
		var addrs []string
		c.fsm.View(func(s *State) {
			for id, n := range s.Nodes {
				if id != c.cfg.NodeID && n.GossipAddr != "" {
					addrs = append(addrs, n.GossipAddr)
				}
			}
		})
		sort.Strings(addrs)
		data, _ := json.Marshal(addrs)
		path := filepath.Join(c.cfg.DataDir, "peers.json")
		if err := os.WriteFile(path+".tmp", data, 0o600); err == nil {
			os.Rename(path+".tmp", path)
		}
	}
}

func (c *Cluster) loadPeers() []string {
	data, err := os.ReadFile(filepath.Join(c.cfg.DataDir, "peers.json"))
	if err != nil {
		return nil
	}
	var addrs []string
	json.Unmarshal(data, &addrs)
	return addrs
}
