package objproto

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"github.com/herd-storage/herd/internal/object"
	"github.com/herd-storage/herd/internal/peer"
	"io"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults of ObjectClient.
const (
	defaultObjectConnectionsPerAddress = 2
	defaultObjectDialTimeout           = 5 * time.Second
	objectClientQueueLength            = 1024
)

// ObjectClientOption configures an ObjectClient.
type ObjectClientOption func(*ObjectClient)

// WithConnectionsPerAddress sets how many connections the client keeps to
// each node (default 2). Calls are spread over them round-robin: one
// connection already carries many requests at once, more let the two ends
// use more cores and TCP windows.
func WithConnectionsPerAddress(n int) ObjectClientOption {
	return func(c *ObjectClient) {
		if n > 0 {
			c.connectionsPerAddress = n
		}
	}
}

// WithDialTimeout bounds connecting and authenticating to a node (default
// 5 s).
func WithDialTimeout(d time.Duration) ObjectClientOption {
	return func(c *ObjectClient) {
		if d > 0 {
			c.dialTimeout = d
		}
	}
}

// ObjectClient is the requesting side of the object protocol: a gateway's
// connections to the replicas. It keeps a few pipelined connections per node
// address, dialled on first use and redialled on the first call after one
// breaks; any number of goroutines may call Do at once, and their requests
// travel together on the same connections, answered in any order.
type ObjectClient struct {
	creds                 *peer.Credentials
	connectionsPerAddress int
	dialTimeout           time.Duration

	// ctx is cancelled by Close, which ends dials in progress.
	ctx    context.Context
	cancel context.CancelFunc
	// running counts dial and connection goroutines; Close waits for them.
	running sync.WaitGroup

	mu        sync.Mutex // guards the fields below; taken after a slot's mu
	addresses map[string]*objectAddress
	closed    bool
}

// objectAddress is the connections of a client to one node.
type objectAddress struct {
	next  atomic.Uint32
	slots []objectConnectionSlot
	// pending counts the calls pending on the address's connections.
	pending atomic.Int32
}

// objectConnectionSlot holds one of an address's connections, or the dial
// that will provide it, so that callers arriving during a dial share it
// instead of dialling again.
type objectConnectionSlot struct {
	mu         sync.Mutex // guards the fields below
	connection *objectClientConnection
	dial       *objectDial
}

type objectDial struct {
	done       chan struct{} // closed when connection or err is set
	connection *objectClientConnection
	err        error
}

// NewObjectClient returns a client that authenticates to nodes with creds
// (see Dial).
func NewObjectClient(creds *peer.Credentials, options ...ObjectClientOption) *ObjectClient {
	c := &ObjectClient{
		creds:                 creds,
		connectionsPerAddress: defaultObjectConnectionsPerAddress,
		dialTimeout:           defaultObjectDialTimeout,
		addresses:             make(map[string]*objectAddress),
	}
	for _, option := range options {
		option(c)
	}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	return c
}

// Do sends request to the node at address and waits for its response.
//
// payload is the WRITE data (nil for every other opcode); Do sets the
// request's Length from it, computes its CRC and assigns the request id, and
// does not modify request. For a response with a body (READ data, a STAT or
// LIST body) the body is read straight from the connection into into when
// cap(into) is large enough, else into a new slice; the body is returned.
// payload and into must not be used by the caller until Do returns; Do does
// not keep them afterwards.
//
// A status other than OK is returned as an error wrapping its sentinel
// (ErrObjectNotFound, a *StaleEpochError, ...), with the response, so its
// Epoch can be read. If the connection breaks, or the node cannot be
// reached, the error wraps ErrPeerUnavailable and names address: the
// request may or may not have been applied. If ctx ends first, Do returns
// ctx.Err() and the connection stays up (a late response is discarded);
// only if the call's payload or body is at that moment being written or
// read on the connection does Do first wait for that to end, since both
// belong to the caller again once Do returns. That wait is short unless the
// node stops reading, and then ends when the connection is dropped for it
// (a batch not written within 30 s).
func (c *ObjectClient) Do(ctx context.Context, address string, request *ObjectRequest, payload []byte, into []byte) (ObjectResponse, []byte, error) {
	pending, err := c.Start(ctx, address, request, payload, into)
	if err != nil {
		return ObjectResponse{}, nil, err
	}
	return pending.Wait(ctx)
}

// ObjectPending is a request Start has sent, whose answer Wait returns.
type ObjectPending struct {
	call       *objectCall
	connection *objectClientConnection
}

// Start is the first half of Do: it queues request on a connection to
// address and returns without waiting for the answer, so that one
// goroutine can have requests to several nodes in flight at once. If it
// returns no error, the caller must call Wait exactly once, and must not
// touch payload or into until Wait has returned (as for Do).
func (c *ObjectClient) Start(ctx context.Context, address string, request *ObjectRequest, payload []byte, into []byte) (ObjectPending, error) {
	var checksum uint32
	if request.Opcode == ObjectWrite && len(payload) <= MaxPayload {
		checksum = ObjectChecksum(payload)
	}
	return c.StartChecksummed(ctx, address, request, payload, checksum, into)
}

// StartChecksummed is Start for a WRITE whose payload's checksum the caller
// has computed already (ObjectChecksum(payload), which it must be: a
// wrong one makes the node refuse the write), as a gateway does once for
// the replicas it sends the same data to. For other opcodes checksum is
// ignored.
func (c *ObjectClient) StartChecksummed(ctx context.Context, address string, request *ObjectRequest, payload []byte, checksum uint32, into []byte) (ObjectPending, error) {
	r := *request
	r.ID = 0
	if r.Opcode == ObjectWrite {
		if len(payload) > MaxPayload {
			return ObjectPending{}, fmt.Errorf("%w: WRITE of %d bytes exceeds the %d-byte maximum payload", ErrObjectTooLarge, len(payload), MaxPayload)
		}
		r.Length = uint32(len(payload))
		r.Checksum = checksum
	} else if len(payload) > 0 {
		return ObjectPending{}, fmt.Errorf("%w: %s carries no payload, got %d bytes", ErrObjectInvalid, r.Opcode, len(payload))
	}
	if status, message := ValidateObjectRequest(&r); status != ObjectStatusOK {
		return ObjectPending{}, fmt.Errorf("%w: %s", objectStatusErrors[status], message)
	}
	if err := ctx.Err(); err != nil {
		return ObjectPending{}, err
	}

	call := &objectCall{payload: payload, into: into, opcode: r.Opcode, flags: r.Flags, length: r.Length, done: make(chan struct{})}
	if len(payload) > 0 {
		call.written = make(chan struct{})
	}
	// A connection found broken before the call was registered on it never
	// saw the call: dial again once rather than fail a request that was
	// not sent.
	var connection *objectClientConnection
	var alone bool
	for attempt := 0; ; attempt++ {
		var err error
		connection, err = c.connection(ctx, address)
		if err != nil {
			return ObjectPending{}, err
		}
		r.ID, alone, err = connection.register(call)
		if err == nil {
			break
		}
		if attempt == 1 {
			return ObjectPending{}, err
		}
	}
	EncodeObjectRequest(&call.header, &r)

	if alone && len(payload) <= objectDirectBytesMaximum-ObjectRequestHeaderSize && connection.writeDirect(call) {
		return ObjectPending{call: call, connection: connection}, nil
	}
	select {
	case connection.queue <- call:
	case <-call.done: // the connection failed and failed the call
	case <-ctx.Done():
		connection.abandon(call)
		return ObjectPending{}, ctx.Err()
	}
	return ObjectPending{call: call, connection: connection}, nil
}

// Wait waits for the answer to a request Start sent, as Do does: if ctx
// ends first it returns ctx.Err() once the connection no longer uses the
// request's payload or into.
func (p ObjectPending) Wait(ctx context.Context) (ObjectResponse, []byte, error) {
	call := p.call
	select {
	case <-call.done:
	case <-ctx.Done():
		p.connection.abandon(call)
		return ObjectResponse{}, nil, ctx.Err()
	}
	call.releasePayload()
	return call.response, call.body, call.err
}

// Answered is when the answer Wait returned arrived: the zero time if
// there was none (the connection failed, or ctx ended first). Valid once
// Wait has returned.
func (p ObjectPending) Answered() time.Time { return p.call.answered }

// connection returns a working connection to address, dialling if needed.
func (c *ObjectClient) connection(ctx context.Context, address string) (*objectClientConnection, error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, ErrObjectClientClosed
	}
	a := c.addresses[address]
	if a == nil {
		a = &objectAddress{slots: make([]objectConnectionSlot, c.connectionsPerAddress)}
		c.addresses[address] = a
	}
	c.mu.Unlock()

	slot := &a.slots[(a.next.Add(1)-1)%uint32(len(a.slots))]
	slot.mu.Lock()
	if connection := slot.connection; connection != nil && !connection.broken() {
		slot.mu.Unlock()
		return connection, nil
	}
	slot.connection = nil
	d := slot.dial
	if d == nil {
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			slot.mu.Unlock()
			return nil, ErrObjectClientClosed
		}
		c.running.Add(1) // under c.mu, before Close can Wait
		c.mu.Unlock()
		d = &objectDial{done: make(chan struct{})}
		slot.dial = d
		go c.dial(address, a, slot, d)
	}
	slot.mu.Unlock()
	select {
	case <-d.done:
		return d.connection, d.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// dial connects slot to address. It runs on its own goroutine, with the
// client's context rather than a caller's, so that one caller giving up does
// not fail the others waiting for the same dial.
func (c *ObjectClient) dial(address string, a *objectAddress, slot *objectConnectionSlot, d *objectDial) {
	defer c.running.Done()
	ctx, cancel := context.WithTimeout(c.ctx, c.dialTimeout)
	raw, err := peer.Dial(ctx, address, c.creds, peer.ProtocolObject)
	cancel()
	var connection *objectClientConnection
	if err != nil {
		if c.ctx.Err() != nil {
			err = ErrObjectClientClosed
		} else {
			err = peerUnavailable(address, err)
		}
	} else {
		connection = newObjectClientConnection(address, raw, &a.pending)
		c.running.Add(2)
		go func() {
			defer c.running.Done()
			connection.readResponses()
		}()
		go func() {
			defer c.running.Done()
			connection.writeRequests()
		}()
	}

	slot.mu.Lock()
	slot.dial = nil
	if connection != nil {
		c.mu.Lock()
		closed := c.closed
		c.mu.Unlock()
		if closed {
			// Close has passed this slot already, or will find it
			// empty: close the connection here.
			connection.fail(ErrObjectClientClosed)
			connection, err = nil, ErrObjectClientClosed
		} else {
			slot.connection = connection
		}
	}
	slot.mu.Unlock()
	d.connection, d.err = connection, err
	close(d.done)
}

// Close closes every connection, failing the calls pending on them, and
// returns once the client's goroutines have ended. Later calls to Do fail
// with ErrObjectClientClosed.
func (c *ObjectClient) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	addresses := c.addresses
	c.addresses = nil
	c.mu.Unlock()
	c.cancel()
	for _, a := range addresses {
		for i := range a.slots {
			slot := &a.slots[i]
			slot.mu.Lock()
			connection := slot.connection
			slot.connection = nil
			slot.mu.Unlock()
			if connection != nil {
				connection.fail(ErrObjectClientClosed)
			}
		}
	}
	c.running.Wait()
	return nil
}

// objectClientConnection is one pipelined connection to a node.
type objectClientConnection struct {
	address string
	conn    net.Conn
	queue   chan *objectCall // to the writer
	done    chan struct{}    // closed by fail
	nextID  atomic.Uint64

	// writeMu is held by whoever writes to conn: the writer, or a caller
	// in writeDirect, which uses direct.
	writeMu sync.Mutex
	direct  objectVectors

	// addressPending is the objectAddress's count of pending calls,
	// changed with pending.
	addressPending *atomic.Int32

	mu      sync.Mutex // guards the fields below
	pending map[uint64]*objectCall
	err     error // why the connection failed; set once
}

// objectCall is one request in flight and, later, its result.
//
// Ownership, so that the caller's payload and into are never touched after
// Do returns: the writer takes a call by moving state from queued to
// writing (writeDirect by setting it before the call is queued anywhere),
// and closes written once its write has returned; a call is
// completed (result set, done closed) by whoever removes it from pending:
// the reader, when it has read the body into into; fail; or never, if Do
// removed it when abandoning it.
type objectCall struct {
	header  [ObjectRequestHeaderSize]byte
	payload []byte
	into    []byte
	opcode  ObjectOpcode
	flags   object.Flags
	length  uint32
	id      uint64

	state   atomic.Int32  // objectCallQueued, objectCallWriting, objectCallAbandoned
	written chan struct{} // closed by the writer; nil without payload

	done     chan struct{}
	answered time.Time // when the reader completed the call
	response ObjectResponse
	body     []byte
	err      error
}

const (
	objectCallQueued int32 = iota
	objectCallWriting
	objectCallAbandoned
)

func newObjectClientConnection(address string, conn net.Conn, addressPending *atomic.Int32) *objectClientConnection {
	return &objectClientConnection{
		address:        address,
		addressPending: addressPending,
		conn:           conn,
		queue:          make(chan *objectCall, objectClientQueueLength),
		done:           make(chan struct{}),
		pending:        make(map[uint64]*objectCall),
	}
}

func (c *objectClientConnection) broken() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// register assigns call an id and makes it pending; alone reports that no
// other call was pending on the connections to the same address.
func (c *objectClientConnection) register(call *objectCall) (id uint64, alone bool, err error) {
	id = c.nextID.Add(1)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return 0, false, c.err
	}
	call.id = id
	c.pending[id] = call
	return id, c.addressPending.Add(1) == 1, nil
}

// writeDirect writes call, a small request registered alone on the
// connections to its address, from the caller's goroutine, if the writer is not writing
// and has nothing queued; it reports whether it did (else the caller
// queues call as usual). Nothing else pending means the peer has read
// what this end sent, except requests whose callers gave up, so a
// message smaller than a socket buffer does not wait for it to read.
// Those abandoned requests may still fill the buffers of a peer that
// stopped reading, and nothing can abandon a write the caller makes
// itself: so it has objectAbandonGrace to finish, the time an abandoned
// call gives its payload's send before the connection is closed under it.
// A failed write fails the connection, and with it the call, which the
// caller retries elsewhere as for any ErrPeerUnavailable.
func (c *objectClientConnection) writeDirect(call *objectCall) bool {
	if len(c.queue) > 0 || !c.writeMu.TryLock() {
		return false
	}
	defer c.writeMu.Unlock()
	// The call is not queued, so nobody else moves its state.
	call.state.Store(objectCallWriting)
	c.direct.reset()
	c.direct.add(call.header[:], call.payload)
	err := c.direct.writeTo(c.conn, objectAbandonGrace)
	c.direct.reset()
	if call.written != nil {
		close(call.written)
	}
	if err != nil {
		c.fail(fmt.Errorf("writing a request: %w", err))
	}
	return true
}

// abandon withdraws a call whose caller stopped waiting, and returns once
// nothing of the connection uses the call's payload or into any more.
// objectAbandonGrace is how long an abandoned call waits for its payload's
// send to finish before the connection is closed under it.
const objectAbandonGrace = time.Second

func (c *objectClientConnection) abandon(call *objectCall) {
	c.mu.Lock()
	_, stillPending := c.pending[call.id]
	if stillPending {
		delete(c.pending, call.id)
		c.addressPending.Add(-1)
	}
	c.mu.Unlock()
	if !stillPending {
		// The reader is reading the response into into (or fail has
		// completed the call): that ends soon, with the connection's
		// data or its failure.
		<-call.done
	}
	if call.written != nil && !call.state.CompareAndSwap(objectCallQueued, objectCallAbandoned) {
		// The payload is being sent. On a working link that ends in
		// microseconds; a peer that stopped reading (a paused or
		// partitioned node) would hold the caller until the write times
		// out, 30 s. After a grace period, close the connection: the write
		// fails at once and the connection's other calls see
		// ErrPeerUnavailable, which callers retry elsewhere.
		grace := time.NewTimer(objectAbandonGrace)
		select {
		case <-call.written:
		case <-grace.C:
			c.fail(errors.New("a call was abandoned while its payload was still being sent: the peer stopped reading"))
			<-call.written
		}
		grace.Stop()
	}
}

// releasePayload returns once the writer will not read the call's payload
// any more.
func (call *objectCall) releasePayload() {
	if call.written == nil {
		return
	}
	if !call.state.CompareAndSwap(objectCallQueued, objectCallAbandoned) {
		<-call.written
	}
}

// fail closes the connection and fails its pending calls with an error
// wrapping ErrPeerUnavailable.
func (c *objectClientConnection) fail(cause error) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	c.err = peerUnavailable(c.address, cause)
	pending := c.pending
	c.addressPending.Add(-int32(len(pending)))
	c.pending = nil
	close(c.done)
	c.mu.Unlock()
	c.conn.Close()
	for _, call := range pending {
		call.err = c.err
		close(call.done)
	}
}

// writeRequests writes queued requests in batches until the connection
// fails.
func (c *objectClientConnection) writeRequests() {
	var vectors objectVectors
	batch := make([]*objectCall, 0, objectBatchMessagesMaximum)
	for {
		var call *objectCall
		select {
		case call = <-c.queue:
		case <-c.done:
			return
		}
		// Let the goroutines that are ready to run queue theirs first: at
		// depth they are many, and one write (one system call, one TLS
		// record, one read at the other end) then carries them all.
		// Measured on 3 nodes, 4 KiB random writes at QD32: +25-50% IOPS
		// and 20-30% less CPU per write; at QD1 nothing else is ready and
		// the yield returns at once.
		runtime.Gosched()
		batch = batch[:0]
		vectors.reset()
		for call != nil {
			if call.state.CompareAndSwap(objectCallQueued, objectCallWriting) {
				batch = append(batch, call)
				vectors.add(call.header[:], call.payload)
				if vectors.full() {
					break
				}
			}
			select {
			case call = <-c.queue:
			default:
				call = nil // the queue is empty: write now
			}
		}
		var err error
		if len(batch) > 0 {
			c.writeMu.Lock()
			err = vectors.writeTo(c.conn, objectWriteTimeout)
			c.writeMu.Unlock()
		}
		vectors.reset()
		for _, call := range batch {
			if call.written != nil {
				close(call.written)
			}
		}
		if err != nil {
			c.fail(fmt.Errorf("writing requests: %w", err))
			return
		}
	}
}

// readResponses reads responses and completes their calls until the
// connection fails.
func (c *objectClientConnection) readResponses() {
	reader := bufio.NewReaderSize(c.conn, objectReadBufferSize)
	var header [ObjectResponseHeaderSize]byte
	for {
		if _, err := io.ReadFull(reader, header[:]); err != nil {
			c.fail(fmt.Errorf("reading responses: %w", err))
			return
		}
		response, err := DecodeObjectResponse(&header)
		if err != nil {
			c.fail(err)
			return
		}
		c.mu.Lock()
		call := c.pending[response.ID]
		if call != nil {
			delete(c.pending, response.ID)
			c.addressPending.Add(-1)
		}
		c.mu.Unlock()
		if call == nil {
			// The caller gave up on it: discard the body.
			if _, err := io.CopyN(io.Discard, reader, int64(response.Length)); err != nil {
				c.fail(fmt.Errorf("reading responses: %w", noEOF(err)))
				return
			}
			continue
		}
		if err := c.receive(reader, call, &response); err != nil {
			call.err = c.failed(err)
			close(call.done)
			return
		}
		call.answered = time.Now()
		close(call.done)
	}
}

// failed fails the connection for cause and returns the error its calls get.
func (c *objectClientConnection) failed(cause error) error {
	c.fail(cause)
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// receive reads the body of call's response and sets call's result. It
// returns an error only if the connection cannot go on.
func (c *objectClientConnection) receive(reader *bufio.Reader, call *objectCall, response *ObjectResponse) error {
	call.response = *response
	n := int(response.Length)
	if response.Status != ObjectStatusOK {
		message := make([]byte, n) // at most MaxObjectErrorMessage: checked by the decoder
		if _, err := io.ReadFull(reader, message); err != nil {
			return fmt.Errorf("reading an error message: %w", noEOF(err))
		}
		if ObjectChecksum(message) != response.Checksum {
			message = []byte("(message damaged in transit)")
		}
		call.err = objectResponseError(response, c.address, message)
		return nil
	}
	if problem := objectResponseLengthProblem(call, n); problem != "" {
		return fmt.Errorf("%w: %s", ErrObjectProtocol, problem)
	}
	if n == 0 {
		return nil
	}
	var body []byte
	if cap(call.into) >= n {
		body = call.into[:n]
	} else {
		body = make([]byte, n)
	}
	if _, err := io.ReadFull(reader, body); err != nil {
		return fmt.Errorf("reading a %d-byte response: %w", n, noEOF(err))
	}
	if sum := ObjectChecksum(body); sum != response.Checksum {
		// The header was intact (its CRC held) so the stream is still
		// framed: only this answer is lost. Another replica has the data.
		call.err = fmt.Errorf("%w: %s response from %s damaged in transit (payload CRC32C 0x%08x, header says 0x%08x)", ErrCorrupt, call.opcode, c.address, sum, response.Checksum)
		return nil
	}
	call.body = body
	return nil
}

// objectResponseLengthProblem checks the length of an OK response against
// its request.
func objectResponseLengthProblem(call *objectCall, n int) string {
	switch call.opcode {
	case ObjectRead:
		if n != int(call.length) {
			return fmt.Sprintf("READ of %d bytes answered with %d", call.length, n)
		}
	case ObjectStat:
		return statBodyProblem(call.flags, n)
	case ObjectList:
		if n%ObjectListEntrySize != 0 || n/ObjectListEntrySize > int(call.length) {
			return fmt.Sprintf("LIST of at most %d entries answered with %d bytes", call.length, n)
		}
	default:
		if n != 0 {
			return fmt.Sprintf("%s answered with %d bytes", call.opcode, n)
		}
	}
	return ""
}
