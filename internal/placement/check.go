package placement

import (
	"fmt"
	"math/bits"
	"strings"
)

// Check verifies the ring's invariants and returns an error wrapping
// ErrInvariant for the first one broken. A ring built by New always
// passes, so a failure is a bug or memory corruption. Tests call it after
// every construction; a caller may too, as a self-check costing about as
// much as New.
func (r *Ring) Check() error {
	count := len(r.nodes)
	if count == 0 {
		return invariant("no nodes")
	}
	if len(r.keys) != count || len(r.domainOf) != count {
		return invariant("%d nodes but %d keys and %d domain entries", count, len(r.keys), len(r.domainOf))
	}
	var total uint64
	zoned := false
	seen := make(map[uint64]bool, count)
	for i, node := range r.nodes {
		if node.ID == "" {
			return invariant("node %d has an empty id", i)
		}
		if i > 0 && strings.Compare(r.nodes[i-1].ID, node.ID) >= 0 {
			return invariant("nodes %q and %q are not in strictly increasing id order", r.nodes[i-1].ID, node.ID)
		}
		if node.Weight == 0 {
			return invariant("node %q has weight 0", node.ID)
		}
		var carry uint64
		total, carry = bits.Add64(total, node.Weight, 0)
		if carry != 0 {
			return invariant("total weight overflows")
		}
		if r.keys[i] != nodeKey(node.ID) {
			return invariant("node %q has key %#x, want %#x", node.ID, r.keys[i], nodeKey(node.ID))
		}
		if seen[r.keys[i]] {
			return invariant("node %q shares its key with another node", node.ID)
		}
		seen[r.keys[i]] = true
		zoned = zoned || node.Zone != ""
	}
	if total != r.totalWeight {
		return invariant("total weight %d, nodes sum to %d", r.totalWeight, total)
	}
	if zoned != r.zoned {
		return invariant("zoned is %t but nodes say %t", r.zoned, zoned)
	}
	if err := r.checkDomains(); err != nil {
		return err
	}
	return r.checkWeights()
}

func invariant(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvariant, fmt.Sprintf(format, args...))
}

// checkDomains verifies domainOf, domainWeights and domainSizes: one domain per node
// without zones, one per distinct zone (in zone order) with zones.
func (r *Ring) checkDomains() error {
	domains := len(r.domainWeights)
	if !r.zoned {
		if domains != len(r.nodes) {
			return invariant("%d domains for %d nodes without zones", domains, len(r.nodes))
		}
		for i := range r.nodes {
			if r.domainOf[i] != int32(i) {
				return invariant("node %d is in domain %d without zones", i, r.domainOf[i])
			}
		}
	}
	if len(r.domainSizes) != domains {
		return invariant("%d domain sizes for %d domains", len(r.domainSizes), domains)
	}
	zoneOf := make([]string, domains)
	sums := make([]uint64, domains)
	sizes := make([]int32, domains)
	used := make([]bool, domains)
	for i, node := range r.nodes {
		domain := int(r.domainOf[i])
		if domain < 0 || domain >= domains {
			return invariant("node %q in domain %d of %d", node.ID, domain, domains)
		}
		if used[domain] && zoneOf[domain] != node.Zone {
			return invariant("zones %q and %q share domain %d", zoneOf[domain], node.Zone, domain)
		}
		zoneOf[domain], used[domain] = node.Zone, true
		sums[domain] += node.Weight
		sizes[domain]++
	}
	for domain := range domains {
		if !used[domain] {
			return invariant("domain %d has no node", domain)
		}
		if sums[domain] != r.domainWeights[domain] {
			return invariant("domain %d weight %d, nodes sum to %d", domain, r.domainWeights[domain], sums[domain])
		}
		if sizes[domain] != r.domainSizes[domain] {
			return invariant("domain %d has %d nodes, recorded as %d", domain, sizes[domain], r.domainSizes[domain])
		}
		if r.zoned && domain > 0 && zoneOf[domain-1] >= zoneOf[domain] {
			return invariant("zones %q and %q out of order", zoneOf[domain-1], zoneOf[domain])
		}
	}
	return nil
}

// checkWeights verifies the effective weight tables: one per copy count up
// to the limit, positive, scaled so the largest is in [2⁶², 2⁶³) and in
// the same order as capacities inside each domain (a domain's rate is
// shared by its nodes).
func (r *Ring) checkWeights() error {
	if want := min(len(r.domainWeights), correctedCopiesLimit); len(r.weightsByCopies) != want {
		return invariant("%d weight tables, want %d", len(r.weightsByCopies), want)
	}
	for index, table := range r.weightsByCopies {
		copies := index + 1
		if len(table) != len(r.nodes) {
			return invariant("weight table for %d copies has %d entries for %d nodes", copies, len(table), len(r.nodes))
		}
		var largest uint64
		for i, weight := range table {
			if weight == 0 || weight >= 1<<63 {
				return invariant("node %q has effective weight %#x for %d copies", r.nodes[i].ID, weight, copies)
			}
			largest = max(largest, weight)
		}
		if largest < 1<<62 {
			return invariant("largest effective weight %#x for %d copies is not normalized", largest, copies)
		}
		// Within a domain, compare each node with the heaviest one before
		// it in id order: enough to catch a table out of order.
		heaviest := make(map[int32]int)
		for i := range r.nodes {
			domain := r.domainOf[i]
			j, found := heaviest[domain]
			if !found {
				heaviest[domain] = i
				continue
			}
			wi, wj := r.nodes[i].Weight, r.nodes[j].Weight
			vi, vj := table[i], table[j]
			if (wi == wj && vi != vj) || (wi < wj && vi > vj) || (wi > wj && vi < vj) {
				return invariant("nodes %q and %q: weights %d and %d but effective weights %d and %d for %d copies",
					r.nodes[i].ID, r.nodes[j].ID, wi, wj, vi, vj, copies)
			}
			if wi > wj {
				heaviest[domain] = i
			}
		}
	}
	return nil
}
