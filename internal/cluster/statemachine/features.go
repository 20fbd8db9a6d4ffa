package statemachine

// Feature levels: the mixed-version rule (docs/UPGRADE.md).
//
// Every herd binary supports the feature levels up to SupportedLevel and
// says so in its gossip metadata. The log records the cluster's level: the
// features every member may rely on. A command, a field of a command, a
// peer opcode or an on-disk format that older binaries do not know is
// used only once the cluster's level allows it; below it the old form is
// used, or the request is refused with an error naming the nodes that
// must be upgraded (ErrUpgradeRequired).
//
// The level rises only when an operator runs `herd cluster
// finalize-upgrade` (FinalizeUpgrade), which the leader commits only once
// every member reports that it supports the new level; it never falls.
// It is not raised automatically when the last node is upgraded: until
// the finalize an upgrade can be rolled back by putting the old binaries
// back, and the operator, not the last restart, decides when that chance
// is given up (Ceph's require-osd-release, CockroachDB's cluster version).
// A node whose binary supports less than the cluster's level is not
// admitted: its join is refused with a message saying so (join handler,
// reconcile), and a member that restarts on such a binary stops applying
// the log at the first entry it does not know (FSM.ApplyBatch).

import (
	"errors"
	"fmt"
	"time"
)

const (
	// LevelBase is what every herd before feature levels supports, and
	// the level of a cluster whose log never raised it.
	LevelBase = 1
	// LevelVDICopies: `vdi create --copies N` records a VDI's own number
	// of copies in the create command (older binaries would drop the
	// field and use the cluster's).
	LevelVDICopies = 2
	// LevelSecurity: the security pass's records, which older binaries
	// would drop: nodes admitted by id and certificate serial (the peer
	// allow-list; admission.go) and the scopes of admin tokens.
	LevelSecurity = 3
	// LevelCopyDigests: recovery asks other nodes for the content digest
	// of their copies (the object protocol's STAT with
	// object.FlagDigest, which older binaries refuse), so that a node
	// back from a restart restamps its copies that tie with the newest
	// stamp when they hold the same bytes, and fetches them otherwise.
	// Below it such a copy is fetched (internal/recovery).
	LevelCopyDigests = 4
	// LevelSessionProof: a node that asks a holder of the CA key to sign
	// an NBD session certificate sends the secret of the admin token it
	// is for, and the holder checks it against the log (server/signing.go):
	// a node certificate alone signs no session. Below it a holder also
	// signs a request without the secret (older builds send none).
	LevelSessionProof = 5
	// LevelErasureCoding: erasure-coded VDIs (`vdi create --ec K+M`): the
	// scheme in the create command and in the VDI (older binaries would
	// drop it and create a VDI of copies), and everything of the data
	// path that only an erasure-coded VDI uses (docs/ARCHITECTURE.md,
	// "Erasure-coded VDIs").
	LevelErasureCoding = 6

	// SupportedLevel is the highest level this binary supports.
	SupportedLevel = LevelErasureCoding
)

// Feature is one change gated by a level.
type Feature struct {
	Name  string
	Level int
}

var (
	FeatureVDICopies     = Feature{Name: "a VDI's own number of copies (vdi create --copies)", Level: LevelVDICopies}
	FeatureErasureCoding = Feature{Name: "erasure-coded VDIs (vdi create --ec)", Level: LevelErasureCoding}
	FeatureDataScope     = Feature{Name: "read-only tokens that may read VDI data (token create --read-only --data)", Level: LevelSecurity}
)

// ErrUpgradeRequired: the feature needs a cluster level not reached yet.
var ErrUpgradeRequired = errors.New("the cluster must be upgraded first")

const commandFeatureLevel commandType = 30

func init() {
	if commands[commandFeatureLevel] != nil {
		panic("cluster: command type 30 registered twice")
	}
	commands[commandFeatureLevel] = applyFeatureLevel
	errorCodes = append(errorCodes, struct {
		code string
		err  error
	}{"upgrade_required", ErrUpgradeRequired})
}

type featureLevelCommand struct {
	Level int       `json:"level"`
	Time  time.Time `json:"time"`
	// Admitted, when the level crosses LevelSecurity, names every
	// member's node certificate serial, as each proved it in a TLS
	// handshake with the proposer (admission.go).
	Admitted map[string]string `json:"admitted,omitempty"`
}

// Level is the cluster's feature level.
func (s *State) Level() int {
	return max(s.FeatureLevel, LevelBase)
}

func applyFeatureLevel(s *State, data []byte) (any, error) {
	var c featureLevelCommand
	if err := decode(data, &c); err != nil {
		return nil, err
	}
	if c.Level <= s.Level() {
		return nil, fmt.Errorf("%w: the cluster is at feature level %d already; it never goes back (asked for %d)", ErrInvalid, s.Level(), c.Level)
	}
	if s.Level() < LevelSecurity && c.Level >= LevelSecurity {
		// From here on peers are let in by these records only: every
		// member gets one, with the serial the finalize learnt from it
		// (FinalizeUpgrade always sends them all; a member without one
		// is bound by id only, admission.go).
		for id, serial := range c.Admitted {
			if err := validAdmission(id, serial); err != nil {
				return nil, err
			}
		}
		s.Admitted = map[string]string{}
		for id := range s.Nodes {
			if _, removed := s.Removed[id]; !removed {
				s.Admitted[id] = c.Admitted[id]
			}
		}
	}
	s.FeatureLevel = c.Level
	s.note("cluster", "cluster feature level raised to %d", c.Level)
	return s.Level(), nil
}

// Build is what a node reports about its binary in gossip: herd's
// version and commit, and the formats it speaks.
type Build struct {
	Version string `json:"v,omitempty"`
	Commit  string `json:"c,omitempty"` // at most 12 hex digits
	// Level is the highest feature level the binary supports; absent
	// (0) in nodes older than feature levels, which support LevelBase.
	Level        int `json:"l,omitempty"`
	StoreFormat  int `json:"o,omitempty"` // object file format it writes
	PeerProtocol int `json:"r,omitempty"` // object protocol version
	// Signs: the node holds the cluster CA's key (nodes admitted from
	// LevelSecurity on do not; they ask one that does, server/signing.go).
	Signs bool `json:"k,omitempty"`
}

// BuildInfo is Build as the admin API shows it (`node list --json`).
type BuildInfo struct {
	Version      string `json:"version,omitempty"`
	Commit       string `json:"commit,omitempty"`
	Level        int    `json:"feature_level"` // the highest it supports
	StoreFormat  int    `json:"object_format,omitempty"`
	PeerProtocol int    `json:"object_protocol,omitempty"`
	Signs        bool   `json:"holds_ca_key,omitempty"`
}

// Info is b for the admin API.
func (b Build) Info() BuildInfo {
	return BuildInfo{Version: b.Version, Commit: b.Commit, Level: b.SupportedLevel(), StoreFormat: b.StoreFormat, PeerProtocol: b.PeerProtocol, Signs: b.Signs}
}

// SupportedLevel says which level the node's binary supports.
func (b Build) SupportedLevel() int { return max(b.Level, LevelBase) }

// String is "herd VERSION (COMMIT)", or "an herd before feature levels".
func (b Build) String() string {
	if b.Version == "" && b.Level == 0 {
		return "a herd older than feature levels"
	}
	s := "herd " + b.Version
	if b.Commit != "" {
		s += " (" + b.Commit + ")"
	}
	return s
}

// maxBuildField bounds the version strings a node puts in its metadata
// (memberlist's 512 bytes hold the addresses, the zone and these).
const maxBuildField = 32

func (b Build) Bounded() Build {
	b.Version = truncateRunes(b.Version, maxBuildField)
	b.Commit = truncateRunes(b.Commit, 12)
	return b
}

func truncateRunes(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

func utf8RuneStart(b byte) bool { return b&0xC0 != 0x80 }

// Level is the cluster's feature level as this node has applied it.
func (c *Reads) Level() (level int) {
	c.fsm.View(func(s *State) { level = s.Level() })
	return level
}
