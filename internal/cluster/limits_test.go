package cluster

import (
	"context"
	"errors"
	"strings"
	"testing"
	"testing/synctest"
)

// Through the API a long lock key is refused before it is proposed:
// the log does not grow.
func TestLongLockKeyNeverEntersTheLog(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := NewLocal()
		defer l.Close()
		a := l.Member("a", "a.1", 0)
		a.SetConnected(true)
		if _, err := l.NodeJoin(Node{ID: "a", Incarnation: "a.1"}); err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		entries := l.Len()
		_, err := a.AcquireLock(ctx, strings.Repeat("k", 5000), "s")
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "lock key of 5000 bytes: at most 256") {
			t.Fatalf("acquire of a 5000-byte key: %v", err)
		}
		if err := a.ReleaseLock(ctx, "k", strings.Repeat("s", 129)); !errors.Is(err, ErrInvalid) {
			t.Fatalf("release with a 129-byte session: %v", err)
		}
		if got := l.Len(); got != entries {
			t.Fatalf("the log grew by %d entries", got-entries)
		}
		if _, err := a.AcquireLock(ctx, VDILockKey(strings.Repeat("n", MaxNameLength)), "s"); err != nil {
			t.Fatalf("the lock of a VDI with the longest name: %v", err)
		}
	})
}
