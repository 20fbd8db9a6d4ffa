//go:build simbugs

package recovery

import "fmt"

// The seeded bugs of bugs.go, switchable: this file is compiled only with
// the build tag simbugs, for the simulator's test that it finds them.
var bugEveryNodeWitnesses = false

// SeededBugs lists the names SetSeededBug accepts.
var SeededBugs = []string{"every-node-witnesses"}

// SetSeededBug turns a seeded bug on or off. Call it before the code it
// affects runs (it is not synchronised).
func SetSeededBug(name string, on bool) error {
	switch name {
	case "every-node-witnesses":
		bugEveryNodeWitnesses = on
	default:
		return fmt.Errorf("recovery: no seeded bug %q (known: %v)", name, SeededBugs)
	}
	return nil
}
