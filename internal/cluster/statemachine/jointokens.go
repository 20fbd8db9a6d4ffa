package statemachine

// Join tokens with a lifetime (from LevelSecurity): `herd cluster
// join-token create [--ttl D] [--uses N]` records a join secret's hash
// that admits nodes until it expires, is used up or is revoked. The
// cluster's own join secret (DATA/join.token of the first node, replaced
// by rotate-join-token) stays valid until rotated. A join is checked
// against the log after a read index from the leader (the join handler
// calls SyncForRead first), so a revoke or a rotation holds on every node
// once the command returns; the admission entry itself counts the use
// and refuses an expired, revoked or used-up token, so two joins racing
// for a token's last use cannot both win.

import (
	"fmt"
	"sort"
	"time"
)

// JoinToken is a join secret with a lifetime.
type JoinToken struct {
	ID      string    `json:"id"`
	Hash    string    `json:"hash,omitempty"` // SHA-256 of the secret
	Created time.Time `json:"created"`
	Expires time.Time `json:"expires"`
	// Uses is how many nodes it may admit (0: any number until it
	// expires); Used how many it did.
	Uses    int  `json:"uses,omitempty"`
	Used    int  `json:"used,omitempty"`
	Revoked bool `json:"revoked,omitempty"`
}

// Valid says whether the token admits a node at now.
func (t JoinToken) Valid(now time.Time) bool {
	return !t.Revoked && now.Before(t.Expires) && (t.Uses == 0 || t.Used < t.Uses)
}

// Join token limits.
const (
	DefaultJoinTokenTTL = 24 * time.Hour
	MaxJoinTokenTTL     = 365 * 24 * time.Hour
	maxJoinTokens       = 256 // recorded and not expired
)

// FeatureJoinTokens gates the join token records.
var FeatureJoinTokens = Feature{Name: "join tokens with a lifetime (cluster join-token create)", Level: LevelSecurity}

const (
	commandJoinTokenCreate commandType = 32
	commandJoinTokenRevoke commandType = 33
)

func init() {
	for _, t := range []commandType{commandJoinTokenCreate, commandJoinTokenRevoke} {
		if commands[t] != nil {
			panic(fmt.Sprintf("cluster: command type %d registered twice", t))
		}
	}
	commands[commandJoinTokenCreate] = applyJoinTokenCreate
	commands[commandJoinTokenRevoke] = applyJoinTokenRevoke
}

type joinTokenRevokeCommand struct {
	ID string `json:"id"`
}

func applyJoinTokenCreate(s *State, data []byte) (any, error) {
	var t JoinToken
	if err := decode(data, &t); err != nil {
		return nil, err
	}
	if s.Level() < FeatureJoinTokens.Level {
		return nil, fmt.Errorf("%w: join tokens need cluster feature level %d, the cluster is at %d", ErrUpgradeRequired, FeatureJoinTokens.Level, s.Level())
	}
	if t.ID == "" || len(t.ID) > 32 || t.Hash == "" || len(t.Hash) > maxHashLength || !t.Expires.After(t.Created) || t.Uses < 0 || t.Used != 0 || t.Revoked {
		return nil, fmt.Errorf("%w: malformed join token", ErrInvalid)
	}
	if _, ok := s.JoinTokens[t.ID]; ok {
		return nil, fmt.Errorf("join token %s %w", t.ID, ErrAlreadyExists)
	}
	// Expired tokens are forgotten here (the entry's time decides, so
	// every node forgets the same ones).
	live := 0
	for id, old := range s.JoinTokens {
		if !t.Created.Before(old.Expires) {
			delete(s.JoinTokens, id)
		} else {
			live++
		}
	}
	if live >= maxJoinTokens {
		return nil, fmt.Errorf("%w: %d join tokens are live; revoke some or let them expire", ErrExhausted, live)
	}
	if s.JoinTokens == nil {
		s.JoinTokens = map[string]*JoinToken{}
	}
	s.JoinTokens[t.ID] = &t
	s.note("cluster", "join token %s created, valid until %s", t.ID, t.Expires.UTC().Format(time.RFC3339))
	shown := t
	shown.Hash = ""
	return shown, nil
}

func applyJoinTokenRevoke(s *State, data []byte) (any, error) {
	var c joinTokenRevokeCommand
	if err := decode(data, &c); err != nil {
		return nil, err
	}
	t, ok := s.JoinTokens[c.ID]
	if !ok {
		return nil, fmt.Errorf("join token %q: %w", c.ID, ErrNotFound)
	}
	t.Revoked = true
	s.note("cluster", "join token %s revoked", c.ID)
	shown := *t
	shown.Hash = ""
	return shown, nil
}

// useJoinToken counts one admission against token id at now, or refuses.
func (s *State) UseJoinToken(id string, now time.Time) error {
	t, ok := s.JoinTokens[id]
	switch {
	case !ok:
		return fmt.Errorf("%w: join token %s is not known (expired and forgotten?)", ErrUnauthorized, id)
	case t.Revoked:
		return fmt.Errorf("%w: join token %s was revoked", ErrUnauthorized, id)
	case !now.Before(t.Expires):
		return fmt.Errorf("%w: join token %s expired at %s", ErrUnauthorized, id, t.Expires.UTC().Format(time.RFC3339))
	case t.Uses > 0 && t.Used >= t.Uses:
		return fmt.Errorf("%w: join token %s was used %d times, all it allows", ErrUnauthorized, id, t.Used)
	}
	t.Used++
	return nil
}

// JoinTokens lists the join tokens the log holds, oldest first, without
// their hashes.
func (c *Reads) JoinTokens() []JoinToken {
	var out []JoinToken
	c.fsm.View(func(s *State) {
		for _, t := range s.JoinTokens {
			shown := *t
			shown.Hash = ""
			out = append(out, shown)
		}
	})
	sort.Slice(out, func(i, j int) bool {
		return out[i].Created.Before(out[j].Created) || out[i].Created.Equal(out[j].Created) && out[i].ID < out[j].ID
	})
	return out
}
