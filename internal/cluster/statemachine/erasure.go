package statemachine

// Erasure-coded VDIs: the control plane (docs/ARCHITECTURE.md, "Erasure-coded VDIs").
//
// A VDI created with a scheme K+M (`vdi create --ec K+M`, from
// LevelErasureCoding on) records it in VDI.EC; its snapshots, clones and
// rollbacks inherit it as they inherit Copies, and its garbage record
// keeps it. Its map objects and its data objects (the recent writes not
// folded into chunks yet) are replicated with Copies = M+1, so every
// layer that computes a replica set treats them as it treats any VDI's.
// Its chunks, one copy each, need K+M nodes, at most M of them in a
// zone when zones are used (losing a zone then leaves K chunks): a
// create is refused when the nodes cannot hold them, and so are a drain
// and a zone change that would leave too few for an existing
// erasure-coded VDI.

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/herd-storage/herd/internal/ec"
)

// parseScheme reads a scheme given by a client ("4+2"), as an
// ErrInvalid naming what is wrong with it.
func parseScheme(text string) (ec.Scheme, error) {
	scheme, err := ec.Parse(text)
	if err != nil {
		return ec.Scheme{}, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return scheme, nil
}

// errCopiesWithScheme refuses a create that asks for both.
func errCopiesWithScheme(scheme string, copies int) error {
	return fmt.Errorf("%w: copies %d and erasure coding %s cannot be asked for together: an erasure-coded VDI keeps M+1 copies of its map objects and recent writes by itself", ErrInvalid, copies, scheme)
}

// chunkNodes returns the alive nodes that may hold chunks of a new or an
// existing erasure-coded VDI: all but the draining ones (their data is
// moving out) and skip; and how many draining ones were left out.
func chunkNodes(s *State, skip string) (nodes []*Node, draining int) {
	for _, id := range s.AliveNodes() {
		n := s.Nodes[id]
		switch {
		case id == skip:
		case n.Draining:
			draining++
		default:
			nodes = append(nodes, n)
		}
	}
	return nodes, draining
}

// schemeShortfall says why nodes cannot hold the K+M chunks of a stripe
// of scheme, each on its own node and, when zones are used (a node has
// one), at most M in a zone; "" when they can. have introduces what the
// nodes are ("the cluster has", "the drain would leave").
func schemeShortfall(scheme ec.Scheme, nodes []*Node, have string) string {
	need := scheme.Chunks()
	if len(nodes) < need {
		return fmt.Sprintf("erasure coding %s needs %d nodes, %s %d", scheme, need, have, len(nodes))
	}
	perZone := map[string]int{}
	zoned := false
	for _, n := range nodes {
		perZone[n.Zone]++
		zoned = zoned || n.Zone != ""
	}
	if !zoned {
		return ""
	}
	room := 0
	for _, count := range perZone {
		room += min(count, scheme.M)
	}
	if room >= need {
		return ""
	}
	zones := slices.Sorted(maps.Keys(perZone))
	described := make([]string, 0, len(zones))
	for _, z := range zones {
		name := z
		if z == "" {
			name = "(no zone)"
		}
		count := perZone[z]
		described = append(described, fmt.Sprintf("%s (%s, %s)", name, plural(count, "node"), plural(min(count, scheme.M), "chunk")))
	}
	return fmt.Sprintf("erasure coding %s needs %d nodes with at most %d in a zone, %s zones that hold %d chunks: %s",
		scheme, need, scheme.M, have, room, strings.Join(described, ", "))
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

// checkSchemeCreate refuses a new VDI of scheme that the cluster cannot
// place: its chunks (schemeShortfall, over chunkNodes) or the M+1 copies
// of its map objects (checkCopiesPlaceable).
func checkSchemeCreate(s *State, scheme ec.Scheme) error {
	nodes, draining := chunkNodes(s, "")
	have := "the cluster has"
	if draining > 0 {
		have = fmt.Sprintf("besides %s draining, the cluster has", plural(draining, "node"))
	}
	if why := schemeShortfall(scheme, nodes, have); why != "" {
		return fmt.Errorf("%w: %s (start more nodes, or use a scheme of fewer chunks)", ErrTooFewNodes, why)
	}
	if err := checkCopiesPlaceable(s, scheme.M+1); err != nil {
		return fmt.Errorf("erasure coding %s keeps %d copies of its map objects and recent writes: %w", scheme, scheme.M+1, err)
	}
	return nil
}

// schemeUse is a scheme some VDI or garbage record of the state uses,
// and one of them, to name in a refusal.
type schemeUse struct {
	scheme ec.Scheme
	what   string
}

// schemesInUse returns every scheme a VDI, snapshot or garbage record
// uses, the one of the most chunks first (then by text, so that every
// node names the same one), each with the first user by id.
func (s *State) schemesInUse() []schemeUse {
	type user struct {
		id   uint32
		what string
	}
	first := map[ec.Scheme]user{}
	see := func(text string, id uint32, what func() string) {
		scheme, ok := schemeOf(text)
		if !ok {
			return
		}
		if u, seen := first[scheme]; !seen || id < u.id {
			first[scheme] = user{id, what()}
		}
	}
	for _, v := range s.VDIs {
		see(v.EC, v.ID, func() string { return fmt.Sprintf("vdi %q", v.Name) })
	}
	for _, v := range s.Snapshots {
		see(v.EC, v.ID, func() string {
			if v.Deleted {
				return fmt.Sprintf("deleted snapshot %s (vdi %d)", v.FullName(), v.ID)
			}
			return fmt.Sprintf("snapshot %s", v.FullName())
		})
	}
	for _, g := range s.Garbage {
		see(g.EC, g.ID, func() string { return fmt.Sprintf("deleted vdi %d (its objects not freed yet)", g.ID) })
	}
	out := make([]schemeUse, 0, len(first))
	for scheme, u := range first {
		out = append(out, schemeUse{scheme, u.what})
	}
	slices.SortFunc(out, func(a, b schemeUse) int {
		if c := cmp.Compare(b.scheme.Chunks(), a.scheme.Chunks()); c != 0 {
			return c
		}
		return strings.Compare(a.scheme.String(), b.scheme.String())
	})
	return out
}

// schemesShortfall says why nodes cannot hold the chunks of some
// erasure-coded VDI of the state (schemeShortfall), naming it; "" when
// they hold every one's.
func (s *State) schemesShortfall(nodes []*Node, have string) string {
	for _, u := range s.schemesInUse() {
		if why := schemeShortfall(u.scheme, nodes, have); why != "" {
			return u.what + ": " + why
		}
	}
	return ""
}
