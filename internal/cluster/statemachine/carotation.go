package statemachine

// CA rotation (from LevelSecurity): `herd cluster rotate-ca` makes a new
// CA on a node that holds the cluster CA's key, which keeps the new key;
// the log records the new CA's certificate (public) and from then on
// every node trusts both CAs (server/trust.go). Each node asks the holder
// for a certificate from the new CA and records its serial here before
// it uses it; `rotate-ca --finish` makes the new CA the cluster's once
// every node has one: the old CA is trusted no more, each node's admitted
// serial becomes its new certificate's, and the old certificates, of
// nodes and clients, are refused on every port. `--cancel` drops the new
// CA instead.
//
// While a rotation is under way a node certificate from the new CA is let
// in for an admitted node before its serial is recorded (a node behind
// on the log has not applied the record yet, and refusing the leader's
// connection would keep it behind for ever): only the holder of the new
// key issues those, and only to the node that asks for itself
// (server/signing.go). Once recorded, the serial must match.

import (
	"bytes"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/herd-storage/herd/internal/pki/pkiconst"
)

// CAState is the log's record of the cluster CA.
type CAState struct {
	// Fingerprint is the cluster CA's ("": the first one, never rotated:
	// every node's ca.crt holds it); Cert its certificate (PEM), from the
	// first rotation on; Since when it became the cluster's.
	Fingerprint string    `json:"fingerprint,omitempty"`
	Cert        []byte    `json:"cert,omitempty"`
	Since       time.Time `json:"since,omitzero"`
	// Rotation is the rotation under way, if any.
	Rotation *CARotation `json:"rotation,omitempty"`
	// Retired are the CAs rotated out, the newest last (at most
	// maxRetiredCAs).
	Retired []RetiredCA `json:"retired,omitempty"`
}

// CARotation is a CA rotation under way.
type CARotation struct {
	Fingerprint string    `json:"fingerprint"` // the new CA's
	Cert        []byte    `json:"cert"`        // its certificate (PEM)
	Holder      string    `json:"holder"`      // the node holding its key
	Started     time.Time `json:"started"`
	// Certificates are the serials of the nodes' certificates from the
	// new CA, by node id.
	Certificates map[string]string `json:"certificates,omitempty"`
}

// RetiredCA is a CA the cluster trusted until Until.
type RetiredCA struct {
	Fingerprint string    `json:"fingerprint"` // "": the first CA
	Until       time.Time `json:"until"`
}

const (
	maxRetiredCAs  = 8
	maxCACertBytes = 8 << 10
)

// FeatureCARotation gates the rotation's log records.
var FeatureCARotation = Feature{Name: "CA rotation (cluster rotate-ca)", Level: LevelSecurity}

const commandCA commandType = 36

func init() {
	if commands[commandCA] != nil {
		panic("cluster: command type 36 registered twice")
	}
	commands[commandCA] = applyCA
}

// Operations of commandCA.
const (
	caStart       = "start"       // a rotation to the CA of Cert begins; Node holds its key
	caCertificate = "certificate" // Node's certificate from the new CA has Serial
	caFinish      = "finish"      // the new CA becomes the cluster's
	caCancel      = "cancel"      // the new CA is dropped
)

type caCommand struct {
	Op          string `json:"op"`
	Fingerprint string `json:"fingerprint"`
	Cert        []byte `json:"cert,omitempty"`
	Node        string `json:"node,omitempty"`
	Serial      string `json:"serial,omitempty"`
	// Force: finish although some nodes have no certificate from the new
	// CA (they are down); they must join again.
	Force bool      `json:"force,omitempty"`
	Time  time.Time `json:"time"`
}

func (c caCommand) check() error {
	if err := checkLength("node id", c.Node, MaxOwnerLength); err != nil {
		return err
	}
	if len(c.Cert) > maxCACertBytes {
		return fmt.Errorf("%w: a CA certificate of %d bytes", ErrInvalid, len(c.Cert))
	}
	if len(c.Fingerprint) != pkiconst.FingerprintLength {
		return fmt.Errorf("%w: CA fingerprint of %d characters", ErrInvalid, len(c.Fingerprint))
	}
	return nil
}

// caName names a CA in events.
func caName(fingerprint string) string {
	if fingerprint == "" {
		return "the first CA"
	}
	return "CA " + fingerprint
}

// members are the nodes of the log not removed, sorted.
func (s *State) members() []string {
	var out []string
	for id := range s.Nodes {
		if _, removed := s.Removed[id]; !removed {
			out = append(out, id)
		}
	}
	sort.Strings(out)
	return out
}

// caMissing lists the members without a certificate from the new CA.
func (s *State) CAMissing() (alive, down []string) {
	r := s.CA.Rotation
	if r == nil {
		return nil, nil
	}
	for _, id := range s.members() {
		if _, ok := r.Certificates[id]; ok {
			continue
		}
		if s.Nodes[id].State == NodeAlive {
			alive = append(alive, id)
		} else {
			down = append(down, id)
		}
	}
	return alive, down
}

// ParseCA reads the PEM certificate of a CA rotation's start for
// applyCA: its fingerprint (pki.Fingerprint) and whether it is a CA
// certificate. The state machine does not parse X.509 itself
// (crypto/x509 brings in the network packages it keeps out):
// internal/cluster sets ParseCA, from pki, before any FSM applies an
// entry. It must be deterministic: every node applies the same entries
// with it.
var ParseCA func(certPEM []byte) (fingerprint string, isCA bool, err error)

func applyCA(s *State, data []byte) (any, error) {
	var c caCommand
	if err := decode(data, &c); err != nil {
		return nil, err
	}
	if s.Level() < FeatureCARotation.Level {
		return nil, fmt.Errorf("%w: CA rotation needs cluster feature level %d, the cluster is at %d", ErrUpgradeRequired, FeatureCARotation.Level, s.Level())
	}
	r := s.CA.Rotation
	if c.Op != caStart && (r == nil || r.Fingerprint != c.Fingerprint) {
		return nil, fmt.Errorf("%w: no rotation to CA %s is under way", ErrNotFound, c.Fingerprint)
	}
	switch c.Op {
	case caStart:
		if r != nil {
			return nil, fmt.Errorf("%w: a rotation to CA %s is under way since %s (finish or cancel it first)", ErrBusy, r.Fingerprint, r.Started.UTC().Format(time.RFC3339))
		}
		if ParseCA == nil {
			panic("statemachine: ParseCA is not set: the runtime sets it before any entry is applied")
		}
		fingerprint, isCA, err := ParseCA(c.Cert)
		if err != nil || !isCA || fingerprint != c.Fingerprint {
			return nil, fmt.Errorf("%w: the new CA's certificate is not a CA certificate of fingerprint %s", ErrInvalid, c.Fingerprint)
		}
		if c.Fingerprint == s.CA.Fingerprint {
			return nil, fmt.Errorf("%w: CA %s is the cluster's already", ErrInvalid, c.Fingerprint)
		}
		if _, ok := s.Admitted[c.Node]; !ok {
			return nil, fmt.Errorf("%w: node %q, which would hold the new CA's key, is not admitted", ErrInvalid, c.Node)
		}
		s.CA.Rotation = &CARotation{Fingerprint: c.Fingerprint, Cert: bytes.Clone(c.Cert), Holder: c.Node, Started: c.Time, Certificates: map[string]string{}}
		s.note("credentials", "CA rotation started: new CA %s (its key on node %s); every node trusts it and %s, and gets a certificate from it", c.Fingerprint, c.Node, caName(s.CA.Fingerprint))
		return caSummary(s.CA), nil
	case caCertificate:
		if _, ok := s.Admitted[c.Node]; !ok {
			return nil, fmt.Errorf("%w: node %q is not admitted", ErrInvalid, c.Node)
		}
		if err := validAdmission(c.Node, c.Serial); err != nil {
			return nil, err
		}
		if r.Certificates[c.Node] == c.Serial {
			return nil, nil // recorded before (a retry)
		}
		if r.Certificates == nil {
			r.Certificates = map[string]string{}
		}
		r.Certificates[c.Node] = c.Serial
		s.note("credentials", "node %s has a certificate from the new CA %s (serial %s)", c.Node, c.Fingerprint, c.Serial)
		return nil, nil
	case caFinish:
		alive, down := s.CAMissing()
		if len(alive) > 0 || (len(down) > 0 && !c.Force) {
			var parts []string
			if len(alive) > 0 {
				parts = append(parts, fmt.Sprintf("nodes %s are getting theirs (wait a moment)", strings.Join(alive, ", ")))
			}
			if len(down) > 0 {
				parts = append(parts, fmt.Sprintf("nodes %s are down: start them so that they get one, or `herd node remove` them, or finish with --force and have them join again with a join token", strings.Join(down, ", ")))
			}
			return nil, fmt.Errorf("%w: not every node has a certificate from the new CA %s: %s", ErrBusy, c.Fingerprint, strings.Join(parts, "; "))
		}
		for id, serial := range r.Certificates {
			if _, ok := s.Admitted[id]; ok {
				s.Admitted[id] = serial
			}
		}
		for _, client := range s.Clients {
			client.Previous = ""
		}
		s.CA.Retired = append(s.CA.Retired, RetiredCA{Fingerprint: s.CA.Fingerprint, Until: c.Time})
		if len(s.CA.Retired) > maxRetiredCAs {
			s.CA.Retired = s.CA.Retired[len(s.CA.Retired)-maxRetiredCAs:]
		}
		old := s.CA.Fingerprint
		s.CA.Fingerprint, s.CA.Cert, s.CA.Since, s.CA.Rotation = r.Fingerprint, r.Cert, c.Time, nil
		s.note("credentials", "CA rotation finished: CA %s is the cluster's; %s is no longer trusted, nor any certificate it issued", r.Fingerprint, caName(old))
		if len(down) > 0 {
			s.note("credentials", "nodes %s had no certificate from CA %s: they must be removed (herd node remove) and join again with a join token", strings.Join(down, ", "), r.Fingerprint)
		}
		return caSummary(s.CA), nil
	case caCancel:
		for _, client := range s.Clients {
			if client.Previous != "" {
				client.Serial, client.Previous = client.Previous, ""
			}
		}
		s.CA.Rotation = nil
		s.note("credentials", "CA rotation to CA %s cancelled: %s stays the cluster's; certificates from the new CA are refused, renewed clients use their previous certificate", c.Fingerprint, caName(s.CA.Fingerprint))
		return caSummary(s.CA), nil
	}
	return nil, fmt.Errorf("%w: CA operation %q", ErrInvalid, c.Op)
}

// caSummary is s without certificates (what the proposer is answered).
func caSummary(s CAState) CAState {
	s.Cert = nil
	if s.Rotation != nil {
		r := *s.Rotation
		r.Cert = nil
		s.Rotation = &r
	}
	return s
}

// CA is the log's record of the cluster CA (a copy).
func (c *Reads) CA() (out CAState) {
	c.fsm.View(func(s *State) { out = copyCAState(s.CA) })
	return out
}

func copyCAState(in CAState) CAState {
	out := in
	out.Cert = bytes.Clone(in.Cert)
	out.Retired = append([]RetiredCA(nil), in.Retired...)
	if in.Rotation != nil {
		r := *in.Rotation
		r.Cert = bytes.Clone(in.Rotation.Cert)
		r.Certificates = make(map[string]string, len(in.Rotation.Certificates))
		for id, serial := range in.Rotation.Certificates {
			r.Certificates[id] = serial
		}
		out.Rotation = &r
	}
	return out
}

// CAMissing lists the members without a certificate from the new CA:
// alive (getting theirs) and down.
func (c *Reads) CAMissing() (alive, down []string) {
	c.fsm.View(func(s *State) { alive, down = s.CAMissing() })
	return alive, down
}

// CertificateExpires is when the client's certificate expires: as
// recorded, or, for a record made before expiries were, its creation plus
// pki's client validity, at most caExpires (a leaf never outlives its CA).
func (c Client) CertificateExpires(caExpires time.Time) time.Time {
	expires := c.Expires
	if expires.IsZero() {
		expires = c.Created.Add(pkiconst.ClientValidity)
	}
	if !caExpires.IsZero() && caExpires.Before(expires) {
		expires = caExpires
	}
	return expires
}
