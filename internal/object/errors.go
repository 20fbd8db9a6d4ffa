package object

import (
	"errors"
	"fmt"
)

// Conditions of an operation on an object copy. Errors wrap one of these
// (test with errors.Is); the text after it says where and why.
var (
	// ErrNotFound: the node holds no copy of the object.
	ErrNotFound = errors.New("object not found")
	// ErrStaleEpoch: the node is in another epoch than the request (see
	// StaleEpochError for its epoch).
	ErrStaleEpoch = errors.New("stale epoch")
	// ErrUnavailable: the node cannot be reached or cannot serve now (no
	// quorum, shutting down, did not answer); trying again later, or in
	// the next epoch, may succeed.
	ErrUnavailable = errors.New("replica unavailable")
	// ErrNotRecovered: the node's copy was not written or proven current
	// in this epoch, so it may be stale: the node must recover it first.
	ErrNotRecovered = errors.New("copy not recovered in this epoch")
	// ErrNoCopy: no reachable copy is provably current: the newest copies
	// may be on nodes that are down. Refused until one returns.
	ErrNoCopy = errors.New("no provably current copy of object is reachable")
	// ErrNoObject: no reachable node holds the object, and no node that
	// is down can hold a newer copy: it was never written (or deleted).
	ErrNoObject = errors.New("object does not exist")
	// ErrNoSpace: the disk is full, or a new object would eat into its
	// reserve.
	ErrNoSpace = errors.New("no space left")
	// ErrCorrupt: the copy cannot be trusted (bad header, failed sync): it
	// is never read again; it is removed and recovered from another copy.
	ErrCorrupt = errors.New("object corrupt")
	// ErrChecksum: some 4 KiB blocks of the copy's data failed their
	// checksum (bit rot, a misdirected or lost write). Those blocks are
	// never returned; the rest of the copy is good. The reader goes to
	// another replica, and the bad blocks are rewritten from a good copy
	// (a block repair), never by removing the whole copy.
	ErrChecksum = errors.New("data checksum mismatch")
	// ErrIO: the disk reported an I/O error.
	ErrIO = errors.New("input/output error")
	// ErrInvalid: a request out of range or otherwise malformed.
	ErrInvalid = errors.New("invalid argument")
)

// StaleEpochError says the node is at epoch Current, not the request's.
type StaleEpochError struct{ Current Epoch }

func (e *StaleEpochError) Error() string {
	return fmt.Sprintf("%s: the node is at epoch %d", ErrStaleEpoch, e.Current)
}

// Is makes errors.Is(err, ErrStaleEpoch) true.
func (e *StaleEpochError) Is(target error) bool { return target == ErrStaleEpoch }

// CurrentEpoch is the node's epoch.
func (e *StaleEpochError) CurrentEpoch() Epoch { return e.Current }

// ReplicaError names the node and object an operation failed on.
type ReplicaError struct {
	Node string
	OID  OID
	Err  error
}

func (e *ReplicaError) Error() string {
	return fmt.Sprintf("object %016x on node %s: %v", e.OID, e.Node, e.Err)
}

func (e *ReplicaError) Unwrap() error { return e.Err }

// Retryable says whether err means "try again, in this epoch or the
// next" rather than a failure to report.
func Retryable(err error) bool {
	return errors.Is(err, ErrStaleEpoch) || errors.Is(err, ErrUnavailable)
}

// Damaged says whether err means the copy (or its disk) failed: it is
// replaced from another copy.
func Damaged(err error) bool {
	return errors.Is(err, ErrCorrupt) || errors.Is(err, ErrIO)
}
