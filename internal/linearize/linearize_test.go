package linearize

import (
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// at builds a call at a fixed time, so that the histories below do not
// depend on the clock.
func at(h *History, client int, t time.Duration) Call { return Call{client: client, at: int64(t)} }

func record(h *History, c Call, block int, write bool, value uint64, ret time.Duration) {
	if write {
		h.Write(c, block, value, true)
	} else {
		h.Read(c, block, value)
	}
	// Replace the return time the recorder took with the one given.
	h.mu.Lock()
	h.ops[len(h.ops)-1].Return = int64(ret)
	h.mu.Unlock()
}

func TestStaleReadIsCaught(t *testing.T) {
	h := NewHistory()
	record(h, at(h, 0, 0), 1, true, 1, 10)
	record(h, at(h, 0, 20), 1, true, 2, 30)
	// Begins after write 2 was acknowledged and returns write 1: stale.
	record(h, at(h, 1, 40), 1, false, 1, 50)
	out := filepath.Join(t.TempDir(), "history.html")
	err := h.Check(10*time.Second, out)
	if err == nil || !strings.Contains(err.Error(), "not linearizable") {
		t.Fatalf("a stale read passed the check: %v", err)
	}
	if !strings.Contains(err.Error(), out) {
		t.Fatalf("no visualization written: %v", err)
	}
}

func TestConcurrentAndUnknownWritesAreAllowed(t *testing.T) {
	h := NewHistory()
	record(h, at(h, 0, 0), 1, true, 1, 10)
	// Write 2 fails (unknown outcome): a later read may see 1 or 2, and
	// once it saw 2 no read may go back to 1.
	h.Write(at(h, 0, 20), 1, 2, false)
	record(h, at(h, 1, 25), 1, false, 1, 30)
	record(h, at(h, 1, 35), 1, false, 2, 40)
	// A read concurrent with write 3 may return 2 or 3.
	record(h, at(h, 0, 50), 1, true, 3, 70)
	record(h, at(h, 1, 55), 1, false, 2, 60)
	// Another block, never written, reads zeros.
	record(h, at(h, 1, 80), 7, false, 0, 90)
	if err := h.Check(10*time.Second, ""); err != nil {
		t.Fatal(err)
	}
	record(h, at(h, 1, 100), 1, false, 1, 110) // back from 3 to 1
	if err := h.Check(10*time.Second, ""); err == nil {
		t.Fatal("a read going back in time passed the check")
	}
}
