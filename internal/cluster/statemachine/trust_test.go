package statemachine

// The trust state machine of the log, phase by phase: what the log trusts
// (the CAs, the node and client certificates, the gossip key) before, during
// and after a CA rotation and a gossip key rotation, the transitions it
// refuses (with a clear error and no change), and a node that missed the
// change and catches up by replaying the log or by a snapshot.
// carotation_test.go and gossipkeys_test.go walk the happy paths;
// server/trust_test.go the node's side (the certificates it holds and
// presents).

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/herd-storage/herd/internal/pki"
)

// trustedCAs are the CAs the log trusts: the cluster's ("": the first,
// every node's ca.crt) and, during a rotation, the new one. A node's
// trust (server/trust.go) must end up equal to it.
func trustedCAs(s *State) []string {
	out := []string{s.CA.Fingerprint}
	if r := s.CA.Rotation; r != nil {
		out = append(out, r.Fingerprint)
	}
	return out
}

// verifies is what a TLS handshake and the log's check together decide
// about a node certificate (id, serial) from the CA ca: the CA must be
// trusted (the pool) and the log must let it in (peerAllowed).
func verifies(s *State, id, serial, ca string) error {
	if !slices.Contains(trustedCAs(s), ca) {
		return fmt.Errorf("%s is not trusted (trusted: %q)", caName(ca), trustedCAs(s))
	}
	return s.peerAllowed(id, serial, ca)
}

// clientAccepted is the same for an NBD client's certificate.
func clientAccepted(s *State, name, serial, ca string) bool {
	c, ok := s.Clients[name]
	return ok && slices.Contains(trustedCAs(s), ca) && c.Accepts(serial)
}

// refusedUnchanged applies a command that must be refused with an error
// of kind and a message containing want, and checks it changed nothing.
func refusedUnchanged(t *testing.T, h *harness, what string, ct commandType, payload any, kind error, want string) {
	t.Helper()
	before := stateJSON(t, h.fsm)
	_, err := h.apply(ct, payload)
	if !errors.Is(err, kind) || !strings.Contains(err.Error(), want) {
		t.Errorf("%s: %v, want %v saying %q", what, err, kind, want)
	}
	if after := stateJSON(t, h.fsm); !bytes.Equal(before, after) {
		t.Errorf("%s was refused but changed the state:\n%s\n%s", what, before, after)
	}
}

// snapshotOf returns a new FSM restored from a snapshot of f: what a node
// that fell too far behind is sent.
func snapshotOf(t *testing.T, f *FSM) *FSM {
	t.Helper()
	snapshot, err := f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	sink := bytes.NewBuffer(snapshot)
	restored := New()
	if err := restored.Restore(bytes.NewReader(sink.Bytes())); err != nil {
		t.Fatal(err)
	}
	return restored
}

// TestCATrustPhases: the certificates the log lets in at each phase of a
// CA rotation, for peers (node certificates), NBD clients and the CAs
// themselves: before it only the first CA's; during it both CAs' (a
// node's and a client's certificate from either); after --finish the new
// CA's only (the old CA's node and client certificates refused, a node's
// old serial under the new CA too). The CLI's admin token names a CA by
// fingerprint: it must be one the log trusts at each phase.
func TestCATrustPhases(t *testing.T) {
	h := securityHarness(t) // a, b, c admitted with serials 0a, 0b, 0c
	const old = ""          // the first CA: never recorded
	next := pkiCA(t)
	nextFP := pki.Fingerprint(next.Cert)
	ca := func(c caCommand) {
		t.Helper()
		c.Time = t0
		if _, err := h.apply(commandCA, c); err != nil {
			t.Fatalf("%s: %v", c.Op, err)
		}
	}
	if _, err := h.apply(commandClientAdd, Client{Name: "vm", Pattern: "vm*", Serial: "c1", Created: t0}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.apply(commandClientAdd, Client{Name: "lazy", Pattern: "*", Serial: "l1", Created: t0}); err != nil {
		t.Fatal(err)
	}
	type check struct {
		what            string
		id, serial, ca  string
		client          bool
		wantLetIn       bool
		wantDescription string
	}
	run := func(phase string, want []string, checks []check) {
		t.Helper()
		s := h.state()
		if got := trustedCAs(s); !slices.Equal(got, want) {
			t.Errorf("%s: the log trusts %q, want %q", phase, got, want)
		}
		for _, c := range checks {
			var err error
			if c.client {
				if !clientAccepted(s, c.id, c.serial, c.ca) {
					err = errors.New("refused")
				}
			} else {
				err = verifies(s, c.id, c.serial, c.ca)
			}
			if (err == nil) != c.wantLetIn {
				t.Errorf("%s: %s (%s serial %s from %s): let in %v (%v), want %v", phase, c.what, c.id, c.serial, caName(c.ca), err == nil, err, c.wantLetIn)
			}
		}
		if err := checkState(s); err != nil {
			t.Errorf("%s: %v", phase, err)
		}
	}

	run("before the rotation", []string{old}, []check{
		{what: "a node's certificate", id: "a", serial: "0a", ca: old, wantLetIn: true},
		{what: "a node's certificate of another serial", id: "a", serial: "9a", ca: old},
		{what: "a certificate from a CA the log does not know", id: "a", serial: "1a", ca: nextFP},
		{what: "a client's certificate", id: "vm", serial: "c1", ca: old, client: true, wantLetIn: true},
		{what: "a client's certificate from an unknown CA", id: "vm", serial: "c1", ca: nextFP, client: true},
	})

	ca(caCommand{Op: caStart, Fingerprint: nextFP, Cert: next.CertPEM, Node: "a"})
	ca(caCommand{Op: caCertificate, Fingerprint: nextFP, Node: "a", Serial: "1a"})
	if _, err := h.apply(commandClientAdd, Client{Name: "vm", Pattern: "*", Serial: "c2", Renew: true, Created: t0}); err != nil {
		t.Fatal(err)
	}
	run("during the rotation", []string{old, nextFP}, []check{
		{what: "a node's old certificate", id: "a", serial: "0a", ca: old, wantLetIn: true},
		{what: "a node's recorded new certificate", id: "a", serial: "1a", ca: nextFP, wantLetIn: true},
		{what: "another new-CA certificate than the recorded one", id: "a", serial: "2a", ca: nextFP},
		{what: "a node's new certificate not recorded yet", id: "b", serial: "1b", ca: nextFP, wantLetIn: true},
		{what: "a node's old certificate, its new one not recorded yet", id: "b", serial: "0b", ca: old, wantLetIn: true},
		{what: "a new-CA certificate for an id never admitted", id: "zz", serial: "1z", ca: nextFP},
		{what: "a renewed client's old certificate", id: "vm", serial: "c1", ca: old, client: true, wantLetIn: true},
		{what: "a renewed client's new certificate", id: "vm", serial: "c2", ca: nextFP, client: true, wantLetIn: true},
		{what: "a client not renewed yet", id: "lazy", serial: "l1", ca: old, client: true, wantLetIn: true},
	})

	ca(caCommand{Op: caCertificate, Fingerprint: nextFP, Node: "b", Serial: "1b"})
	ca(caCommand{Op: caCertificate, Fingerprint: nextFP, Node: "c", Serial: "1c"})
	ca(caCommand{Op: caFinish, Fingerprint: nextFP})
	run("after the finish", []string{nextFP}, []check{
		{what: "a node's new certificate", id: "b", serial: "1b", ca: nextFP, wantLetIn: true},
		{what: "a node's old certificate", id: "b", serial: "0b", ca: old},
		{what: "a node's old serial in a certificate from the new CA", id: "b", serial: "0b", ca: nextFP},
		{what: "a renewed client's new certificate", id: "vm", serial: "c2", ca: nextFP, client: true, wantLetIn: true},
		{what: "a renewed client's old certificate", id: "vm", serial: "c1", ca: old, client: true},
		{what: "a renewed client's old serial from the new CA", id: "vm", serial: "c1", ca: nextFP, client: true},
		{what: "a client never renewed (its certificate is the old CA's)", id: "lazy", serial: "l1", ca: old, client: true},
	})
	if s := h.state(); s.CA.Rotation != nil || len(s.CA.Retired) != 1 || s.CA.Retired[0].Fingerprint != old || !bytes.Equal(s.CA.Cert, next.CertPEM) {
		t.Fatalf("after the finish the log's CA is %+v", caSummary(s.CA))
	}
}

// TestCARotationRefusals: every transition the trust state machine must
// refuse, in each phase, is refused with an error that says why (and what
// to do), and leaves the state exactly as it was: --finish or --cancel
// without a rotation, a second rotation during one, --finish before every
// node recorded its certificate from the new CA (naming them), steps of a
// rotation to another CA than the one under way, a certificate for a node
// not admitted, a rotation to the cluster's own CA.
func TestCARotationRefusals(t *testing.T) {
	h := securityHarness(t)
	next, other := pkiCA(t), pkiCA(t)
	nextFP, otherFP := pki.Fingerprint(next.Cert), pki.Fingerprint(other.Cert)
	c := NewCommands(nil, h.fsm, "", "") // refuses before it proposes

	// Before any rotation.
	refusedUnchanged(t, h, "--finish without a rotation", commandCA, caCommand{Op: caFinish, Fingerprint: nextFP, Time: t0}, ErrNotFound, "no rotation to CA "+nextFP+" is under way")
	refusedUnchanged(t, h, "--force --finish without a rotation", commandCA, caCommand{Op: caFinish, Fingerprint: nextFP, Force: true, Time: t0}, ErrNotFound, "no rotation")
	refusedUnchanged(t, h, "--cancel without a rotation", commandCA, caCommand{Op: caCancel, Fingerprint: nextFP, Time: t0}, ErrNotFound, "no rotation")
	refusedUnchanged(t, h, "a certificate without a rotation", commandCA, caCommand{Op: caCertificate, Fingerprint: nextFP, Node: "a", Serial: "1a", Time: t0}, ErrNotFound, "no rotation")
	if _, err := c.FinishCARotation(context.Background(), false); !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "herd cluster rotate-ca starts one") {
		t.Errorf("Cluster.FinishCARotation without a rotation: %v, want ErrNotFound saying how to start one", err)
	}
	if _, err := c.CancelCARotation(context.Background()); !errors.Is(err, ErrNotFound) {
		t.Errorf("Cluster.CancelCARotation without a rotation: %v, want ErrNotFound", err)
	}

	if _, err := h.apply(commandCA, caCommand{Op: caStart, Fingerprint: nextFP, Cert: next.CertPEM, Node: "a", Time: t0}); err != nil {
		t.Fatal(err)
	}
	// During it.
	refusedUnchanged(t, h, "a second rotation during one", commandCA, caCommand{Op: caStart, Fingerprint: otherFP, Cert: other.CertPEM, Node: "b", Time: t0}, ErrBusy, "a rotation to CA "+nextFP+" is under way")
	refusedUnchanged(t, h, "the same rotation again", commandCA, caCommand{Op: caStart, Fingerprint: nextFP, Cert: next.CertPEM, Node: "a", Time: t0}, ErrBusy, "finish or cancel it first")
	refusedUnchanged(t, h, "--finish before any node recorded its certificate", commandCA, caCommand{Op: caFinish, Fingerprint: nextFP, Time: t0}, ErrBusy, "nodes a, b, c are getting theirs")
	refusedUnchanged(t, h, "--finish of another rotation", commandCA, caCommand{Op: caFinish, Fingerprint: otherFP, Time: t0}, ErrNotFound, "no rotation to CA "+otherFP)
	refusedUnchanged(t, h, "--cancel of another rotation", commandCA, caCommand{Op: caCancel, Fingerprint: otherFP, Time: t0}, ErrNotFound, "no rotation to CA "+otherFP)
	refusedUnchanged(t, h, "a certificate from another CA", commandCA, caCommand{Op: caCertificate, Fingerprint: otherFP, Node: "b", Serial: "1b", Time: t0}, ErrNotFound, "no rotation")
	refusedUnchanged(t, h, "a certificate of a node never admitted", commandCA, caCommand{Op: caCertificate, Fingerprint: nextFP, Node: "zz", Serial: "1z", Time: t0}, ErrInvalid, `node "zz" is not admitted`)
	for _, id := range []string{"a", "b"} {
		if _, err := h.apply(commandCA, caCommand{Op: caCertificate, Fingerprint: nextFP, Node: id, Serial: "1" + id, Time: t0}); err != nil {
			t.Fatal(err)
		}
	}
	refusedUnchanged(t, h, "--finish before the last alive node recorded its certificate", commandCA, caCommand{Op: caFinish, Fingerprint: nextFP, Time: t0}, ErrBusy, "nodes c are getting theirs")
	refusedUnchanged(t, h, "--force --finish while an alive node has none", commandCA, caCommand{Op: caFinish, Fingerprint: nextFP, Force: true, Time: t0}, ErrBusy, "nodes c are getting theirs")
	if _, err := h.apply(commandNodeLeave, nodeLeaveCommand{ID: "c", Reason: "killed", Time: t0}); err != nil {
		t.Fatal(err)
	}
	refusedUnchanged(t, h, "--finish while a node that is down has none", commandCA, caCommand{Op: caFinish, Fingerprint: nextFP, Time: t0}, ErrBusy, "nodes c are down: start them")
	if alive, down := (&Reads{fsm: h.fsm}).CAMissing(); len(alive) != 0 || !slices.Equal(down, []string{"c"}) {
		t.Errorf("CAMissing: alive %v, down %v; want c down", alive, down)
	}
	h.join("c", "", "2")
	if _, err := h.apply(commandCA, caCommand{Op: caCertificate, Fingerprint: nextFP, Node: "c", Serial: "1c", Time: t0}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.apply(commandCA, caCommand{Op: caFinish, Fingerprint: nextFP, Time: t0}); err != nil {
		t.Fatalf("--finish once every node recorded its certificate: %v", err)
	}

	// After it.
	refusedUnchanged(t, h, "--finish again", commandCA, caCommand{Op: caFinish, Fingerprint: nextFP, Time: t0}, ErrNotFound, "no rotation")
	refusedUnchanged(t, h, "a late certificate of the finished rotation", commandCA, caCommand{Op: caCertificate, Fingerprint: nextFP, Node: "c", Serial: "2c", Time: t0}, ErrNotFound, "no rotation")
	refusedUnchanged(t, h, "a rotation to the cluster's own CA", commandCA, caCommand{Op: caStart, Fingerprint: nextFP, Cert: next.CertPEM, Node: "a", Time: t0}, ErrInvalid, "is the cluster's already")
	if _, err := c.FinishCARotation(context.Background(), true); !errors.Is(err, ErrNotFound) {
		t.Errorf("Cluster.FinishCARotation after the finish: %v, want ErrNotFound", err)
	}
}

// TestCARotationOfANodeThatMissedIt: a node down from before the start
// (its FSM stopped at the log's prefix before the start) catches up on a
// rotation by replaying the entries it missed, or by a snapshot of the
// leader, at each later point of the rotation: it then trusts exactly
// what the leader trusts and decides every certificate alike (its own
// old certificate and its new one, the others' old and new ones, one of
// a node never admitted). Once it recorded its certificate the rotation
// can finish; a rotation finished with --force without it leaves its
// old certificate refused everywhere.
func TestCARotationOfANodeThatMissedIt(t *testing.T) {
	next := pkiCA(t)
	nextFP := pki.Fingerprint(next.Cert)
	type entry struct {
		ct      commandType
		payload any
	}
	// c is down through the start, back before the finish.
	log := []entry{
		{commandNodeLeave, nodeLeaveCommand{ID: "c", Reason: "killed", Time: t0}},
		{commandCA, caCommand{Op: caStart, Fingerprint: nextFP, Cert: next.CertPEM, Node: "a", Time: t0}},
		{commandCA, caCommand{Op: caCertificate, Fingerprint: nextFP, Node: "a", Serial: "1a", Time: t0}},
		{commandCA, caCommand{Op: caCertificate, Fingerprint: nextFP, Node: "b", Serial: "1b", Time: t0}},
		{commandNodeJoin, nodeJoinCommand{Node: Node{ID: "c", Address: "c", Incarnation: "2"}, Time: t0}},
		{commandCA, caCommand{Op: caCertificate, Fingerprint: nextFP, Node: "c", Serial: "1c", Time: t0}},
		{commandCA, caCommand{Op: caFinish, Fingerprint: nextFP, Time: t0}},
	}
	certificates := []struct{ id, serial, ca string }{
		{"a", "0a", ""}, {"a", "1a", nextFP}, {"b", "0b", ""}, {"b", "1b", nextFP}, {"b", "2b", nextFP},
		{"c", "0c", ""}, {"c", "1c", nextFP}, {"c", "9c", nextFP}, {"zz", "1z", nextFP}, {"zz", "0z", ""},
	}
	same := func(what string, leader, follower *State) {
		t.Helper()
		if got, want := trustedCAs(follower), trustedCAs(leader); !slices.Equal(got, want) {
			t.Errorf("%s: the node trusts %q, the cluster %q", what, got, want)
		}
		for _, c := range certificates {
			l, f := verifies(leader, c.id, c.serial, c.ca), verifies(follower, c.id, c.serial, c.ca)
			if (l == nil) != (f == nil) {
				t.Errorf("%s: %s's certificate %s from %s: the cluster says %v, the node %v", what, c.id, c.serial, caName(c.ca), l, f)
			}
		}
		if !bytes.Equal(jsonOf(t, leader.CA), jsonOf(t, follower.CA)) || !maps.Equal(leader.Admitted, follower.Admitted) {
			t.Errorf("%s: the node's CA record %+v / admitted %v differ from the cluster's %+v / %v", what, caSummary(follower.CA), follower.Admitted, caSummary(leader.CA), leader.Admitted)
		}
	}
	for k := 1; k <= len(log); k++ {
		leader := securityHarness(t)
		behind := securityHarness(t)
		// entries[0] takes c down: its FSM keeps the prefix before it.
		for i, e := range log[:k] {
			if _, err := leader.apply(e.ct, e.payload); err != nil {
				t.Fatalf("entry %d: %v", i, err)
			}
		}
		if k < 6 {
			// Before c recorded its certificate a finish is refused
			// (c is down, or back without one).
			if _, err := leader.apply(commandCA, caCommand{Op: caFinish, Fingerprint: nextFP, Time: t0}); k >= 2 && k < 6 && !errors.Is(err, ErrBusy) {
				t.Fatalf("after %d entries, --finish without c's certificate: %v, want ErrBusy", k, err)
			}
		}
		// Catching up by replaying the log ...
		for _, e := range log[:k] {
			behind.apply(e.ct, e.payload)
		}
		// (the refused finish too: a refused entry is in the log as well)
		if k < 6 {
			behind.apply(commandCA, caCommand{Op: caFinish, Fingerprint: nextFP, Time: t0})
		}
		same(fmt.Sprintf("replayed %d entries", k), leader.state(), behind.state())
		// ... or from a snapshot.
		var restored *State
		snapshotOf(t, leader.fsm).View(func(s *State) { restored = s })
		same(fmt.Sprintf("a snapshot after %d entries", k), leader.state(), restored)
	}

	// Down through the whole rotation, finished with --force: its old
	// certificate is refused by the log as the others have it.
	leader := securityHarness(t)
	steps := []entry{log[0], log[1], log[2], log[3], {commandCA, caCommand{Op: caFinish, Fingerprint: nextFP, Force: true, Time: t0}}}
	for i, e := range steps {
		if _, err := leader.apply(e.ct, e.payload); err != nil {
			t.Fatalf("entry %d: %v", i, err)
		}
	}
	s := leader.state()
	if err := verifies(s, "c", "0c", ""); err == nil {
		t.Error("after a --force finish without c, c's old certificate is let in")
	}
	if err := verifies(s, "c", "1c", nextFP); err == nil {
		t.Error("after a --force finish without c, a new-CA certificate of c that was never recorded is let in")
	}
	if got := trustedCAs(snapshotOf(t, leader.fsm).state); !slices.Equal(got, []string{nextFP}) {
		t.Errorf("a snapshot after a --force finish trusts %q", got)
	}
}

func jsonOf(t *testing.T, v any) []byte {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// TestGossipKeyRefusals: every transition of a gossip key rotation the
// log must refuse is refused with an error saying why and changes
// nothing: a switch or an end without a rotation, a second rotation
// during one, the switch before every alive node installed the key
// (naming them), a node reporting it uses the key before the switch, the
// end before every alive node uses it, steps of another key, a rotation
// to the key in use.
func TestGossipKeyRefusals(t *testing.T) {
	h := securityHarness(t)
	k1, k2 := GossipKeyID([]byte("one")), GossipKeyID([]byte("two"))
	step := func(op, key, node string) gossipKeyCommand {
		return gossipKeyCommand{Op: op, Key: key, Node: node, Time: t0}
	}
	ok := func(op, key, node string) {
		t.Helper()
		if _, err := h.apply(commandGossipKey, step(op, key, node)); err != nil {
			t.Fatalf("%s %s: %v", op, node, err)
		}
	}
	refusedUnchanged(t, h, "a switch without a rotation", commandGossipKey, step(GossipKeyOpSwitch, k1, ""), ErrNotFound, "no rotation to gossip key "+k1)
	refusedUnchanged(t, h, "an end without a rotation", commandGossipKey, step(GossipKeyOpDone, k1, ""), ErrNotFound, "no rotation")
	refusedUnchanged(t, h, "an install report without a rotation", commandGossipKey, step(gossipKeyInstalled, k1, "a"), ErrNotFound, "no rotation")
	refusedUnchanged(t, h, "a start that names no holder", commandGossipKey, step(gossipKeyStart, k1, ""), ErrInvalid, "names the node holding the new key")

	ok(gossipKeyStart, k1, "a")
	refusedUnchanged(t, h, "a second rotation during one", commandGossipKey, step(gossipKeyStart, k2, "b"), ErrBusy, "a rotation to gossip key "+k1+" is under way (phase install")
	refusedUnchanged(t, h, "the switch before any node installed the key", commandGossipKey, step(GossipKeyOpSwitch, k1, ""), ErrBusy, "nodes a, b, c have not installed gossip key "+k1)
	ok(gossipKeyInstalled, k1, "a")
	ok(gossipKeyInstalled, k1, "b")
	refusedUnchanged(t, h, "the switch before c installed the key", commandGossipKey, step(GossipKeyOpSwitch, k1, ""), ErrBusy, "nodes c have not installed")
	refusedUnchanged(t, h, "a node using the key before the switch", commandGossipKey, step(gossipKeyUsing, k1, "a"), ErrInvalid, "not in use yet (phase install)")
	refusedUnchanged(t, h, "the end in the install phase", commandGossipKey, step(GossipKeyOpDone, k1, ""), ErrInvalid, "is in phase install")
	refusedUnchanged(t, h, "the switch of another key", commandGossipKey, step(GossipKeyOpSwitch, k2, ""), ErrNotFound, "no rotation to gossip key "+k2)
	refusedUnchanged(t, h, "an install report of another key", commandGossipKey, step(gossipKeyInstalled, k2, "c"), ErrNotFound, "no rotation")
	refusedUnchanged(t, h, "an install report of a node not in the log", commandGossipKey, step(gossipKeyInstalled, k1, "zz"), ErrNotFound, `node "zz"`)
	ok(gossipKeyInstalled, k1, "c")
	ok(GossipKeyOpSwitch, k1, "")
	refusedUnchanged(t, h, "the switch again", commandGossipKey, step(GossipKeyOpSwitch, k1, ""), ErrInvalid, "is in phase use")
	ok(gossipKeyUsing, k1, "a")
	refusedUnchanged(t, h, "the end before b and c use the key", commandGossipKey, step(GossipKeyOpDone, k1, ""), ErrBusy, "nodes b, c do not encrypt with gossip key "+k1)
	ok(gossipKeyUsing, k1, "b")
	ok(gossipKeyUsing, k1, "c")
	ok(GossipKeyOpDone, k1, "")
	refusedUnchanged(t, h, "the end again", commandGossipKey, step(GossipKeyOpDone, k1, ""), ErrNotFound, "no rotation")
	refusedUnchanged(t, h, "a rotation to the key in use", commandGossipKey, step(gossipKeyStart, k1, "a"), ErrInvalid, "is the cluster's already")
	if err := checkState(h.state()); err != nil {
		t.Fatal(err)
	}
}

// TestGossipKeyRotationOfANodeThatMissedIt: the log's gossip key record as
// a node that missed the rotation sees it after replaying the entries or
// from a snapshot, at every point of the rotation, is the leader's; and
// the end needs no report from a node that is down.
func TestGossipKeyRotationOfANodeThatMissedIt(t *testing.T) {
	k := GossipKeyID([]byte("next"))
	log := []gossipKeyCommand{
		{Op: gossipKeyStart, Key: k, Node: "a"},
		{Op: gossipKeyInstalled, Key: k, Node: "a"},
		{Op: gossipKeyInstalled, Key: k, Node: "b"},
		{Op: GossipKeyOpSwitch, Key: k},
		{Op: gossipKeyUsing, Key: k, Node: "a"},
		{Op: gossipKeyUsing, Key: k, Node: "b"},
		{Op: GossipKeyOpDone, Key: k},
	}
	for n := 0; n <= len(log); n++ {
		leader, behind := securityHarness(t), securityHarness(t)
		for _, h := range []*harness{leader, behind} {
			if _, err := h.apply(commandNodeLeave, nodeLeaveCommand{ID: "c", Reason: "killed", Time: t0}); err != nil {
				t.Fatal(err)
			}
		}
		for i, c := range log[:n] {
			c.Time = t0
			if _, err := leader.apply(commandGossipKey, c); err != nil {
				t.Fatalf("entry %d: %v", i, err)
			}
			behind.apply(commandGossipKey, c)
		}
		want := jsonOf(t, leader.state().GossipKeys)
		if got := jsonOf(t, behind.state().GossipKeys); !bytes.Equal(got, want) {
			t.Errorf("after %d entries replayed: %s, the leader %s", n, got, want)
		}
		if got := jsonOf(t, snapshotOf(t, leader.fsm).state.GossipKeys); !bytes.Equal(got, want) {
			t.Errorf("from a snapshot after %d entries: %s, the leader %s", n, got, want)
		}
	}
}

// TestCARotationClientRenewedTwice: a client renewed twice during one
// rotation (its files lost, or renewed again by a script) keeps its
// certificate from before the rotation working until the finish, as the
// first renewal promised (the renewal in between, from the new CA, is
// superseded); a cancel gives it that certificate back, not the one from
// the CA the cancel drops, which no node trusts any more.
func TestCARotationClientRenewedTwice(t *testing.T) {
	for _, end := range []string{caFinish, caCancel} {
		t.Run(end, func(t *testing.T) {
			h := securityHarness(t)
			next := pkiCA(t)
			nextFP := pki.Fingerprint(next.Cert)
			if _, err := h.apply(commandClientAdd, Client{Name: "vm", Pattern: "vm*", Serial: "c1", Created: t0}); err != nil {
				t.Fatal(err)
			}
			if _, err := h.apply(commandCA, caCommand{Op: caStart, Fingerprint: nextFP, Cert: next.CertPEM, Node: "a", Time: t0}); err != nil {
				t.Fatal(err)
			}
			for _, serial := range []string{"c2", "c3"} {
				if _, err := h.apply(commandClientAdd, Client{Name: "vm", Pattern: "*", Serial: serial, Renew: true, Created: t0}); err != nil {
					t.Fatal(err)
				}
			}
			s := h.state()
			for _, c := range []struct {
				serial, ca string
				want       bool
			}{{"c1", "", true}, {"c2", nextFP, false}, {"c3", nextFP, true}} {
				if got := clientAccepted(s, "vm", c.serial, c.ca); got != c.want {
					t.Errorf("during the rotation, renewed twice: certificate %s from %s accepted %v, want %v (record %+v)", c.serial, caName(c.ca), got, c.want, *s.Clients["vm"])
				}
			}
			for _, id := range []string{"a", "b", "c"} {
				if _, err := h.apply(commandCA, caCommand{Op: caCertificate, Fingerprint: nextFP, Node: id, Serial: "1" + id, Time: t0}); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := h.apply(commandCA, caCommand{Op: end, Fingerprint: nextFP, Time: t0}); err != nil {
				t.Fatal(err)
			}
			s = h.state()
			want := map[string]bool{"c1": end == caCancel, "c2": false, "c3": end == caFinish}
			for serial, accepted := range want {
				ca := nextFP
				if serial == "c1" {
					ca = ""
				}
				if got := clientAccepted(s, "vm", serial, ca); got != accepted {
					t.Errorf("after the %s: certificate %s from %s accepted %v, want %v (record %+v)", end, serial, caName(ca), got, accepted, *s.Clients["vm"])
				}
			}
			if c := s.Clients["vm"]; c.Pattern != "vm*" {
				t.Errorf("the renewals changed the client's pattern: %+v", *c)
			}
		})
	}
}
