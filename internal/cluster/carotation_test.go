package cluster

import (
	"errors"
	"strings"
	"testing"

	"github.com/herd-storage/herd/internal/pki"
)

// TestCARotationTrust walks the trust state machine through a rotation:
// before the start only the admitted serials are let in; during it a
// node's certificate from the new CA is let in before its serial is
// recorded and must match it after, while the old certificates still
// are; the finish waits for every node (a node that is down needs
// --force, and is left behind), then only the new serials are let in;
// a client renewed during the rotation keeps its old certificate until
// the finish; a cancel gives renewed clients their old certificate back.
func TestCARotationTrust(t *testing.T) {
	h := securityHarness(t) // a, b, c admitted with serials 0a, 0b, 0c
	old := pki.Fingerprint(pkiCA(t).Cert)
	next := pkiCA(t)
	nextFP := pki.Fingerprint(next.Cert)
	step := func(c caCommand) error {
		t.Helper()
		c.Time = t0
		_, err := h.apply(commandCA, c)
		return err
	}
	allowed := func(id, serial, ca string) error {
		t.Helper()
		return h.state().peerAllowed(id, serial, ca)
	}
	if err := allowed("a", "0a", old); err != nil {
		t.Fatalf("before the rotation, a's own certificate: %v", err)
	}
	if err := allowed("a", "a1", nextFP); err == nil {
		t.Fatal("before the rotation, a certificate of another serial is let in because it names another CA")
	}
	if _, err := h.apply(commandClientAdd, Client{Name: "vmhost", Pattern: "vm*", Serial: "c1", Created: t0}); err != nil {
		t.Fatal(err)
	}

	if err := step(caCommand{Op: caStart, Fingerprint: nextFP, Cert: []byte("garbage"), Node: "a"}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("a start with no CA certificate: %v, want ErrInvalid", err)
	}
	if err := step(caCommand{Op: caStart, Fingerprint: nextFP, Cert: next.CertPEM, Node: "zz"}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("a start whose holder is not admitted: %v, want ErrInvalid", err)
	}
	if err := step(caCommand{Op: caStart, Fingerprint: nextFP, Cert: next.CertPEM, Node: "a"}); err != nil {
		t.Fatal(err)
	}
	if err := step(caCommand{Op: caStart, Fingerprint: pki.Fingerprint(pkiCA(t).Cert), Cert: pkiCA(t).CertPEM, Node: "a"}); !errors.Is(err, ErrBusy) {
		t.Fatalf("a second rotation during one: %v, want ErrBusy", err)
	}
	// Both CAs: old serials, and new-CA certificates not recorded yet.
	if err := allowed("b", "0b", old); err != nil {
		t.Fatalf("during the rotation, b's old certificate: %v", err)
	}
	if err := allowed("b", "b1", nextFP); err != nil {
		t.Fatalf("during the rotation, b's certificate from the new CA before its record: %v", err)
	}
	if err := allowed("zz", "01", nextFP); err == nil {
		t.Fatal("during the rotation, a new-CA certificate of an id never admitted is let in")
	}
	if err := step(caCommand{Op: caCertificate, Fingerprint: nextFP, Node: "b", Serial: "b1"}); err != nil {
		t.Fatal(err)
	}
	if err := allowed("b", "b2", nextFP); err == nil {
		t.Fatal("a new-CA certificate of b with another serial than recorded is let in")
	}
	// A client renewed during the rotation: both certificates work.
	if _, err := h.apply(commandClientAdd, Client{Name: "vmhost", Pattern: "*", Serial: "c2", Renew: true, Created: t0}); err != nil {
		t.Fatal(err)
	}
	if c := h.state().Clients["vmhost"]; c.Pattern != "vm*" || !c.Accepts("c1") || !c.Accepts("c2") {
		t.Fatalf("a client renewed during the rotation: %+v (pattern kept, both certificates accepted)", *c)
	}
	if _, err := h.apply(commandClientAdd, Client{Name: "none", Pattern: "*", Serial: "c3", Renew: true}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("renewing an unknown client: %v, want ErrNotFound", err)
	}

	if err := step(caCommand{Op: caFinish, Fingerprint: nextFP}); !errors.Is(err, ErrBusy) || !strings.Contains(err.Error(), "a, c") {
		t.Fatalf("the finish while a and c have no certificate: %v, want ErrBusy naming them", err)
	}
	if err := step(caCommand{Op: caCertificate, Fingerprint: nextFP, Node: "a", Serial: "a1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.apply(commandNodeLeave, nodeLeaveCommand{ID: "c", Reason: "stopped", Time: t0}); err != nil {
		t.Fatal(err)
	}
	if err := step(caCommand{Op: caFinish, Fingerprint: nextFP}); !errors.Is(err, ErrBusy) || !strings.Contains(err.Error(), "--force") {
		t.Fatalf("the finish while c is down without a certificate: %v, want ErrBusy naming --force", err)
	}
	if err := step(caCommand{Op: caFinish, Fingerprint: nextFP, Force: true}); err != nil {
		t.Fatal(err)
	}
	s := h.state()
	if s.CA.Fingerprint != nextFP || s.CA.Rotation != nil || len(s.CA.Retired) != 1 || s.Admitted["a"] != "a1" || s.Admitted["b"] != "b1" || s.Admitted["c"] != "0c" {
		t.Fatalf("after the finish: CA %+v, admitted %v", s.CA, s.Admitted)
	}
	if err := allowed("a", "0a", old); err == nil {
		t.Fatal("after the finish a's old certificate is let in")
	}
	if err := allowed("a", "a1", nextFP); err != nil {
		t.Fatalf("after the finish a's new certificate: %v", err)
	}
	if err := allowed("a", "a9", nextFP); err == nil {
		t.Fatal("after the finish a new-CA certificate of a with another serial is let in")
	}
	if c := s.Clients["vmhost"]; c.Accepts("c1") || !c.Accepts("c2") {
		t.Fatalf("after the finish the renewed client %+v: the old certificate must be refused, the new accepted", *c)
	}
	if err := checkState(s); err != nil {
		t.Fatal(err)
	}

	// Another rotation, cancelled: the renewed client's old certificate
	// is its only one again.
	third := pkiCA(t)
	thirdFP := pki.Fingerprint(third.Cert)
	if err := step(caCommand{Op: caStart, Fingerprint: thirdFP, Cert: third.CertPEM, Node: "b"}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.apply(commandClientAdd, Client{Name: "vmhost", Pattern: "vm*", Serial: "c4", Renew: true, Created: t0}); err != nil {
		t.Fatal(err)
	}
	if err := step(caCommand{Op: caCancel, Fingerprint: thirdFP}); err != nil {
		t.Fatal(err)
	}
	if c := h.state().Clients["vmhost"]; c.Serial != "c2" || c.Accepts("c4") {
		t.Fatalf("after the cancel the client is %+v, want its certificate before the renewal back", *c)
	}
	if err := allowed("b", "b1", nextFP); err != nil {
		t.Fatalf("after the cancel b's certificate: %v", err)
	}
	if err := allowed("b", "b5", thirdFP); err == nil {
		t.Fatal("after the cancel a certificate from the dropped CA is let in")
	}
	var texts []string
	for _, e := range h.state().Events {
		if e.Kind == "credentials" {
			texts = append(texts, e.Text)
		}
	}
	all := strings.Join(texts, "\n")
	for _, want := range []string{"CA rotation started: new CA " + nextFP + " (its key on node a)", "node b has a certificate from the new CA", "client vmhost renewed",
		"CA rotation finished: CA " + nextFP + " is the cluster's; the first CA is no longer trusted", "nodes c had no certificate from CA " + nextFP + ": they must be removed", "CA rotation to CA " + thirdFP + " cancelled"} {
		if !strings.Contains(all, want) {
			t.Errorf("no event saying %q in:\n%s", want, all)
		}
	}
}

func TestCARotationNeedsItsLevel(t *testing.T) {
	h := newHarness(t)
	h.join("a", "", "1")
	next := pkiCA(t)
	if _, err := h.apply(commandCA, caCommand{Op: caStart, Fingerprint: pki.Fingerprint(next.Cert), Cert: next.CertPEM, Node: "a", Time: t0}); !errors.Is(err, ErrUpgradeRequired) {
		t.Fatalf("a CA rotation below LevelSecurity: %v, want ErrUpgradeRequired", err)
	}
	if _, err := h.apply(commandClientAdd, Client{Name: "x", Pattern: "*", Serial: "01", Renew: true}); err != nil {
		t.Fatalf("a renewal below LevelSecurity is applied as older binaries do (a plain add): %v", err)
	}
}

func pkiCA(t *testing.T) *pki.CA {
	t.Helper()
	ca, err := pki.NewCA("test CA")
	if err != nil {
		t.Fatal(err)
	}
	return ca
}
