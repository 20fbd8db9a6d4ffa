package objproto

import (
	"bufio"
	"crypto/tls"
	"net"
	"time"

	"github.com/herd-storage/herd/internal/tlsbatch"
)

// Both ends of an object connection write from one goroutine that batches
// what is queued and writes it with one vectored write (writev), flushing
// when its queue is empty: concurrent requests share system calls, and a
// lone request is not delayed waiting for company. A small message on a
// connection with nothing else in flight is written by the goroutine that
// produced it instead (writeDirect): at queue depth 1 handing it to the
// writer costs a goroutine wake-up, often another thread's, and there is
// nothing to batch it with.
const (
	// objectCopyThreshold: pieces shorter than this (headers, error
	// messages, STAT bodies) are copied into one contiguous run; longer
	// ones (data payloads) are written in place, never copied.
	objectCopyThreshold = 1024
	// objectBatchBytesMaximum and objectBatchMessagesMaximum bound one
	// batch, so that the resources of its messages are released soon and
	// a batch stays within a few writev calls (Linux caps one at 1024
	// vectors; Go splits longer ones).
	objectBatchBytesMaximum    = 8 << 20
	objectBatchMessagesMaximum = 256
	// objectWriteTimeout bounds one batch write. A peer that stops
	// reading for this long holds resources for nothing: its connection
	// is closed. 8 MiB in 30 s is 280 kB/s, far below any working link.
	objectWriteTimeout = 30 * time.Second
	// objectDirectBytesMaximum bounds a message that the goroutine which
	// produced it writes itself, bypassing the connection's writer (see
	// objectClientConnection.writeDirect): small enough to fit in any
	// socket's send buffer, so that such a write does not wait for the
	// peer to read.
	objectDirectBytesMaximum = 64 << 10
)

// objectVectors gathers the messages of one batch into net.Buffers.
type objectVectors struct {
	scratch  []byte
	runStart int // start in scratch of the run not yet in vectors
	vectors  net.Buffers
	bytes    int
	messages int
	// coalesce gathers the vectors for a connection that cannot write
	// them in one system call and is not TLS (tests' pipes; TLS
	// connections use tlsbatch, which also gathers the records).
	coalesce *bufio.Writer
}

// objectCoalesceBytes is the size of coalesce's buffer: four full TLS
// records.
const objectCoalesceBytes = 64 << 10

func (v *objectVectors) reset() {
	v.scratch = v.scratch[:0]
	v.runStart = 0
	clear(v.vectors) // drop references to payloads already written
	v.vectors = v.vectors[:0]
	v.bytes = 0
	v.messages = 0
}

// add appends one message: its header and its payload (possibly empty).
func (v *objectVectors) add(header, payload []byte) {
	v.scratch = append(v.scratch, header...)
	if len(payload) < objectCopyThreshold {
		v.scratch = append(v.scratch, payload...)
	} else {
		v.endRun()
		v.vectors = append(v.vectors, payload)
	}
	v.bytes += len(header) + len(payload)
	v.messages++
}

// endRun moves the copied bytes not yet in vectors into one vector. An
// earlier run stays valid if scratch grows later: append copies scratch to a
// new array and leaves the old one, which the earlier vector references,
// untouched. The capacity limit keeps later appends from writing into a
// vector's range.
func (v *objectVectors) endRun() {
	if len(v.scratch) > v.runStart {
		v.vectors = append(v.vectors, v.scratch[v.runStart:len(v.scratch):len(v.scratch)])
		v.runStart = len(v.scratch)
	}
}

func (v *objectVectors) full() bool {
	return v.bytes >= objectBatchBytesMaximum || v.messages >= objectBatchMessagesMaximum
}

// writeTo writes the batch to conn with a deadline timeout from now.
func (v *objectVectors) writeTo(conn net.Conn, timeout time.Duration) error {
	v.endRun()
	conn.SetWriteDeadline(time.Now().Add(timeout))
	buffers := v.vectors // WriteTo consumes its receiver; keep v.vectors for reuse
	if _, vectored := conn.(*net.TCPConn); vectored {
		_, err := buffers.WriteTo(conn)
		return err
	}
	if t, ok := conn.(*tls.Conn); ok {
		_, err := tlsbatch.Write(t, buffers)
		return err
	}
	if v.coalesce == nil {
		v.coalesce = bufio.NewWriterSize(conn, objectCoalesceBytes)
	}
	v.coalesce.Reset(conn)
	if _, err := buffers.WriteTo(v.coalesce); err != nil {
		return err
	}
	return v.coalesce.Flush()
}
