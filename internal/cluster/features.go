package cluster

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
)

// Builds returns what every alive gossip member reports about its binary,
// by node id.
func (c *Cluster) Builds() map[string]Build {
	out := map[string]Build{}
	for id, m := range c.gossipMembers() {
		out[id] = m.Build
	}
	return out
}

// Requires returns nil if the cluster's level allows feature, or an
// ErrUpgradeRequired naming what must happen first.
func (c *Cluster) Requires(feature Feature) error {
	level := c.Level()
	if level >= feature.Level {
		return nil
	}
	return upgradeRequired(feature, level, c.membersBelow(feature.Level))
}

func upgradeRequired(feature Feature, level int, below []string) error {
	if len(below) == 0 {
		return fmt.Errorf("%w: %s needs cluster feature level %d, the cluster is at %d; every member supports it: run `herd cluster finalize-upgrade`", ErrUpgradeRequired, feature.Name, feature.Level, level)
	}
	return fmt.Errorf("%w: %s needs cluster feature level %d, the cluster is at %d; upgrade herd on %s, then run `herd cluster finalize-upgrade`", ErrUpgradeRequired, feature.Name, feature.Level, level, strings.Join(below, ", "))
}

// membersBelow lists the members of the log (not removed) whose binary
// does not support level, or that gossip does not see, each with what it
// runs.
func (c *Cluster) membersBelow(level int) []string {
	builds := c.Builds()
	var ids []string
	c.fsm.View(func(s *State) {
		for id := range s.Nodes {
			if _, removed := s.Removed[id]; !removed {
				ids = append(ids, id)
			}
		}
	})
	sort.Strings(ids)
	var below []string
	for _, id := range ids {
		b, alive := builds[id]
		switch {
		case !alive:
			below = append(below, fmt.Sprintf("%s (down: its version is unknown; start it on the new herd, or `herd node remove` it)", id))
		case b.SupportedLevel() < level:
			below = append(below, fmt.Sprintf("%s (runs %s, level %d)", id, b, b.SupportedLevel()))
		}
	}
	return below
}

// FinalizeUpgrade raises the cluster's level to what this binary supports,
// once every member reports that it supports it. It returns the level the
// cluster is at afterwards.
func (c *Cluster) FinalizeUpgrade(ctx context.Context) (int, error) {
	level := c.Level()
	if level >= SupportedLevel {
		return level, nil
	}
	if below := c.membersBelow(SupportedLevel); len(below) > 0 {
		return level, fmt.Errorf("%w: cannot raise the cluster to feature level %d: upgrade herd on %s first", ErrUpgradeRequired, SupportedLevel, strings.Join(below, ", "))
	}
	var admitted map[string]string
	if level < LevelSecurity && SupportedLevel >= LevelSecurity {
		serials, err := c.memberSerials(ctx)
		if err != nil {
			return level, err
		}
		admitted = serials
	}
	raised, err := c.cmds().RaiseLevel(ctx, SupportedLevel, admitted)
	if err != nil {
		if errors.Is(err, ErrInvalid) && c.Level() >= SupportedLevel {
			return c.Level(), nil // raised meanwhile (another finalize)
		}
		return level, err
	}
	return raised, nil
}

// Signers returns the peer addresses of the alive members that hold the
// CA key, this node first if it does.
func (c *Cluster) Signers() []string {
	var out []string
	for id, m := range c.gossipMembers() {
		if !m.Build.Signs || m.PeerAddr == "" {
			continue
		}
		if id == c.cfg.NodeID {
			out = append([]string{m.PeerAddr}, out...)
		} else {
			out = append(out, m.PeerAddr)
		}
	}
	return out
}
