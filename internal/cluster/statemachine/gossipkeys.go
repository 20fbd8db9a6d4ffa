package statemachine

// Gossip key rotation (from LevelSecurity): memberlist encrypts with the
// first key of a node's keyring and decrypts with any of them, and its
// keyring is per node. herd distributes: `herd cluster rotate-gossip-key`
// makes a new key on the node asked, which adds it to its own keyring and
// commits the key's id (never the key: secrets stay out of the log) with
// the phase "install". Every node fetches the key over mTLS from a member
// that holds it (the peer protocol "secrets", which only admitted nodes
// reach), adds it, and reports it installed. Once every alive member did,
// the leader commits "use": every node encrypts with the new key and
// reports it. Once every alive member did, the leader commits the end:
// the new key is the cluster's, and every node removes the others. At no
// step may a node send with a key an alive member cannot read. A node that
// was down fetches the keyring of a member over mTLS when it starts (and
// whenever gossip has left it alone), so it never needs a key it missed.
//
// The log holds the phase and who reported what, so each step is in
// `herd events` and the rules are checked by every node alike: the switch
// is refused until every alive member installed the key, the end until
// every alive member uses it.

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"
)

// GossipKeyring is the log's record of the cluster's gossip key.
type GossipKeyring struct {
	// Primary is the id of the key every node encrypts with ("": the
	// key the first node made, never rotated).
	Primary string `json:"primary,omitempty"`
	// Rotated is when the last rotation ended.
	Rotated time.Time `json:"rotated,omitzero"`
	// Rotation is the rotation under way, if any.
	Rotation *GossipKeyRotation `json:"rotation,omitempty"`
}

// GossipKeyRotation is a gossip key rotation under way.
type GossipKeyRotation struct {
	Key     string    `json:"key"`           // the new key's id
	Old     string    `json:"old,omitempty"` // the id of the key it replaces ("": the first key)
	Phase   string    `json:"phase"`         // GossipKeyInstall, then GossipKeyUse
	Started time.Time `json:"started"`
	// Holder is the node that made the key: the first to fetch it from.
	Holder string `json:"holder"`
	// Installed and Using are the nodes that reported the key in their
	// keyring, and encrypting with it.
	Installed []string `json:"installed,omitempty"`
	Using     []string `json:"using,omitempty"`
}

// Phases of a gossip key rotation.
const (
	GossipKeyInstall = "install"
	GossipKeyUse     = "use"
)

// FeatureGossipKeyRotation gates the rotation's log records.
var FeatureGossipKeyRotation = Feature{Name: "gossip key rotation (cluster rotate-gossip-key)", Level: LevelSecurity}

const commandGossipKey commandType = 34

func init() {
	if commands[commandGossipKey] != nil {
		panic("cluster: command type 34 registered twice")
	}
	commands[commandGossipKey] = applyGossipKey
}

// Operations of commandGossipKey.
const (
	gossipKeyStart     = "start"     // a rotation begins: Key, Node (the holder)
	gossipKeyInstalled = "installed" // Node holds Key
	GossipKeyOpSwitch  = "switch"    // every alive member holds Key: use it
	gossipKeyUsing     = "using"     // Node encrypts with Key
	GossipKeyOpDone    = "done"      // every alive member uses Key: the others go
)

type gossipKeyCommand struct {
	Op   string    `json:"op"`
	Key  string    `json:"key"`
	Node string    `json:"node,omitempty"`
	Time time.Time `json:"time"`
}

func (c gossipKeyCommand) check() error {
	if err := checkLength("node id", c.Node, MaxOwnerLength); err != nil {
		return err
	}
	if !validGossipKeyID(c.Key) {
		return fmt.Errorf("%w: gossip key id %q", ErrInvalid, truncateRunes(c.Key, 64))
	}
	return nil
}

// gossipKeyIDLength is the length of GossipKeyID's result.
const gossipKeyIDLength = 16

func validGossipKeyID(id string) bool {
	if len(id) != gossipKeyIDLength {
		return false
	}
	_, err := hex.DecodeString(id)
	return err == nil
}

// GossipKeyID names a gossip key in the log and in events: 8 bytes of a
// hash of it, which says nothing about the key.
func GossipKeyID(key []byte) string {
	sum := sha256.Sum256(append([]byte("herd gossip key id\x00"), key...))
	return hex.EncodeToString(sum[:gossipKeyIDLength/2])
}

// aliveMembers are the nodes the log has alive and not removed: the ones a
// rotation waits for.
func (s *State) aliveMembers() []string {
	var out []string
	for _, id := range s.AliveNodes() {
		if _, removed := s.Removed[id]; !removed {
			out = append(out, id)
		}
	}
	return out
}

// missing returns the alive members not in reported.
func (s *State) Missing(reported []string) []string {
	var out []string
	for _, id := range s.aliveMembers() {
		if !slices.Contains(reported, id) {
			out = append(out, id)
		}
	}
	return out
}

func applyGossipKey(s *State, data []byte) (any, error) {
	var c gossipKeyCommand
	if err := decode(data, &c); err != nil {
		return nil, err
	}
	if s.Level() < FeatureGossipKeyRotation.Level {
		return nil, fmt.Errorf("%w: gossip key rotation needs cluster feature level %d, the cluster is at %d", ErrUpgradeRequired, FeatureGossipKeyRotation.Level, s.Level())
	}
	r := s.GossipKeys.Rotation
	if c.Op != gossipKeyStart && (r == nil || r.Key != c.Key) {
		return nil, fmt.Errorf("%w: no rotation to gossip key %s is under way", ErrNotFound, c.Key)
	}
	switch c.Op {
	case gossipKeyStart:
		if r != nil {
			return nil, fmt.Errorf("%w: a rotation to gossip key %s is under way (phase %s, since %s)", ErrBusy, r.Key, r.Phase, r.Started.UTC().Format(time.RFC3339))
		}
		if c.Key == s.GossipKeys.Primary {
			return nil, fmt.Errorf("%w: gossip key %s is the cluster's already", ErrInvalid, c.Key)
		}
		if c.Node == "" {
			return nil, fmt.Errorf("%w: a gossip key rotation names the node holding the new key", ErrInvalid)
		}
		s.GossipKeys.Rotation = &GossipKeyRotation{Key: c.Key, Old: s.GossipKeys.Primary, Phase: GossipKeyInstall, Started: c.Time, Holder: c.Node}
		s.note("credentials", "gossip key rotation started: new key %s made by node %s; every node installs it", c.Key, c.Node)
		return *s.GossipKeys.Rotation, nil
	case gossipKeyInstalled, gossipKeyUsing:
		if _, ok := s.Nodes[c.Node]; !ok {
			return nil, fmt.Errorf("node %q: %w", c.Node, ErrNotFound)
		}
		list := &r.Installed
		if c.Op == gossipKeyUsing {
			if r.Phase != GossipKeyUse {
				return nil, fmt.Errorf("%w: gossip key %s is not in use yet (phase %s)", ErrInvalid, c.Key, r.Phase)
			}
			list = &r.Using
		}
		if slices.Contains(*list, c.Node) {
			return nil, nil // reported before (a retry)
		}
		*list = append(*list, c.Node)
		sort.Strings(*list)
		if c.Op == gossipKeyInstalled {
			s.note("credentials", "node %s installed gossip key %s", c.Node, c.Key)
		} else {
			s.note("credentials", "node %s encrypts gossip with key %s", c.Node, c.Key)
		}
		return nil, nil
	case GossipKeyOpSwitch:
		if r.Phase != GossipKeyInstall {
			return nil, fmt.Errorf("%w: gossip key %s is in phase %s", ErrInvalid, c.Key, r.Phase)
		}
		if missing := s.Missing(r.Installed); len(missing) > 0 {
			return nil, fmt.Errorf("%w: nodes %s have not installed gossip key %s yet", ErrBusy, strings.Join(missing, ", "), c.Key)
		}
		r.Phase = GossipKeyUse
		s.note("credentials", "every node holds gossip key %s: each switches to it", c.Key)
		return nil, nil
	case GossipKeyOpDone:
		if r.Phase != GossipKeyUse {
			return nil, fmt.Errorf("%w: gossip key %s is in phase %s", ErrInvalid, c.Key, r.Phase)
		}
		if missing := s.Missing(r.Using); len(missing) > 0 {
			return nil, fmt.Errorf("%w: nodes %s do not encrypt with gossip key %s yet", ErrBusy, strings.Join(missing, ", "), c.Key)
		}
		old := r.Old
		if old == "" {
			old = "(the first)"
		}
		s.GossipKeys = GossipKeyring{Primary: c.Key, Rotated: c.Time}
		s.note("credentials", "gossip key %s in use on every node: the old key %s is removed everywhere", c.Key, old)
		return nil, nil
	}
	return nil, fmt.Errorf("%w: gossip key operation %q", ErrInvalid, c.Op)
}

// GossipKeyState is the log's record of the gossip key.
func (c *Reads) GossipKeyState() (k GossipKeyring) {
	c.fsm.View(func(s *State) { k = s.GossipKeys.Clone() })
	return k
}

// Clone returns a copy of the keyring record that shares nothing with it.
func (in GossipKeyring) Clone() GossipKeyring {
	out := in
	if r := in.Rotation; r != nil {
		copied := *r
		copied.Installed, copied.Using = slices.Clone(r.Installed), slices.Clone(r.Using)
		out.Rotation = &copied
	}
	return out
}
