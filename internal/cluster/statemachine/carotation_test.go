package statemachine

import (
	"encoding/json"
	"errors"
	"fmt"
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

// TestCARotationNoNodeIsLockedOut: the log of a rotation (start, each
// node's certificate, finish) applied to every prefix a node can be at,
// and a connection between any two nodes at any two such prefixes (the
// leader ahead, a follower behind, or the other way), with each side
// presenting what server/trust.go presents: the server its certificate
// from the CA the dialer names (the newest it trusts) if it holds one,
// else its old one; the dialer the newest certificate the server's
// trusted CAs accept. Every such connection is let in by both sides
// (a follower behind must take the leader's connections, or it never
// catches up). A node left out (no certificate when the finish
// committed, as with --force) is refused by every node past the finish.
func TestCARotationNoNodeIsLockedOut(t *testing.T) {
	oldCA, newCA := pkiCA(t), pkiCA(t)
	oldFP, newFP := pki.Fingerprint(oldCA.Cert), pki.Fingerprint(newCA.Cert)
	nodes := []string{"a", "b", "c"}
	// The log: entry 0 starts, entries 1-3 record a, b and c, 4 finishes.
	log := []caCommand{{Op: caStart, Fingerprint: newFP, Cert: newCA.CertPEM, Node: "a"}}
	for _, id := range nodes {
		log = append(log, caCommand{Op: caCertificate, Fingerprint: newFP, Node: id, Serial: "1" + id})
	}
	log = append(log, caCommand{Op: caFinish, Fingerprint: newFP})
	states := make([]*State, len(log)+1) // states[k]: k entries applied
	h := securityHarness(t)
	states[0] = cloneState(t, h.state())
	for k, c := range log {
		c.Time = t0
		if _, err := h.apply(commandCA, c); err != nil {
			t.Fatalf("entry %d: %v", k, err)
		}
		states[k+1] = cloneState(t, h.state())
	}
	// What a node at prefix k trusts, and holds: it gets its new
	// certificate after applying the start and records it before its
	// prefix passes its record; the old one is replaced at the finish.
	recordOf := map[string]int{"a": 2, "b": 3, "c": 4} // prefix once applied
	trusts := func(k int, ca string) bool {
		return (ca == oldFP && k < len(log)) || (ca == newFP && k >= 1)
	}
	holds := func(id string, k int, ca string) bool {
		return (ca == oldFP && k < len(log)) || (ca == newFP && k >= recordOf[id])
	}
	serial := func(id, ca string) string {
		if ca == newFP {
			return "1" + id
		}
		return "0" + id // securityHarness's admitted serials
	}
	newest := func(k int) string {
		if trusts(k, newFP) {
			return newFP
		}
		return oldFP
	}
	connect := func(dialer string, kd int, server string, ks int) error {
		// The server's certificate: from the CA the dialer names, if held.
		shown := oldFP
		if hint := newest(kd); holds(server, ks, hint) {
			shown = hint
		} else if !holds(server, ks, oldFP) {
			shown = newFP
		}
		if !trusts(kd, shown) {
			return fmt.Errorf("the dialer does not trust the server's CA")
		}
		if err := states[kd].peerAllowed(server, serial(server, shown), shown); err != nil {
			return fmt.Errorf("the dialer refuses the server: %v", err)
		}
		// The dialer's certificate: the newest the server accepts.
		presented := ""
		for _, ca := range []string{newFP, oldFP} {
			if holds(dialer, kd, ca) && trusts(ks, ca) {
				presented = ca
				break
			}
		}
		if presented == "" {
			return fmt.Errorf("the dialer holds no certificate the server trusts")
		}
		if err := states[ks].peerAllowed(dialer, serial(dialer, presented), presented); err != nil {
			return fmt.Errorf("the server refuses the dialer: %v", err)
		}
		return nil
	}
	for _, d := range nodes {
		for _, s := range nodes {
			if d == s {
				continue
			}
			for kd := recordOf[d]; kd <= len(log); kd++ {
				for ks := recordOf[s]; ks <= len(log); ks++ {
					if err := connect(d, kd, s, ks); err != nil {
						t.Errorf("node %s at log prefix %d dialing node %s at prefix %d: %v", d, kd, s, ks, err)
					}
				}
			}
		}
	}
	// Before the rotation, nothing changed.
	if err := connect("a", 0, "b", 0); err != nil {
		t.Fatalf("before the rotation: %v", err)
	}
	// A node that missed the change (down from before the start until
	// after the finish): refused both ways by a node past the finish.
	missed := func(id string, k int, ca string) bool { return ca == oldFP }
	holds2 := holds
	holds = func(id string, k int, ca string) bool {
		if id == "c" {
			return missed(id, k, ca)
		}
		return holds2(id, k, ca)
	}
	if err := connect("c", 0, "a", len(log)); err == nil {
		t.Error("a node that missed the rotation reached a node past its finish")
	}
	if err := connect("a", len(log), "c", 0); err == nil {
		t.Error("a node past the finish accepted a node that missed the rotation")
	}
}

func cloneState(t *testing.T, s *State) *State {
	t.Helper()
	data, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	out := newState()
	if err := json.Unmarshal(data, out); err != nil {
		t.Fatal(err)
	}
	return out
}
