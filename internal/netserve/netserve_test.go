package netserve

import (
	"errors"
	"io"
	"log/slog"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"
)

const testTimeout = 20 * time.Second

var discard = slog.New(slog.NewTextHandler(io.Discard, nil))

// fakeListener returns what is sent on accepts, and net.ErrClosed once
// closed.
type fakeListener struct {
	accepts   chan any // net.Conn or error
	closeOnce sync.Once
	closed    chan struct{}
}

func newFakeListener() *fakeListener {
	return &fakeListener{accepts: make(chan any), closed: make(chan struct{})}
}

func (l *fakeListener) Accept() (net.Conn, error) {
	select {
	case next := <-l.accepts:
		if err, ok := next.(error); ok {
			return nil, err
		}
		return next.(net.Conn), nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

func (l *fakeListener) Close() error {
	l.closeOnce.Do(func() { close(l.closed) })
	return nil
}

func (l *fakeListener) Addr() net.Addr { return &net.TCPAddr{} }

func receive[T any](t *testing.T, c <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-c:
		return v
	case <-time.After(testTimeout):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

// TestAcceptRetriesTemporaryErrors: a temporary error is retried, a
// connection accepted after it is handed over, and StopAccepting ends
// Accept with ErrStopped, closing the listener.
func TestAcceptRetriesTemporaryErrors(t *testing.T) {
	var tracker Tracker[int]
	listener := newFakeListener()
	handled := make(chan net.Conn, 1)
	returned := make(chan error, 1)
	go func() {
		returned <- tracker.Accept(listener, discard, "accept failed; retrying", func(c net.Conn) { handled <- c })
	}()
	listener.accepts <- syscall.EMFILE
	client, server := net.Pipe()
	defer client.Close()
	listener.accepts <- server
	if got := receive(t, handled, "the connection"); got != server {
		t.Fatalf("handled %v, want %v", got, server)
	}
	tracker.StopAccepting()
	if err := receive(t, returned, "Accept to return"); !errors.Is(err, ErrStopped) {
		t.Fatalf("Accept returned %v, want ErrStopped", err)
	}
	select {
	case <-listener.closed:
	default:
		t.Error("StopAccepting did not close the listener")
	}
	if err := tracker.Accept(newFakeListener(), discard, "", nil); !errors.Is(err, ErrStopped) {
		t.Errorf("Accept after StopAccepting: %v", err)
	}
}

// TestAcceptReturnsOtherErrors: an error that is not temporary ends Accept
// with that error.
func TestAcceptReturnsOtherErrors(t *testing.T) {
	var tracker Tracker[int]
	listener := newFakeListener()
	returned := make(chan error, 1)
	go func() { returned <- tracker.Accept(listener, discard, "", nil) }()
	failure := errors.New("listener broken")
	listener.accepts <- failure
	if err := receive(t, returned, "Accept to return"); err != failure {
		t.Fatalf("Accept returned %v, want %v", err, failure)
	}
	// The listener no longer counts: closing the tracker is idle at once.
	receive(t, tracker.Close(func(int) {}), "idle")
}

// TestCloseWaitsForEveryone: Close stops every connection once, refuses
// new ones, and its channel closes only when the last connection and the
// last Accept have ended.
func TestCloseWaitsForEveryone(t *testing.T) {
	var tracker Tracker[int]
	listener := newFakeListener()
	returned := make(chan error, 1)
	go func() { returned <- tracker.Accept(listener, discard, "", nil) }()
	for c := range 3 {
		if !tracker.Add(c) {
			t.Fatalf("Add(%d) refused", c)
		}
	}
	tracker.Remove(1)
	stopped := map[int]int{}
	idle := tracker.Close(func(c int) { stopped[c]++ })
	if len(stopped) != 2 || stopped[0] != 1 || stopped[2] != 1 {
		t.Errorf("stopped %v, want 0 and 2 once", stopped)
	}
	tracker.Close(func(c int) { stopped[c]++ })
	if stopped[0] != 1 {
		t.Error("a second Close stopped the connections again")
	}
	if tracker.Add(4) {
		t.Error("Add after Close accepted")
	}
	if !tracker.Closed() || !tracker.Stopping() {
		t.Error("Closed or Stopping is false after Close")
	}
	receive(t, returned, "Accept to return")
	tracker.Remove(0)
	select {
	case <-idle:
		t.Fatal("idle with a connection still running")
	default:
	}
	tracker.Remove(2)
	receive(t, idle, "idle")
}
