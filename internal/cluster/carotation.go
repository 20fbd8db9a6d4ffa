package cluster

import (
	"context"
	"crypto/x509"
	"sort"
	"time"

	"github.com/herd-storage/herd/internal/pki"
)

// StartCARotation records a new CA, whose key this node holds.
func (c *Cluster) StartCARotation(ctx context.Context, cert *x509.Certificate, certPEM []byte) (CAState, error) {
	if err := c.Requires(FeatureCARotation); err != nil {
		return CAState{}, err
	}
	return c.cmds().StartCARotation(ctx, pki.Fingerprint(cert), certPEM, c.cfg.NodeID)
}

// RecordCACertificate records this node's certificate from the new CA.
func (c *Cluster) RecordCACertificate(ctx context.Context, fingerprint, serial string) error {
	return c.cmds().RecordCACertificate(ctx, fingerprint, serial)
}

// FinishCARotation makes the new CA the cluster's; with force, although
// nodes that are down have no certificate from it.
func (c *Cluster) FinishCARotation(ctx context.Context, force bool) (CAState, error) {
	return c.cmds().FinishCARotation(ctx, force)
}

// CancelCARotation drops the new CA.
func (c *Cluster) CancelCARotation(ctx context.Context) (CAState, error) {
	return c.cmds().CancelCARotation(ctx)
}

// CAInfo is what cluster info shows of the CA.
type CAInfo struct {
	Fingerprint string    `json:"fingerprint"`
	Created     time.Time `json:"created"` // the CA certificate's start
	Expires     time.Time `json:"expires"`
	Since       time.Time `json:"since,omitzero"` // the cluster's since (a rotation's end)
	// Rotation is the rotation under way, if any.
	Rotation *CARotationInfo `json:"rotation,omitempty"`
}

// CARotationInfo is a CA rotation under way, as cluster info shows it.
type CARotationInfo struct {
	Fingerprint string    `json:"fingerprint"`
	Started     time.Time `json:"started"`
	Holder      string    `json:"holder"`
	Done        []string  `json:"done"`              // nodes with a certificate from the new CA
	Missing     []string  `json:"missing,omitempty"` // alive nodes without one yet
	Down        []string  `json:"down,omitempty"`    // nodes down without one
}

// caInfo is the CA's part of Info; current is the CA this node trusts as
// the cluster's.
func (c *Cluster) caInfo(current *x509.Certificate) *CAInfo {
	if current == nil {
		return nil
	}
	info := &CAInfo{Fingerprint: pki.Fingerprint(current), Created: current.NotBefore, Expires: current.NotAfter}
	c.fsm.View(func(s *State) {
		info.Since = s.CA.Since
		if r := s.CA.Rotation; r != nil {
			ri := &CARotationInfo{Fingerprint: r.Fingerprint, Started: r.Started, Holder: r.Holder}
			for id := range r.Certificates {
				ri.Done = append(ri.Done, id)
			}
			sort.Strings(ri.Done)
			ri.Missing, ri.Down = s.CAMissing()
			info.Rotation = ri
		}
	})
	return info
}
