package statemachine

import (
	"errors"
	"testing"
)

func TestCredentialsInTheLog(t *testing.T) {
	h := newHarness(t)
	h.join("a", "", "1")
	h.join("b", "", "1")
	admin := Token{ID: "t1", Name: "admin", Hash: "h1", Created: t0}
	if _, err := h.apply(commandSecurityInit, securityInitCommand{JoinHash: "j1", Admin: admin}); err != nil {
		t.Fatal(err)
	}
	// A retried init (a lost answer) changes nothing.
	if _, err := h.apply(commandSecurityInit, securityInitCommand{JoinHash: "j2", Admin: Token{ID: "t2", Name: "admin", Hash: "h2"}}); err != nil {
		t.Fatal(err)
	}
	if s := h.state(); s.JoinHash != "j1" || len(s.Tokens) != 1 || s.Tokens["t1"].Hash != "h1" {
		t.Fatalf("after a second init: join %q tokens %+v", s.JoinHash, s.Tokens)
	}
	if _, err := h.apply(commandTokenCreate, Token{ID: "t3", Name: "admin", Hash: "h3"}); !errors.Is(err, ErrAlreadyExists) {
		t.Errorf("a second live token named admin: %v, want ErrAlreadyExists", err)
	}
	if _, err := h.apply(commandTokenCreate, Token{ID: "t3", Name: "../x", Hash: "h3"}); !errors.Is(err, ErrInvalid) {
		t.Errorf("token named ../x: %v, want ErrInvalid", err)
	}
	if _, err := h.apply(commandTokenRevoke, tokenRevokeCommand{ID: "admin"}); err != nil {
		t.Fatal(err)
	}
	if !h.state().Tokens["t1"].Revoked {
		t.Error("token revoked by name is not revoked")
	}
	if _, err := h.apply(commandClientAdd, Client{Name: "host1", Pattern: "vm*", Serial: "01"}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.apply(commandClientAdd, Client{Name: "host1", Pattern: "*", Serial: "02"}); !errors.Is(err, ErrAlreadyExists) {
		t.Errorf("re-adding a live client: %v, want ErrAlreadyExists", err)
	}
	if _, err := h.apply(commandClientAdd, Client{Name: "host2", Pattern: "[", Serial: "03"}); !errors.Is(err, ErrInvalid) {
		t.Errorf("a malformed pattern: %v, want ErrInvalid", err)
	}
	if _, err := h.apply(commandClientRevoke, clientRevokeCommand{Name: "host1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.apply(commandClientAdd, Client{Name: "host1", Pattern: "*", Serial: "04"}); err != nil {
		t.Errorf("re-adding a revoked client: %v", err)
	}
	if c := h.state().Clients["host1"]; c.Revoked || c.Serial != "04" {
		t.Errorf("re-added client: %+v", c)
	}
	if _, err := h.apply(commandNodeRemove, nodeRemoveCommand{ID: "b", Time: t0}); !errors.Is(err, ErrBusy) {
		t.Errorf("removing an alive node: %v, want ErrBusy", err)
	}
	if _, err := h.apply(commandNodeLeave, nodeLeaveCommand{ID: "b", Time: t0}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.apply(commandNodeRemove, nodeRemoveCommand{ID: "b", Time: t0}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.apply(commandNodeJoin, nodeJoinCommand{Node: Node{ID: "b", Address: "b", Incarnation: "2"}, Time: t0}); !errors.Is(err, ErrUnauthorized) {
		t.Errorf("a removed node joining again: %v, want ErrUnauthorized", err)
	}
	if _, err := h.apply(commandJoinSecretSet, joinSecretCommand{Hash: "j9"}); err != nil || h.state().JoinHash != "j9" {
		t.Errorf("join secret rotation: %v, hash %q", err, h.state().JoinHash)
	}
}

func TestMatchPattern(t *testing.T) {
	for _, c := range []struct {
		pattern, name string
		want          bool
	}{{"vm*", "vm1", true}, {"vm*", "db1", false}, {"*", "db1", true}, {"db1", "db1", true}, {"vm?", "vm12", false}, {"[", "x", false}} {
		if got := MatchPattern(c.pattern, c.name); got != c.want {
			t.Errorf("MatchPattern(%q, %q) = %v, want %v", c.pattern, c.name, got, c.want)
		}
	}
}
