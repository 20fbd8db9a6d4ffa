package nbd

import (
	"errors"
	"log/slog"
	"net"
	"os"
	"runtime"
	"sync"
	"time"

	"github.com/herd-storage/herd/internal/bufpool"
	"github.com/herd-storage/herd/internal/tlsbatch"
)

// Replies are written by whichever worker has one ready while nobody else
// is writing, and that worker writes every reply the others queued
// meanwhile in the same vectored write ("combining"): at depth one system
// call (and, with TLS, one gathered run of records) carries many replies,
// with no writer goroutine to wake, and at depth 1 a worker writes its own
// reply at once, as before.
//
// A request holds its slot, its budget and its buffers until its reply is
// written, whoever writes it: a client that does not read its replies
// still holds at most its slots' worth of them (a request refused by the
// reader takes a slot too). One deadline, the reply timeout, covers each
// batch's write.

// outgoing is one request's answer, with what the request holds until the
// answer is written (finish gives it all back).
type outgoing struct {
	parts [][]byte
	head  [replyHeadRoom]byte // backs the reply's header

	// slot: the request holds a slot (a request refused by the reader
	// does not). Every reply counts in inFlight until it is written.
	slot        bool
	payload     *bufpool.Buffer // a WRITE's data
	data        *bufpool.Buffer // a READ's data
	budgetBytes int64
}

// replyHeadRoom is room for the largest fixed reply header: a structured
// chunk's header and an offset (NBD_REPLY_TYPE_OFFSET_DATA) or an error
// code and message length (NBD_REPLY_TYPE_ERROR).
const replyHeadRoom = 32

var replyPool = sync.Pool{New: func() any { return &outgoing{parts: make([][]byte, 0, 4)} }}

func newReply() *outgoing { return replyPool.Get().(*outgoing) }

// replyQueue is a transmission's replies not yet written.
type replyQueue struct {
	mu      sync.Mutex
	queue   []*outgoing
	spare   []*outgoing // the last batch's slice, reused
	writing bool        // a worker is writing a batch
	err     error       // the first write failure: nothing more is written
	vectors net.Buffers
}

// deliver queues rep's reply and, if no other worker is writing, writes
// it and every reply queued until the queue is empty. The request's
// resources are given back once its reply is written or can no longer be.
func (t *transmission) deliver(rep *outgoing) {
	t.serving.Add(-1)
	q := &t.replies
	q.mu.Lock()
	if q.err != nil {
		q.mu.Unlock()
		t.finish(rep)
		return
	}
	q.queue = append(q.queue, rep)
	if q.writing {
		q.mu.Unlock() // the writer takes it after its write
		return
	}
	q.writing = true
	if t.serving.Load() > 0 {
		// Other requests are being served: let those ready to answer
		// queue theirs first, so that one write carries them all. At
		// depth 1 nothing else is served and the write goes out at once.
		q.mu.Unlock()
		runtime.Gosched()
		q.mu.Lock()
	}
	t.writeQueued()
}

// writeQueued writes the queued replies, batch after batch, until the
// queue is empty or a write fails; the caller set q.writing. If writing or
// giving back a reply panics, nothing more is written on the connection
// and every reply queued or in the batch is given back, then the panic
// goes on (handle's recover closes the connection): no reply is left
// queued with nobody to write it.
func (t *transmission) writeQueued() {
	q := &t.replies
	var batch []*outgoing
	defer func() {
		recovered := recover()
		if recovered == nil {
			return
		}
		for i, r := range batch {
			if r != nil {
				batch[i] = nil
				t.finish(r)
			}
		}
		q.mu.Lock()
		t.stopWriting(errRepliesCut) // unlocks q.mu
		t.cut.Store(true)
		panic(recovered)
	}()
	for {
		batch = q.queue
		q.queue = q.spare[:0]
		q.spare = nil
		q.mu.Unlock()
		err := t.writeReplies(batch)
		for i, r := range batch {
			batch[i] = nil // before finish: a panic there must not give r back twice
			t.finish(r)
		}
		q.mu.Lock()
		q.spare = batch[:0]
		batch = nil
		if err != nil {
			t.stopWriting(err) // unlocks q.mu
			return
		}
		if len(q.queue) == 0 {
			q.writing = false
			q.mu.Unlock()
			return
		}
	}
}

// stopWriting, called with q.mu held by the writer, records err as the
// end of writing on this connection, unlocks q.mu and gives back every
// reply still queued: none will be written.
func (t *transmission) stopWriting(err error) {
	q := &t.replies
	q.err = err
	left := q.queue
	q.queue = nil
	q.writing = false
	q.mu.Unlock()
	for _, r := range left {
		t.finish(r)
	}
}

// writeReplies writes batch in one vectored write. After a failed write
// the connection is closed and nothing more is sent: a reply cut short
// leaves the stream unparseable.
//
// Each write has the reply timeout as its deadline: a client that sends
// requests but does not read the replies would otherwise hold their
// buffers, and its share of the Server's memory budget, for ever.
func (t *transmission) writeReplies(batch []*outgoing) error {
	q := &t.replies
	vectors := q.vectors[:0]
	for _, r := range batch {
		vectors = append(vectors, r.parts...)
	}
	connection := t.connection
	connection.server.replyWrites.Add(1)
	timeout := connection.server.replyTimeout()
	connection.netConn.SetWriteDeadline(time.Now().Add(timeout))
	var err error
	buffers := vectors // WriteTo consumes its receiver
	if connection.tlsConn != nil {
		// One vectored write's worth of system calls, not one per
		// part and TLS record.
		_, err = tlsbatch.Write(connection.tlsConn, buffers)
	} else {
		_, err = buffers.WriteTo(connection.writer)
	}
	clear(vectors)
	q.vectors = vectors[:0]
	if err != nil {
		// Nothing more reaches the client: read no more of what it
		// sent. The requests already running finish (a write cut off
		// between its replicas would leave them different).
		t.cut.Store(true)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			connection.logLimited(slog.LevelWarn,
				"nbd: client did not read its replies within the reply timeout; disconnecting it",
				"reply_timeout", timeout)
		}
		connection.hardClose()
	}
	return err
}

// finish gives back what rep's request held: its buffers, its bytes of
// memory and budget (in the reverse order of taking them), its slot.
func (t *transmission) finish(rep *outgoing) {
	t.putBuffer(rep.data)
	t.putBuffer(rep.payload)
	if rep.budgetBytes != 0 {
		t.memory.Release(rep.budgetBytes)
		t.client.Release(rep.budgetBytes)
		t.budget.Release(rep.budgetBytes)
	}
	slot := rep.slot
	parts := rep.parts
	clear(parts)
	*rep = outgoing{parts: parts[:0]}
	replyPool.Put(rep)
	if slot {
		<-t.slots
	}
	t.inFlight.Done()
}
