package statemachine

import (
	"errors"
	"testing"
	"time"
)

// TestJoinTokenUsesAreCountedInTheLog: two admissions racing for a
// one-use token both pass the join handler's check, but the log admits
// only the first; an expired or revoked token admits nobody, and the
// entry's time (not the applying node's clock) decides expiry.
func TestJoinTokenUsesAreCountedInTheLog(t *testing.T) {
	h := newHarness(t)
	if _, err := h.apply(commandSecurityInit, securityInitCommand{JoinHash: "j", Admin: Token{ID: "t", Name: "admin", Hash: "h"}, Level: LevelSecurity, Self: &nodeAdmitCommand{ID: "a", Serial: "0a"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.apply(commandJoinTokenCreate, JoinToken{ID: "once", Hash: "x", Created: t0, Expires: t0.Add(time.Hour), Uses: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.apply(commandNodeAdmit, nodeAdmitCommand{ID: "b", Serial: "0b", Time: t0, JoinToken: "once"}); err != nil {
		t.Fatalf("first use: %v", err)
	}
	if _, err := h.apply(commandNodeAdmit, nodeAdmitCommand{ID: "c", Serial: "0c", Time: t0, JoinToken: "once"}); !errors.Is(err, ErrUnauthorized) {
		t.Fatalf("second use of a one-use token: %v, want refused", err)
	}
	if _, ok := h.state().Admitted["c"]; ok {
		t.Fatal("the refused admission was recorded")
	}
	if _, err := h.apply(commandJoinTokenCreate, JoinToken{ID: "hour", Hash: "y", Created: t0, Expires: t0.Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.apply(commandNodeAdmit, nodeAdmitCommand{ID: "d", Serial: "0d", Time: t0.Add(2 * time.Hour), JoinToken: "hour"}); !errors.Is(err, ErrUnauthorized) {
		t.Fatalf("an admission stamped after the token expired: %v, want refused", err)
	}
	if _, err := h.apply(commandJoinTokenRevoke, joinTokenRevokeCommand{ID: "hour"}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.apply(commandNodeAdmit, nodeAdmitCommand{ID: "e", Serial: "0e", Time: t0, JoinToken: "hour"}); !errors.Is(err, ErrUnauthorized) {
		t.Fatalf("a revoked token: %v, want refused", err)
	}
	// A create stamped after "once" expired forgets it.
	if _, err := h.apply(commandJoinTokenCreate, JoinToken{ID: "later", Hash: "z", Created: t0.Add(3 * time.Hour), Expires: t0.Add(4 * time.Hour)}); err != nil {
		t.Fatal(err)
	}
	if _, ok := h.state().JoinTokens["once"]; ok {
		t.Fatal("an expired token is still recorded after a later create")
	}
	if err := checkState(h.state()); err != nil {
		t.Fatal(err)
	}
}
