package recovery

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/herd-storage/herd/internal/cluster"

	"github.com/herd-storage/herd/internal/layout"
	"github.com/herd-storage/herd/internal/object"
)

// Proof proves copies current; recovery and maintenance (checks) use it.
type Proof struct {
	cluster  Cluster
	layouts  *layout.History
	replicas interface {
		Stat(ctx context.Context, node cluster.Node, epoch object.Epoch, oid object.OID) (stamp object.Epoch, digest uint64, err error)
	}
}

// NewProof returns a prover over the cluster's epochs and replicas.
func NewProof(c Cluster, layouts *layout.History, replicas Replicas) *Proof {
	return &Proof{cluster: c, layouts: layouts, replicas: replicas}
}

// surveyTimeout bounds a survey: a node that has not answered by then
// counts as silent (a member that did not answer: retried).
const surveyTimeout = 5 * time.Second

// Proving a copy current (the paper's Fig. 4).
//
// Every copy carries the epoch in which it was last written or recovered
// (its stamp), and a replica serves only copies stamped with the current
// epoch. When the epoch changes, a copy becomes servable again only once
// recovery proves that no write since its stamp can have been missed:
//
// A write acknowledged in epoch e reached every replica of the object in
// e and stamped them e. So if the newest copy any reachable node holds is
// stamped b, an acknowledged write in an epoch e after b is impossible
// when some replica of e answered now (its stamp is at most b < e). The
// newest reachable copy is current when every epoch between b and the
// current one has such a witness. An epoch whose replicas are all
// unreachable may have taken writes that only they hold: the object is
// then refused (object.ErrNoCopy) until one of them returns, never served from
// the older copy. Copies of an epoch in which writes were refused (no
// current copy reachable) are not stale, so a node that returns with the
// newest copy serves it again.

// Survey asks every node of rv's epoch for its stamp of oid, and its
// content digest (where the node reported one: Replicas.Stat), in
// parallel. A node that answered "not found" is in answered without a
// stamp; one that did not answer is in neither.
func (p *Proof) Survey(ctx context.Context, rv *layout.Epoch, oid object.OID) (stamps map[string]object.Epoch, digests map[string]uint64, answered func(string) bool) {
	stamps, digests = map[string]object.Epoch{}, map[string]uint64{}
	ok := map[string]bool{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	scope, cancel := layout.Scoped(ctx, p.cluster, rv.Number, surveyTimeout)
	defer cancel()
	for id, node := range rv.Nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			stamp, digest, err := p.replicas.Stat(scope, node, rv.Number, oid)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				stamps[id], ok[id] = stamp, true
				if digest != 0 {
					digests[id] = digest
				}
			case errors.Is(err, object.ErrNotFound):
				ok[id] = true
			}
		}()
	}
	wg.Wait()
	return stamps, digests, func(id string) bool { return ok[id] }
}

// Current returns nil when a copy of oid stamped newest (the newest
// any answering node holds) is current in rv's epoch, copies being the
// number of copies of oid's VDI (its replicas in every epoch are that
// many: a witness outside them proves nothing): every epoch after
// newest and before rv's, from the one in which oid's VDI was created
// on (no write to oid is older), has a replica of oid among the nodes
// that answered. Otherwise object.ErrNoCopy naming the epoch and the nodes that
// may hold newer data, when all of them are out of rv's epoch (down), or
// object.ErrUnavailable when some of them are members that just did not answer
// (paused, cut off, busy, or not yet in this epoch): that clears when
// they answer or the epoch that drops them arrives, so it is retried,
// never reported as data the cluster cannot serve.
//
// A chunk of an erasure-coded object (object.IsChunk) is refused
// (object.ErrInvalid): it has one copy, on the node its object's head
// names rather than where the epochs placed its id, so no stamp or
// witness says anything about it.
func (p *Proof) Current(oid object.OID, copies int, rv *layout.Epoch, newest object.Epoch, answered func(string) bool) error {
	if object.IsChunk(oid) {
		return fmt.Errorf("%w: object %016x is a chunk of an erasure-coded object: no epoch stamp proves it current (its gateway checks it against its object's head)", object.ErrInvalid, oid)
	}
	epoch := rv.Number
	if newest+1 >= epoch {
		return nil // the common case: stamped in the previous epoch
	}
	from := max(newest+1, p.writableSince(oid))
	for _, e := range p.cluster.Epochs() {
		if number := object.Epoch(e.Number); number < from || number >= epoch {
			continue
		}
		past := p.layouts.At(e)
		if past == nil {
			continue // no nodes: no writes
		}
		replicas := past.ReplicasOf(oid, copies)
		witnessed := false
		var ids, silent []string
		for _, n := range replicas {
			ids = append(ids, n.ID)
			if answered(n.ID) {
				witnessed = true
				break
			}
			if rv.Member(n.ID) {
				silent = append(silent, n.ID)
			}
		}
		if witnessed {
			continue
		}
		if len(silent) > 0 {
			return fmt.Errorf("%w: object %016x: its newest copy that answered is from epoch %d, and of its epoch-%d replicas %s, node %s is in epoch %d but did not answer; trying again",
				object.ErrUnavailable, oid, newest, e.Number, strings.Join(ids, ", "), strings.Join(silent, ", "), epoch)
		}
		return fmt.Errorf("%w: object %016x: its newest reachable copy is from epoch %d, but in epoch %d it lived on %s, none of which is reachable now and which may hold newer data; it is unavailable until one of them returns",
			object.ErrNoCopy, oid, newest, e.Number, strings.Join(ids, ", "))
	}
	return nil
}

// writableSince returns the first epoch in which oid can have been
// written: the one in which its VDI was created (0 when unknown).
func (p *Proof) writableSince(oid object.OID) object.Epoch {
	if v, ok := p.cluster.VDIByID(uint32(object.VDI(oid))); ok {
		return object.Epoch(v.Since)
	}
	return 0
}
