// Package testenv decides what a test does when this machine lacks
// something it needs: network namespaces, root, qemu, fio, libnbd. On a
// developer's machine the test is skipped with the reason; under CI
// (CI=true in the environment) it fails with the same reason, because CI
// installs everything (.ci/run) and a test that skips there proves
// nothing while the run still looks green.
//
// Skips that are not about a missing prerequisite (-short, a corpus
// generator run only on request) call t.Skip directly and say so.
package testenv

import (
	"os"
	"os/exec"
	"testing"
)

// CIVariable is the environment variable that marks a CI run; CI systems
// set it to "true", and .ci/run exports it.
const CIVariable = "CI"

// CI reports whether this is a CI run: $CI is "true".
func CI() bool { return os.Getenv(CIVariable) == "true" }

// Require does nothing when err is nil. Otherwise it ends the test: with
// t.Skipf outside CI, with t.Fatalf under CI. what names the prerequisite
// ("network namespaces", "qemu-io"), err says why it is missing.
func Require(t testing.TB, what string, err error) {
	t.Helper()
	if err == nil {
		return
	}
	if CI() {
		t.Fatalf("testenv: %s is required under %s=true (.ci/run installs it) but unavailable: %v", what, CIVariable, err)
	}
	t.Skipf("skipping: %s is unavailable: %v (under %s=true this fails the test)", what, err, CIVariable)
}

// LookPath returns the path of program, or ends the test through Require
// when it is not installed. debianPackage names the Debian package that
// installs it, for the message ("" for none).
func LookPath(t testing.TB, program, debianPackage string) string {
	t.Helper()
	path, err := exec.LookPath(program)
	if err != nil && debianPackage != "" {
		err = &missingError{err: err, debianPackage: debianPackage}
	}
	Require(t, program, err)
	return path
}

// RequireRoot ends the test through Require unless it runs as root; why
// says what needs root.
func RequireRoot(t testing.TB, why string) {
	t.Helper()
	var err error
	if os.Geteuid() != 0 {
		err = errNotRoot
	}
	Require(t, "root ("+why+")", err)
}
