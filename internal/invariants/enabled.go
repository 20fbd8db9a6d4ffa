//go:build invariants

package invariants

// Enabled is true in a build with the tag invariants: the costly checks
// run.
const Enabled = true
