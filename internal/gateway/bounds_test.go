package gateway

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"math/rand"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/herd-storage/herd/internal/bufpool"
	"github.com/herd-storage/herd/internal/object"
)

// The bounds of bounds.go are checked from outside the gateway: the fake
// replicas hold the operations a test selects (gate), and inside a
// synctest bubble synctest.Wait returns once every goroutine is blocked,
// so what is held then is exactly what the gateway has in flight: no
// sleep, and an unbounded gateway would show every piece at once.

// gate holds the replica operations match selects until released, and
// counts the objects that have one held.
type gate struct {
	match func(op string, oid object.OID) bool

	mu       sync.Mutex // guards the fields below
	held     map[uint64][]chan struct{}
	peak     int  // the most objects ever held at once
	released int  // objects released
	stopped  bool // holds nothing more: the test ended
}

func newGate(t *testing.T, w *fakeWorld, match func(op string, oid object.OID) bool) *gate {
	g := &gate{match: match, held: map[uint64][]chan struct{}{}}
	w.replicas.before = func(op, node string, oid object.OID, p []byte) {
		if !g.match(op, oid) {
			return
		}
		release := make(chan struct{})
		g.mu.Lock()
		if g.stopped {
			g.mu.Unlock()
			return
		}
		g.held[uint64(oid)] = append(g.held[uint64(oid)], release)
		g.peak = max(g.peak, len(g.held))
		g.mu.Unlock()
		<-release
	}
	// A test that failed leaves nothing blocked behind it.
	t.Cleanup(func() {
		g.mu.Lock()
		g.stopped = true
		g.mu.Unlock()
		g.open()
	})
	return g
}

// objects is the number of objects with an operation held.
func (g *gate) objects() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.held)
}

// open releases every held operation.
func (g *gate) open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	for oid, waiters := range g.held {
		for _, release := range waiters {
			close(release)
		}
		delete(g.held, oid)
		g.released++
	}
}

// drain lets the held operations through round by round until done
// closes, checking before each round that no more than limit objects
// are in flight, and that the first round has exactly want (the bound is
// reached: the pieces really run in parallel up to it).
func (g *gate) drain(t *testing.T, done <-chan error, limit, want int) {
	t.Helper()
	for round := 0; ; round++ {
		synctest.Wait()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("request failed: %v", err)
			}
			if n := g.objects(); n != 0 {
				t.Fatalf("the request returned with %d objects still in flight", n)
			}
			if g.peak > limit {
				t.Fatalf("%d objects were in flight at once, the bound is %d", g.peak, limit)
			}
			return
		default:
		}
		n := g.objects()
		if n > limit {
			t.Fatalf("round %d: %d objects in flight, the bound is %d", round, n, limit)
		}
		if round == 0 && n != want {
			t.Fatalf("%d objects in flight at first, want %d", n, want)
		}
		if n == 0 {
			t.Fatal("nothing in flight and the request has not returned: stuck")
		}
		g.open()
	}
}

// dataOf matches operations on the data objects of VDI id.
func dataOf(id uint32, ops ...string) func(op string, oid object.OID) bool {
	return func(op string, oid object.OID) bool {
		if object.Type(oid) != object.Type(object.DataOID(0, 0)) || object.VDI(oid) != object.VDIID(id) {
			return false
		}
		for _, o := range ops {
			if o == op {
				return true
			}
		}
		return false
	}
}

// smallObject is the object size of these tests' VDIs: the smallest the
// cluster allows, so that a test over hundreds of objects stays small.
const smallObject = 64 << 10

// newSmallWorld is newWorld with smallObject objects.
func newSmallWorld(t *testing.T, nodes, copies int) *fakeWorld {
	return newWorldWith(t, nodes, copies, smallObject)
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// writeEach writes byte i|1 at the start of objects [0, n) of e.
func writeEach(t *testing.T, e *Disk, n int) {
	t.Helper()
	for i := range n {
		if err := e.WriteAt(context.Background(), []byte{byte(i) | 1}, uint64(i)*smallObject, false); err != nil {
			t.Fatalf("write object %d: %v", i, err)
		}
	}
}

// A WRITE_ZEROES (here a TRIM) over 1000 objects has at most
// PiecesPerRequest of them in flight, and reaches that many.
func TestZeroPiecesPerRequestBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const objects = 1000
		w := newSmallWorld(t, 4, 2)
		w.cluster.addVDI("disk", 7, objects*smallObject)
		g := w.gateway("node00")
		e := open(t, g, "disk")
		writeEach(t, e, objects)
		gate := newGate(t, w, dataOf(7, "remove", "zero"))
		done := make(chan error, 1)
		go func() { done <- e.WriteZeroes(context.Background(), 0, objects*smallObject, false, false) }()
		gate.drain(t, done, DefaultPiecesPerRequest, DefaultPiecesPerRequest)
		if gate.released != objects {
			t.Fatalf("%d objects were removed, want %d", gate.released, objects)
		}
		extents, err := e.Extents(context.Background(), 0, objects*smallObject)
		if err != nil || len(extents) != 1 || !extents[0].Hole {
			t.Fatalf("after WRITE_ZEROES over the whole disk its extents are %+v (%v), want one hole", extents, err)
		}
	})
}

// Many TRIM and WRITE_ZEROES requests at once have at most ZeroPieces
// pieces in flight on the node, whatever each request would allow.
func TestZeroPiecesBoundedNodeWide(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const requests, perRequest = 6, 20
		w := newSmallWorld(t, 4, 2)
		w.cluster.addVDI("disk", 7, requests*perRequest*smallObject)
		g := w.gatewayWith("node00", quiet(), Options{PiecesPerRequest: 4, ZeroPieces: 10})
		e := open(t, g, "disk")
		writeEach(t, e, requests*perRequest)
		m := make(model, requests*perRequest*smallObject)
		for i := range requests * perRequest {
			m[i*smallObject] = byte(i) | 1
		}
		gate := newGate(t, w, dataOf(7, "remove", "zero"))
		results := make(chan error, requests)
		for r := range requests {
			offset := uint64(r * perRequest * smallObject)
			go func() {
				if r%2 == 0 {
					results <- e.Trim(context.Background(), offset, perRequest*smallObject, false)
				} else {
					// Unaligned, NO_HOLE: partial and whole pieces, zeroed in place.
					results <- e.WriteZeroes(context.Background(), offset+512, perRequest*smallObject-1024, true, false)
				}
			}()
			if r%2 == 1 {
				clear(m[offset+512 : offset+perRequest*smallObject-512])
			} else {
				clear(m[offset : offset+perRequest*smallObject])
			}
		}
		done := make(chan error, 1)
		go func() {
			var errs []error
			for range requests {
				errs = append(errs, <-results)
			}
			done <- errors.Join(errs...)
		}()
		// 6 requests of 4 pieces each would be 24 in flight: 10 are.
		gate.drain(t, done, 10, 10)
		if peak := g.admit.zeroPieces.peakUsed(); peak != 10 {
			t.Fatalf("the node-wide semaphore peaked at %d, want 10", peak)
		}
		verify(t, e, m)
	})
}

// Small writes to many objects a snapshot shares copy each whole object,
// but at most CopyBytes of copies are in memory at once; the copies are
// right.
func TestCopyOnWriteMemoryBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const objects = 40
		w := newSmallWorld(t, 3, 2)
		w.cluster.addVDI("disk", 7, objects*smallObject)
		g := w.gatewayWith("node00", quiet(), Options{CopyBytes: 3 * smallObject})
		e := open(t, g, "disk")
		ctx := context.Background()
		m := make(model, objects*smallObject)
		base := pattern(1, objects*smallObject)
		for i := range objects {
			p := base[i*smallObject : (i+1)*smallObject]
			if err := e.WriteAt(ctx, p, uint64(i)*smallObject, false); err != nil {
				t.Fatal(err)
			}
			m.write(p, uint64(i)*smallObject)
		}
		if _, err := g.Snapshot(ctx, "disk", "s1"); err != nil {
			t.Fatal(err)
		}
		buffers := bufpool.Outstanding()
		// The snapshot's objects are VDI 7's; the copies' reads of them
		// are what the gate holds.
		gate := newGate(t, w, dataOf(7, "read"))
		results := make(chan error, objects)
		for i := range objects {
			p := pattern(int64(100+i), 512)
			offset := uint64(i)*smallObject + 4096
			m.write(p, offset)
			go func() { results <- e.WriteAt(ctx, p, offset, false) }()
		}
		done := make(chan error, 1)
		go func() {
			var errs []error
			for range objects {
				errs = append(errs, <-results)
			}
			done <- errors.Join(errs...)
		}()
		gate.drain(t, done, 3, 3)
		if peak := g.admit.copyBytes.peakUsed(); peak != 3*smallObject {
			t.Fatalf("copy buffers peaked at %d bytes, want %d", peak, 3*smallObject)
		}
		if got := bufpool.Outstanding(); got != buffers {
			t.Fatalf("%d copy buffers not returned to the pool", got-buffers)
		}
		w.replicas.before = nil
		verify(t, e, m)
		verify(t, open(t, g, "disk@s1"), model(base))
	})
}

// A copy of an object larger than the whole copy budget still runs, alone.
func TestCopyLargerThanBudgetRunsAlone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newSmallWorld(t, 3, 2)
		w.cluster.addVDI("disk", 7, 4*smallObject)
		g := w.gatewayWith("node00", quiet(), Options{CopyBytes: smallObject / 2})
		e := open(t, g, "disk")
		writeEach(t, e, 4)
		if _, err := g.Snapshot(context.Background(), "disk", "s1"); err != nil {
			t.Fatal(err)
		}
		gate := newGate(t, w, dataOf(7, "read"))
		done := make(chan error, 1)
		// One request over 4 objects: the first and last pieces are
		// partial (copies), the middle two whole (no copy).
		go func() { done <- e.WriteAt(context.Background(), make([]byte, 3*smallObject), smallObject/2, false) }()
		gate.drain(t, done, 1, 1)
	})
}

// WRITE_ZEROES with NO_HOLE over whole objects a snapshot shares writes
// the shared zero buffer: no object-sized allocation per piece.
func TestWholeObjectZerosShareOneBuffer(t *testing.T) {
	w := newSmallWorld(t, 3, 2)
	w.cluster.addVDI("disk", 7, 8*smallObject)
	g := w.gateway("node00")
	e := open(t, g, "disk")
	writeEach(t, e, 8)
	ctx := context.Background()
	if _, err := g.Snapshot(ctx, "disk", "s1"); err != nil {
		t.Fatal(err)
	}
	child := e.VDI().ID
	shared := &zeros(smallObject)[0]
	var mu sync.Mutex
	creates, other := 0, 0
	w.replicas.before = func(op, node string, oid object.OID, p []byte) {
		if op != "write" || object.VDI(oid) != object.VDIID(child) || object.Type(oid) != object.Type(object.DataOID(0, 0)) {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if len(p) == smallObject && &p[0] == shared {
			creates++
		} else {
			other++
		}
	}
	if err := e.WriteZeroes(ctx, 0, 8*smallObject, true, false); err != nil {
		t.Fatal(err)
	}
	if creates != 8*2 || other != 0 {
		t.Fatalf("%d whole-object writes of the shared zero buffer (want 16: 8 objects, 2 copies), %d of other buffers", creates, other)
	}
	if got := readAll(t, e, 8*smallObject); !bytes.Equal(got, make([]byte, len(got))) {
		t.Fatal("the disk does not read as zeros")
	}
	if got := readAll(t, open(t, g, "disk@s1"), 8*smallObject); got[0] != 1 || got[2*smallObject] != 3 {
		t.Fatal("zeroing the VDI changed its snapshot")
	}
}

// span computes the same pieces as the naive loop it replaced.
func TestSpanMatchesNaivePieces(t *testing.T) {
	naive := func(offset, length, objectSize uint64) []piece {
		var out []piece
		for done := uint64(0); done < length; {
			at := offset + done
			within := at % objectSize
			n := min(length-done, objectSize-within)
			out = append(out, piece{index: uint32(at / objectSize), within: uint32(within), start: done, length: n})
			done += n
		}
		return out
	}
	random := rand.New(rand.NewSource(1))
	for range 10000 {
		objectSize := uint64(1) << (16 + random.Intn(4))
		offset := uint64(random.Int63n(int64(64 * objectSize)))
		length := uint64(random.Int63n(int64(8 * objectSize)))
		if random.Intn(4) == 0 {
			offset -= offset % objectSize
		}
		s := span{offset: offset, length: length, objectSize: objectSize}
		want := naive(offset, length, objectSize)
		if s.count() != uint64(len(want)) {
			t.Fatalf("span %+v: %d pieces, want %d", s, s.count(), len(want))
		}
		for i, p := range want {
			if got := s.piece(uint64(i)); got != p {
				t.Fatalf("span %+v piece %d = %+v, want %+v", s, i, got, p)
			}
		}
	}
}

// each stops starting pieces once one failed, and returns its error.
func TestEachStopsAfterAFailure(t *testing.T) {
	var mu sync.Mutex
	started := 0
	failure := errors.New("replica on fire")
	err := each(context.Background(), span{offset: 0, length: 1000 << 16, objectSize: 1 << 16}, 4, func(p piece) error {
		mu.Lock()
		started++
		mu.Unlock()
		if p.index == 2 {
			return failure
		}
		return nil
	})
	if !errors.Is(err, failure) {
		t.Fatalf("each returned %v", err)
	}
	if started >= 1000 {
		t.Fatalf("all %d pieces started after piece 2 failed", started)
	}
}

// The semaphore serves waiters in order (a waiter that fits does not
// pass an earlier one that does not), gives up with its context, and
// warns at most once a second when a request waited longer than
// slowWait, counting the warnings it held back.
func TestSemaphoreOrderCancelAndWarning(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logsMu sync.Mutex
		var logs bytes.Buffer
		logger := slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
			logsMu.Lock()
			defer logsMu.Unlock()
			return logs.Write(p)
		}), nil))
		logged := func() string {
			logsMu.Lock()
			defer logsMu.Unlock()
			return logs.String()
		}
		g := newWorld(t, 1, 1).gatewayWith("node00", logger, Options{})
		sem := newSemaphore("test units", "units", 4)
		ctx := context.Background()
		if err := acquire(ctx, g.logger, sem, 4, "first"); err != nil {
			t.Fatal(err)
		}
		waiter := func(name string, n int64, ctx context.Context) chan error {
			done := make(chan error, 1)
			go func() { done <- acquire(ctx, g.logger, sem, n, name) }()
			synctest.Wait() // queued in call order
			return done
		}
		pending := func(done chan error) bool {
			select {
			case err := <-done:
				t.Fatalf("a waiter returned early: %v", err)
			default:
			}
			return true
		}
		big := waiter("big", 3, ctx)
		cancelled, cancel := context.WithCancel(ctx)
		gaveUp := waiter("gives up", 1, cancelled)
		small := waiter("small", 1, ctx)
		cancel()
		if err := <-gaveUp; !errors.Is(err, context.Canceled) {
			t.Fatalf("a cancelled waiter got %v", err)
		}
		time.Sleep(2 * time.Second) // fake time: big and small wait 2 s
		sem.release(1)              // 3 taken: small would fit, big would not
		synctest.Wait()
		pending(big)
		pending(small)
		sem.release(3)
		if err := <-big; err != nil {
			t.Fatal(err)
		}
		if err := <-small; err != nil {
			t.Fatal(err)
		}
		text := logged()
		if n := strings.Count(text, "at a resource bound"); n != 1 {
			t.Fatalf("%d warnings for two slow waits at the same time, want 1:\n%s", n, text)
		}
		if !strings.Contains(text, `bound="test units"`) || !strings.Contains(text, "limit=4") || !strings.Contains(text, "waited=2s") {
			t.Fatalf("the warning does not name the bound, its limit and the wait:\n%s", text)
		}
		time.Sleep(time.Second)
		third := waiter("third", 4, ctx)
		time.Sleep(2 * time.Second)
		sem.release(4)
		if err := <-third; err != nil {
			t.Fatal(err)
		}
		if text := logged(); strings.Count(text, "at a resource bound") != 2 || !strings.Contains(text, "similar_waits_not_logged=1") {
			t.Fatalf("want a second warning counting the 1 not logged:\n%s", text)
		}
		sem.release(4)
		if peak := sem.peakUsed(); peak != 4 {
			t.Fatalf("peak %d, limit 4", peak)
		}
		// More than the whole limit is taken alone.
		if err := acquire(ctx, g.logger, sem, 10, "huge"); err != nil {
			t.Fatal(err)
		}
		next := waiter("after huge", 1, ctx)
		pending(next)
		sem.release(10)
		if err := <-next; err != nil {
			t.Fatal(err)
		}
		sem.release(1)
	})
}

type writerFunc func(p []byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
