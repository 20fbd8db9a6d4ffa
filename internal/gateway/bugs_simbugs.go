//go:build simbugs

package gateway

import "fmt"

// The seeded bugs of bugs.go, switchable: this file is compiled only with
// the build tag simbugs, for the simulator's tests that it finds them.
var (
	bugOneReplicaReads    = false
	bugECHeadBeforeChunks = false
	bugECTrimBeforeHead   = false
)

// SeededBugs lists the names SetSeededBug accepts.
var SeededBugs = []string{"one-replica-reads", "ec-head-before-chunks", "ec-trim-before-head"}

// SetSeededBug turns a seeded bug on or off. Call it before the code it
// affects runs (it is not synchronised).
func SetSeededBug(name string, on bool) error {
	switch name {
	case "one-replica-reads":
		bugOneReplicaReads = on
	case "ec-head-before-chunks":
		bugECHeadBeforeChunks = on
	case "ec-trim-before-head":
		bugECTrimBeforeHead = on
	default:
		return fmt.Errorf("gateway: no seeded bug %q (known: %v)", name, SeededBugs)
	}
	return nil
}
