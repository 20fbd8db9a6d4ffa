package testcluster

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestWaitForSatisfied(t *testing.T) {
	evaluations := 0
	WaitFor(t, 10*time.Second, "the third evaluation", func() (bool, error) {
		evaluations++
		return evaluations == 3, nil
	})
	if evaluations != 3 {
		t.Errorf("condition evaluated %d times, want 3", evaluations)
	}
}

func TestWaitForTimeout(t *testing.T) {
	start := time.Now()
	recorder := runRecorded(t, func(tb testing.TB) {
		WaitFor(tb, 50*time.Millisecond, "the impossible", func() (bool, error) {
			return false, errors.New("3 nodes in epoch 4")
		})
		tb.Errorf("WaitFor returned")
	})
	got := recorder.recorded()
	if !strings.Contains(got, "timed out after 50ms waiting for the impossible: last error: 3 nodes in epoch 4") {
		t.Errorf("WaitFor failed with %q, want the description and the last error", got)
	}
	if elapsed := time.Since(start); elapsed < 50*time.Millisecond {
		t.Errorf("WaitFor gave up after %v, before its timeout", elapsed)
	}
}
