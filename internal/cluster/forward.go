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
	"time"

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
)

var errForwardClosed = errors.New("cluster: connection to leader closed")

// forwarder keeps the connection to the current leader.
type forwarder struct {
	key []byte

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
}

type forwardRequest struct {
	id      uint64
	command []byte
}

func (f *forwarder) send(ctx context.Context, address string, command []byte) (json.RawMessage, uint64, error) {
	conn, err := f.connection(ctx, address)
	if err != nil {
		return nil, 0, err
	}
	reply := make(chan forwardResult, 1)
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
	raw, err := peer.Dial(dialCtx, address, f.key, peer.ProtocolForward)
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
			binary.BigEndian.PutUint32(header[0:], uint32(8+len(r.command)))
			binary.BigEndian.PutUint64(header[4:], r.id)
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
	header := make([]byte, 4)
	for {
		if _, err := io.ReadFull(r, header); err != nil {
			c.close(fmt.Errorf("cluster: leader connection: %w", err))
			return
		}
		length := binary.BigEndian.Uint32(header)
		if length < 17 || length > maxForwardFrame {
			c.close(fmt.Errorf("cluster: leader sent a bad frame length %d", length))
			return
		}
		frame := make([]byte, length)
		if _, err := io.ReadFull(r, frame); err != nil {
			c.close(fmt.Errorf("cluster: leader connection: %w", err))
			return
		}
		id := binary.BigEndian.Uint64(frame[0:])
		result := forwardResult{index: binary.BigEndian.Uint64(frame[8:])}
		body := frame[17:]
		switch frame[16] {
		case forwardOK:
			result.value = body
		case forwardError:
			code, message, _ := strings.Cut(string(body), "\x00")
			result.err = ErrorFromCode(code, message)
		default:
			c.close(fmt.Errorf("cluster: leader sent status %d", frame[16]))
			return
		}
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
	header := make([]byte, 4)
	var inflight sync.WaitGroup
	defer inflight.Wait()
	for {
		if _, err := io.ReadFull(r, header); err != nil {
			return
		}
		length := binary.BigEndian.Uint32(header)
		if length < 9 || length > maxForwardFrame { // id + at least one command byte
			c.logger.Warn("cluster: refused a forwarding connection", "from", conn.RemoteAddr().String(), "reason", fmt.Sprintf("bad frame length %d", length))
			return
		}
		frame := make([]byte, length)
		if _, err := io.ReadFull(r, frame); err != nil {
			return
		}
		id := binary.BigEndian.Uint64(frame)
		inflight.Add(1)
		go func() {
			defer inflight.Done()
			ctx, cancel := context.WithTimeout(context.Background(), applyTimeout)
			defer cancel()
			value, index, err := c.ProposeForwarded(ctx, frame[8:])
			status, body := byte(forwardOK), []byte(value)
			if err != nil {
				status, body = forwardError, []byte(ErrorCode(err)+"\x00"+err.Error())
			}
			reply := make([]byte, 4+17+len(body))
			binary.BigEndian.PutUint32(reply[0:], uint32(17+len(body)))
			binary.BigEndian.PutUint64(reply[4:], id)
			binary.BigEndian.PutUint64(reply[12:], index)
			reply[20] = status
			copy(reply[21:], body)
			select {
			case replies <- reply:
			case <-done:
			}
		}()
	}
}
