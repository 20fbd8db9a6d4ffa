// Package peertest gives tests of the packages built on the peer port
// (internal/peer) node credentials from one shared test CA.
package peertest

import (
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/peer"
	"github.com/herd-storage/herd/internal/pki"
)

// sharedCA is the cluster CA of a test process: nodes started by
// different helpers trust each other, as in one cluster.
var sharedCA = sync.OnceValues(func() (*pki.CA, error) { return pki.NewCA("peer-test") })

// CA returns the shared test CA.
func CA(t testing.TB) *pki.CA {
	t.Helper()
	ca, err := sharedCA()
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// Credentials are node nodeID's credentials on 127.0.0.1, certified by
// the shared test CA.
func Credentials(t testing.TB, nodeID string) *peer.Credentials {
	t.Helper()
	return CredentialsFrom(t, CA(t), nodeID)
}

// OtherCluster is another cluster's CA.
func OtherCluster(t testing.TB) *pki.CA {
	t.Helper()
	ca, err := pki.NewCA("other-cluster")
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// CredentialsFrom are node nodeID's credentials on 127.0.0.1, certified
// by ca.
func CredentialsFrom(t testing.TB, ca *pki.CA, nodeID string) *peer.Credentials {
	t.Helper()
	certPEM, keyPEM, err := ca.IssueNode(nodeID, []net.IP{net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	creds, err := peer.NewCredentials(certPEM, keyPEM, ca.CertPEM, nil)
	if err != nil {
		t.Fatal(err)
	}
	return creds
}

// LockedBuffer collects log output from many goroutines.
type LockedBuffer struct {
	mu     sync.Mutex
	buffer strings.Builder
}

func (b *LockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buffer.Write(p)
}

func (b *LockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buffer.String()
}

// WaitFor polls condition until it holds or timeout passes.
func WaitFor(t testing.TB, timeout time.Duration, what string, condition func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !condition() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}
