// Package invariants switches on herd's executable invariants: checks of
// internal consistency too costly to run on every production request or
// log entry (the cluster state after every applied entry, every new
// placement, a store's or replica's bookkeeping where it changes). They
// are compiled in with the build tag `invariants`:
//
//	go test -tags invariants ./internal/...
//
// and their call sites read
//
//	if invariants.Enabled {
//		if err := s.Check(); err != nil {
//			invariants.Fail("cluster state after entry %d: %v", index, err)
//		}
//	}
//
// so that without the tag the compiler drops them. A few cheap checks
// (O(1) where a broken assumption would otherwise corrupt data) run in
// every build and panic through Fail too, naming the invariant.
// docs/ARCHITECTURE.md ("Executable invariants") lists them all.
package invariants

import "fmt"

// Fail panics with a message naming the invariant that does not hold.
func Fail(format string, args ...any) {
	panic("herd: invariant violated: " + fmt.Sprintf(format, args...))
}
