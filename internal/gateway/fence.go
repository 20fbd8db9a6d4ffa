package gateway

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/herd-storage/herd/internal/cluster"
)

// Proving a copy current (issue 5, the paper's Fig. 4).
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
// then refused (ErrNoCopy) until one of them returns, never served from
// the older copy. Copies of an epoch in which writes were refused (no
// current copy reachable) are not stale, so a node that returns with the
// newest copy serves it again.

// survey asks every node of rv's epoch for its stamp of oid, in
// parallel. A node that answered "not found" is in answered without a
// stamp; one that did not answer is in neither.
func (g *Gateway) survey(ctx context.Context, rv *ringView, oid uint64) (stamps map[string]uint64, answered func(string) bool) {
	stamps = map[string]uint64{}
	ok := map[string]bool{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	scope, cancel := g.scoped(ctx, rv.epoch, readTimeout)
	defer cancel()
	for id, node := range rv.nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			stamp, err := g.replicas.Stat(scope, node, rv.epoch, oid)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				stamps[id], ok[id] = stamp, true
			case errors.Is(err, ErrNotFound):
				ok[id] = true
			}
		}()
	}
	wg.Wait()
	return stamps, func(id string) bool { return ok[id] }
}

// proveCurrent returns nil when a copy of oid stamped newest (the newest
// any answering node holds) is current in epoch: every epoch after
// newest and before epoch has a replica of oid among the nodes that
// answered. Otherwise an ErrNoCopy naming the epoch and the nodes that
// may hold newer data.
func (g *Gateway) proveCurrent(oid uint64, copies int, epoch, newest uint64, answered func(string) bool) error {
	if newest+1 >= epoch {
		return nil // the common case: stamped in the previous epoch
	}
	for _, e := range g.cluster.Epochs() {
		if e.Number <= newest || e.Number >= epoch {
			continue
		}
		past := g.ringAt(e)
		if past == nil {
			continue // no nodes: no writes
		}
		replicas := past.replicasOf(oid, copies)
		witnessed := false
		var ids []string
		for _, n := range replicas {
			ids = append(ids, n.ID)
			if answered(n.ID) {
				witnessed = true
				break
			}
		}
		if !witnessed {
			return fmt.Errorf("%w: object %016x: its newest reachable copy is from epoch %d, but in epoch %d it lived on %s, none of which is reachable now and which may hold newer data; it is unavailable until one of them returns",
				ErrNoCopy, oid, newest, e.Number, strings.Join(ids, ", "))
		}
	}
	return nil
}

// ringAt returns the placement of a past epoch (cached), or nil if the
// epoch has no nodes.
func (g *Gateway) ringAt(e cluster.Epoch) *ringView {
	g.mu.Lock()
	if rv, ok := g.past[e.Number]; ok {
		g.mu.Unlock()
		return rv
	}
	g.mu.Unlock()
	var members []cluster.Node
	for _, id := range e.Placed() {
		if n, ok := g.cluster.Node(id); ok {
			members = append(members, n)
		}
	}
	var rv *ringView
	if ring, err := ringFor(members); err == nil && len(members) > 0 {
		rv = &ringView{epoch: e.Number, ring: ring, nodes: map[string]cluster.Node{}}
		for _, n := range members {
			rv.nodes[n.ID] = n
		}
	}
	g.mu.Lock()
	if len(g.past) >= 1024 {
		clear(g.past)
	}
	g.past[e.Number] = rv
	g.mu.Unlock()
	return rv
}
