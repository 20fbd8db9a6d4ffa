package sim

import (
	"bytes"
	"context"
	"fmt"
	"hash/fnv"
	"time"

	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/gateway"
	"github.com/herd-storage/herd/internal/object"
	"github.com/herd-storage/herd/internal/recovery"
	"github.com/herd-storage/herd/internal/replica"
)

// transport is the network as one process sees it: gateway.Replicas and
// Recovery's Lister, done by calling the target process's
// *replica.Replica directly, as gateway.PeerReplicas does through the
// peer protocol, with the faults in force:
//
//   - a request to a process that was killed is refused (connection
//     refused), and so is every request of a killed process;
//   - a request to or from a paused process, or across the partition,
//     waits until that ends or the caller's context does (a peer that
//     stops answering with its connection open); the same holds for the
//     answer, so a request can run without its caller ever hearing back;
//   - drops lose a request (not run) or its answer (run), delays hold
//     either: concurrent requests are reordered.
//
// As on the peer port, the target runs a request in its own goroutine
// with a context of its own (ended when either process dies), not the
// caller's: a caller that gives up does not stop a write already
// running. Requests to the process itself take PeerReplicas's shortcut:
// no network, the caller's context, only a pause holds them.
//
// A message's fate (dropped, its delay) is drawn from a hash of the seed,
// the message (operation, nodes, object, offset, epoch) and the fake
// time, not from a shared stream, so it does not depend on the order in
// which goroutines happen to send.
type transport struct {
	w    *World
	from *process
}

var (
	_ gateway.Replicas    = (*transport)(nil)
	_ recovery.Replicas   = (*transport)(nil)
	_ gateway.Cluster     = (*cluster.LocalMember)(nil)
	_ replica.EpochSource = (*cluster.LocalMember)(nil)
	_ recovery.Cluster    = (*cluster.LocalMember)(nil)
)

// fate is what the network does to one request and its answer.
type fate struct {
	dropRequest, dropAnswer   bool
	delayRequest, delayAnswer time.Duration
}

func (w *World) fate(from, to, op string, epoch object.Epoch, oid object.OID, offset uint32) fate {
	w.mu.Lock()
	drop, delay := w.dropPerMille, w.delayMax
	w.mu.Unlock()
	var f fate
	if drop == 0 && delay == 0 {
		return f
	}
	h := fnv.New64a()
	fmt.Fprintf(h, "%s>%s %s %x %d %d %d", from, to, op, oid, offset, epoch, time.Since(w.started))
	r := newSplitMix(h.Sum64() ^ w.seed)
	f.dropRequest = int(r.next()%1000) < drop
	f.dropAnswer = int(r.next()%1000) < drop
	if delay > 0 {
		f.delayRequest = time.Duration(r.next() % uint64(delay))
		f.delayAnswer = time.Duration(r.next() % uint64(delay))
	}
	return f
}

func unavailable(format string, args ...any) error {
	return fmt.Errorf("%w: %s", object.ErrUnavailable, fmt.Sprintf(format, args...))
}

// link waits until a message can go from `from` to the current process
// of node `to` (to may be from's own node): both run, neither is paused
// and no partition separates them. It returns that process, or an error:
// the caller's context ended, or a process is dead.
func (w *World) link(ctx context.Context, from *process, to int) (*process, error) {
	for {
		w.mu.Lock()
		if from.dead {
			w.mu.Unlock()
			return nil, unavailable("process %s has died", from.incarnation)
		}
		target := w.nodes[to]
		self := to == from.node.index
		held := from.node.paused || (!self && (target.paused || w.cut[from.node.index] != w.cut[to]))
		if !held {
			p := target.proc
			dead := p.dead
			w.mu.Unlock()
			if dead {
				return nil, unavailable("node %s refused the connection: its process is dead", target.id)
			}
			return p, nil
		}
		changed := w.changed
		w.mu.Unlock()
		select {
		case <-changed:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// sleep waits d of fake time or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// call sends one request to node and runs handler on its replica side.
func (t *transport) call(ctx context.Context, node cluster.Node, op string, epoch object.Epoch, oid object.OID, offset uint32, handler func(ctx context.Context, r *replica.Replica) error) error {
	return t.callServed(ctx, node, op, epoch, oid, offset, func(ctx context.Context, s replica.Served) error { return handler(ctx, s.Replica) })
}

// callServed is call with the node's whole side of the object protocol:
// its replica and its recovery (RECOVER).
func (t *transport) callServed(ctx context.Context, node cluster.Node, op string, epoch object.Epoch, oid object.OID, offset uint32, handler func(ctx context.Context, s replica.Served) error) error {
	w := t.w
	to := w.index(node.ID)
	if to < 0 {
		return unavailable("no node %s", node.ID)
	}
	if to == t.from.node.index {
		// PeerReplicas's shortcut to the local replica.
		p, err := w.link(ctx, t.from, to)
		if err != nil {
			return err
		}
		return handler(ctx, p.served)
	}
	f := w.fate(t.from.node.id, node.ID, op, epoch, oid, offset)
	target, err := w.link(ctx, t.from, to)
	if err != nil {
		return err
	}
	if tw := w.trustModel(); tw != nil {
		// The peer port's mutual TLS (trust.go): a refusal between
		// two admitted nodes breaks the rotations' promise.
		if err := tw.handshake(t.from, target); err != nil {
			w.violation("%s request refused: %v", op, err)
			return unavailable("%v", err)
		}
	}
	if f.dropRequest {
		return unavailable("request to %s lost", node.ID)
	}
	if f.delayRequest > 0 {
		if err := sleep(ctx, f.delayRequest); err != nil {
			return err
		}
		again, err := w.link(ctx, t.from, to)
		if err != nil {
			return err
		}
		if again != target {
			return unavailable("connection to %s reset: it restarted", node.ID)
		}
	}
	// The target side: its own goroutine and context, which end when
	// either process dies (the connection goes with it).
	serve, cancel := context.WithCancel(target.ctx)
	stop := context.AfterFunc(t.from.ctx, cancel)
	done := make(chan error, 1)
	go func() {
		defer cancel()
		defer stop()
		done <- handler(serve, target.served)
	}()
	var result error
	select {
	case result = <-done:
	case <-ctx.Done():
		return ctx.Err()
	}
	if err := sleep(ctx, f.delayAnswer); err != nil {
		return err
	}
	again, err := w.link(ctx, t.from, to)
	if err != nil {
		return err
	}
	if again != target {
		return unavailable("connection to %s reset: it restarted", node.ID)
	}
	if f.dropAnswer {
		return unavailable("answer from %s lost", node.ID)
	}
	return result
}

func (w *World) index(id string) int {
	for i, n := range w.nodes {
		if n.id == id {
			return i
		}
	}
	return -1
}

// Read implements gateway.Replicas. The target reads into a buffer of
// its own, copied to p only when the answer arrives (as the peer
// client does), so a request its caller gave up on never writes into p.
func (t *transport) Read(ctx context.Context, node cluster.Node, epoch object.Epoch, oid object.OID, p []byte, offset uint32) (object.Epoch, error) {
	var stamp object.Epoch
	buffer := make([]byte, len(p))
	err := t.call(ctx, node, "read", epoch, oid, offset, func(ctx context.Context, r *replica.Replica) error {
		var err error
		stamp, err = r.Read(ctx, epoch, oid, buffer, offset)
		return err
	})
	if err != nil {
		return 0, err // the target may still be running: leave its variables alone
	}
	copy(p, buffer)
	return stamp, nil
}

// Write implements gateway.Replicas. The payload is copied, as it is
// when it is sent: the caller may reuse p once it returns.
func (t *transport) Write(ctx context.Context, node cluster.Node, epoch object.Epoch, oid object.OID, p []byte, offset uint32, flags object.Flags) error {
	data := bytes.Clone(p)
	return t.call(ctx, node, "write", epoch, oid, offset, func(ctx context.Context, r *replica.Replica) error {
		return r.Write(ctx, epoch, oid, data, offset, flags)
	})
}

// StartWrite implements gateway.Starter, as the peer client does:
// a write to another node is on its way when it returns; this node's
// own copy is left to Write.
func (t *transport) StartWrite(ctx context.Context, node cluster.Node, epoch object.Epoch, oid object.OID, p *object.Payload, offset uint32, flags object.Flags) func() error {
	if t.w.index(node.ID) == t.from.node.index {
		return nil
	}
	if p.Checksum() != object.Checksum(p.Data) {
		panic("sim: a write's payload changed after its checksum was taken")
	}
	data := bytes.Clone(p.Data) // as Write: p is the caller's again once the wait returns
	done := make(chan error, 1)
	go func() { done <- t.Write(ctx, node, epoch, oid, data, offset, flags) }()
	return func() error { return <-done }
}

// StartFlush implements gateway.Starter, as StartWrite does.
func (t *transport) StartFlush(ctx context.Context, node cluster.Node, epoch object.Epoch) func() error {
	if t.w.index(node.ID) == t.from.node.index {
		return nil
	}
	done := make(chan error, 1)
	go func() { done <- t.Flush(ctx, node, epoch) }()
	return func() error { return <-done }
}

// Zero implements gateway.Replicas.
func (t *transport) Zero(ctx context.Context, node cluster.Node, epoch object.Epoch, oid object.OID, offset, length uint32, flags object.Flags) error {
	return t.call(ctx, node, "zero", epoch, oid, offset, func(ctx context.Context, r *replica.Replica) error {
		return r.Zero(ctx, epoch, oid, offset, length, flags)
	})
}

// Remove implements gateway.Replicas.
func (t *transport) Remove(ctx context.Context, node cluster.Node, epoch object.Epoch, oid object.OID) error {
	return t.call(ctx, node, "remove", epoch, oid, 0, func(ctx context.Context, r *replica.Replica) error {
		return r.Remove(ctx, epoch, oid)
	})
}

// Flush implements gateway.Replicas.
func (t *transport) Flush(ctx context.Context, node cluster.Node, epoch object.Epoch) error {
	return t.call(ctx, node, "flush", epoch, 0, 0, func(ctx context.Context, r *replica.Replica) error {
		return r.Flush(ctx, epoch)
	})
}

// Stat implements recovery.Replicas: the stamp and the content digest,
// which every simulated node reports (the runtime asks for it only from
// cluster.LevelCopyDigests on: replica.Client.Digests).
func (t *transport) Stat(ctx context.Context, node cluster.Node, epoch object.Epoch, oid object.OID) (object.Epoch, uint64, error) {
	var stamp object.Epoch
	var digest uint64
	err := t.call(ctx, node, "stat", epoch, oid, 0, func(ctx context.Context, r *replica.Replica) error {
		var err error
		stamp, digest, err = r.Stat(ctx, epoch, oid)
		return err
	})
	if err != nil {
		return 0, 0, err // the target may still be running: leave its variables alone
	}
	return stamp, digest, nil
}

// Fetch implements gateway.Replicas.
func (t *transport) Fetch(ctx context.Context, node cluster.Node, epoch object.Epoch, oid object.OID, p []byte) (object.Epoch, error) {
	var stamp object.Epoch
	buffer := make([]byte, len(p))
	err := t.call(ctx, node, "fetch", epoch, oid, 0, func(ctx context.Context, r *replica.Replica) error {
		var err error
		stamp, err = r.Fetch(ctx, epoch, oid, buffer)
		return err
	})
	if err != nil {
		return 0, err // the target may still be running: leave its variables alone
	}
	copy(p, buffer)
	return stamp, nil
}

// FetchAt implements maintenance.Replicas.
func (t *transport) FetchAt(ctx context.Context, node cluster.Node, epoch object.Epoch, oid object.OID, p []byte, offset uint32) (object.Epoch, error) {
	var stamp object.Epoch
	buffer := make([]byte, len(p))
	err := t.call(ctx, node, "fetch", epoch, oid, 0, func(ctx context.Context, r *replica.Replica) error {
		var err error
		stamp, err = r.FetchAt(ctx, epoch, oid, buffer, offset)
		return err
	})
	if err != nil {
		return 0, err
	}
	copy(p, buffer)
	return stamp, nil
}

// Recover implements gateway.Replicas.
func (t *transport) Recover(ctx context.Context, node cluster.Node, epoch object.Epoch, oid object.OID) error {
	return t.callServed(ctx, node, "recover", epoch, oid, 0, func(ctx context.Context, s replica.Served) error {
		return s.Recover(ctx, epoch, oid)
	})
}

// List implements gateway.Lister, as PeerReplicas.List: the epoch is
// checked, then every copy listed with its stamp.
func (t *transport) List(ctx context.Context, node cluster.Node, epoch object.Epoch) (map[object.OID]object.Epoch, error) {
	var out map[object.OID]object.Epoch
	err := t.call(ctx, node, "list", epoch, 0, 0, func(ctx context.Context, r *replica.Replica) error {
		if err := r.Check(ctx, epoch); err != nil {
			return err
		}
		objects := map[object.OID]object.Epoch{}
		err := r.List(func(oid object.OID, stamp object.Epoch) error { objects[oid] = stamp; return nil })
		out = objects
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}
