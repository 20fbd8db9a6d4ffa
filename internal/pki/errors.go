package pki

import (
	"errors"
	"fmt"
	"os"
)

var (
	// ErrBadToken is wrapped by every error of ParseJoinToken and
	// ParseAdminToken; the error's text says what is wrong for a person.
	ErrBadToken = errors.New("pki: bad token")
	// ErrFingerprintMismatch: the server's chain holds no CA certificate
	// with the expected fingerprint.
	ErrFingerprintMismatch = errors.New("pki: the server's CA fingerprint does not match")
	// ErrNotNode: a certificate that verifies is not a herd node's.
	ErrNotNode = errors.New("pki: not a herd node certificate")
	// ErrInsecureMode is wrapped by *ModeError.
	ErrInsecureMode = errors.New("pki: secret readable by others")
	// ErrBadPEM: a PEM input holds no block of the expected type, or one
	// that does not parse.
	ErrBadPEM = errors.New("pki: bad PEM")
)

// tokenError is a token parse failure. Its text is written for the person
// who pasted the token, so it carries no package prefix; errors.Is(err,
// ErrBadToken) identifies it.
type tokenError struct{ reason string }

func (e *tokenError) Error() string { return e.reason }
func (e *tokenError) Unwrap() error { return ErrBadToken }

func badToken(format string, args ...any) error {
	return &tokenError{reason: fmt.Sprintf(format, args...)}
}

// ModeError reports a file or directory holding secrets that others may
// access. Its text names the fix.
type ModeError struct {
	Path string
	Mode os.FileMode // the permission bits found
	Want os.FileMode // the permission bits expected (0600 or 0700)
	Dir  bool
}

func (e *ModeError) Error() string {
	what := "it holds a secret"
	if e.Dir {
		what = "it holds secrets"
	}
	return fmt.Sprintf("%s has mode %04o: %s, make it %04o (chmod %o %s)", e.Path, uint32(e.Mode), what, uint32(e.Want), uint32(e.Want), e.Path)
}

func (e *ModeError) Unwrap() error { return ErrInsecureMode }
