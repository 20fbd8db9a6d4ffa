package statemachine

import (
	"errors"
	"testing"
	"time"
)

// TestAdmissionAndJoinTokensNeedTheirLevel: below LevelSecurity (a
// cluster upgraded from before admission records, not yet finalized) the
// log refuses a node admission and a join token with
// ErrUpgradeRequired and records nothing, as a binary from before them
// would have halted on the entry; at the level both are applied.
func TestAdmissionAndJoinTokensNeedTheirLevel(t *testing.T) {
	h := newHarness(t)
	h.join("a", "", "1")
	for _, level := range []int{LevelBase, LevelVDICopies} {
		if level > LevelBase {
			if _, err := h.apply(commandFeatureLevel, featureLevelCommand{Level: level, Time: t0}); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := h.apply(commandNodeAdmit, nodeAdmitCommand{ID: "b", Serial: "0b", Time: t0}); !errors.Is(err, ErrUpgradeRequired) {
			t.Fatalf("a node admission at level %d: %v, want ErrUpgradeRequired", level, err)
		}
		if _, err := h.apply(commandJoinTokenCreate, JoinToken{ID: "tok", Hash: "x", Created: t0, Expires: t0.Add(time.Hour)}); !errors.Is(err, ErrUpgradeRequired) {
			t.Fatalf("a join token at level %d: %v, want ErrUpgradeRequired", level, err)
		}
		if s := h.state(); len(s.Admitted) != 0 || len(s.JoinTokens) != 0 {
			t.Fatalf("refused entries at level %d left admitted %v, join tokens %v", level, s.Admitted, s.JoinTokens)
		}
	}
	if FeatureJoinTokens.Level != LevelSecurity {
		t.Fatalf("FeatureJoinTokens is at level %d; this test expects LevelSecurity (%d)", FeatureJoinTokens.Level, LevelSecurity)
	}

	if _, err := h.apply(commandFeatureLevel, featureLevelCommand{Level: LevelSecurity, Time: t0}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.apply(commandJoinTokenCreate, JoinToken{ID: "tok", Hash: "x", Created: t0, Expires: t0.Add(time.Hour), Uses: 1}); err != nil {
		t.Fatalf("a join token at LevelSecurity: %v", err)
	}
	if _, err := h.apply(commandNodeAdmit, nodeAdmitCommand{ID: "b", Serial: "0b", Time: t0, JoinToken: "tok"}); err != nil {
		t.Fatalf("a node admission at LevelSecurity: %v", err)
	}
	s := h.state()
	if s.Admitted["b"] != "0b" || s.JoinTokens["tok"] == nil || s.JoinTokens["tok"].Used != 1 {
		t.Fatalf("at LevelSecurity: admitted %v, join token %+v; want b admitted through tok, used once", s.Admitted, s.JoinTokens["tok"])
	}
	if err := checkState(s); err != nil {
		t.Fatal(err)
	}
}
