package objproto

import (
	"fmt"

	"github.com/herd-storage/herd/internal/bufpool"
)

// Payload buffers of the object protocol come from internal/bufpool, on
// both sides of a connection: the server reads WRITE payloads into them and
// handlers may return READ data in them; a gateway may read into them with
// ObjectClient.Do.

// Every payload of the protocol fits in a pooled buffer (a negative
// difference does not compile).
const _ uint = bufpool.MaximumLength - MaxPayload

// Releaser is something to give back when its user is done with it.
type Releaser interface {
	Release()
}

// ReleaseFunc adapts a function to Releaser.
type ReleaseFunc func()

// Release calls f.
func (f ReleaseFunc) Release() { f() }

// GetObjectBuffer returns a pooled buffer of n bytes, 0 <= n <= MaxPayload.
// Its contents are unspecified. Release it when done (a *bufpool.Buffer is a
// Releaser).
func GetObjectBuffer(n int) *bufpool.Buffer {
	if n < 0 || n > MaxPayload {
		// Callers validate lengths from the wire first: this is a bug.
		panic(fmt.Sprintf("peer: object buffer of %d bytes requested (maximum %d)", n, MaxPayload))
	}
	return bufpool.Get(n)
}
