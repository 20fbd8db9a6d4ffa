package bufpool

import (
	"testing"
	"time"
)

func TestBufferClasses(t *testing.T) {
	before := Outstanding()
	for _, test := range []struct{ n, capacity int }{
		{0, 4096}, {1, 4096}, {4096, 4096}, {4097, 8192}, {1 << 20, 1 << 20}, {1<<20 + 1, 2 << 20}, {MaximumLength, MaximumLength},
	} {
		b := Get(test.n)
		if len(b.Bytes) != test.n || cap(b.Bytes) != test.capacity {
			t.Errorf("Get(%d): len %d cap %d, want cap %d", test.n, len(b.Bytes), cap(b.Bytes), test.capacity)
		}
		b.Release()
	}
	if n := Outstanding() - before; n != 0 {
		t.Errorf("%d buffers outstanding", n)
	}
	b := Get(10)
	b.Release()
	func() {
		defer func() {
			if recover() == nil {
				t.Error("a second Release did not panic")
			}
		}()
		b.Release()
	}()
	func() {
		defer func() {
			if recover() == nil {
				t.Error("a buffer over MaximumLength did not panic")
			}
		}()
		Get(MaximumLength + 1)
	}()
}

// TestBudget: acquisitions wait for room, one larger than the limit is
// admitted alone, and Close wakes a waiter.
func TestBudget(t *testing.T) {
	budget := NewBudget(100)
	if !budget.Acquire(150) {
		t.Fatal("a request larger than the budget was refused while it was empty")
	}
	acquired := make(chan bool)
	go func() { acquired <- budget.Acquire(10) }()
	select {
	case <-acquired:
		t.Fatal("Acquire did not wait for room")
	case <-time.After(20 * time.Millisecond): // a wait that must not end
	}
	budget.Release(150)
	if !<-acquired {
		t.Fatal("Acquire failed after room was made")
	}
	if !budget.TryAcquire(90) || budget.TryAcquire(1) {
		t.Fatal("TryAcquire did not take exactly what fits")
	}
	budget.Release(90)
	budget.Add(95)
	go func() { acquired <- budget.Acquire(10) }()
	budget.Close()
	if <-acquired {
		t.Error("Acquire succeeded on a closed budget")
	}
	if used := budget.InUse(); used != 105 {
		t.Errorf("%d bytes in use, want 105", used)
	}
	budget.Release(105)
	func() {
		defer func() {
			if recover() == nil {
				t.Error("releasing more than acquired did not panic")
			}
		}()
		budget.Release(1)
	}()
}
