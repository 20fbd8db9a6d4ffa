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
	self      string // the leader
	servers   []raft.Server
	nodes     map[string]Node
	members   map[string]Node
	stopping  map[string]bool // announced in gossip
	reachable map[string]bool
}

func newPlanFixture(voters, nonvoters []string) *planFixture {
	f := &planFixture{self: id0, nodes: map[string]Node{}, members: map[string]Node{}, stopping: map[string]bool{}, reachable: map[string]bool{}}
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
	reachable := func(id string) bool { return id == f.self || f.reachable[id] }
	return voterPlan{self: f.self, servers: f.servers, nodes: f.nodes, members: f.members, stopping: f.stopping, reachable: reachable}.next()
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

// forget takes ids out of the fixture: a smaller cluster.
func (f *planFixture) forget(ids ...string) {
	for _, id := range ids {
		delete(f.nodes, id)
		delete(f.members, id)
		delete(f.reachable, id)
	}
}

// back records id alive in the log and in gossip, reachable, no longer
// stopping: a node restarted.
func (f *planFixture) back(id string) {
	n := f.nodes[id]
	n.State = NodeAlive
	f.nodes[id], f.members[id], f.reachable[id] = n, n, true
	delete(f.stopping, id)
}

// settleThrough is settle for a departure: before and after every change
// the voters other than the departing node that the leader reaches must
// be a majority of the voters, since the departing node may stop
// answering at any moment.
func (f *planFixture) settleThrough(t *testing.T, departing string) []string {
	t.Helper()
	check := func(after string) {
		t.Helper()
		voters, reached := f.voters(), 0
		for _, v := range voters {
			if v != departing && (v == f.self || f.reachable[v]) {
				reached++
			}
		}
		if 2*reached <= len(voters) {
			t.Fatalf("%s: voters %v; once %s has stopped %d of them answer: no majority", after, voters, departing, reached)
		}
	}
	check("before any change")
	for range 20 {
		ch, held := f.next()
		if ch == nil {
			return held
		}
		t.Logf("%v %s (held: %v)", ch, ch.why, held)
		f.apply(t, *ch)
		check("after " + ch.String())
	}
	t.Fatal("the plan never settled")
	return nil
}

// The reported failure: three voters, node 2 stops cleanly and leaves
// gossip while its raft still answers (its leave is not committed yet).
// Two healthy nodes want one voter, but demoting node 1 then leaves
// voters {0, 2}, and node 2 stops a moment later: no majority. Nothing
// may change until node 2 is gone from the log; then it is removed, and
// only then is node 1 demoted.
func TestVoterPlanKeepsHealthyVotersWhileAVoterLeaves(t *testing.T) {
	f := newPlanFixture([]string{id0, id1, id2}, nil)
	f.forget(id3, id4)
	delete(f.members, id2) // left gossip; raft still answers
	if held := f.settleThrough(t, id2); len(held) != 0 {
		t.Fatalf("held %v", held)
	}
	if got, want := f.voters(), sorted(id0, id1, id2); !slices.Equal(got, want) {
		t.Fatalf("voters %v while node 2 leaves, want %v", got, want)
	}
	f.reachable[id2] = false // its raft stopped
	f.settleThrough(t, id2)
	f.dead(id2) // its leave committed
	f.settleThrough(t, id2)
	if got, want := f.voters(), []string{id0}; !slices.Equal(got, want) {
		t.Fatalf("voters %v once node 2 left, want %v (two nodes, one voter)", got, want)
	}
	f.back(id2)
	f.settle(t)
	if got, want := f.voters(), sorted(id0, id1, id2); !slices.Equal(got, want) {
		t.Fatalf("voters %v once node 2 is back, want %v", got, want)
	}
}

// A voter that announced it is stopping is demoted at once, before it
// leaves gossip, and no healthy voter before it.
func TestVoterPlanDemotesAStoppingVoterFirst(t *testing.T) {
	f := newPlanFixture([]string{id0, id1, id2}, nil)
	f.forget(id3, id4)
	f.stopping[id2] = true
	ch, held := f.next()
	if ch == nil || ch.kind != changeDemote || ch.id != id2 || len(held) != 0 {
		t.Fatalf("node 2 stopping: change %v, held %v; want demote %s", ch, held, id2)
	}
	f.settleThrough(t, id2)
	if got := f.voters(); slices.Contains(got, id2) || len(got) != 1 {
		t.Fatalf("voters %v after node 2 announced its stop, want one voter, not node 2", got)
	}
	// It stops, leaves the log, and comes back a voter.
	f.reachable[id2] = false
	delete(f.members, id2)
	f.settleThrough(t, id2)
	f.dead(id2)
	f.settleThrough(t, id2)
	f.back(id2)
	f.settle(t)
	if got, want := f.voters(), sorted(id0, id1, id2); !slices.Equal(got, want) {
		t.Fatalf("voters %v once node 2 is back, want %v", got, want)
	}
}

// A stopping voter whose raft already stopped answering is demoted all
// the same (gossip still lists it with its announcement).
func TestVoterPlanDemotesAStoppedVoter(t *testing.T) {
	f := newPlanFixture([]string{id0, id1, id2}, nil)
	f.forget(id3, id4)
	f.stopping[id2] = true
	f.reachable[id2] = false
	f.settleThrough(t, id2)
	if got := f.voters(); slices.Contains(got, id2) || len(got) != 1 {
		t.Fatalf("voters %v, want one voter, not node 2", got)
	}
}

// The leader itself stopping: it demotes no one (it hands leadership
// over first, Close), and its successor demotes it.
func TestVoterPlanCleanStopOfTheLeader(t *testing.T) {
	f := newPlanFixture([]string{id0, id1, id2}, nil)
	f.forget(id3, id4)
	f.stopping[id0] = true
	if ch, held := f.next(); ch != nil || len(held) != 0 {
		t.Fatalf("the leader stopping: change %v, held %v; want none", ch, held)
	}
	f.self = id1 // leadership handed over
	ch, _ := f.next()
	if ch == nil || ch.kind != changeDemote || ch.id != id0 {
		t.Fatalf("the new leader: change %v, want demote %s", ch, id0)
	}
	f.settleThrough(t, id0)
	if got, want := f.voters(), []string{id1}; !slices.Equal(got, want) {
		t.Fatalf("voters %v, want %v", got, want)
	}
}

// The only voter (two nodes) stopping: it promotes the other first, so
// that it has someone to hand leadership to.
func TestVoterPlanCleanStopOfTheOnlyVoter(t *testing.T) {
	f := newPlanFixture([]string{id0}, []string{id1})
	f.forget(id2, id3, id4)
	f.stopping[id0] = true
	ch, _ := f.next()
	if ch == nil || ch.kind != changeAddVoter || ch.id != id1 {
		t.Fatalf("the only voter stopping: change %v, want add voter %s", ch, id1)
	}
	f.apply(t, *ch)
	if ch, held := f.next(); ch != nil {
		t.Fatalf("change %v (held %v) before leadership is handed over, want none", ch, held)
	}
	// Node 0 leads {0, 1} and waits, in Close, to be demoted before it
	// stops: {0, 1} with node 0 gone would be no majority.
	f.self = id1
	ch, _ = f.next()
	if ch == nil || ch.kind != changeDemote || ch.id != id0 {
		t.Fatalf("the new leader: change %v, want demote %s", ch, id0)
	}
	f.apply(t, *ch)
	f.settleThrough(t, id0)
	if got, want := f.voters(), []string{id1}; !slices.Equal(got, want) {
		t.Fatalf("voters %v, want %v", got, want)
	}
}

// A stopping voter's replacement is promoted before it is demoted.
func TestVoterPlanReplacesAStoppingVoter(t *testing.T) {
	f := newPlanFixture([]string{id0, id1, id2}, []string{id3})
	f.forget(id4)
	f.stopping[id2] = true
	ch, _ := f.next()
	if ch == nil || ch.kind != changeAddVoter || ch.id != id3 {
		t.Fatalf("change %v, want add voter %s", ch, id3)
	}
	f.settleThrough(t, id2)
	if got, want := f.voters(), sorted(id0, id1, id3); !slices.Equal(got, want) {
		t.Fatalf("voters %v, want %v", got, want)
	}
}

// One of five voters stopping: it is the one demoted, then the four
// healthy voters come down to three.
func TestVoterPlanCleanStopOfOneOfFive(t *testing.T) {
	f := newPlanFixture([]string{id0, id1, id2, id3, id4}, nil)
	f.stopping[id3] = true
	ch, _ := f.next()
	if ch == nil || ch.kind != changeDemote || ch.id != id3 {
		t.Fatalf("change %v, want demote %s", ch, id3)
	}
	f.settleThrough(t, id3)
	if got := f.voters(); len(got) != 3 || slices.Contains(got, id3) {
		t.Fatalf("voters %v, want three, not node 3", got)
	}
}

// Every node stopping at once (the whole cluster shut down): no voter is
// demoted, so that any two of the three bring the cluster back. Two of
// three stopping at once: the third, healthy, is left the only voter.
func TestVoterPlanWhenEveryNodeStops(t *testing.T) {
	f := newPlanFixture([]string{id0, id1, id2}, nil)
	f.forget(id3, id4)
	f.stopping[id0], f.stopping[id1], f.stopping[id2] = true, true, true
	for _, self := range []string{id0, id1} { // before and after a hand-over
		f.self = self
		if ch, held := f.next(); ch != nil || len(held) != 0 {
			t.Fatalf("every node stopping, %s leads: change %v, held %v; want none", self, ch, held)
		}
	}

	f = newPlanFixture([]string{id0, id1, id2}, nil)
	f.forget(id3, id4)
	f.stopping[id1], f.stopping[id2] = true, true
	f.settle(t)
	if got, want := f.voters(), []string{id0}; !slices.Equal(got, want) {
		t.Fatalf("nodes 1 and 2 stopping: voters %v, want %v", got, want)
	}
}

// A voter and the non-voter that would replace it killed at the same
// moment (seen in an e2e test with four nodes): the non-voter still
// counts as reached for a second. Promoted first, it made four voters
// with two dead: no majority until one returned. The unreachable voter
// is demoted first, so the second death leaves two of three.
func TestVoterPlanDemotesTheUnreachableBeforePromoting(t *testing.T) {
	f := newPlanFixture([]string{id0, id1, id2}, []string{id3})
	f.forget(id4)
	f.reachable[id2] = false // killed; gossip has not noticed
	ch, _ := f.next()
	if ch == nil || ch.kind != changeDemote || ch.id != id2 {
		t.Fatalf("change %v; want demote %s before any promotion", ch, id2)
	}
	f.apply(t, *ch)
	ch, _ = f.next()
	if ch == nil || ch.kind != changeAddVoter || ch.id != id3 {
		t.Fatalf("change %v; want add voter %s", ch, id3)
	}
	f.apply(t, *ch)
	// id3 was killed too: the voters the leader reaches are still a
	// majority.
	f.reachable[id3] = false
	reached := 0
	for _, v := range f.voters() {
		if v == id0 || f.reachable[v] {
			reached++
		}
	}
	if voters := len(f.voters()); 2*reached <= voters {
		t.Fatalf("voters %v, %d reached: no majority", f.voters(), reached)
	}
}

func TestVoterPolicy(t *testing.T) {
	for n, want := range map[int]int{1: 1, 2: 1, 3: 3, 4: 3, 5: 5, 9: 5} {
		if got := targetVoters(n); got != want {
			t.Errorf("targetVoters(%d) = %d, want %d", n, got, want)
		}
	}
	zones := map[string]string{"a": "z1", "b": "z1", "c": "z2", "d": "z3", "e": "z2"}
	zoneOf := func(id string) string { return zones[id] }
	if got := pickByZone([]string{"b", "c", "d"}, []string{"a", "e"}, zoneOf, false); got != "d" {
		t.Errorf("promote: picked %s, want d (its zone has no voter)", got)
	}
	if got := pickByZone([]string{"a", "b", "c"}, []string{"a", "b", "c"}, zoneOf, true); got != "a" {
		t.Errorf("demote: picked %s, want a (z1 has two voters, smallest id)", got)
	}
}
