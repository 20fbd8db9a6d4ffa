// Package netserve is the part of a TCP server's life that herd's servers
// share (internal/nbd's Server and internal/peer's ObjectServer): the
// accept loop, and the record of the listeners being served and the
// connections running, so that stopping the server reaches every one of
// them and waiting for it ends when the last has ended.
//
// What a connection does, and what stopping means for it (stop reading,
// answer what is in flight, or drop everything), is the protocol's: Close
// takes it as a function.
package netserve

import (
	"errors"
	"log/slog"
	"net"
	"sync"
	"syscall"
	"time"
)

// ErrStopped is returned by Accept once the tracker stopped accepting.
var ErrStopped = errors.New("netserve: stopped accepting")

// acceptRetryDelayMaximum bounds the back-off after a failed Accept.
const acceptRetryDelayMaximum = time.Second

// Tracker records a server's listeners and connections (of type C). The
// zero value is ready to use; its methods are safe for concurrent use.
type Tracker[C comparable] struct {
	mu          sync.Mutex // guards the fields below
	listeners   map[net.Listener]struct{}
	connections map[C]struct{}
	// active counts the listeners being served and the connections
	// running; idle is closed when it reaches zero once closed is set.
	active     int
	stopping   bool          // StopAccepting or Close was called
	stopped    chan struct{} // closed when stopping is set
	closed     bool          // Close was called
	idle       chan struct{}
	idleClosed bool
	ready      bool
}

// init makes the channels and maps; called with mu held.
func (t *Tracker[C]) init() {
	if !t.ready {
		t.ready = true
		t.listeners = make(map[net.Listener]struct{})
		t.connections = make(map[C]struct{})
		t.stopped = make(chan struct{})
		t.idle = make(chan struct{})
	}
}

// Accept serves listener until it fails for good: it hands every
// connection accepted to handle, on the calling goroutine. While Accept
// runs the listener counts as active, and StopAccepting and Close close it.
//
// It returns ErrStopped once the tracker stopped accepting (at once if it
// had already), and the listener's error if that error is not temporary.
// A temporary error (a timeout, running out of file descriptors or
// buffers, a connection aborted before it was accepted) is an operating
// error: it is logged with message and retried after a delay that doubles
// from 5 ms up to 1 s, so that the connections already running keep being
// served. Accept does not close listener.
func (t *Tracker[C]) Accept(listener net.Listener, logger *slog.Logger, message string, handle func(net.Conn)) error {
	t.mu.Lock()
	t.init()
	if t.stopping {
		t.mu.Unlock()
		return ErrStopped
	}
	t.listeners[listener] = struct{}{}
	t.active++
	stopped := t.stopped
	t.mu.Unlock()
	defer func() {
		t.mu.Lock()
		delete(t.listeners, listener)
		t.mu.Unlock()
		t.release()
	}()

	var retryDelay time.Duration
	for {
		conn, err := listener.Accept()
		if err != nil {
			if t.Stopping() {
				return ErrStopped
			}
			if !temporary(err) {
				return err
			}
			retryDelay = min(max(2*retryDelay, 5*time.Millisecond), acceptRetryDelayMaximum)
			logger.Warn(message, "error", err, "delay", retryDelay)
			timer := time.NewTimer(retryDelay)
			select {
			case <-timer.C:
			case <-stopped:
				timer.Stop()
			}
			continue
		}
		retryDelay = 0
		handle(conn)
	}
}

// temporary reports whether a failed Accept is worth retrying.
func temporary(err error) bool {
	var netError net.Error
	if errors.As(err, &netError) && netError.Timeout() {
		return true
	}
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) ||
		errors.Is(err, syscall.ECONNABORTED) || errors.Is(err, syscall.ENOBUFS) || errors.Is(err, syscall.ENOMEM)
}

// Add records a connection that starts running. It reports false once the
// tracker is closed: the caller then closes the connection instead.
func (t *Tracker[C]) Add(c C) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.init()
	if t.closed {
		return false
	}
	t.connections[c] = struct{}{}
	t.active++
	return true
}

// Remove records that a connection Add accepted has ended.
func (t *Tracker[C]) Remove(c C) {
	t.mu.Lock()
	delete(t.connections, c)
	t.mu.Unlock()
	t.release()
}

// release records the end of an Accept or a connection.
func (t *Tracker[C]) release() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.active--
	if t.active < 0 {
		panic("netserve: more ends than starts")
	}
	t.closeIdleLocked()
}

func (t *Tracker[C]) closeIdleLocked() {
	if t.closed && t.active == 0 && !t.idleClosed {
		t.idleClosed = true
		close(t.idle)
	}
}

// StopAccepting makes every Accept return ErrStopped, now and later, by
// closing the listeners. Connections go on.
func (t *Tracker[C]) StopAccepting() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.stopAcceptingLocked()
}

func (t *Tracker[C]) stopAcceptingLocked() {
	t.init()
	if t.stopping {
		return
	}
	t.stopping = true
	close(t.stopped)
	for listener := range t.listeners {
		listener.Close()
	}
}

// Stopping reports whether StopAccepting or Close was called.
func (t *Tracker[C]) Stopping() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.stopping
}

// Close stops accepting, refuses connections from now on and, the first
// time, calls stop for every running connection (under the tracker's lock:
// stop must not block or call the tracker). It returns a channel closed
// once no Accept and no connection is running any more.
func (t *Tracker[C]) Close(stop func(C)) <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.stopAcceptingLocked()
	if !t.closed {
		t.closed = true
		for c := range t.connections {
			stop(c)
		}
		t.closeIdleLocked()
	}
	return t.idle
}

// Closed reports whether Close was called.
func (t *Tracker[C]) Closed() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.closed
}

// Each calls f for every running connection, under the tracker's lock: f
// must not block or call the tracker.
func (t *Tracker[C]) Each(f func(C)) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for c := range t.connections {
		f(c)
	}
}
