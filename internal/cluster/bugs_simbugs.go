//go:build simbugs

package cluster

import "fmt"

// The seeded bugs of bugs.go, switchable: this file is compiled only with
// the build tag simbugs, for the simulator's tests that it finds them.
var (
	bugDemoteHealthyVoter = false
	bugServeByContact     = false
)

// SeededBugs lists the names SetSeededBug accepts.
var SeededBugs = []string{"demote-healthy-voter", "serve-by-contact"}

// SetSeededBug turns a seeded bug on or off. Call it before the code it
// affects runs (it is not synchronised).
func SetSeededBug(name string, on bool) error {
	switch name {
	case "demote-healthy-voter":
		bugDemoteHealthyVoter = on
	case "serve-by-contact":
		bugServeByContact = on
	default:
		return fmt.Errorf("cluster: no seeded bug %q (known: %v)", name, SeededBugs)
	}
	return nil
}
