package api

import (
	"strings"
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/pki"
)

// TestCertificateHealth: cluster health WARNs for the CA, a node's
// certificate or a live NBD client's that expires within 30 days (a
// client recorded before expiries by its creation plus the client
// validity), and says what to do; nothing for the others.
func TestCertificateHealth(t *testing.T) {
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	day := 24 * time.Hour
	nodes := []NodeEntry{
		{NodeInfo: cluster.NodeInfo{Node: cluster.Node{ID: "a", Address: "10.0.0.1"}}, CertificateExpires: now.Add(40 * day)},
		{NodeInfo: cluster.NodeInfo{Node: cluster.Node{ID: "b", Address: "10.0.0.2"}}, CertificateExpires: now.Add(5 * day)},
		{NodeInfo: cluster.NodeInfo{Node: cluster.Node{ID: "c", Address: "10.0.0.3"}}}, // an older herd: says nothing
	}
	clients := []cluster.Client{
		{Name: "fresh", Expires: now.Add(365 * day)},
		{Name: "old", Created: now.Add(-pki.ClientValidity + 10*day)}, // recorded before expiries
		{Name: "gone", Expires: now.Add(day), Revoked: true},
		{Name: "lapsed", Expires: now.Add(-day)},
	}
	h := Health{Status: HealthOK}
	certificateHealth(&h, now, &cluster.CAInfo{Fingerprint: "f00d", Expires: now.Add(400 * day)}, nodes, clients)
	var all []string
	for _, r := range h.Reasons {
		all = append(all, r.What)
	}
	text := strings.Join(all, "\n")
	if h.Status != HealthWarn || len(h.Reasons) != 3 {
		t.Fatalf("status %s with %d reasons, want WARN and 3 (node b, clients old and lapsed):\n%s", h.Status, len(h.Reasons), text)
	}
	for _, want := range []string{"node b (10.0.0.2): its certificate expires on 2030-01-06: rotate the CA", "NBD client old: its certificate expires on 2030-01-11: herd client add old --renew",
		"NBD client lapsed: its certificate expired on 2029-12-31"} {
		if !strings.Contains(text, want) {
			t.Errorf("no reason saying %q in:\n%s", want, text)
		}
	}
	h = Health{Status: HealthOK}
	certificateHealth(&h, now, &cluster.CAInfo{Fingerprint: "f00d", Expires: now.Add(20 * day)}, nil, []cluster.Client{{Name: "capped", Expires: now.Add(365 * day)}})
	if len(h.Reasons) != 2 || !strings.Contains(h.Reasons[0].What, "the cluster CA f00d expires on 2030-01-21: rotate it") || !strings.Contains(h.Reasons[1].What, "NBD client capped") {
		t.Fatalf("a CA expiring in 20 days: %+v, want the CA and the client it caps", h.Reasons)
	}
}
