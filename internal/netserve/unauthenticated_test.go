package netserve

import (
	"fmt"
	"net"
	"sync"
	"testing"
)

// closer records which connections the pool closed.
type closer struct {
	mu     sync.Mutex
	closed []string
}

func (c *closer) fn(name string) func() {
	return func() {
		c.mu.Lock()
		c.closed = append(c.closed, name)
		c.mu.Unlock()
	}
}

func (c *closer) list() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.closed...)
}

// TestUnauthenticatedPerSource: a source at its bound recycles its own
// oldest connection; other sources are not touched.
func TestUnauthenticatedPerSource(t *testing.T) {
	pool := &Unauthenticated{Max: 100, MaxPerSource: 3}
	var c closer
	other, _ := pool.Admit("10.0.0.2", c.fn("other"))
	var first []*Pending
	for i := range 3 {
		p, evicted := pool.Admit("10.0.0.1", c.fn(fmt.Sprint("a", i)))
		if evicted != "" {
			t.Fatalf("admission %d closed a connection of %s", i, evicted)
		}
		first = append(first, p)
	}
	_, evicted := pool.Admit("10.0.0.1", c.fn("a3"))
	if evicted != "10.0.0.1" || fmt.Sprint(c.list()) != "[a0]" {
		t.Fatalf("the fourth of one source closed %v (source %q), want [a0]", c.list(), evicted)
	}
	if first[0].Leave() || !first[0].Evicted() {
		t.Fatal("the closed connection can still leave the pool as if authenticated")
	}
	if total, fromSource := pool.Len("10.0.0.1"); total != 4 || fromSource != 3 {
		t.Fatalf("pool holds %d, %d of the source; want 4 and 3", total, fromSource)
	}
	if !other.Leave() || !first[1].Leave() {
		t.Fatal("connections never closed cannot leave")
	}
	if total, fromSource := pool.Len("10.0.0.1"); total != 2 || fromSource != 2 {
		t.Fatalf("after two left: %d, %d", total, fromSource)
	}
	if !first[1].Leave() {
		t.Fatal("leaving twice")
	}
}

// TestUnauthenticatedFullPool: a full pool admits a newcomer by closing
// the oldest connection of the source holding the most, so a flood from
// a few sources never closes a lone client's connection; when all hold
// as many, the oldest of all goes.
func TestUnauthenticatedFullPool(t *testing.T) {
	pool := &Unauthenticated{Max: 8, MaxPerSource: 8}
	var c closer
	// Four sources of silent connections fill the pool, 2 each.
	for i := range 8 {
		pool.Admit(fmt.Sprintf("10.0.0.%d", 1+i%4), c.fn(fmt.Sprint("s", i)))
	}
	// All hold two: the oldest of all (s0, from 10.0.0.1) goes.
	client, evicted := pool.Admit("192.0.2.1", c.fn("client"))
	if evicted != "10.0.0.1" || fmt.Sprint(c.list()) != "[s0]" {
		t.Fatalf("closed %v (%s), want [s0]", c.list(), evicted)
	}
	// The strangers reconnect as fast as they can, many times over the
	// pool: they only ever close each other's.
	for i := range 1000 {
		pool.Admit(fmt.Sprintf("10.0.0.%d", 1+i%4), c.fn(fmt.Sprint("r", i)))
	}
	for _, name := range c.list() {
		if name == "client" {
			t.Fatal("the lone client's connection was closed to admit a stranger's")
		}
	}
	if !client.Leave() {
		t.Fatal("the client cannot leave the pool (authenticated)")
	}
	if total, _ := pool.Len(""); total != 7 {
		t.Fatalf("pool holds %d, want 7", total)
	}
	if pool.Evictions() != 1001 {
		t.Fatalf("%d evictions, want 1001", pool.Evictions())
	}
}

// TestUnauthenticatedConcurrent: admissions, leaves and closes from many
// goroutines keep the counts right (run with -race).
func TestUnauthenticatedConcurrent(t *testing.T) {
	pool := &Unauthenticated{Max: 16, MaxPerSource: 4}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 500 {
				p, _ := pool.Admit(fmt.Sprintf("10.0.%d.%d", g, i%6), func() {})
				if i%3 == 0 {
					p.Leave()
				}
			}
		}()
	}
	wg.Wait()
	total, _ := pool.Len("")
	if total > 16 {
		t.Fatalf("pool holds %d, more than its 16", total)
	}
	pool.mu.Lock()
	defer pool.mu.Unlock()
	counted := 0
	for source, q := range pool.sources {
		n := 0
		for p := q.oldest; p != nil; p = p.newer {
			n++
		}
		if n != q.count || q.count > 4 || q.count == 0 {
			t.Fatalf("source %s: %d in its queue, count %d", source, n, q.count)
		}
		counted += n
	}
	if counted != pool.total {
		t.Fatalf("%d in the queues, total %d", counted, pool.total)
	}
}

func TestSource(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if got := Source(a); got != "local" {
		t.Errorf("a pipe's source: %q", got)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	conn, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if got := Source(conn); got != "127.0.0.1" {
		t.Errorf("a TCP connection's source: %q", got)
	}
}
