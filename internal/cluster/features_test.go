package cluster

import (
	"errors"
	"strings"
	"testing"
)

// TestUpgradeRequiredNamesTheNodes: a gated feature's refusal names every
// member whose binary is too old, and those gossip does not see; with
// none it tells the operator to finalize.
func TestUpgradeRequiredNamesTheNodes(t *testing.T) {
	err := upgradeRequired(FeatureVDICopies, 1, []string{"n1 (runs herd 0.8 (abc), level 1)", "n3 (down: its version is unknown; start it on the new herd, or `herd node remove` it)"})
	if !errors.Is(err, ErrUpgradeRequired) || !strings.Contains(err.Error(), "n1 (runs herd 0.8") || !strings.Contains(err.Error(), "n3 (down") {
		t.Fatalf("refusal: %v", err)
	}
	err = upgradeRequired(FeatureVDICopies, 1, nil)
	if !strings.Contains(err.Error(), "herd cluster finalize-upgrade") || !strings.Contains(err.Error(), "every member supports it") {
		t.Fatalf("refusal with every member upgraded: %v", err)
	}
	if ErrorCode(err) != "upgrade_required" {
		t.Fatalf("code %q", ErrorCode(err))
	}
	remote := ErrorFromCode(ErrorCode(err), err.Error())
	if !errors.Is(remote, ErrUpgradeRequired) {
		t.Fatal("a forwarded refusal does not match ErrUpgradeRequired")
	}
	if b := (Build{}); b.SupportedLevel() != LevelBase || !strings.Contains(b.String(), "older than feature levels") {
		t.Fatalf("a node without a build reports level %d, %q", b.SupportedLevel(), b)
	}
}
