package statemachine

import (
	"errors"
	"strings"
	"testing"
)

// securityHarness is a cluster at LevelSecurity with nodes a, b, c alive.
func securityHarness(t *testing.T) *harness {
	t.Helper()
	h := newHarness(t)
	if _, err := h.apply(commandSecurityInit, securityInitCommand{JoinHash: "j", Admin: Token{ID: "t", Name: "admin", Hash: "h"}, Level: LevelSecurity, Self: &nodeAdmitCommand{ID: "a", Serial: "0a"}}); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"b", "c"} {
		if _, err := h.apply(commandNodeAdmit, nodeAdmitCommand{ID: id, Serial: "0" + id, Time: t0}); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range []string{"a", "b", "c"} {
		h.join(id, "", "1")
	}
	return h
}

// TestGossipKeyRotationInTheLog: the log moves a rotation on only when
// every alive member reported the step before (the switch once all
// installed the key, the end once all encrypt with it), a node that is
// down is not waited for, a second rotation waits for the first, and
// each step is an event.
func TestGossipKeyRotationInTheLog(t *testing.T) {
	h := securityHarness(t)
	k1, k2 := GossipKeyID([]byte("key one")), GossipKeyID([]byte("key two"))
	step := func(op, key, node string) error {
		t.Helper()
		_, err := h.apply(commandGossipKey, gossipKeyCommand{Op: op, Key: key, Node: node, Time: t0})
		return err
	}
	if err := step(GossipKeyOpSwitch, k1, ""); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a switch with no rotation: %v, want ErrNotFound", err)
	}
	if err := step(gossipKeyStart, k1, "a"); err != nil {
		t.Fatal(err)
	}
	if err := step(gossipKeyStart, k2, "b"); !errors.Is(err, ErrBusy) {
		t.Fatalf("a second rotation while one is under way: %v, want ErrBusy", err)
	}
	for _, id := range []string{"a", "b"} {
		if err := step(gossipKeyInstalled, k1, id); err != nil {
			t.Fatal(err)
		}
	}
	if err := step(gossipKeyInstalled, k1, "a"); err != nil {
		t.Fatalf("a report made twice (a retry): %v", err)
	}
	if err := step(gossipKeyUsing, k1, "a"); !errors.Is(err, ErrInvalid) {
		t.Fatalf("a node using the key before the switch: %v, want refused", err)
	}
	if err := step(GossipKeyOpSwitch, k1, ""); !errors.Is(err, ErrBusy) || !strings.Contains(err.Error(), "c") {
		t.Fatalf("the switch while node c has not installed the key: %v, want ErrBusy naming c", err)
	}
	// c goes down: the rotation does not wait for it (it fetches the
	// keyring over mTLS when it starts).
	if _, err := h.apply(commandNodeLeave, nodeLeaveCommand{ID: "c", Reason: "killed", Time: t0}); err != nil {
		t.Fatal(err)
	}
	if err := step(GossipKeyOpSwitch, k1, ""); err != nil {
		t.Fatalf("the switch once every alive member installed the key: %v", err)
	}
	if err := step(gossipKeyUsing, k1, "a"); err != nil {
		t.Fatal(err)
	}
	// c is back before the end: now it is waited for.
	h.join("c", "", "2")
	if err := step(GossipKeyOpDone, k1, ""); !errors.Is(err, ErrBusy) {
		t.Fatalf("the end while b and c do not use the key: %v, want ErrBusy", err)
	}
	for _, id := range []string{"b", "c"} {
		if err := step(gossipKeyUsing, k1, id); err != nil {
			t.Fatal(err)
		}
	}
	if err := step(GossipKeyOpDone, k1, ""); err != nil {
		t.Fatal(err)
	}
	if k := h.state().GossipKeys; k.Primary != k1 || k.Rotation != nil || !k.Rotated.Equal(t0) {
		t.Fatalf("after the rotation: %+v", k)
	}
	if err := checkState(h.state()); err != nil {
		t.Fatal(err)
	}
	if err := step(gossipKeyStart, k1, "a"); !errors.Is(err, ErrInvalid) {
		t.Fatalf("a rotation to the key in use: %v, want refused", err)
	}
	if err := step(gossipKeyStart, k2, "b"); err != nil {
		t.Fatalf("the next rotation: %v", err)
	}
	if r := h.state().GossipKeys.Rotation; r == nil || r.Old != k1 || r.Holder != "b" {
		t.Fatalf("the next rotation is recorded as %+v", r)
	}
	var texts []string
	for _, e := range h.state().Events {
		if e.Kind == "credentials" {
			texts = append(texts, e.Text)
		}
	}
	all := strings.Join(texts, "\n")
	for _, want := range []string{"gossip key rotation started: new key " + k1 + " made by node a", "node b installed gossip key " + k1, "every node holds gossip key " + k1,
		"node b encrypts gossip with key " + k1, "gossip key " + k1 + " in use on every node: the old key (the first) is removed everywhere"} {
		if !strings.Contains(all, want) {
			t.Errorf("no event saying %q in:\n%s", want, all)
		}
	}
	if strings.Count(all, "node a installed") != 1 {
		t.Errorf("a repeated report made a second event:\n%s", all)
	}
}

func TestGossipKeyRotationNeedsItsLevel(t *testing.T) {
	h := newHarness(t)
	h.join("a", "", "1")
	if _, err := h.apply(commandGossipKey, gossipKeyCommand{Op: gossipKeyStart, Key: GossipKeyID([]byte("k")), Node: "a", Time: t0}); !errors.Is(err, ErrUpgradeRequired) {
		t.Fatalf("a rotation below LevelSecurity: %v, want ErrUpgradeRequired", err)
	}
}
