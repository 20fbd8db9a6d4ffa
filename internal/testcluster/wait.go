package testcluster

import (
	"context"
	"errors"
	"testing"
	"time"
)

const (
	// pollIntervalFirst is the first pause between two evaluations of a
	// condition: most conditions in a local cluster become true within
	// milliseconds.
	pollIntervalFirst = 5 * time.Millisecond
	// pollIntervalMaximum caps the pause, which doubles after each
	// evaluation, so that slow conditions do not cost a process start or an
	// HTTP request every few milliseconds.
	pollIntervalMaximum = 100 * time.Millisecond
)

// WaitFor evaluates condition until it returns true, pausing a few
// milliseconds (growing to 100 ms) between evaluations, and fails the test
// when timeout passes first. An error from condition is not fatal: it is the
// state reported if the deadline passes ("timed out after 10s waiting for
// node 2 to leave: 3 nodes in epoch 4"). Return (false, fmt.Errorf(...)) to
// describe why the condition does not hold yet.
//
// This is the only way tests should wait: on a named condition with a
// deadline, never with a bare sleep. WaitFor must be called from the test's
// goroutine, because it may call t.Fatalf.
func WaitFor(t testing.TB, timeout time.Duration, description string, condition func() (bool, error)) {
	t.Helper()
	if last, ok := poll(t.Context(), timeout, condition); !ok {
		state := "the condition was still false"
		if last != nil {
			state = "last error: " + last.Error()
		}
		t.Fatalf("testcluster: timed out after %v waiting for %s: %s", timeout, description, state)
	}
}

// finalError, returned by a condition given to poll, means the condition can
// never become true (the process it waits for has exited): poll stops at once
// instead of waiting for its timeout.
type finalError struct{ error }

func (e finalError) Unwrap() error { return e.error }

// poll evaluates condition until it is true (satisfied), the timeout passes,
// ctx is done or condition returns a finalError; it returns the last error
// condition returned.
func poll(ctx context.Context, timeout time.Duration, condition func() (bool, error)) (lastError error, satisfied bool) {
	deadline := time.Now().Add(timeout)
	interval := pollIntervalFirst
	for {
		done, err := condition()
		if done {
			return nil, true
		}
		lastError = err
		if final := (finalError{}); errors.As(err, &final) {
			return final.error, false
		}
		remaining := time.Until(deadline)
		if remaining <= 0 {
			return lastError, false
		}
		timer := time.NewTimer(min(interval, remaining))
		select {
		case <-ctx.Done():
			timer.Stop()
			if lastError == nil {
				lastError = ctx.Err()
			}
			return lastError, false
		case <-timer.C:
		}
		interval = min(2*interval, pollIntervalMaximum)
	}
}
