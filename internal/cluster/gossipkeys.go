package cluster

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/herd-storage/herd/internal/peer"
)

// NewGossipKey returns a new random gossip key (AES-256).
func NewGossipKey() []byte {
	key := make([]byte, 32)
	rand.Read(key)
	return key
}

// GossipKeys is a node's gossip keyring and how it keeps it: what the
// server gives the cluster (server/gossipkeys.go).
type GossipKeys struct {
	// Keyring is memberlist's keyring: the first key encrypts, any
	// decrypts. Only the cluster changes it once started.
	Keyring *memberlist.Keyring
	// Save writes the keyring (the primary first) where the node finds
	// it at its next start.
	Save func(keys [][]byte) error
	// Fetch asks the member at a peer address, over mTLS, for the gossip
	// keys it holds (its primary first).
	Fetch func(ctx context.Context, peer string) ([][]byte, error)

	mu sync.Mutex // serializes changes: memberlist's keyring is not safe for concurrent changes
	// pending is a key this node made for a rotation it is starting:
	// kept until the log says where the rotation is.
	pending []byte
}

// NewGossipKeys makes a keyring of keys, the first the primary.
func NewGossipKeys(keys [][]byte, save func([][]byte) error, fetch func(context.Context, string) ([][]byte, error)) (*GossipKeys, error) {
	if len(keys) == 0 {
		return nil, errors.New("cluster: a gossip keyring needs a key")
	}
	ring, err := memberlist.NewKeyring(keys[1:], keys[0])
	if err != nil {
		return nil, fmt.Errorf("cluster: gossip keys: %w", err)
	}
	return &GossipKeys{Keyring: ring, Save: save, Fetch: fetch}, nil
}

// Keys returns a copy of the keys, the primary first.
func (g *GossipKeys) Keys() [][]byte {
	var out [][]byte
	for _, key := range g.Keyring.GetKeys() {
		out = append(out, bytes.Clone(key))
	}
	return out
}

// change runs fn on the keyring under the lock and saves it when fn says
// it changed it.
func (g *GossipKeys) change(fn func(ring *memberlist.Keyring) (bool, error)) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	changed, err := fn(g.Keyring)
	if err != nil || !changed || g.Save == nil {
		return err
	}
	return g.Save(g.Keyring.GetKeys())
}

func (g *GossipKeys) byID(id string) []byte {
	for _, key := range g.Keyring.GetKeys() {
		if GossipKeyID(key) == id {
			return key
		}
	}
	return nil
}

// PrimaryID is the id of the key this node encrypts gossip with.
func (g *GossipKeys) PrimaryID() string { return GossipKeyID(g.Keyring.GetPrimaryKey()) }

// IDs are the ids of the keys in the keyring, the primary first.
func (g *GossipKeys) IDs() []string {
	var out []string
	for _, key := range g.Keyring.GetKeys() {
		out = append(out, GossipKeyID(key))
	}
	return out
}

// add installs keys; with primary, the first of them becomes the primary
// unless the keyring has it already.
func (g *GossipKeys) add(keys [][]byte, primary bool) error {
	return g.change(func(ring *memberlist.Keyring) (bool, error) {
		changed := false
		for _, key := range keys {
			if slices.ContainsFunc(ring.GetKeys(), func(k []byte) bool { return bytes.Equal(k, key) }) {
				continue
			}
			if err := ring.AddKey(key); err != nil {
				return changed, err
			}
			changed = true
		}
		if primary && len(keys) > 0 && !bytes.Equal(ring.GetPrimaryKey(), keys[0]) {
			if err := ring.UseKey(keys[0]); err != nil {
				return changed, err
			}
			changed = true
		}
		return changed, nil
	})
}

// use makes the key of id the primary.
func (g *GossipKeys) use(id string) error {
	return g.change(func(ring *memberlist.Keyring) (bool, error) {
		key := g.byID(id)
		if key == nil {
			return false, fmt.Errorf("gossip key %s is not in this node's keyring", id)
		}
		if bytes.Equal(ring.GetPrimaryKey(), key) {
			return false, nil
		}
		return true, ring.UseKey(key)
	})
}

// keepPrimaryOnly removes every key but the primary. Keys are removed
// from the end of the ring: memberlist's RemoveKey shifts the keys after
// the one removed in place, under the feet of a reader decrypting with
// them, unless it is the last.
func (g *GossipKeys) keepPrimaryOnly() error {
	return g.change(func(ring *memberlist.Keyring) (bool, error) {
		if g.pending != nil {
			return false, nil // a rotation is being started here
		}
		changed := false
		for keys := ring.GetKeys(); len(keys) > 1; keys = ring.GetKeys() {
			if err := ring.RemoveKey(keys[len(keys)-1]); err != nil {
				return changed, err
			}
			changed = true
		}
		return changed, nil
	})
}

// fetchGossipKey asks the members, the node named first before the
// others, for the key of id and installs it.
func (c *Cluster) fetchGossipKey(ctx context.Context, id string, first string) error {
	var errs []string
	for _, peer := range c.secretPeers(first) {
		keys, err := c.fetchGossipKeys(ctx, peer)
		if err != nil {
			errs = append(errs, err.Error())
			continue
		}
		for _, key := range keys {
			if GossipKeyID(key) == id {
				return c.cfg.GossipKeys.add([][]byte{key}, false)
			}
		}
		errs = append(errs, peer+" does not hold it yet")
	}
	if len(errs) == 0 {
		return errors.New("no other member is known to ask")
	}
	return fmt.Errorf("no member answered with it: %s", strings.Join(errs, "; "))
}

func (c *Cluster) fetchGossipKeys(ctx context.Context, peer string) ([][]byte, error) {
	g := c.cfg.GossipKeys
	if g == nil || g.Fetch == nil {
		return nil, errors.New("this node cannot fetch gossip keys")
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	keys, err := g.Fetch(ctx, peer)
	if err != nil {
		return nil, err
	}
	for _, key := range keys {
		if err := memberlist.ValidateKey(key); err != nil {
			return nil, fmt.Errorf("%s answered a gossip key that is no key: %v", peer, err)
		}
	}
	return keys, nil
}

// secretPeers are the peer addresses to ask for secrets: the node named
// first (if any) first, then every other member the log or raft knows.
func (c *Cluster) secretPeers(first string) []string {
	var out, rest []string
	c.fsm.View(func(s *State) {
		for id, n := range s.Nodes {
			if id == c.cfg.NodeID || n.PeerAddr == "" {
				continue
			}
			if _, removed := s.Removed[id]; removed {
				continue
			}
			if id == first {
				out = append(out, n.PeerAddr)
			} else {
				rest = append(rest, n.PeerAddr)
			}
		}
	})
	if c.raft != nil {
		if future := c.raft.GetConfiguration(); future.Error() == nil {
			for _, server := range future.Configuration().Servers {
				if string(server.ID) != c.cfg.NodeID {
					rest = append(rest, string(server.Address))
				}
			}
		}
	}
	sort.Strings(rest)
	return dedupe(append(out, rest...))
}

// RefreshGossipKeys asks a member over mTLS for its gossip keys and
// installs those this node lacks, the member's primary as this node's if
// it did not hold it or the member cannot read this node's: what a node
// that was down while the key was rotated needs before gossip lets it in
// again (TestGossipKeyringOfANodeThatMissedTheRotation). It changes
// nothing when no member answers.
func (c *Cluster) RefreshGossipKeys(ctx context.Context) error {
	g := c.cfg.GossipKeys
	if g == nil || g.Fetch == nil {
		return nil
	}
	var errs []string
	refused := 0 // members that refused this node's certificate, or showed one it does not trust
	for _, member := range c.secretPeers("") {
		keys, err := c.fetchGossipKeys(ctx, member)
		if err != nil {
			errs = append(errs, err.Error())
			if errors.Is(err, peer.ErrCertificateRefused) || errors.Is(err, peer.ErrWrongCluster) {
				refused++
			}
			if ctx.Err() != nil {
				break
			}
			continue
		}
		if len(keys) == 0 {
			continue
		}
		before := g.PrimaryID()
		held := g.byID(GossipKeyID(keys[0])) != nil
		// The member's primary becomes this node's when this node did
		// not hold it, or when the member cannot read this node's
		// primary: a node that installed the new key but stopped before
		// the switch holds both, the old one first, and the cluster has
		// dropped the old one since. Kept, it would gossip under a key no
		// member reads, never be seen alive, never be taken back into
		// raft, and so never apply the log that would switch it.
		readable := slices.ContainsFunc(keys, func(key []byte) bool { return GossipKeyID(key) == before })
		if err := g.add(keys, !held || !readable); err != nil {
			return err
		}
		if after := g.PrimaryID(); after != before {
			c.logger.Info("gossip: installed the cluster's current gossip key from a member", "key", after, "was", before, "from", member)
		}
		return nil
	}
	if len(errs) > 0 && refused == len(errs) {
		return fmt.Errorf("%w: %s", ErrTrustLost, strings.Join(errs, "; "))
	}
	if len(errs) > 0 {
		return fmt.Errorf("no member gave its gossip keys: %s", strings.Join(errs, "; "))
	}
	return nil
}

// ErrTrustLost: every member asked refused this node's certificate or
// showed one from a CA this node does not trust: the cluster's CA was
// rotated while the node was away and it has no certificate from the new
// one (carotation.go), or its data directory is another cluster's.
var ErrTrustLost = errors.New("every member refused this node's certificate, or showed one from a CA this node does not trust")

// RotateGossipKey starts a rotation to key, which this node holds from
// then on (it is added to its keyring first). The rotation goes on by
// itself (gossipKeyLoop); GossipKeyState tells how far it is.
func (c *Cluster) RotateGossipKey(ctx context.Context, key []byte) (GossipKeyRotation, error) {
	if err := c.Requires(FeatureGossipKeyRotation); err != nil {
		return GossipKeyRotation{}, err
	}
	g := c.cfg.GossipKeys
	if g == nil {
		return GossipKeyRotation{}, fmt.Errorf("%w: this node's gossip keyring cannot change", ErrInvalid)
	}
	if err := memberlist.ValidateKey(key); err != nil {
		return GossipKeyRotation{}, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if r := c.GossipKeyState().Rotation; r != nil {
		return GossipKeyRotation{}, fmt.Errorf("%w: a rotation to gossip key %s is under way (phase %s); wait for it to end (herd cluster info)", ErrBusy, r.Key, r.Phase)
	}
	g.mu.Lock()
	g.pending = key
	g.mu.Unlock()
	defer func() {
		g.mu.Lock()
		g.pending = nil
		g.mu.Unlock()
	}()
	if err := g.add([][]byte{key}, false); err != nil {
		return GossipKeyRotation{}, err
	}
	return c.cmds().StartGossipKeyRotation(ctx, GossipKeyID(key), c.cfg.NodeID)
}

// gossipKeyInterval is how often a node compares its keyring with the log
// when nothing was applied.
const gossipKeyInterval = time.Second

// gossipKeyLoop keeps this node's keyring where the log says the rotation
// is, reports each step, and, on the leader, moves the rotation on.
func (c *Cluster) gossipKeyLoop() {
	defer c.wg.Done()
	if c.cfg.GossipKeys == nil {
		return
	}
	var lastErr string
	for {
		changed := c.fsm.Changes()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := c.syncGossipKeys(ctx)
		cancel()
		if err != nil && err.Error() != lastErr {
			c.logger.Warn("gossip key rotation: this node's step failed, retrying", "err", err)
		}
		lastErr = ""
		if err != nil {
			lastErr = err.Error()
		}
		select {
		case <-c.stop:
			return
		case <-changed:
		case <-time.After(gossipKeyInterval):
		}
	}
}

// syncGossipKeys is one turn of gossipKeyLoop.
func (c *Cluster) syncGossipKeys(ctx context.Context) error {
	g := c.cfg.GossipKeys
	var ring GossipKeyring
	var member bool
	var missingInstall, missingUse []string
	c.fsm.View(func(s *State) {
		ring = s.GossipKeys
		if r := ring.Rotation; r != nil {
			copied := *r
			copied.Installed, copied.Using = slices.Clone(r.Installed), slices.Clone(r.Using)
			ring.Rotation = &copied
			missingInstall, missingUse = s.Missing(r.Installed), s.Missing(r.Using)
		}
		_, member = s.Nodes[c.cfg.NodeID]
	})
	r := ring.Rotation
	if r == nil {
		if (ring.Primary == "" || g.PrimaryID() == ring.Primary) && len(g.Keyring.GetKeys()) == 1 {
			return nil
		}
		// This node's view may be old (it just started): act on the
		// leader's.
		if err := c.Sync(ctx); err != nil {
			return nil
		}
		if ring = c.GossipKeyState(); ring.Rotation != nil {
			return nil // the next turn
		}
		if ring.Primary != "" && g.PrimaryID() != ring.Primary {
			// The rotation ended while this node was away.
			if g.byID(ring.Primary) == nil {
				if err := c.fetchGossipKey(ctx, ring.Primary, ""); err != nil {
					return fmt.Errorf("fetching the cluster's gossip key %s: %w", ring.Primary, err)
				}
			}
			if err := g.use(ring.Primary); err != nil {
				return err
			}
		}
		if len(g.Keyring.GetKeys()) > 1 {
			return g.keepPrimaryOnly()
		}
		return nil
	}
	if !member {
		return nil // not in the log yet: its join reports nothing
	}
	if g.byID(r.Key) == nil {
		if err := c.fetchGossipKey(ctx, r.Key, r.Holder); err != nil {
			return fmt.Errorf("fetching gossip key %s: %w", r.Key, err)
		}
	}
	self := c.cfg.NodeID
	if !slices.Contains(r.Installed, self) {
		if err := c.cmds().ReportGossipKey(ctx, r.Key, false); err != nil && !errors.Is(err, ErrNotFound) {
			return fmt.Errorf("reporting gossip key %s installed: %w", r.Key, err)
		}
	}
	if r.Phase == GossipKeyUse {
		if err := g.use(r.Key); err != nil {
			return err
		}
		if !slices.Contains(r.Using, self) {
			if err := c.cmds().ReportGossipKey(ctx, r.Key, true); err != nil && !errors.Is(err, ErrNotFound) {
				return fmt.Errorf("reporting gossip key %s in use: %w", r.Key, err)
			}
		}
	}
	if !c.IsLeader() {
		return nil
	}
	switch {
	case r.Phase == GossipKeyInstall && len(missingInstall) == 0:
		return ignoreRace(c.cmds().GossipKeyStep(ctx, GossipKeyOpSwitch, r.Key))
	case r.Phase == GossipKeyUse && len(missingUse) == 0:
		return ignoreRace(c.cmds().GossipKeyStep(ctx, GossipKeyOpDone, r.Key))
	}
	return nil
}

// ignoreRace drops the refusals of a step another turn took already or
// that a node's arrival postponed: the next turn looks again.
func ignoreRace(err error) error {
	if errors.Is(err, ErrBusy) || errors.Is(err, ErrNotFound) || errors.Is(err, ErrInvalid) {
		return nil
	}
	return err
}
