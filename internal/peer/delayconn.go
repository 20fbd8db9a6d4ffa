package peer

// A connection that delays what it sends and receives: the zones far
// apart of the tests and benchmarks that build herd with -tags testknobs
// (knobs_on.go). Bandwidth is not limited: bytes are queued, not paced.

import (
	"net"
	"strings"
	"sync"
	"time"
)

// parseDelays reads HERD_TEST_PEER_DELAY's value (knobs_on.go).
func parseDelays(spec string) map[string]time.Duration {
	if spec == "" {
		return nil
	}
	out := map[string]time.Duration{}
	for _, part := range strings.Split(spec, ";") {
		hosts, value, ok := strings.Cut(part, "=")
		d, err := time.ParseDuration(value)
		if !ok || err != nil || d < 0 {
			continue
		}
		for _, host := range strings.Split(hosts, ",") {
			out[strings.TrimSpace(host)] = d
		}
	}
	return out
}

type delayed struct {
	due  time.Time
	data []byte
	err  error
}

// delayConn delays both directions of conn by delay. Deadlines apply to
// the delayed reads and writes, not to conn (whose goroutines run on).
type delayConn struct {
	net.Conn
	delay time.Duration

	out    chan delayed
	in     chan delayed
	closed chan struct{}
	once   sync.Once

	mu           sync.Mutex
	writeErr     error
	readDeadline time.Time
	current      []byte
	currentErr   error
}

func newDelayConn(conn net.Conn, delay time.Duration) *delayConn {
	c := &delayConn{Conn: conn, delay: delay, out: make(chan delayed, 4096), in: make(chan delayed, 4096),
		closed: make(chan struct{})}
	go c.sendLoop()
	go c.receiveLoop()
	return c
}

func (c *delayConn) sendLoop() {
	for {
		select {
		case <-c.closed:
			return
		case d := <-c.out:
			if wait := time.Until(d.due); wait > 0 {
				select {
				case <-time.After(wait):
				case <-c.closed:
					return
				}
			}
			if _, err := c.Conn.Write(d.data); err != nil {
				c.mu.Lock()
				c.writeErr = err
				c.mu.Unlock()
				return
			}
		}
	}
}

func (c *delayConn) receiveLoop() {
	for {
		buffer := make([]byte, 64<<10)
		n, err := c.Conn.Read(buffer)
		select {
		case c.in <- delayed{due: time.Now().Add(c.delay), data: buffer[:n], err: err}:
		case <-c.closed:
			return
		}
		if err != nil {
			return
		}
	}
}

func (c *delayConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	err := c.writeErr
	c.mu.Unlock()
	if err != nil {
		return 0, err
	}
	select {
	case c.out <- delayed{due: time.Now().Add(c.delay), data: append([]byte(nil), p...)}:
		return len(p), nil
	case <-c.closed:
		return 0, net.ErrClosed
	}
}

func (c *delayConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	if len(c.current) > 0 {
		n := copy(p, c.current)
		c.current = c.current[n:]
		c.mu.Unlock()
		return n, nil
	}
	if c.currentErr != nil {
		err := c.currentErr
		c.mu.Unlock()
		return 0, err
	}
	deadline := c.readDeadline
	c.mu.Unlock()
	var timeout <-chan time.Time
	if !deadline.IsZero() {
		timer := time.NewTimer(time.Until(deadline))
		defer timer.Stop()
		timeout = timer.C
	}
	var d delayed
	select {
	case d = <-c.in:
	case <-timeout:
		return 0, &timeoutError{}
	case <-c.closed:
		return 0, net.ErrClosed
	}
	if wait := time.Until(d.due); wait > 0 {
		select {
		case <-time.After(wait):
		case <-c.closed:
			return 0, net.ErrClosed
		}
	}
	n := copy(p, d.data)
	c.mu.Lock()
	c.current, c.currentErr = d.data[n:], d.err
	c.mu.Unlock()
	if n == 0 && d.err != nil {
		return 0, d.err
	}
	return n, nil
}

func (c *delayConn) Close() error {
	c.once.Do(func() { close(c.closed) })
	return c.Conn.Close()
}

func (c *delayConn) SetDeadline(t time.Time) error { return c.SetReadDeadline(t) }

func (c *delayConn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	c.readDeadline = t
	c.mu.Unlock()
	return nil
}

func (c *delayConn) SetWriteDeadline(time.Time) error { return nil }

type timeoutError struct{}

func (*timeoutError) Error() string   { return "i/o timeout (delayed test connection)" }
func (*timeoutError) Timeout() bool   { return true }
func (*timeoutError) Temporary() bool { return true }
