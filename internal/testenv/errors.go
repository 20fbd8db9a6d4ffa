package testenv

import (
	"errors"
	"fmt"
)

// errNotRoot is RequireRoot's reason.
var errNotRoot = errors.New("testenv: the test runs without root (run the tests as root)")

// missingError is a program not found, with the package that installs it.
type missingError struct {
	err           error
	debianPackage string
}

func (e *missingError) Error() string {
	return fmt.Sprintf("%v (Debian package %s)", e.err, e.debianPackage)
}

func (e *missingError) Unwrap() error { return e.err }
