package statemachine

// Admission: from feature level LevelSecurity on, the log names every
// node allowed on the peer port by id and by the serial of its node
// certificate (State.Admitted). A join records the new node's id and
// serial before the node receives its certificate; peers accept a
// certificate only if the log names its id with that serial and the id
// was not removed (PeerAllowed). So neither a certificate minted with a
// copy of the CA key for an id never admitted, nor one for a member's id
// with another serial, nor a removed node's own, gets through on any
// peer protocol (raft, objects, forwarding, secrets, signing). Below the
// level only removed nodes are refused, as older binaries do.

import (
	"encoding/hex"
	"fmt"
	"time"
)

const commandNodeAdmit commandType = 31

func init() {
	if commands[commandNodeAdmit] != nil {
		panic("cluster: command type 31 registered twice")
	}
	commands[commandNodeAdmit] = applyNodeAdmit
}

type nodeAdmitCommand struct {
	ID     string    `json:"id"`
	Serial string    `json:"serial"`
	Time   time.Time `json:"time"`
	// JoinToken is the id of the join token the node presented ("": the
	// cluster's join secret); the admission uses it up (jointokens.go).
	JoinToken string `json:"join_token,omitempty"`
}

// maxSerialLength bounds a certificate serial in hex (pki uses 16 bytes).
const maxSerialLength = 64

func validAdmission(id, serial string) error {
	if len(id) == 0 || len(id) > MaxOwnerLength {
		return fmt.Errorf("%w: node id of %d bytes", ErrInvalid, len(id))
	}
	if serial == "" || len(serial) > maxSerialLength {
		return fmt.Errorf("%w: certificate serial of %d characters", ErrInvalid, len(serial))
	}
	if _, err := hex.DecodeString(serial); err != nil {
		return fmt.Errorf("%w: certificate serial %q is not hex", ErrInvalid, serial)
	}
	return nil
}

func applyNodeAdmit(s *State, data []byte) (any, error) {
	var c nodeAdmitCommand
	if err := decode(data, &c); err != nil {
		return nil, err
	}
	if s.Level() < LevelSecurity {
		return nil, fmt.Errorf("%w: admission records need cluster feature level %d, the cluster is at %d", ErrUpgradeRequired, LevelSecurity, s.Level())
	}
	if err := validAdmission(c.ID, c.Serial); err != nil {
		return nil, err
	}
	if _, removed := s.Removed[c.ID]; removed {
		return nil, fmt.Errorf("node %s was removed from the cluster for good: %w", c.ID, ErrForbidden)
	}
	// A node is admitted once: a second admission of an id would hand a
	// member's identity to whoever holds the join secret.
	if _, ok := s.Admitted[c.ID]; ok {
		return nil, fmt.Errorf("node %s %w: it was admitted before (start the new node on an empty data directory: it gets a new id)", c.ID, ErrAlreadyExists)
	}
	if _, ok := s.Nodes[c.ID]; ok {
		return nil, fmt.Errorf("node %s %w: it is a member", c.ID, ErrAlreadyExists)
	}
	if c.JoinToken != "" {
		if err := s.UseJoinToken(c.JoinToken, c.Time); err != nil {
			return nil, err
		}
	}
	if s.Admitted == nil {
		s.Admitted = map[string]string{}
	}
	s.Admitted[c.ID] = c.Serial
	s.note("node", "node %s admitted (certificate %s)", c.ID, c.Serial)
	return nil, nil
}

// PeerAllowed says whether a peer presenting a node certificate for id
// with serial may talk to this node (peer.Credentials.Allowed).
func (c *Reads) PeerAllowed(id, serial string) (err error) {
	return c.PeerAllowedUnder(id, serial, "")
}

// PeerAllowedUnder is PeerAllowed for a certificate that verified against
// the CA of fingerprint ca (peer.Credentials.AllowedUnder): during a CA
// rotation a node's certificate from the new CA is let in before its
// serial is recorded, and must match it once it is (carotation.go).
func (c *Reads) PeerAllowedUnder(id, serial, ca string) (err error) {
	c.fsm.View(func(s *State) { err = s.peerAllowed(id, serial, ca) })
	return err
}

// PeerAdmitted says whether id is admitted and not removed, whatever its
// certificate (a certificate from a CA this node learned from a member
// before its log names it: server/trust.go).
func (c *Reads) PeerAdmitted(id string) (err error) {
	c.fsm.View(func(s *State) {
		if _, removed := s.Removed[id]; removed {
			err = fmt.Errorf("node %s was removed from the cluster for good", id)
		} else if _, ok := s.Admitted[id]; !ok && s.Level() >= LevelSecurity {
			err = fmt.Errorf("node %s was never admitted to this cluster", id)
		}
	})
	return err
}

func (s *State) peerAllowed(id, serial, ca string) error {
	if _, removed := s.Removed[id]; removed {
		return fmt.Errorf("node %s was removed from the cluster for good", id)
	}
	if s.Level() < LevelSecurity {
		return nil
	}
	admitted, ok := s.Admitted[id]
	if r := s.CA.Rotation; ok && r != nil && ca == r.Fingerprint {
		if recorded, known := r.Certificates[id]; known && recorded != serial {
			return fmt.Errorf("certificate %s is not node %s's from the new CA (the log names %s)", serial, id, recorded)
		}
		return nil
	}
	switch {
	case !ok:
		return fmt.Errorf("node %s was never admitted to this cluster", id)
	case admitted != serial && admitted != "": // "": a member the level was raised without its serial
		return fmt.Errorf("certificate %s is not node %s's (the log names %s)", serial, id, admitted)
	}
	return nil
}

// KnownNode says whether id is a member, was admitted or was removed: a
// join of such an id is refused.
func (c *Reads) KnownNode(id string) (known bool) {
	c.fsm.View(func(s *State) {
		_, member := s.Nodes[id]
		_, admitted := s.Admitted[id]
		_, removed := s.Removed[id]
		known = member || admitted || removed
	})
	return known
}
