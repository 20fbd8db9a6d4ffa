package statemachine

import (
	"encoding/json"
	"testing"
)

// TestDataScopeGatedByLevel: below LevelSecurity a token create's data
// scope is ignored, exactly as a binary older than the field (which drops
// it) applies the entry, so every node's state stays the same; once the
// level is raised a read-only token keeps it. An admin token never
// records it (it reads data anyway).
func TestDataScopeGatedByLevel(t *testing.T) {
	h := newHarness(t)
	h.join("a", "", "1")
	if _, err := h.apply(commandTokenCreate, Token{ID: "t1", Name: "early", Hash: "h1", ReadOnly: true, Data: true, Created: t0}); err != nil {
		t.Fatal(err)
	}
	if tok := *h.state().Tokens["t1"]; tok.Data || tok.ReadsData() || tok.Scope() != "read-only" {
		t.Fatalf("below level %d a read-only token kept its data scope: %+v", LevelSecurity, tok)
	}
	// What an older binary decodes from the same entry: no data field.
	raw, _ := json.Marshal(Token{ID: "t1", Name: "early", Hash: "h1", ReadOnly: true, Data: true, Created: t0})
	var old struct {
		ID       string `json:"id"`
		ReadOnly bool   `json:"read_only"`
	}
	if err := json.Unmarshal(raw, &old); err != nil || !old.ReadOnly {
		t.Fatalf("an older binary's view of the entry: %+v %v", old, err)
	}

	if _, err := h.apply(commandFeatureLevel, featureLevelCommand{Level: LevelSecurity, Time: t0}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.apply(commandTokenCreate, Token{ID: "t2", Name: "backup", Hash: "h2", ReadOnly: true, Data: true, Created: t0}); err != nil {
		t.Fatal(err)
	}
	if tok := *h.state().Tokens["t2"]; !tok.Data || !tok.ReadsData() || tok.Scope() != "read-only+data" {
		t.Fatalf("at level %d: %+v, want the data scope", LevelSecurity, tok)
	}
	if _, err := h.apply(commandTokenCreate, Token{ID: "t3", Name: "monitor", Hash: "h3", ReadOnly: true, Created: t0}); err != nil {
		t.Fatal(err)
	}
	if tok := *h.state().Tokens["t3"]; tok.ReadsData() || tok.Scope() != "read-only" {
		t.Fatalf("a read-only token without --data: %+v reads data", tok)
	}
	if _, err := h.apply(commandTokenCreate, Token{ID: "t4", Name: "ops", Hash: "h4", Data: true, Created: t0}); err != nil {
		t.Fatal(err)
	}
	if tok := *h.state().Tokens["t4"]; tok.Data || !tok.ReadsData() || tok.Scope() != "admin" {
		t.Fatalf("an admin token: %+v", tok)
	}
	if err := checkState(h.state()); err != nil {
		t.Fatal(err)
	}
}
