package gateway

import "errors"

// Errors of opening and using a Disk. Conditions of objects and replicas
// are internal/object's.
var (
	// ErrUnknownVDI: no VDI (or snapshot) of that name.
	ErrUnknownVDI = errors.New("gateway: no such vdi")
	// ErrBusy: the VDI is open for writing through another node.
	ErrBusy = errors.New("gateway: vdi is busy")
	// ErrNotReady: the cluster cannot serve the VDI now (not formatted, no
	// quorum, a lock or repair failed); trying again later may succeed.
	ErrNotReady = errors.New("gateway: not ready")
	// ErrOutOfRange: a request beyond the end of the disk.
	ErrOutOfRange = errors.New("gateway: request beyond the end of the vdi")
	// ErrReadOnly: a change to a disk opened read-only.
	ErrReadOnly = errors.New("gateway: vdi is open read-only")
	// ErrTimeout: a request waited for the cluster (epoch changes,
	// unreachable replicas) longer than Options.RetryTimeout.
	ErrTimeout = errors.New("gateway: gave up waiting for the cluster")
)
