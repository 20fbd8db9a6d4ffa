//go:build simbugs

package sim

import (
	"fmt"
	"slices"

	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/gateway"
	"github.com/herd-storage/herd/internal/recovery"
)

// The seeded bugs of bugs.go, switchable: this file is compiled only with
// the build tag simbugs, for the tests that show the simulator finds them.
var bugLeaseByContact = false

// seededBugs lists the names setSeededBug accepts: the simulator's own,
// recovery's and cluster's (the raft mode's: raft_test.go).
var seededBugs = append(append(append([]string{"lease-by-contact"}, recovery.SeededBugs...), cluster.SeededBugs...), gateway.SeededBugs...)

// setSeededBug turns a seeded bug on or off. Call it before a run starts
// (it is not synchronised).
func setSeededBug(name string, on bool) error {
	switch {
	case name == "lease-by-contact":
		bugLeaseByContact = on
	case slices.Contains(recovery.SeededBugs, name):
		return recovery.SetSeededBug(name, on)
	case slices.Contains(cluster.SeededBugs, name):
		return cluster.SetSeededBug(name, on)
	case slices.Contains(gateway.SeededBugs, name):
		return gateway.SetSeededBug(name, on)
	default:
		return fmt.Errorf("sim: no seeded bug %q (known: %v)", name, seededBugs)
	}
	return nil
}
