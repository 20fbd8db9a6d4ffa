package cluster

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
	"context"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"sort"
	"time"

	"github.com/herd-storage/herd/internal/peer"
	"github.com/herd-storage/herd/internal/pki"
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
		if err := s.useJoinToken(c.JoinToken, c.Time); err != nil {
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

// Admit records that node id may join with the certificate of serial,
// through join token joinToken ("": the cluster's join secret).
func (c *Cluster) Admit(ctx context.Context, id, serial, joinToken string) error {
	return c.cmds().Admit(ctx, id, serial, joinToken)
}

// PeerAllowed says whether a peer presenting a node certificate for id
// with serial may talk to this node (peer.Credentials.Allowed).
func (c *Cluster) PeerAllowed(id, serial string) (err error) {
	return c.PeerAllowedUnder(id, serial, "")
}

// PeerAllowedUnder is PeerAllowed for a certificate that verified against
// the CA of fingerprint ca (peer.Credentials.AllowedUnder): during a CA
// rotation a node's certificate from the new CA is let in before its
// serial is recorded, and must match it once it is (carotation.go).
func (c *Cluster) PeerAllowedUnder(id, serial, ca string) (err error) {
	c.fsm.View(func(s *State) { err = s.peerAllowed(id, serial, ca) })
	return err
}

// PeerAdmitted says whether id is admitted and not removed, whatever its
// certificate (a certificate from a CA this node learned from a member
// before its log names it: server/trust.go).
func (c *Cluster) PeerAdmitted(id string) (err error) {
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
func (c *Cluster) KnownNode(id string) (known bool) {
	c.fsm.View(func(s *State) {
		_, member := s.Nodes[id]
		_, admitted := s.Admitted[id]
		_, removed := s.Removed[id]
		known = member || admitted || removed
	})
	return known
}

// memberSerials asks every member of the log (not removed) for its node
// certificate in a TLS handshake on its peer port and returns each one's
// serial: what the finalize to LevelSecurity records (a member proves the
// certificate it holds; gossip's word is not taken).
func (c *Cluster) memberSerials(ctx context.Context) (map[string]string, error) {
	creds := c.cfg.PeerCredentials
	if creds == nil || creds.Leaf() == nil {
		return nil, fmt.Errorf("%w: this node has no peer certificate to ask the others with", ErrInvalid)
	}
	type member struct{ id, address string }
	var members []member
	c.fsm.View(func(s *State) {
		for id, n := range s.Nodes {
			if _, removed := s.Removed[id]; !removed {
				members = append(members, member{id, n.PeerAddr})
			}
		}
	})
	sort.Slice(members, func(i, j int) bool { return members[i].id < members[j].id })
	serials := map[string]string{}
	for _, m := range members {
		if m.id == c.cfg.NodeID {
			serials[m.id] = pki.Serial(creds.Leaf())
			continue
		}
		dialCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		conn, err := peer.Dial(dialCtx, m.address, creds, peer.ProtocolForward)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("%w: cannot ask node %s (%s) for its certificate: %v", ErrUpgradeRequired, m.id, m.address, err)
		}
		state := conn.(*tls.Conn).ConnectionState()
		conn.Close()
		id, _ := pki.NodeID(state.PeerCertificates[0])
		if id != m.id {
			return nil, fmt.Errorf("%w: node %s's peer address %s answered as node %q", ErrInvalid, m.id, m.address, id)
		}
		serials[m.id] = pki.Serial(state.PeerCertificates[0])
	}
	return serials, nil
}
