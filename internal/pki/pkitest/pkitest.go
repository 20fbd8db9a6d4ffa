// Package pkitest gives tests a cluster CA and node credentials without
// files: a test builds what a node would load from its data directory.
package pkitest

import (
	"net"
	"testing"

	"github.com/herd-storage/herd/internal/peer"
	"github.com/herd-storage/herd/internal/pki"
)

// CA returns a new cluster CA. Nodes a test gives credentials from the
// same CA trust each other; from different CAs they are of different
// clusters.
func CA(t testing.TB) *pki.CA {
	t.Helper()
	ca, err := pki.NewCA("test-cluster")
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// Credentials returns the peer credentials of node nodeID certified by
// ca, for loopback addresses, accepting every node.
func Credentials(t testing.TB, ca *pki.CA, nodeID string) *peer.Credentials {
	t.Helper()
	certPEM, keyPEM, err := ca.IssueNode(nodeID, []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback})
	if err != nil {
		t.Fatal(err)
	}
	creds, err := peer.NewCredentials(certPEM, keyPEM, ca.CertPEM, nil)
	if err != nil {
		t.Fatal(err)
	}
	return creds
}
