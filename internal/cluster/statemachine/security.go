package statemachine

// Credentials in the log: the join secret's hash, admin tokens, NBD
// clients and nodes removed for good. Every node checks a credential
// against its own applied copy of the log, so a change (a revoke) takes
// effect on a node as soon as it applied the entry: on every node within
// the replication delay. Secrets never enter the log, only their SHA-256
// (pki.HashSecret); a log or snapshot read by an attacker gives no
// credential.

import (
	"fmt"
	"path"
	"regexp"
	"sort"
	"time"
)

// Token is an admin API credential. Its scope: a token that is not
// ReadOnly may do anything, VDI data included; a ReadOnly one may only
// read the cluster's state (GET), and reads VDI data (an NBD session
// certificate, GET /v1/nbd-session) only with Data.
type Token struct {
	ID       string `json:"id"`
	Name     string `json:"name"`
	Hash     string `json:"hash"` // hex SHA-256 of the secret
	ReadOnly bool   `json:"read_only"`
	// Data lets a read-only token read VDI data. Gated by
	// FeatureDataScope: below its level the field is ignored (cleared
	// when the create is applied), as older binaries (which drop it) do,
	// so every node's state stays the same.
	Data    bool      `json:"data,omitempty"`
	Created time.Time `json:"created"`
	Revoked bool      `json:"revoked,omitempty"`
}

// ReadsData says whether the token may read VDI data: an admin token, or
// a read-only one with the data scope.
func (t Token) ReadsData() bool { return !t.ReadOnly || t.Data }

// Scope names the token's scope as the CLI and the docs do: "admin",
// "read-only" (the cluster's state, no VDI data) or "read-only+data".
func (t Token) Scope() string {
	switch {
	case !t.ReadOnly:
		return "admin"
	case t.Data:
		return "read-only+data"
	}
	return "read-only"
}

// Client is an NBD client certificate's authorization: the VDIs it may
// see and open (a shell pattern on the VDI name), read-only or not, and
// the certificate's serial (a reissued or forged certificate with the
// same name but another serial is refused).
type Client struct {
	Name     string    `json:"name"`
	Pattern  string    `json:"pattern"`
	ReadOnly bool      `json:"read_only"`
	Serial   string    `json:"serial"`
	Created  time.Time `json:"created"`
	Revoked  bool      `json:"revoked,omitempty"`
	// Expires is when its certificate expires (from LevelSecurity; zero
	// in records made before: pki's client validity from Created).
	Expires time.Time `json:"expires,omitzero"`
	// Previous is the serial of the certificate a renewal during a CA
	// rotation replaced (client add --renew): accepted too until the
	// rotation finishes (carotation.go).
	Previous string `json:"previous_serial,omitempty"`
	// Renew, in the add command only: replace the live record of this
	// name, keeping its pattern and scope (from LevelSecurity).
	Renew bool `json:"renew,omitempty"`
}

// Accepts says whether the record lets in the certificate of serial.
func (c Client) Accepts(serial string) bool {
	return !c.Revoked && (c.Serial == serial || c.Previous != "" && c.Previous == serial)
}

// Security limits.
const (
	MaxCredentialName = 64
	maxHashLength     = 128
	maxPatternLength  = 256
)

var credentialNameRegexp = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9._-]*$`)

// ValidateCredentialName checks a token or client name.
func ValidateCredentialName(kind, name string) error {
	switch {
	case name == "":
		return fmt.Errorf("%w: %s name is empty", ErrInvalid, kind)
	case len(name) > MaxCredentialName:
		return fmt.Errorf("%w: %s name is %d characters long, the limit is %d", ErrInvalid, kind, len(name), MaxCredentialName)
	case !credentialNameRegexp.MatchString(name):
		return fmt.Errorf("%w: %s name %q: use letters, digits, '.', '_' and '-', not starting with '.' or '-'", ErrInvalid, kind, name)
	}
	return nil
}

// ValidatePattern checks a client's VDI pattern (path.Match syntax).
func ValidatePattern(pattern string) error {
	if pattern == "" || len(pattern) > maxPatternLength {
		return fmt.Errorf("%w: vdi pattern must be 1 to %d characters", ErrInvalid, maxPatternLength)
	}
	if _, err := matchPattern(pattern, "x"); err != nil {
		return fmt.Errorf("%w: vdi pattern %q: %v", ErrInvalid, pattern, err)
	}
	return nil
}

const (
	commandSecurityInit  commandType = 15
	commandTokenCreate   commandType = 16
	commandTokenRevoke   commandType = 17
	commandClientAdd     commandType = 18
	commandClientRevoke  commandType = 19
	commandNodeRemove    commandType = 20
	commandJoinSecretSet commandType = 21
)

type (
	securityInitCommand struct {
		JoinHash string `json:"join_hash"`
		Admin    Token  `json:"admin"`
		// Level is a new cluster's feature level: the highest its first
		// node supports (0 from binaries older than feature levels).
		Level int `json:"level,omitempty"`
		// Self admits the first node (from LevelSecurity on).
		Self *nodeAdmitCommand `json:"self,omitempty"`
	}
	tokenRevokeCommand struct {
		ID string `json:"id"`
	}
	clientRevokeCommand struct {
		Name string `json:"name"`
	}
	nodeRemoveCommand struct {
		ID   string    `json:"id"`
		Time time.Time `json:"time"`
	}
	joinSecretCommand struct {
		Hash string `json:"hash"`
	}
)

func init() {
	commands[commandSecurityInit] = applySecurityInit
	commands[commandTokenCreate] = applyTokenCreate
	commands[commandTokenRevoke] = applyTokenRevoke
	commands[commandClientAdd] = applyClientAdd
	commands[commandClientRevoke] = applyClientRevoke
	commands[commandNodeRemove] = applyNodeRemove
	commands[commandJoinSecretSet] = applyJoinSecretSet
}

func validToken(t Token) error {
	if t.ID == "" || len(t.ID) > 32 || t.Hash == "" || len(t.Hash) > maxHashLength {
		return fmt.Errorf("%w: malformed token", ErrInvalid)
	}
	return ValidateCredentialName("token", t.Name)
}

// applySecurityInit records the first node's join secret and admin token,
// once: a second init (a retry after a lost answer) changes nothing.
func applySecurityInit(s *State, data []byte) (any, error) {
	var c securityInitCommand
	if err := decode(data, &c); err != nil {
		return nil, err
	}
	if c.JoinHash == "" || len(c.JoinHash) > maxHashLength {
		return nil, fmt.Errorf("%w: malformed join secret", ErrInvalid)
	}
	if err := validToken(c.Admin); err != nil {
		return nil, err
	}
	if s.JoinHash != "" {
		return nil, nil
	}
	if c.Level >= LevelSecurity {
		if c.Self == nil {
			return nil, fmt.Errorf("%w: a cluster at feature level %d starts with its first node admitted", ErrInvalid, c.Level)
		}
		if err := validAdmission(c.Self.ID, c.Self.Serial); err != nil {
			return nil, err
		}
	}
	s.JoinHash = c.JoinHash
	s.Tokens[c.Admin.ID] = &c.Admin
	if c.Level > s.Level() {
		s.FeatureLevel = c.Level
	}
	if c.Level >= LevelSecurity {
		s.Admitted = map[string]string{c.Self.ID: c.Self.Serial}
	}
	return nil, nil
}

func applyTokenCreate(s *State, data []byte) (any, error) {
	var t Token
	if err := decode(data, &t); err != nil {
		return nil, err
	}
	if err := validToken(t); err != nil {
		return nil, err
	}
	if _, ok := s.Tokens[t.ID]; ok {
		return nil, fmt.Errorf("token %s: %w", t.ID, ErrAlreadyExists)
	}
	for _, other := range s.Tokens {
		if other.Name == t.Name && !other.Revoked {
			return nil, fmt.Errorf("token %q: %w", t.Name, ErrAlreadyExists)
		}
	}
	t.Revoked = false
	if !t.ReadOnly || s.Level() < FeatureDataScope.Level {
		t.Data = false // an admin token reads data anyway; below the level as older binaries
	}
	s.Tokens[t.ID] = &t
	return t, nil
}

func applyTokenRevoke(s *State, data []byte) (any, error) {
	var c tokenRevokeCommand
	if err := decode(data, &c); err != nil {
		return nil, err
	}
	t, ok := s.Tokens[c.ID]
	if !ok {
		for _, other := range s.Tokens {
			if other.Name == c.ID && !other.Revoked {
				t, ok = other, true
			}
		}
	}
	if !ok {
		return nil, fmt.Errorf("token %q: %w", c.ID, ErrNotFound)
	}
	t.Revoked = true
	return *t, nil
}

func applyClientAdd(s *State, data []byte) (any, error) {
	var c Client
	if err := decode(data, &c); err != nil {
		return nil, err
	}
	if err := ValidateCredentialName("client", c.Name); err != nil {
		return nil, err
	}
	if err := ValidatePattern(c.Pattern); err != nil {
		return nil, err
	}
	if c.Serial == "" || len(c.Serial) > 64 {
		return nil, fmt.Errorf("%w: malformed client serial", ErrInvalid)
	}
	if s.Level() < LevelSecurity {
		c.Renew, c.Expires = false, time.Time{} // as older binaries, which drop them
	}
	renew := c.Renew
	c.Renew, c.Previous = false, ""
	old, ok := s.Clients[c.Name]
	switch {
	case renew && (!ok || old.Revoked):
		return nil, fmt.Errorf("client %q: %w: nothing to renew (herd client add without --renew)", c.Name, ErrNotFound)
	case renew:
		// The same name, pattern and scope; the old certificate is
		// refused from now on, or, during a CA rotation, once it ends.
		c.Pattern, c.ReadOnly = old.Pattern, old.ReadOnly
		if s.CA.Rotation != nil {
			// The certificate from before the rotation: a second
			// renewal during it replaces the first one's (from the new
			// CA), not that one, which works until the finish and
			// comes back at a cancel.
			c.Previous = old.Serial
			if old.Previous != "" {
				c.Previous = old.Previous
			}
		}
		s.note("credentials", "client %s renewed (certificate %s)", c.Name, c.Serial)
	case ok && !old.Revoked:
		return nil, fmt.Errorf("client %q: %w (revoke it first, or renew it: client add --renew)", c.Name, ErrAlreadyExists)
	}
	c.Revoked = false
	s.Clients[c.Name] = &c
	return c, nil
}

func applyClientRevoke(s *State, data []byte) (any, error) {
	var c clientRevokeCommand
	if err := decode(data, &c); err != nil {
		return nil, err
	}
	client, ok := s.Clients[c.Name]
	if !ok {
		return nil, fmt.Errorf("client %q: %w", c.Name, ErrNotFound)
	}
	client.Revoked = true
	return *client, nil
}

// applyNodeRemove forgets a dead node for good: its certificate is refused
// from then on and gossip never brings it back.
func applyNodeRemove(s *State, data []byte) (any, error) {
	var c nodeRemoveCommand
	if err := decode(data, &c); err != nil {
		return nil, err
	}
	n, ok := s.Nodes[c.ID]
	if !ok {
		// Admitted but never a member (its join stopped half way, or
		// the join secret was used by someone else): removed as well.
		if _, admitted := s.Admitted[c.ID]; !admitted {
			return nil, fmt.Errorf("node %s: %w", c.ID, ErrNotFound)
		}
		delete(s.Admitted, c.ID)
		s.Removed[c.ID] = c.Time
		return nil, nil
	}
	if n.State == NodeAlive {
		return nil, fmt.Errorf("%w: node %s is alive; stop it first (it is removed once the cluster has seen it gone)", ErrBusy, c.ID)
	}
	s.Removed[c.ID] = c.Time
	delete(s.Admitted, c.ID)
	return nil, nil
}

func applyJoinSecretSet(s *State, data []byte) (any, error) {
	var c joinSecretCommand
	if err := decode(data, &c); err != nil {
		return nil, err
	}
	if c.Hash == "" || len(c.Hash) > maxHashLength {
		return nil, fmt.Errorf("%w: malformed join secret", ErrInvalid)
	}
	if s.JoinHash == "" {
		return nil, fmt.Errorf("%w: the cluster's credentials are not set up yet", ErrNotFound)
	}
	s.JoinHash = c.Hash
	return nil, nil
}

// JoinHash is the hash of the current join secret ("" before the first
// node recorded it).
func (c *Reads) JoinHash() (hash string) {
	c.fsm.View(func(s *State) { hash = s.JoinHash })
	return hash
}

// Tokens lists the tokens (hashes included: callers show what they need).
func (c *Reads) Tokens() []Token {
	var out []Token
	c.fsm.View(func(s *State) {
		for _, t := range s.Tokens {
			out = append(out, *t)
		}
	})
	sort.Slice(out, func(i, j int) bool {
		return out[i].Created.Before(out[j].Created) || out[i].Created.Equal(out[j].Created) && out[i].ID < out[j].ID
	})
	return out
}

// LookupToken returns the token with id as this node's log has it.
func (c *Reads) LookupToken(id string) (t Token, ok bool) {
	c.fsm.View(func(s *State) {
		if p, found := s.Tokens[id]; found {
			t, ok = *p, true
		}
	})
	return t, ok
}

// Clients lists the NBD clients by name.
func (c *Reads) Clients() []Client {
	var out []Client
	c.fsm.View(func(s *State) {
		for _, client := range s.Clients {
			out = append(out, *client)
		}
	})
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// LookupClient returns the client named name as this node's log has it.
func (c *Reads) LookupClient(name string) (client Client, ok bool) {
	c.fsm.View(func(s *State) {
		if p, found := s.Clients[name]; found {
			client, ok = *p, true
		}
	})
	return client, ok
}

// NodeRemoved reports whether id was removed for good.
func (c *Reads) NodeRemoved(id string) (removed bool) {
	c.fsm.View(func(s *State) { _, removed = s.Removed[id] })
	return removed
}

// MatchPattern reports whether a VDI name matches a client's pattern.
func MatchPattern(pattern, name string) bool {
	ok, err := matchPattern(pattern, name)
	return err == nil && ok
}

func matchPattern(pattern, name string) (bool, error) { return path.Match(pattern, name) }
