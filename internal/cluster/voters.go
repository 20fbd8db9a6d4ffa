package cluster

// The raft voter set: 1 voter alone, 3 from 3 alive nodes, 5 from 5,
// spread over zones, dead voters removed and replaced.
//
// hashicorp/raft counts a configuration change as committed by a majority
// of the configuration it makes (the new one), and the leader steps down
// when it reaches no majority of it. So a change after which the voters
// the leader reaches are not a majority is never made: raft could not
// commit it, and no server left in the configuration could be elected
// until an unreachable voter came back. The leader knows whom it reaches
// from its raft transport (contact.go), the same measure as its lease;
// gossip and the log say who is alive but lag a failure by seconds, and
// gossip can report a live node dead (a node cut off declares the others
// dead and spreads it when the cut heals).
//
// A clean stop is a departure, not a failure. The target counts the
// healthy nodes (alive in the log, in gossip, not stopping), so a node
// going lowers it (3 nodes -> 2: 1 voter) while that node's raft still
// answers: demoting a healthy voter then passes the majority check, and a
// moment later the departing node stops and the voters left, the leader
// and the departed node, are no majority (the cluster lost its quorum on
// every clean stop of one node of three). The rule: a healthy voter is
// demoted only while every voter of the configuration is healthy and
// reached. A voter that is not goes first: demoted if it announced it is
// stopping (Depart) and a healthy voter stays, demoted if the leader does
// not reach it, removed once the log records it dead; until then the
// others stay voters. Leaving a
// departing voter in changes no majority of the living (3 voters, one
// gone: 2 of 3), whereas shrinking the set around it does. The departing
// node itself, announcing its stop, no longer counts as healthy: if the
// target needs a voter in its place a reachable non-voter is promoted
// first (two nodes, the only voter stopping: the other becomes a voter so
// that leadership can be handed to it), then it is demoted, and only then
// does it leave gossip and stop raft (Close).

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/hashicorp/raft"
)

// targetVoters is the voter count for n healthy nodes: odd, at most 5.
func targetVoters(n int) int {
	switch {
	case n >= 5:
		return 5
	case n >= 3:
		return 3
	default:
		return 1
	}
}

type changeKind int

const (
	changeRemove      changeKind = iota // RemoveServer
	changeAddNonvoter                   // AddNonvoter: a new server, or a non-voter's new address
	changeAddVoter                      // AddVoter: promote a non-voter, or a voter's new address
	changeDemote                        // DemoteVoter
)

func (k changeKind) String() string {
	return [...]string{"remove", "add non-voter", "add voter", "demote"}[k]
}

// voterChange is one raft configuration change.
type voterChange struct {
	kind    changeKind
	id      string
	address raft.ServerAddress
	why     string // for the log
}

func (ch voterChange) String() string { return ch.kind.String() + " " + ch.id }

// voterPlan is what the leader knows when it manages the voter set.
type voterPlan struct {
	self      string
	servers   []raft.Server   // the raft configuration
	nodes     map[string]Node // the log's node table
	members   map[string]Node // gossip's live members
	stopping  map[string]bool // members that announced they are stopping (gossip.go)
	reachable func(id string) bool
}

// next returns the next configuration change to make (nil: none), and
// the changes held back because the voters the leader reaches would not
// be a majority of the configuration after them.
func (p voterPlan) next() (*voterChange, []string) {
	var held []string
	try := func(ch voterChange) *voterChange {
		if p.keepsMajority(ch) {
			return &ch
		}
		held = append(held, ch.String())
		return nil
	}
	inConfig := map[string]raft.Server{}
	for _, s := range p.servers {
		inConfig[string(s.ID)] = s
	}
	// Dead servers out first, so quorum math only counts the living.
	for _, s := range p.servers {
		id := string(s.ID)
		if n, ok := p.nodes[id]; ok && n.State == NodeDead && id != p.self {
			if ch := try(voterChange{kind: changeRemove, id: id}); ch != nil {
				return ch, held
			}
		}
	}
	// Healthy nodes not in the configuration join as non-voters, and
	// servers whose address changed are re-added (a non-voter changes no
	// majority; a voter's new address is the way back to it).
	healthyIDs := []string{}
	healthy := map[string]bool{}
	for id, n := range p.nodes {
		if _, inGossip := p.members[id]; inGossip && n.State == NodeAlive && (!p.stopping[id] || bugDemoteHealthyVoter) {
			healthyIDs = append(healthyIDs, id)
			healthy[id] = true
		}
	}
	sort.Strings(healthyIDs)
	for _, id := range healthyIDs {
		s, ok := inConfig[id]
		address := raft.ServerAddress(p.nodes[id].PeerAddr)
		switch {
		case !ok:
			return &voterChange{kind: changeAddNonvoter, id: id, address: address}, held
		case s.Address != address && s.Suffrage == raft.Voter:
			return &voterChange{kind: changeAddVoter, id: id, address: address}, held
		case s.Address != address:
			return &voterChange{kind: changeAddNonvoter, id: id, address: address}, held
		}
	}
	// A voter gossip still reports alive may already be unreachable
	// (killed a second ago): it counts towards the target only once the
	// leader reaches it, it is demoted before any reachable voter, and
	// only reachable non-voters are promoted.
	var voters, live, unreachable, candidates []string
	for _, id := range healthyIDs {
		switch {
		case inConfig[id].Suffrage == raft.Voter:
			voters = append(voters, id)
			if p.reachable(id) {
				live = append(live, id)
			} else if id != p.self {
				unreachable = append(unreachable, id)
			}
		case p.reachable(id):
			candidates = append(candidates, id)
		}
	}
	target := targetVoters(len(healthyIDs))
	zoneOf := func(id string) string { return p.nodes[id].Zone }
	// An unreachable voter is demoted before a non-voter is promoted in
	// its place. Promoting first grows the configuration around a dead
	// voter, and a second failure at the same moment (the non-voter was
	// killed with it, still counted reachable for a second) leaves two of
	// four voters: no majority until one returns. Demoted first, the same
	// second failure leaves two of three. Only while every other voter
	// is healthy and reached: with a voter dead in the log or departing
	// too, a promotion first is what lets that one go (the removal of a
	// dead voter held back above needs the reachable majority a
	// promotion gives).
	others := 0
	for _, s := range p.servers {
		if id := string(s.ID); s.Suffrage == raft.Voter && !slices.Contains(unreachable, id) && !(healthy[id] && p.reachable(id)) {
			others++
		}
	}
	if len(unreachable) > 0 && others == 0 && len(live) < target && len(candidates) > 0 {
		why := fmt.Sprintf("not reached by the leader; demoted before a replacement is promoted (%d reachable voters of %d wanted)", len(live), target)
		if ch := try(voterChange{kind: changeDemote, id: unreachable[0], why: why}); ch != nil {
			return ch, held
		}
	}
	if len(live) < target && len(candidates) > 0 {
		id := pickByZone(candidates, live, zoneOf, false)
		why := fmt.Sprintf("%d reachable voters of %d wanted", len(live), target)
		if ch := try(voterChange{kind: changeAddVoter, id: id, address: inConfig[id].Address, why: why}); ch != nil {
			return ch, held
		}
	}
	// A voter that announced its stop goes, whatever the target (its
	// replacement, if one was wanted, was promoted above), as long as a
	// healthy voter stays to take its role. The leader never demotes
	// itself: it hands leadership over first (Depart). When every voter
	// is stopping (the whole cluster shut down) the configuration stays
	// as it is, so that any majority of it brings the cluster back.
	settled, keepers := true, 0 // every voter healthy and reached; how many are
	for _, s := range p.servers {
		if id := string(s.ID); s.Suffrage == raft.Voter && healthy[id] && p.reachable(id) {
			keepers++
		}
	}
	for _, s := range p.servers {
		id := string(s.ID)
		if s.Suffrage != raft.Voter || (healthy[id] && p.reachable(id)) {
			continue
		}
		settled = false
		if p.stopping[id] && id != p.self && keepers > 0 && !bugDemoteHealthyVoter {
			if ch := try(voterChange{kind: changeDemote, id: id, why: "stopping"}); ch != nil {
				return ch, held
			}
		}
	}
	if len(voters) > target {
		id, why := "", fmt.Sprintf("%d voters of %d wanted", len(voters), target)
		switch {
		case len(unreachable) > 0:
			id, why = unreachable[0], why+"; not reached by the leader"
		case !settled && !bugDemoteHealthyVoter:
			// A voter is departing (gone from gossip, stopping, dead in
			// the log): the target may count it out already, its raft may
			// still answer, and it stops any moment. It goes first; no
			// healthy voter is demoted around it.
			return nil, held
		default:
			var others []string
			for _, v := range voters {
				if v != p.self {
					others = append(others, v)
				}
			}
			id = pickByZone(others, voters, zoneOf, true)
		}
		if ch := try(voterChange{kind: changeDemote, id: id, why: why}); ch != nil {
			return ch, held
		}
	}
	return nil, held
}

// keepsMajority says whether, after ch, the voters the leader reaches are
// a majority of the voters.
func (p voterPlan) keepsMajority(ch voterChange) bool {
	voters, reached := 0, 0
	count := func(id string) {
		voters++
		if p.reachable(id) {
			reached++
		}
	}
	for _, s := range p.servers {
		id := string(s.ID)
		switch {
		case id == ch.id && ch.kind == changeAddVoter:
			count(id)
		case id == ch.id:
			// removed, demoted, or a non-voter still
		case s.Suffrage == raft.Voter:
			count(id)
		}
	}
	return 2*reached > voters
}

// reconcileVoters makes the raft configuration changes the plan asks
// for, up to three, one after another (raft applies them one at a time;
// the next tick continues). Two in a row matter: an unreachable voter
// demoted to make room for its replacement, and a voter set growing
// from one to three. Between the two changes the configuration has one
// voter fewer than wanted (two), every one of which must stay up; a
// tick (300 ms) of that is how a voter killed in the window left two
// voters and no majority until it returned (the zone test in CI; the
// simulator's raft mode while the set grows), where a commit's round
// trip leaves almost none.
func (c *Cluster) reconcileVoters(members map[string]Node) error {
	for range 3 {
		ch, err := c.reconcileVoter(members)
		if err != nil || ch == nil {
			return err
		}
	}
	return nil
}

// reconcileVoter makes the next raft configuration change, if any, and
// returns it.
func (c *Cluster) reconcileVoter(members map[string]Node) (*voterChange, error) {
	future := c.raft.GetConfiguration()
	if err := future.Error(); err != nil {
		return nil, err
	}
	stopping := c.gossipStopping()
	if c.stopping.Load() {
		stopping[c.cfg.NodeID] = true
	}
	p := voterPlan{self: c.cfg.NodeID, servers: future.Configuration().Servers, members: members, stopping: stopping, reachable: c.reachable}
	c.fsm.View(func(s *State) {
		p.nodes = make(map[string]Node, len(s.Nodes))
		for id, n := range s.Nodes {
			p.nodes[id] = *n
		}
	})
	ch, held := p.next()
	c.noteHeld(held)
	if ch == nil {
		return nil, nil
	}
	id := raft.ServerID(ch.id)
	var f raft.IndexFuture
	switch ch.kind {
	case changeRemove:
		c.logger.Info("removing dead node from raft", "node", ch.id, "suffrage", suffrageOf(p.servers, ch.id))
		f = c.raft.RemoveServer(id, 0, applyTimeout)
	case changeAddNonvoter:
		f = c.raft.AddNonvoter(id, ch.address, 0, applyTimeout)
	case changeAddVoter:
		if suffrageOf(p.servers, ch.id) != raft.Voter.String() {
			c.logger.Info("promoting node to voter", "node", ch.id, "why", ch.why)
		}
		f = c.raft.AddVoter(id, ch.address, 0, applyTimeout)
	default:
		c.logger.Info("demoting voter", "node", ch.id, "why", ch.why)
		f = c.raft.DemoteVoter(id, 0, applyTimeout)
	}
	return ch, f.Error()
}

func suffrageOf(servers []raft.Server, id string) string {
	for _, s := range servers {
		if string(s.ID) == id {
			return s.Suffrage.String()
		}
	}
	return "none"
}

// noteHeld logs the voter changes held back, once each time they change.
func (c *Cluster) noteHeld(held []string) {
	what := strings.Join(held, ", ")
	c.mu.Lock()
	changed := what != c.held
	c.held = what
	c.mu.Unlock()
	if changed && what != "" {
		c.logger.Warn("cluster: holding back raft configuration changes: the voters this leader reaches would not be a majority after them", "changes", what)
	} else if changed {
		c.logger.Info("cluster: no raft configuration change held back any more")
	}
}

// pickByZone chooses from candidates the node whose zone has the fewest
// (or, with most, the most) members among voters; ties go to the smallest
// id so every leader decides alike.
func pickByZone(candidates, voters []string, zoneOf func(string) string, most bool) string {
	count := map[string]int{}
	for _, v := range voters {
		count[zoneOf(v)]++
	}
	best := ""
	for _, id := range candidates {
		if best == "" {
			best = id
			continue
		}
		a, b := count[zoneOf(id)], count[zoneOf(best)]
		if (!most && a < b) || (most && a > b) || (a == b && id < best) {
			best = id
		}
	}
	return best
}
