package gateway

import (
	"errors"
	"fmt"
)

// Errors a Replicas implementation returns, and the gateway's own.
var (
	ErrNotFound    = errors.New("gateway: object not found on replica")
	ErrStaleEpoch  = errors.New("gateway: stale epoch")
	ErrUnavailable = errors.New("gateway: replica unavailable")
	ErrNoCopy      = errors.New("gateway: no provably current copy of object is reachable")
	// ErrNoObject: no reachable node holds the object, and none that is
	// down can hold a newer copy: it was never written (or was deleted).
	ErrNoObject = errors.New("gateway: object does not exist")
	// ErrNotRecovered: the replica's copy was not written or recovered
	// in this epoch, so it may be stale; RECOVER it first.
	ErrNotRecovered = errors.New("gateway: copy not recovered in this epoch")
	ErrNotFormatted = errors.New("gateway: cluster is not formatted")
	ErrTimeout      = errors.New("gateway: gave up waiting for the cluster")
)

// StaleEpochError says the replica is in another epoch than the request.
type StaleEpochError struct{ Current uint64 }

func (e *StaleEpochError) Error() string {
	return fmt.Sprintf("gateway: stale epoch (replica is at epoch %d)", e.Current)
}

func (e *StaleEpochError) Is(target error) bool { return target == ErrStaleEpoch }

// ReplicaError names the node and object a replica operation failed on.
type ReplicaError struct {
	Node string
	OID  uint64
	Err  error
}

func (e *ReplicaError) Error() string {
	return fmt.Sprintf("object %016x on node %s: %v", e.OID, e.Node, e.Err)
}

func (e *ReplicaError) Unwrap() error { return e.Err }

// ErrNoSpace is returned by Replicas when a replica's disk is full.
var ErrNoSpace = errors.New("gateway: replica out of space")

func isNoSpace(err error) bool { return errors.Is(err, ErrNoSpace) }
