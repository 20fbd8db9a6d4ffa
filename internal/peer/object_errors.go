package peer

import (
	"context"
	"errors"
	"fmt"
)

// Errors of the object protocol. Each status but OK has one; ObjectClient.Do
// returns them wrapped with the responder's address and message, and an
// ObjectHandler may return them through ObjectErrorResponse. Translation
// between statuses and errors happens only in this file.
var (
	// ErrObjectNotFound: the replica does not hold the object.
	ErrObjectNotFound = errors.New("peer: object not found")
	// ErrStaleEpoch: the request's epoch is not the replica's. The error
	// is a *StaleEpochError carrying the replica's epoch.
	ErrStaleEpoch = errors.New("peer: stale epoch")
	// ErrObjectInvalid: a request field was out of range, or the payload
	// did not match its CRC (the data was not applied).
	ErrObjectInvalid = errors.New("peer: invalid object request")
	// ErrObjectTooLarge: a READ or WRITE longer than MaxPayload.
	ErrObjectTooLarge = errors.New("peer: object request too large")
	// ErrUnknownObjectOpcode: the replica does not know the opcode.
	ErrUnknownObjectOpcode = errors.New("peer: unknown object opcode")
	// ErrObjectIO: the replica's disk failed.
	ErrObjectIO = errors.New("peer: object input/output error")
	// ErrNoSpace: the replica's disks are full.
	ErrNoSpace = errors.New("peer: no space left on replica")
	// ErrCorrupt: the replica's copy failed its checksum, or the data was
	// damaged on the way (payload CRC mismatch in a response).
	ErrCorrupt = errors.New("peer: object corrupt")
	// ErrShuttingDown: the replica is stopping.
	ErrShuttingDown = errors.New("peer: node shutting down")
	// ErrPeerUnavailable: no answer could be had from the node: it could
	// not be dialled, or its connection broke with the request pending.
	// The request may or may not have been applied.
	ErrPeerUnavailable = errors.New("peer: node unavailable")
	// ErrObjectProtocol: a header could not be trusted (bad magic, version
	// or CRC) or a response broke the protocol; the connection is closed.
	ErrObjectProtocol = errors.New("peer: object protocol violation")
	// ErrNotRecovered: the replica's copy is not yet proven current in
	// this epoch; RECOVER it, then retry.
	ErrNotRecovered = errors.New("peer: copy not recovered in this epoch")
	// ErrNoCopy: no reachable copy of the object is provably current.
	ErrNoCopy = errors.New("peer: no provably current copy reachable")
	// ErrObjectServerClosed is returned by ObjectServer.Serve after Close.
	ErrObjectServerClosed = errors.New("peer: object server closed")
	// ErrObjectClientClosed is returned by ObjectClient.Do after Close.
	ErrObjectClientClosed = errors.New("peer: object client closed")
)

// StaleEpochError is the error of a STALE_EPOCH response: the replica is at
// epoch Current. errors.Is(err, ErrStaleEpoch) holds for it.
type StaleEpochError struct {
	// Current is the responder's epoch.
	Current uint64
	// Address is the responder's (empty when a handler returns the error).
	Address string
	// Message is the responder's explanation, if any.
	Message string
}

func (e *StaleEpochError) Error() string {
	text := fmt.Sprintf("%s: node is at epoch %d", ErrStaleEpoch, e.Current)
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
}

// ObjectStatusOf returns the status that reports err to a requester: the
// status of the sentinel err wraps, SHUTTING_DOWN for a cancelled context
// (the connection or the server is going away), IO for anything else.
func ObjectStatusOf(err error) ObjectStatus {
	if err == nil {
		return ObjectStatusOK
	}
	for status, sentinel := range objectStatusErrors {
		if sentinel != nil && errors.Is(err, sentinel) {
			return ObjectStatus(status)
		}
	}
	if errors.Is(err, context.Canceled) {
		return ObjectStatusShuttingDown
	}
	return ObjectStatusIO
}

// ObjectErrorResponse builds the response and body that report err, for an
// ObjectHandler: the status from ObjectStatusOf, err's text as the message,
// and epoch as the responder's epoch, except that a *StaleEpochError sets
// the epoch to its Current.
func ObjectErrorResponse(epoch uint64, err error) (ObjectResponse, []byte) {
	var stale *StaleEpochError
	if errors.As(err, &stale) {
		epoch = stale.Current
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
		return fmt.Errorf("%w: %s answered with %s: %s", ErrObjectIO, address, response.Status, text)
	}
	if text == "" {
		return fmt.Errorf("%w (%s)", sentinel, address)
	}
	return fmt.Errorf("%w (%s): %s", sentinel, address, text)
}

// peerUnavailable wraps cause as the error of a call that got no answer from
// address.
func peerUnavailable(address string, cause error) error {
	return fmt.Errorf("%w: %s: %w", ErrPeerUnavailable, address, cause)
}
