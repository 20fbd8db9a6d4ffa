// Package linearize records the history of block reads and writes that
// test clients make and checks it for linearizability with
// github.com/anishathalye/porcupine: each block is a read/write register
// holding the sequence number of the write it last took (0: never
// written). A read must return a value some linearization of the history
// allows: never older than a write acknowledged before the read began.
//
// Rules of the record: every operation has its invoke time and its return
// time on one monotonic clock; a write whose outcome the client does not
// know (an error, a dropped connection) gets return time infinity, since
// it may take effect at any later moment; a failed read is dropped, since
// it returned nothing. A check that runs out of time counts as a failure.
package linearize

import (
	"fmt"
	"math"
	"os"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"
)

type input struct {
	block int
	write bool
	value uint64 // for a write: its sequence number
}

// History is a concurrent record of operations.
type History struct {
	mu     sync.Mutex
	origin time.Time
	ops    []porcupine.Operation
}

// NewHistory starts an empty history.
func NewHistory() *History { return &History{origin: time.Now()} }

// Call is an operation invoked and not yet recorded.
type Call struct {
	client int
	at     int64
}

// Invoke marks the start of an operation by client (a small integer, one
// per concurrent actor, for the visualization).
func (h *History) Invoke(client int) Call {
	return Call{client: client, at: int64(time.Since(h.origin))}
}

func (h *History) add(op porcupine.Operation) {
	h.mu.Lock()
	h.ops = append(h.ops, op)
	h.mu.Unlock()
}

// Write records a write of value to block: ok says it was acknowledged;
// otherwise its outcome is unknown.
func (h *History) Write(c Call, block int, value uint64, ok bool) {
	ret := int64(math.MaxInt64)
	if ok {
		ret = int64(time.Since(h.origin))
	}
	h.add(porcupine.Operation{ClientId: c.client, Input: input{block: block, write: true, value: value}, Call: c.at, Return: ret})
}

// Read records a successful read of block that returned value.
func (h *History) Read(c Call, block int, value uint64) {
	h.add(porcupine.Operation{ClientId: c.client, Input: input{block: block}, Output: value, Call: c.at, Return: int64(time.Since(h.origin))})
}

// Len is the number of operations recorded.
func (h *History) Len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.ops)
}

// Model is the register-per-block model.
var Model = porcupine.Model{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byBlock := map[int][]porcupine.Operation{}
		var order []int
		for _, op := range history {
			b := op.Input.(input).block
			if _, ok := byBlock[b]; !ok {
				order = append(order, b)
			}
			byBlock[b] = append(byBlock[b], op)
		}
		out := make([][]porcupine.Operation, 0, len(order))
		for _, b := range order {
			out = append(out, byBlock[b])
		}
		return out
	},
	Init: func() any { return uint64(0) },
	Step: func(state, in, out any) (bool, any) {
		i := in.(input)
		if i.write {
			return true, i.value
		}
		return out.(uint64) == state.(uint64), state
	},
	DescribeOperation: func(in, out any) string {
		i := in.(input)
		if i.write {
			return fmt.Sprintf("write(block %d, %d)", i.block, i.value)
		}
		return fmt.Sprintf("read(block %d) -> %d", i.block, out)
	},
	DescribeState: func(state any) string { return fmt.Sprint(state) },
}

// Check checks the history. It returns nil when it is linearizable; an
// error otherwise, or when the check ran out of timeout. When it fails and
// visualization is not empty, the HTML visualization of the history is
// written there.
func (h *History) Check(timeout time.Duration, visualization string) error {
	h.mu.Lock()
	ops := append([]porcupine.Operation(nil), h.ops...)
	h.mu.Unlock()
	result, info := porcupine.CheckOperationsVerbose(Model, ops, timeout)
	if result == porcupine.Ok {
		return nil
	}
	what := "not linearizable"
	if result == porcupine.Unknown {
		what = fmt.Sprintf("not proven linearizable in %v (counted as a failure)", timeout)
	}
	if visualization != "" {
		if f, err := os.Create(visualization); err == nil {
			porcupine.Visualize(Model, info, f)
			f.Close()
			what += "; visualization in " + visualization
		}
	}
	return fmt.Errorf("history of %d operations is %s", len(ops), what)
}
