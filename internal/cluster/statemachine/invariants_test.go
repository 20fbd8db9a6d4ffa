//go:build invariants

package statemachine

import (
	"strings"
	"testing"
)

// TestFSMPanicsOnABrokenInvariant: with the tag invariants, the FSM
// checks the state after an entry and panics naming what broke (here a
// lock of a node that is not a member, planted behind the FSM's back).
func TestFSMPanicsOnABrokenInvariant(t *testing.T) {
	h := fuzzBase(t)
	h.state().Locks["x"] = &Lock{Key: "x", Node: "d", Incarnation: "1"}
	defer func() {
		message, _ := recover().(string)
		if !strings.Contains(message, "herd: invariant violated: cluster state after log entry") || !strings.Contains(message, "not a live member") {
			t.Fatalf("panic %q; want the invariant named", message)
		}
	}()
	h.apply(commandVDICreate, vdiCreateCommand{Name: "another", Size: 1 << 20, Time: t0})
	t.Fatal("no panic")
}
