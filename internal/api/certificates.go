package api

// Certificates in cluster health: the CA, each node's
// certificate and each NBD client's, WARN when one expires within
// CertificateWarning.

import (
	"time"

	"github.com/herd-storage/herd/internal/cluster"
)

// CertificateWarning is how long before a certificate expires cluster
// health starts warning.
const CertificateWarning = 30 * 24 * time.Hour

// localUsage is this node's usage and its certificate's expiry.
func (s *Server) localUsage() (Usage, error) {
	u, err := s.data.Usage()
	if s.sec.Trust != nil {
		u.CertificateExpires = s.sec.Trust.NodeCertificateExpires()
	}
	return u, err
}

// certificateHealth adds a WARN for the CA, a node's certificate or a live
// client's that expires within CertificateWarning of now (or expired).
func certificateHealth(h *Health, now time.Time, ca *cluster.CAInfo, nodes []NodeEntry, clients []cluster.Client) {
	soon := func(t time.Time) bool { return !t.IsZero() && t.Sub(now) < CertificateWarning }
	when := func(t time.Time) string {
		if t.Before(now) {
			return "expired on " + t.UTC().Format(time.DateOnly)
		}
		return "expires on " + t.UTC().Format(time.DateOnly)
	}
	var caExpires time.Time
	if ca != nil {
		caExpires = ca.Expires
		if soon(ca.Expires) {
			h.add(HealthWarn, "the cluster CA %s %s: rotate it (herd cluster rotate-ca)", ca.Fingerprint, when(ca.Expires))
		}
	}
	for _, n := range nodes {
		if soon(n.CertificateExpires) {
			h.add(HealthWarn, "node %s (%s): its certificate %s: rotate the CA (herd cluster rotate-ca), which gives every node a new one", n.ID, n.Address, when(n.CertificateExpires))
		}
	}
	for _, c := range clients {
		if c.Revoked {
			continue
		}
		if expires := c.CertificateExpires(caExpires); soon(expires) {
			h.add(HealthWarn, "NBD client %s: its certificate %s: herd client add %s --renew --out DIR", c.Name, when(expires), c.Name)
		}
	}
}
