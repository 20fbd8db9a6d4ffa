package store

import (
	"errors"
	"fmt"

	"github.com/herd-storage/herd/internal/object"
)

// Sentinel errors: the data path's shared vocabulary (internal/object),
// so that what the store reports needs no translation above it. Every
// error the store returns for an object is an *ObjectError that wraps one
// of these (and the operating system's error when there is one), so test
// with errors.Is.
var (
	// ErrNotFound: the object has no copy on this node's disks.
	ErrNotFound = object.ErrNotFound
	// ErrCorrupt: the copy cannot be trusted: its header has a bad magic,
	// version, object id or checksum, or an earlier sync of its data
	// failed. Reads and writes are refused until it is removed and
	// recovered from another replica.
	ErrCorrupt = object.ErrCorrupt
	// ErrChecksum: blocks of the copy's data fail their checksum
	// (checksum.go); they are not returned, and the copy's other blocks
	// are good. Repair rewrites them from another replica's.
	ErrChecksum = object.ErrChecksum
	// ErrNoSpace: the disk is full (ENOSPC or EDQUOT from the kernel), or a
	// new object would eat into the disk's reserve.
	ErrNoSpace = object.ErrNoSpace
	// ErrIO: the kernel reported EIO; the disk or file system is failing.
	ErrIO = object.ErrIO
	// ErrInvalid: a bad argument (range beyond MaxObjectSize, bad options).
	ErrInvalid = object.ErrInvalid
	// ErrClosed: the store has been closed (the node is stopping).
	ErrClosed = fmt.Errorf("store: closed: %w", object.ErrUnavailable)
	// ErrPermissions: Open refused a disk whose directory other users
	// can write, or could not close its objects/ to them.
	ErrPermissions = errors.New("store: unsafe permissions")
)

// ObjectError is a failed operation on one object. Kind is one of the
// sentinel errors above, or nil for an unclassified operating system error;
// Err is the underlying cause (an *os.PathError, a syscall.Errno, ...) or nil.
// errors.Is matches both.
type ObjectError struct {
	Op   string // "read", "write", "create", "sync", ...
	OID  object.OID
	Path string // the object's file, when known
	Kind error
	Err  error
}

func (e *ObjectError) Error() string {
	message := fmt.Sprintf("store: %s object %016x", e.Op, e.OID)
	if e.Path != "" {
		message += " (" + e.Path + ")"
	}
	if e.Kind != nil {
		message += ": " + trimPrefix(e.Kind.Error())
	}
	if e.Err != nil {
		message += ": " + e.Err.Error()
	}
	return message
}

// Unwrap lets errors.Is and errors.As see both the sentinel and the cause.
func (e *ObjectError) Unwrap() []error {
	errs := make([]error, 0, 2)
	if e.Kind != nil {
		errs = append(errs, e.Kind)
	}
	if e.Err != nil {
		errs = append(errs, e.Err)
	}
	return errs
}

// trimPrefix drops the "store: " of a sentinel so that a wrapped message
// does not repeat it.
func trimPrefix(message string) string {
	const prefix = "store: "
	if len(message) > len(prefix) && message[:len(prefix)] == prefix {
		return message[len(prefix):]
	}
	return message
}

// objectError wraps an operating system error from operation op on object
// oid, classified (ENOSPC -> ErrNoSpace, EIO -> ErrIO).
func objectError(op string, oid object.OID, path string, err error) error {
	return &ObjectError{Op: op, OID: oid, Path: path, Kind: classify(err), Err: err}
}

// classifiedError is a cause that also matches a sentinel (kind may be nil)
// without repeating the sentinel's text in the message.
type classifiedError struct {
	kind error
	err  error
}

func (e *classifiedError) Error() string { return e.err.Error() }

func (e *classifiedError) Unwrap() []error {
	if e.kind == nil {
		return []error{e.err}
	}
	return []error{e.kind, e.err}
}

// oidString formats an object id as in file names, for logs.
func oidString(oid object.OID) string {
	return fmt.Sprintf("%016x", oid)
}
