package cluster

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/herd-storage/herd/internal/cluster/statemachine"
	"github.com/herd-storage/herd/internal/logging"
	"github.com/herd-storage/herd/internal/peer"
)

// Forwarding: followers send log commands to the leader over the peer port
// (protocol peer.ProtocolForward), on one persistent, pipelined connection:
// many commands in flight, replies matched by id, frames written in
// batches. An HTTP round trip per command cost the leader more CPU than
// raft itself (docs/BENCHMARKS.md).
//
// Frames (big-endian):
//
//	request:  length(4) id(8) command(length-8)
//	response: length(4) id(8) index(8) status(1) body(length-17)
//	          status 0: body = result JSON; 1: body = code "\x00" message
const (
	maxForwardFrame = 1 << 20
	forwardOK       = 0
	forwardError    = 1
	// The shortest frames: a request has an id and at least one command
	// byte, a response an id, an index and a status.
	minForwardRequest  = 8 + 1
	minForwardResponse = 8 + 8 + 1
)

var (
	errForwardClosed = errors.New("cluster: connection to leader closed")
	// errForwardFrame reports a frame that breaks the format above.
	errForwardFrame = errors.New("cluster: bad forwarding frame")
)

// putForwardRequestHeader writes the length and id of a request whose
// command is commandLength bytes into header[:12]; the command follows.
func putForwardRequestHeader(header []byte, id uint64, commandLength int) {
	binary.BigEndian.PutUint32(header[0:], uint32(8+commandLength))
	binary.BigEndian.PutUint64(header[4:], id)
}

// parseForwardRequest splits a request frame (without its length).
func parseForwardRequest(frame []byte) (id uint64, command []byte, err error) {
	if len(frame) < minForwardRequest {
		return 0, nil, fmt.Errorf("%w: a request of %d bytes", errForwardFrame, len(frame))
	}
	return binary.BigEndian.Uint64(frame), frame[8:], nil
}

// appendForwardResponse appends the response frame, length first, to a
// command's outcome: its result value, or err with its code.
func appendForwardResponse(dst []byte, id, index uint64, value json.RawMessage, err error) []byte {
	status, body := byte(forwardOK), []byte(value)
	if err != nil {
		status, body = forwardError, []byte(ErrorCode(err)+"\x00"+err.Error())
	}
	dst = binary.BigEndian.AppendUint32(dst, uint32(minForwardResponse+len(body)))
	dst = binary.BigEndian.AppendUint64(dst, id)
	dst = binary.BigEndian.AppendUint64(dst, index)
	dst = append(dst, status)
	return append(dst, body...)
}

// parseForwardResponse decodes a response frame (without its length). An
// error's code keeps its sentinel identity (ErrorFromCode).
func parseForwardResponse(frame []byte) (id uint64, result forwardResult, err error) {
	if len(frame) < minForwardResponse {
		return 0, result, fmt.Errorf("%w: a response of %d bytes", errForwardFrame, len(frame))
	}
	id = binary.BigEndian.Uint64(frame[0:])
	result.index = binary.BigEndian.Uint64(frame[8:])
	body := frame[17:]
	switch frame[16] {
	case forwardOK:
		result.value = body
	case forwardError:
		code, message, _ := strings.Cut(string(body), "\x00")
		result.err = ErrorFromCode(code, message)
	default:
		return 0, forwardResult{}, fmt.Errorf("%w: status %d", errForwardFrame, frame[16])
	}
	return id, result, nil
}

// readForwardFrame reads one frame: its length, checked against minimum
// and maxForwardFrame before anything is allocated, then the frame. It
// returns io.EOF only when the stream ends between frames.
func readForwardFrame(r io.Reader, minimum uint32) ([]byte, error) {
	var header [4]byte
	if _, err := io.ReadFull(r, header[:]); err != nil {
		return nil, err
	}
	length := binary.BigEndian.Uint32(header[:])
	if length < minimum || length > maxForwardFrame {
		return nil, fmt.Errorf("%w: length %d", errForwardFrame, length)
	}
	frame := make([]byte, length)
	if _, err := io.ReadFull(r, frame); err != nil {
		if err == io.EOF {
			// The length promised a frame: io.EOF means the stream ended
			// between frames, never inside one.
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return frame, nil
}

// forwarder keeps the connection to the current leader.
type forwarder struct {
	creds *peer.Credentials // the node's, to dial the leader
	// sim, if set, carries each request instead of a connection: the
	// simulator's network (sim.go).
	sim func(ctx context.Context, address string, command []byte) (json.RawMessage, uint64, error)

	mu      sync.Mutex // guards conn
	conn    *forwardConn
	address string
}

type forwardResult struct {
	value json.RawMessage
	index uint64
	err   error
}

type forwardConn struct {
	net     net.Conn
	queue   chan forwardRequest
	mu      sync.Mutex // guards pending, nextID, err
	pending map[uint64]chan forwardResult
	nextID  uint64
	err     error
	done    chan struct{}
	// replies counts the responses read: a request that times out
	// while none arrived since it was sent finds the connection silent.
	replies atomic.Uint64
}

type forwardRequest struct {
	id      uint64
	command []byte
}

func (f *forwarder) send(ctx context.Context, address string, command []byte) (json.RawMessage, uint64, error) {
	if f.sim != nil {
		return f.sim(ctx, address, command)
	}
	conn, err := f.connection(ctx, address)
	if err != nil {
		return nil, 0, err
	}
	reply := make(chan forwardResult, 1)
	repliesBefore := conn.replies.Load()
	conn.mu.Lock()
	if conn.err != nil {
		conn.mu.Unlock()
		return nil, 0, conn.err
	}
	conn.nextID++
	id := conn.nextID
	conn.pending[id] = reply
	conn.mu.Unlock()
	select {
	case conn.queue <- forwardRequest{id: id, command: command}:
	case <-conn.done:
		return nil, 0, conn.failure()
	case <-ctx.Done():
		conn.forget(id)
		return nil, 0, ctx.Err()
	}
	select {
	case r := <-reply:
		return r.value, r.index, r.err
	case <-conn.done:
		return nil, 0, conn.failure()
	case <-ctx.Done():
		conn.forget(id)
		if errors.Is(ctx.Err(), context.DeadlineExceeded) && conn.replies.Load() == repliesBefore {
			// Nothing came back on the connection since this request
			// was sent: the leader may be cut off, or the path to it
			// was and TCP backs off its retransmissions for minutes
			// after the cut heals. Dial afresh next time rather than
			// queue every later request behind it.
			conn.close(fmt.Errorf("%w: no answer from the leader", errForwardClosed))
		}
		return nil, 0, ctx.Err()
	}
}

func (f *forwarder) connection(ctx context.Context, address string) (*forwardConn, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.conn != nil && f.address == address {
		select {
		case <-f.conn.done:
		default:
			return f.conn, nil
		}
	}
	if f.conn != nil {
		f.conn.close(errForwardClosed)
	}
	dialCtx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	raw, err := peer.Dial(dialCtx, address, f.creds, peer.ProtocolForward)
	if err != nil {
		return nil, err
	}
	c := &forwardConn{net: raw, queue: make(chan forwardRequest, 1024), pending: map[uint64]chan forwardResult{}, done: make(chan struct{})}
	f.conn, f.address = c, address
	go c.writeLoop()
	go c.readLoop()
	return c, nil
}

func (f *forwarder) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.conn != nil {
		f.conn.close(errForwardClosed)
	}
}

func (c *forwardConn) forget(id uint64) {
	c.mu.Lock()
	delete(c.pending, id)
	c.mu.Unlock()
}

func (c *forwardConn) failure() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

func (c *forwardConn) close(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return
	}
	c.err = err
	close(c.done)
	c.net.Close()
}

// writeLoop writes queued requests, flushing only when the queue is empty
// so that concurrent commands share system calls.
func (c *forwardConn) writeLoop() {
	w := bufio.NewWriterSize(c.net, 64<<10)
	header := make([]byte, 12)
	for {
		var r forwardRequest
		select {
		case r = <-c.queue:
		case <-c.done:
			return
		}
		for {
			putForwardRequestHeader(header, r.id, len(r.command))
			w.Write(header)
			if _, err := w.Write(r.command); err != nil {
				c.close(err)
				return
			}
			if len(c.queue) == 0 {
				break
			}
			r = <-c.queue
		}
		if err := w.Flush(); err != nil {
			c.close(err)
			return
		}
	}
}

func (c *forwardConn) readLoop() {
	r := bufio.NewReaderSize(c.net, 64<<10)
	for {
		frame, err := readForwardFrame(r, minForwardResponse)
		if err != nil {
			c.close(fmt.Errorf("cluster: leader connection: %w", err))
			return
		}
		id, result, err := parseForwardResponse(frame)
		if err != nil {
			c.close(fmt.Errorf("cluster: leader connection: %w", err))
			return
		}
		c.replies.Add(1)
		c.mu.Lock()
		reply, ok := c.pending[id]
		delete(c.pending, id)
		c.mu.Unlock()
		if ok {
			reply <- result
		}
	}
}

// serveForward accepts forwarding connections from followers.
func (c *Cluster) serveForward(l net.Listener) {
	defer c.wg.Done()
	for {
		conn, err := l.Accept()
		if err != nil {
			return
		}
		go c.serveForwardConn(conn)
	}
}

func (c *Cluster) serveForwardConn(conn net.Conn) {
	defer conn.Close()
	node, _ := peer.RemoteNode(conn)
	replies := make(chan []byte, 1024)
	done := make(chan struct{})
	defer close(done)
	go func() {
		w := bufio.NewWriterSize(conn, 64<<10)
		for {
			var frame []byte
			select {
			case frame = <-replies:
			case <-done:
				return
			}
			for {
				if _, err := w.Write(frame); err != nil {
					conn.Close()
					return
				}
				if len(replies) == 0 {
					break
				}
				frame = <-replies
			}
			if err := w.Flush(); err != nil {
				conn.Close()
				return
			}
		}
	}()
	r := bufio.NewReaderSize(conn, 64<<10)
	var inflight sync.WaitGroup
	defer inflight.Wait()
	for {
		frame, err := readForwardFrame(r, minForwardRequest)
		if errors.Is(err, errForwardFrame) {
			c.logger.Warn("cluster: refused a forwarding connection", logging.From("peer", conn.RemoteAddr()), "reason", err.Error())
			return
		}
		if err != nil {
			return
		}
		id, command, err := parseForwardRequest(frame)
		if err != nil {
			c.logger.Warn("cluster: refused a forwarding connection", logging.From("peer", conn.RemoteAddr()), "reason", err.Error())
			return
		}
		inflight.Add(1)
		go func() {
			defer inflight.Done()
			ctx, cancel := context.WithTimeout(context.Background(), applyTimeout)
			defer cancel()
			var value json.RawMessage
			var index uint64
			err := c.forwardRefusal(node, command)
			if err == nil {
				value, index, err = c.ProposeForwarded(ctx, command)
			} else {
				c.logger.Warn("cluster: refused a forwarded command", logging.From("peer", conn.RemoteAddr()), "node", node, "reason", err.Error())
			}
			reply := appendForwardResponse(make([]byte, 0, 4+minForwardResponse+len(value)), id, index, value, err)
			select {
			case replies <- reply:
			case <-done:
			}
		}()
	}
}

// forwardRefusal says why the leader does not propose command forwarded
// by node, or nil. A node the log admitted (a join's node certificate)
// passes the peer port's allow-list before it ever starts; it may not
// change credentials until it runs: a member of raft, or alive in
// gossip. Otherwise whoever held a join token once could leave an admin
// token or an NBD client behind that outlives the id's removal (herd
// node remove). Such a node shows in herd node list; an id only admitted
// does not.
func (c *Cluster) forwardRefusal(node string, command []byte) error {
	if !statemachine.ChangesCredentials(command) {
		return nil
	}
	if node == "" {
		return fmt.Errorf("%w: a forwarded change of credentials from a connection that names no node", ErrForbidden)
	}
	if !c.Running(node) {
		return fmt.Errorf("%w: node %s may not change credentials: it is admitted, but neither a member of raft nor alive in gossip", ErrForbidden, node)
	}
	return nil
}
