package statemachine

import (
	"errors"
)

// Sentinel errors. Each has a stable code so that an error produced on the
// leader keeps its identity when it is forwarded to the node a client asked.
var (
	ErrNoQuorum         = errors.New("no quorum")
	ErrNotFormatted     = errors.New("cluster is not formatted (run: herd cluster format --copies N)")
	ErrAlreadyFormatted = errors.New("cluster is already formatted")
	ErrAlreadyExists    = errors.New("already exists")
	ErrNotFound         = errors.New("not found")
	ErrInvalid          = errors.New("invalid argument")
	ErrLockHeld         = errors.New("lock is held")
	ErrNotLockOwner     = errors.New("lock is not held by this owner")
	ErrTooFewNodes      = errors.New("not enough nodes")
	ErrShrink           = errors.New("shrinking a vdi is not supported")
	ErrBusy             = errors.New("busy")
	ErrUnauthorized     = errors.New("wrong, revoked or missing credential")
	ErrForbidden        = errors.New("not allowed with this credential")
	ErrExhausted        = errors.New("identifiers exhausted")
	ErrIncompatible     = errors.New("incompatible herd versions")
)

var errorCodes = []struct {
	code string
	err  error
}{
	{"no_quorum", ErrNoQuorum},
	{"incompatible", ErrIncompatible},
	{"not_formatted", ErrNotFormatted},
	{"already_formatted", ErrAlreadyFormatted},
	{"already_exists", ErrAlreadyExists},
	{"not_found", ErrNotFound},
	{"invalid", ErrInvalid},
	{"lock_held", ErrLockHeld},
	{"not_lock_owner", ErrNotLockOwner},
	{"too_few_nodes", ErrTooFewNodes},
	{"shrink", ErrShrink},
	{"busy", ErrBusy},
	{"unauthorized", ErrUnauthorized},
	{"forbidden", ErrForbidden},
	{"exhausted", ErrExhausted},
}

// ErrorCode returns the stable code of the first sentinel err wraps, or
// "internal".
func ErrorCode(err error) string {
	for _, c := range errorCodes {
		if errors.Is(err, c.err) {
			return c.code
		}
	}
	return "internal"
}

// RemoteError is an error that crossed the network: it keeps the message
// and, through its code, matches the sentinel it was made from.
type RemoteError struct {
	Code    string
	Message string
}

func (e *RemoteError) Error() string { return e.Message }

// Is lets errors.Is(remote, ErrAlreadyExists) hold on the receiving side.
func (e *RemoteError) Is(target error) bool {
	for _, c := range errorCodes {
		if c.code == e.Code {
			return c.err == target
		}
	}
	return false
}

// ErrorFromCode rebuilds an error received with a code and message.
func ErrorFromCode(code, message string) error {
	return &RemoteError{Code: code, Message: message}
}

// Sentinel is a sentinel error with its stable code.
type Sentinel struct {
	Code string
	Err  error
}

// Sentinels lists the sentinel errors with their codes, as ErrorCode and
// RemoteError match them.
func Sentinels() []Sentinel {
	out := make([]Sentinel, len(errorCodes))
	for i, c := range errorCodes {
		out[i] = Sentinel{Code: c.code, Err: c.err}
	}
	return out
}
