package cluster

// Rejoining: a node that lost contact keeps trying the members it knows
// (persisted in a peers file) until it is back.

import (
	"encoding/json"
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
		if len(members) <= 1 {
			targets = append(targets, c.cfg.Join...)
			targets = append(targets, c.loadPeers()...)
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
