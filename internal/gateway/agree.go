package gateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/herd-storage/herd/internal/bufpool"
	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/object"
)

// Reads of a VDI another gateway writes.
//
// The writer's gateway reads one replica (read): every change it made is
// on every replica once acknowledged, and it knows its own changes still
// in flight. A gateway that only reads a VDI written through another
// node (a ro/ open of a live VDI) knows nothing of the writer's changes
// in flight: one may have reached some replicas and not others yet (a
// write's pieces, or the map entry of an object's first write, land on
// its replicas in any order). Reading one replica, a reader through one
// node could return the new data and a later reader through another node
// the old, which no order of the operations explains (not linearizable;
// the simulator's read floor, sim/reader.go checkReadFloor).
//
// So such a read reads the piece from every replica of the current epoch
// and returns it only when all hold the same bytes; otherwise a change is
// in flight, and it reads again (after 1 ms, doubling up to 100 ms) until
// they agree. Each replica's copy only moves forward (a change lands, a
// failed one is resolved as applied by the suspect repair, recovery rolls
// a partial change forward: suspect.go, recovery.go "Copies with the same
// stamp"), so bytes every replica held during the read are what every
// replica holds, or newer, once it returns: no later read returns older
// data, and a write acknowledged before the read began is on all of them.
// It costs a read per replica instead of one, for ro/ opens of live VDIs
// only: snapshots and the ancestors' objects never change, and the
// writer reads one copy.
//
// Agreement is bounded like any wait for the cluster (Options.
// RetryTimeout per epoch): a change that failed and that the writer has
// not yet repaired (its next access to the object, or its close) keeps
// the replicas apart, and a read that still finds them apart then fails
// with an I/O error naming the object.

type agreeKey struct{}

// withAgreement marks ctx's reads of the objects of VDI id (its data and
// map objects) as reads of a VDI another gateway may be changing.
func withAgreement(ctx context.Context, id uint32) context.Context {
	return context.WithValue(ctx, agreeKey{}, object.VDIID(id))
}

// needsAgreement says whether ctx's read of oid must find every replica
// agreeing (withAgreement).
func needsAgreement(ctx context.Context, oid object.OID) bool {
	if bugOneReplicaReads {
		return false
	}
	id, ok := ctx.Value(agreeKey{}).(object.VDIID)
	return ok && object.VDI(oid) == id
}

// ErrReplicasDisagree: a read of a VDI written elsewhere found the
// replicas of an object holding different data for longer than the
// retry budget (a change in flight or failed and not yet repaired).
var ErrReplicasDisagree = errors.New("gateway: the replicas of an object still hold different data")

// agreeWaitMax caps the wait between two reads of replicas that differ.
const agreeWaitMax = 100 * time.Millisecond

// readAgreed reads a piece of oid from every replica of the current epoch
// and returns once they hold the same bytes (see above).
func (g *Gateway) readAgreed(ctx context.Context, oid object.OID, copies int, p []byte, offset uint32) error {
	budget := g.newBudget()
	wait := time.Millisecond
	for {
		rv, err := g.layouts.Current()
		if err != nil {
			return err
		}
		candidates := rv.ReplicasOf(oid, copies)
		if len(candidates) == 0 {
			return fmt.Errorf("object %016x: no replica in epoch %d", oid, rv.Number)
		}
		// The first candidate reads into p, the others into buffers of
		// their own; all at once.
		others := make([]*bufpool.Buffer, len(candidates)-1)
		for i := range others {
			others[i] = bufpool.Get(len(p))
		}
		errs := make([]error, len(candidates))
		var wg sync.WaitGroup
		for i, node := range candidates[1:] {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[i+1] = g.readFrom(ctx, node, rv, oid, others[i].Bytes, offset)
			}()
		}
		errs[0] = g.readFrom(ctx, candidates[0], rv, oid, p, offset)
		wg.Wait()
		agree := true
		for i, b := range others {
			if errs[0] == nil && errs[i+1] == nil && !bytes.Equal(p, b.Bytes) {
				agree = false
			}
			b.Release()
		}

		var retry, hard error
		var damaged, badBlocks []cluster.Node
		answered := 0
		for i, err := range errs {
			if err == nil {
				answered++
				continue
			}
			if errors.Is(err, object.ErrNoCopy) {
				return err // the same on every replica: the proof is global
			}
			if errors.Is(err, object.ErrNoObject) {
				// No node holds it: a never-written map object, or an
				// object whose first write has not created it anywhere
				// yet. Every replica says so, or the others hold a copy
				// (created since) and the next round finds it.
				if allNoObject(errs) {
					return err
				}
				retry = err
				continue
			}
			if object.Damaged(err) {
				damaged = append(damaged, candidates[i])
			}
			if errors.Is(err, object.ErrChecksum) {
				badBlocks = append(badBlocks, candidates[i])
			}
			err = &object.ReplicaError{Node: candidates[i].ID, OID: oid, Err: err}
			if object.Retryable(err) {
				retry = err
			} else {
				hard = err
			}
		}
		if retry == nil && agree && answered > 0 {
			// A replica that cannot serve the piece (a damaged copy, a
			// block failing its checksum) has nothing to agree with:
			// the others' agreement stands, as a read of one replica
			// fails over, and the bad copy is healed from them.
			if errs[0] != nil {
				// p holds nothing: read it again from one that agreed.
				for i, node := range candidates {
					if errs[i] == nil {
						if err := g.readFrom(ctx, node, rv, oid, p, offset); err != nil {
							retry = err
						}
						break
					}
				}
			}
			if retry == nil {
				g.healAfterRead(rv, oid, copies, offset, len(p), damaged, badBlocks)
				return nil
			}
		}
		switch {
		case retry == nil && answered == 0 && len(badBlocks) > 0:
			// Every replica failed, some with bad blocks: take each
			// block from where it is good, as a one-replica read does.
			err := g.heal.readBlockwise(ctx, rv, oid, copies, p, offset)
			if err == nil || errors.Is(err, object.ErrChecksum) {
				return err
			}
			return hard
		case retry == nil && answered == 0:
			return hard
		case retry != nil:
			if err := g.waitNextEpoch(ctx, rv.Number, budget, retry); err != nil {
				if hard != nil {
					return hard
				}
				return err
			}
		default:
			// The replicas differ: a change is on its way.
			if g.expired(budget, object.Epoch(g.cluster.Epoch())) {
				return fmt.Errorf("%w: object %016x, bytes %d-%d, for %v in epoch %d (a change by the VDI's writer is in flight, or failed and is not repaired yet; the writer repairs it at its next access to the object or when it closes the VDI)",
					ErrReplicasDisagree, oid, offset, int(offset)+len(p), time.Since(budget.started).Round(time.Millisecond), rv.Number)
			}
			if err := sleepCtx(ctx, wait); err != nil {
				return err
			}
			wait = min(2*wait, agreeWaitMax)
		}
	}
}

// allNoObject says whether every replica answered that no node holds the object.
func allNoObject(errs []error) bool {
	for _, err := range errs {
		if !errors.Is(err, object.ErrNoObject) {
			return false
		}
	}
	return true
}

// The VDI a ro/NAME read reads.
//
// A ro/ open of a live VDI reads the VDI that has the name now
// (followName): after a snapshot through the writer, a new VDI, while
// the old one, now the snapshot, no longer changes. A node that applies
// the log late (within its lease: cluster/lease.go) would read the old
// one, and miss every write the writer made into the new one since: a
// stale read (the simulator's TestScenarioSnapshotOnLaggingNode). So such
// a read first has this node apply everything the leader had committed
// when the read began (the cluster's Sync: the leader's commit index,
// confirmed as leader, then applied here): a snapshot whose writes were
// acknowledged before the read began is known. Reads share the round
// trips: a read that arrives while one runs waits for the next, which
// starts after it (readBarrier).

// syncer is what the cluster offers for that (cluster.Cluster and
// cluster.LocalMember).
type syncer interface {
	Sync(ctx context.Context) error
}

// readBarrier batches the syncs of ro/ reads: at most one runs at a
// time, and every read waits for one that started after it arrived.
type readBarrier struct {
	mu      sync.Mutex
	running bool
	next    *barrierRound // the round that starts when the running one ends
}

type barrierRound struct {
	done    chan struct{}
	err     error
	waiters int // the reads waiting for it (guarded by readBarrier.mu)
}

// syncRetry is the pause between two tries of a round's sync while this
// node knows no leader (an election under way, a leader just killed).
const syncRetry = 100 * time.Millisecond

// wait returns once this node applied everything committed before it
// was called. The syncs run under life, which ends them all (the
// gateway's).
func (b *readBarrier) wait(ctx, life context.Context, limit time.Duration, sync func(context.Context) error) error {
	b.mu.Lock()
	r := b.next
	if r == nil {
		r = &barrierRound{done: make(chan struct{})}
		b.next = r
	}
	r.waiters++
	if !b.running {
		b.running, b.next = true, nil
		go b.run(life, limit, r, sync)
	}
	b.mu.Unlock()
	select {
	case <-r.done:
		return r.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// run runs rounds until no read waits. A round tries its sync again
// while it fails (no leader known yet: a leader election takes a few
// seconds), for at most limit, as a request waits for the cluster.
func (b *readBarrier) run(life context.Context, limit time.Duration, r *barrierRound, sync func(context.Context) error) {
	for {
		ctx, cancel := context.WithTimeout(life, limit)
		for {
			r.err = sync(ctx)
			if r.err == nil || ctx.Err() != nil {
				break
			}
			select {
			case <-ctx.Done():
			case <-time.After(syncRetry):
			}
		}
		cancel()
		close(r.done)
		b.mu.Lock()
		r = b.next
		if r == nil {
			b.running = false
			b.mu.Unlock()
			return
		}
		b.next = nil
		b.mu.Unlock()
	}
}

// syncForRead has this node apply what the leader committed before now,
// for a ro/ read of a live VDI (see above). A cluster that cannot (a
// test's) is taken as current.
func (g *Gateway) syncForRead(ctx context.Context) error {
	s, ok := g.cluster.(syncer)
	if !ok || bugOneReplicaReads {
		return nil
	}
	if err := g.readSync.wait(ctx, g.ctx, g.options.RetryTimeout, s.Sync); err != nil {
		return fmt.Errorf("a read of a VDI written through another node must first know what the cluster committed, and this node could not catch up with the leader: %w", err)
	}
	return nil
}
