package cluster

import (
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// planFixture is a voter plan over five nodes in one zone.
type planFixture struct {
	servers   []raft.Server
	nodes     map[string]Node
	members   map[string]Node
	reachable map[string]bool
}

func newPlanFixture(voters, nonvoters []string) *planFixture {
	f := &planFixture{nodes: map[string]Node{}, members: map[string]Node{}, reachable: map[string]bool{}}
	for _, id := range []string{id0, id1, id2, id3, id4} {
		n := Node{ID: id, PeerAddr: id + ":7000", State: NodeAlive}
		f.nodes[id], f.members[id], f.reachable[id] = n, n, true
	}
	for _, id := range voters {
		f.servers = append(f.servers, raft.Server{ID: raft.ServerID(id), Address: raft.ServerAddress(id + ":7000"), Suffrage: raft.Voter})
	}
	for _, id := range nonvoters {
		f.servers = append(f.servers, raft.Server{ID: raft.ServerID(id), Address: raft.ServerAddress(id + ":7000"), Suffrage: raft.Nonvoter})
	}
	return f
}

// dead records id as left in the log and gone from gossip.
func (f *planFixture) dead(id string) {
	n := f.nodes[id]
	n.State = NodeDead
	f.nodes[id] = n
	delete(f.members, id)
}

func (f *planFixture) next() (*voterChange, []string) {
	return voterPlan{self: id0, servers: f.servers, nodes: f.nodes, members: f.members, reachable: func(id string) bool { return f.reachable[id] }}.next()
}

// apply makes ch in the fixture's configuration, as raft would.
func (f *planFixture) apply(t *testing.T, ch voterChange) {
	t.Helper()
	i := slices.IndexFunc(f.servers, func(s raft.Server) bool { return string(s.ID) == ch.id })
	switch ch.kind {
	case changeRemove:
		f.servers = slices.Delete(f.servers, i, i+1)
	case changeDemote:
		f.servers[i].Suffrage = raft.Nonvoter
	case changeAddVoter, changeAddNonvoter:
		s := raft.Server{ID: raft.ServerID(ch.id), Address: ch.address, Suffrage: raft.Nonvoter}
		if ch.kind == changeAddVoter {
			s.Suffrage = raft.Voter
		}
		if i < 0 {
			f.servers = append(f.servers, s)
		} else {
			f.servers[i] = s
		}
	}
}

func (f *planFixture) voters() []string {
	var out []string
	for _, s := range f.servers {
		if s.Suffrage == raft.Voter {
			out = append(out, string(s.ID))
		}
	}
	slices.Sort(out)
	return out
}

// settle makes every change the plan asks for and returns the last
// changes held back.
func (f *planFixture) settle(t *testing.T) []string {
	t.Helper()
	for range 20 {
		ch, held := f.next()
		if ch == nil {
			return held
		}
		t.Logf("%v (held: %v)", ch, held)
		f.apply(t, *ch)
		reached := 0
		voters := f.voters()
		for _, v := range voters {
			if f.reachable[v] {
				reached++
			}
		}
		if 2*reached <= len(voters) {
			t.Fatalf("after %v the voters %v have %d reachable: no majority", ch, voters, reached)
		}
	}
	t.Fatal("the plan never settled")
	return nil
}

func sorted(ids ...string) []string {
	slices.Sort(ids)
	return ids
}

// The robustness failure, as the leader's plan: node 2 cut off and node 4
// killed (the leader reaches neither; gossip has declared node 2 dead but
// not node 4 yet), then node 2's stale "dead" message about node 1.
func TestVoterPlanThroughAFalseDeath(t *testing.T) {
	f := newPlanFixture([]string{id0, id1, id2, id3, id4}, nil)
	f.reachable[id2], f.reachable[id4] = false, false
	f.dead(id2)
	f.settle(t)
	// Node 4 (unreachable) is demoted, not node 3, whose id sorts first.
	if got, want := f.voters(), sorted(id0, id1, id3); !slices.Equal(got, want) {
		t.Fatalf("voters %v after node 2 left, want %v", got, want)
	}
	f.dead(id1) // node 1 still answers the leader's raft
	f.settle(t)
	if got, want := f.voters(), sorted(id0, id3); !slices.Equal(got, want) {
		t.Fatalf("voters %v after node 1's false death, want %v", got, want)
	}
}

// A removal after which the reachable voters would not be a majority is
// held back; a promotion that restores the margin goes first.
func TestVoterPlanHoldsAChangeThatLosesTheMajority(t *testing.T) {
	f := newPlanFixture([]string{id0, id1, id4}, nil)
	f.reachable[id4] = false
	delete(f.members, id4) // gossip lost it, its leave is not committed yet
	f.dead(id1)
	f.dead(id2)
	f.dead(id3)
	ch, held := f.next()
	if ch != nil || !slices.Equal(held, []string{"remove " + id1}) {
		t.Fatalf("voters {0, 1, 4}, 4 unreachable, 1 dead in the log: change %v, held %v; want none, remove %s held", ch, held, id1)
	}
	// Once node 4's leave is committed it goes first, and then node 1.
	f.dead(id4)
	f.settle(t)
	if got, want := f.voters(), []string{id0}; !slices.Equal(got, want) {
		t.Fatalf("voters %v, want %v", got, want)
	}

	// With a reachable non-voter, it is promoted first, and then node 1
	// can go.
	f = newPlanFixture([]string{id0, id1, id4}, []string{id3})
	f.reachable[id4] = false
	f.dead(id1)
	f.dead(id2)
	ch, held = f.next()
	if ch == nil || ch.kind != changeAddVoter || ch.id != id3 || !slices.Equal(held, []string{"remove " + id1}) {
		t.Fatalf("change %v, held %v; want add voter %s, remove %s held", ch, held, id3, id1)
	}
	if held := f.settle(t); len(held) != 0 {
		t.Fatalf("still held: %v", held)
	}
	if got, want := f.voters(), sorted(id0, id3, id4); !slices.Equal(got, want) {
		t.Fatalf("voters %v, want %v", got, want)
	}
}

// Only a non-voter the leader reaches is promoted, whatever the zones and
// ids prefer.
func TestVoterPlanPromotesOnlyReachableNodes(t *testing.T) {
	f := newPlanFixture([]string{id0, id1, id2}, []string{id3, id4})
	f.reachable[id3] = false // its id sorts before id4's
	ch, _ := f.next()
	if ch == nil || ch.kind != changeAddVoter || ch.id != id4 {
		t.Fatalf("change %v, want add voter %s", ch, id4)
	}
	f.apply(t, *ch)
	if ch, _ := f.next(); ch != nil {
		t.Fatalf("change %v with node 3 unreachable, want none", ch)
	}
	f.reachable[id3] = true
	if ch, _ := f.next(); ch == nil || ch.kind != changeAddVoter || ch.id != id3 {
		t.Fatalf("change %v once node 3 answers, want add voter %s", ch, id3)
	}
}

// A voter gossip still reports alive but the leader no longer reaches is
// replaced at once by a reachable non-voter, then demoted.
func TestVoterPlanReplacesAnUnreachableVoter(t *testing.T) {
	f := newPlanFixture([]string{id0, id1, id4}, []string{id3})
	f.dead(id2)
	f.reachable[id4] = false
	f.settle(t)
	if got, want := f.voters(), sorted(id0, id1, id3); !slices.Equal(got, want) {
		t.Fatalf("voters %v, want %v", got, want)
	}
	// Steady state: nothing to do.
	f.reachable[id4] = true
	if ch, held := f.next(); ch != nil || len(held) != 0 {
		t.Fatalf("change %v, held %v in a steady state", ch, held)
	}
}

// Gossip's word that a node died is taken at once only when the leader's
// raft does not reach it either; otherwise after gossipDeathVeto.
func TestLeaveNeedsTheLeaderToLoseContact(t *testing.T) {
	now := time.Date(2026, 11, 24, 14, 22, 50, 0, time.UTC)
	contact := newContactTransport(nil)
	contact.now = func() time.Time { return now }
	c := &Cluster{
		cfg: Config{NodeID: id0}, logger: slog.New(slog.DiscardHandler), contact: contact, started: time.Now().Add(-time.Hour),
		seen: map[string]gossipState{
			id1: {alive: false, since: now.Add(-10 * time.Millisecond)}, // node 2's stale message, just now
			id2: {alive: false, since: now.Add(-500 * time.Millisecond)},
			id3: {alive: true, since: now.Add(-time.Minute)},
		},
		vetoed: map[string]time.Time{},
	}
	contact.last[id1] = now.Add(-200 * time.Millisecond) // answered a heartbeat just now
	contact.last[id2] = now.Add(-3 * time.Second)
	if c.leaveConfirmed(id1, now) {
		t.Error("a node gossip reports dead but the leader reached 200 ms ago: leave confirmed")
	}
	if !c.leaveConfirmed(id2, now) {
		t.Error("a node gossip reports dead and the leader last reached 3 s ago: leave not confirmed")
	}
	if c.leaveConfirmed(id3, now) {
		t.Error("a node gossip reports alive: leave confirmed")
	}
	if !c.leaveConfirmed(id4, now) {
		t.Error("a node gossip never saw after the grace period, with no raft contact: leave not confirmed")
	}
	// It stops answering: its leave is confirmed once the lease passed.
	now = now.Add(900 * time.Millisecond)
	if !c.leaveConfirmed(id1, now) {
		t.Error("node 1 unreached for 1.1 s: leave not confirmed")
	}
	// It keeps answering raft (a node stopping leaves gossip first):
	// gossip wins after gossipDeathVeto.
	contact.last[id1] = now
	if c.leaveConfirmed(id1, now) {
		t.Error("node 1 answering, dead in gossip for 0.9 s: leave confirmed")
	}
	now = now.Add(gossipDeathVeto)
	contact.last[id1] = now
	if !c.leaveConfirmed(id1, now) {
		t.Errorf("node 1 answering, dead in gossip for %v: leave not confirmed", gossipDeathVeto+900*time.Millisecond)
	}
}
