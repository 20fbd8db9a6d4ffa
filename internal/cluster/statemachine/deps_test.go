package statemachine

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestNoRuntimeImports: the state machine imports no raft, no gossip
// (memberlist) and no network package, directly or through another
// package (crypto/x509 brings in net: CA certificates are parsed through
// ParseCA, which the runtime sets). What it needs of the runtime comes
// through its interfaces (Proposer) and hooks, so it stays a pure
// function of the log that tests and fuzzing drive alone.
func TestNoRuntimeImports(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("the go tool is missing: %v", err)
		}
		t.Skipf("the go tool is missing: %v", err)
	}
	out, err := exec.Command(goTool, "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	for _, dep := range strings.Fields(string(out)) {
		switch {
		case strings.HasPrefix(dep, "github.com/hashicorp/raft"),
			strings.HasPrefix(dep, "github.com/hashicorp/memberlist"),
			dep == "net", strings.HasPrefix(dep, "net/"):
			t.Errorf("the state machine depends on %s (go list -deps ./internal/cluster/statemachine)", dep)
		}
	}
}
