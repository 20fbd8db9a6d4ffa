package objproto

import (
	"context"
	"errors"
	"fmt"

	"github.com/herd-storage/herd/internal/object"
)

// Errors of the object protocol. Each status but OK has one; ObjectClient.Do
// returns them wrapped with the responder's address and message, and an
// ObjectHandler may return them through ObjectErrorResponse. Translation
// between statuses and errors happens only in this file. The conditions of
// an object copy are the data path's shared vocabulary (internal/object):
// a replica's store error crosses the wire and comes out as the same
// sentinel on the requester's side.
var (
	// ErrObjectNotFound: the replica does not hold the object.
	ErrObjectNotFound = object.ErrNotFound
	// ErrStaleEpoch: the request's epoch is not the replica's. The error
	// is a *StaleEpochError carrying the replica's epoch.
	ErrStaleEpoch = object.ErrStaleEpoch
	// ErrObjectInvalid: a request field was out of range, or the payload
	// did not match its CRC (the data was not applied).
	ErrObjectInvalid = object.ErrInvalid
	// ErrObjectTooLarge: a READ or WRITE longer than MaxPayload.
	ErrObjectTooLarge = fmt.Errorf("peer: object request too large: %w", object.ErrInvalid)
	// ErrUnknownObjectOpcode: the replica does not know the opcode.
	ErrUnknownObjectOpcode = errors.New("peer: unknown object opcode")
	// ErrObjectIO: the replica's disk failed.
	ErrObjectIO = object.ErrIO
	// ErrNoSpace: the replica's disks are full.
	ErrNoSpace = object.ErrNoSpace
	// ErrCorrupt: the replica's copy failed its checksum, or the data was
	// damaged on the way (payload CRC mismatch in a response).
	ErrCorrupt = object.ErrCorrupt
	// ErrChecksum: blocks of the replica's copy fail their data checksum.
	ErrChecksum = object.ErrChecksum
	// ErrShuttingDown: the replica is stopping, or cannot serve now (no
	// quorum): object.ErrUnavailable.
	ErrShuttingDown = object.ErrUnavailable
	// ErrPeerUnavailable: no answer could be had from the node: it could
	// not be dialled, or its connection broke with the request pending.
	// The request may or may not have been applied.
	ErrPeerUnavailable = fmt.Errorf("peer: no answer from the node: %w", object.ErrUnavailable)
	// ErrObjectProtocol: a header could not be trusted (bad magic, version
	// or CRC) or a response broke the protocol; the connection is closed.
	ErrObjectProtocol = errors.New("peer: object protocol violation")
	// ErrNotRecovered: the replica's copy is not yet proven current in
	// this epoch; RECOVER it, then retry.
	ErrNotRecovered = object.ErrNotRecovered
	// ErrNoCopy: no reachable copy of the object is provably current.
	ErrNoCopy = object.ErrNoCopy
	// ErrObjectServerClosed is returned by ObjectServer.Serve after Close.
	ErrObjectServerClosed = errors.New("peer: object server closed")
	// ErrObjectClientClosed is returned by ObjectClient.Do after Close.
	ErrObjectClientClosed = fmt.Errorf("peer: object client closed: %w", object.ErrUnavailable)
)

// StaleEpochError is the error of a STALE_EPOCH response: the replica is at
// epoch Current. errors.Is(err, ErrStaleEpoch) holds for it.
type StaleEpochError struct {
	// Current is the responder's epoch.
	Current object.Epoch
	// Address is the responder's (empty when a handler returns the error).
	Address string
	// Message is the responder's explanation, if any.
	Message string
}

func (e *StaleEpochError) Error() string {
	text := fmt.Sprintf("peer: %s: node is at epoch %d", ErrStaleEpoch, e.Current)
	if e.Address != "" {
		text += " (" + e.Address + ")"
	}
	if e.Message != "" {
		text += ": " + e.Message
	}
	return text
}

// Is makes errors.Is(err, ErrStaleEpoch) true.
func (e *StaleEpochError) Is(target error) bool { return target == ErrStaleEpoch }

// CurrentEpoch is the responder's epoch.
func (e *StaleEpochError) CurrentEpoch() object.Epoch { return e.Current }

// objectStatusErrors maps each status but OK to its sentinel.
var objectStatusErrors = [objectStatusCount]error{
	ObjectStatusNotFound:      ErrObjectNotFound,
	ObjectStatusStaleEpoch:    ErrStaleEpoch,
	ObjectStatusInvalid:       ErrObjectInvalid,
	ObjectStatusIO:            ErrObjectIO,
	ObjectStatusNoSpace:       ErrNoSpace,
	ObjectStatusCorrupt:       ErrCorrupt,
	ObjectStatusShuttingDown:  ErrShuttingDown,
	ObjectStatusUnknownOpcode: ErrUnknownObjectOpcode,
	ObjectStatusTooLarge:      ErrObjectTooLarge,
	ObjectStatusNotRecovered:  ErrNotRecovered,
	ObjectStatusNoCopy:        ErrNoCopy,
	ObjectStatusChecksum:      ErrChecksum,
}

// ObjectStatusOf returns the status that reports err to a requester: the
// status of the sentinel err wraps, SHUTTING_DOWN for a cancelled context
// (the connection or the server is going away), IO for anything else.
func ObjectStatusOf(err error) ObjectStatus {
	if err == nil {
		return ObjectStatusOK
	}
	// Highest first: TOO_LARGE's error is also an INVALID one.
	for status := len(objectStatusErrors) - 1; status > 0; status-- {
		if sentinel := objectStatusErrors[status]; sentinel != nil && errors.Is(err, sentinel) {
			return ObjectStatus(status)
		}
	}
	if errors.Is(err, context.Canceled) {
		return ObjectStatusShuttingDown
	}
	return ObjectStatusIO
}

// epochReporter is an error that names the node's current epoch. Found
// by errors.As, so its method's signature is checked here: an error type
// whose CurrentEpoch changed would otherwise no longer match, silently.
type epochReporter interface{ CurrentEpoch() object.Epoch }

var (
	_ epochReporter = (*StaleEpochError)(nil)
	_ epochReporter = (*object.StaleEpochError)(nil)
)

// ObjectErrorResponse builds the response and body that report err, for an
// ObjectHandler: the status from ObjectStatusOf, err's text as the message,
// and epoch as the responder's epoch, except that a *StaleEpochError sets
// the epoch to its Current.
func ObjectErrorResponse(epoch object.Epoch, err error) (ObjectResponse, []byte) {
	var stale epochReporter
	if errors.As(err, &stale) {
		epoch = stale.CurrentEpoch()
	}
	return ObjectResponse{Status: ObjectStatusOf(err), Epoch: epoch}, []byte(objectErrorMessage(err.Error()))
}

// objectResponseError turns a non-OK response from address into the error
// Do returns.
func objectResponseError(response *ObjectResponse, address string, message []byte) error {
	text := objectErrorMessage(string(message))
	if response.Status == ObjectStatusStaleEpoch {
		return &StaleEpochError{Current: response.Epoch, Address: address, Message: text}
	}
	var sentinel error
	if response.Status < objectStatusCount {
		sentinel = objectStatusErrors[response.Status]
	}
	if sentinel == nil {
		// A status this version does not know, from a newer node.
		return fmt.Errorf("peer: %w: %s answered with %s: %s", ErrObjectIO, address, response.Status, text)
	}
	if text == "" {
		return fmt.Errorf("peer: %w (%s)", sentinel, address)
	}
	return fmt.Errorf("peer: %w (%s): %s", sentinel, address, text)
}

// peerUnavailable wraps cause as the error of a call that got no answer from
// address.
func peerUnavailable(address string, cause error) error {
	return fmt.Errorf("%w: %s: %w", ErrPeerUnavailable, address, cause)
}
