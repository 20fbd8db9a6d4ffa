package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/herd-storage/herd/internal/cluster/statemachine"
	"github.com/herd-storage/herd/internal/logging"
)

// The node ids of the robustness run that lost its raft quorum (seed
// 1795530086916370419): node 0 led, node 2 was cut off, node 4 killed.
const (
	id0 = "521948f910d8fbc9"
	id1 = "f5df78920bcab450"
	id2 = "c61f89a89eecf7d0"
	id3 = "4d77d46875c9d5e6"
	id4 = "f048a477ee793fda"
)

// raftNode is one server of an in-memory raft cluster: the real FSM, the
// contact-recording transport over raft's in-memory transport.
type raftNode struct {
	id    string
	addr  raft.ServerAddress
	inmem *raft.InmemTransport
	trans *contactTransport
	fsm   *FSM
	raft  *raft.Raft
	store *raft.InmemStore // log and stable store
}

func startRaftNodes(t *testing.T, ids ...string) []*raftNode {
	t.Helper()
	var nodes []*raftNode
	for _, id := range ids {
		addr, inmem := raft.NewInmemTransport(raft.ServerAddress(id + ":7000"))
		nodes = append(nodes, &raftNode{id: id, addr: addr, inmem: inmem, trans: newContactTransport(inmem), fsm: newFSM()})
	}
	for _, a := range nodes {
		for _, b := range nodes {
			if a != b {
				a.inmem.Connect(b.addr, b.inmem)
			}
		}
	}
	for i, n := range nodes {
		rc := raft.DefaultConfig()
		rc.LocalID = raft.ServerID(n.id)
		rc.Logger = logging.Hclog(slog.New(slog.DiscardHandler), "raft")
		rc.HeartbeatTimeout = 200 * time.Millisecond
		rc.ElectionTimeout = 200 * time.Millisecond
		rc.LeaderLeaseTimeout = 200 * time.Millisecond
		rc.CommitTimeout = 5 * time.Millisecond
		store := raft.NewInmemStore()
		n.store = store
		r, err := raft.NewRaft(rc, n.fsm, store, store, raft.NewInmemSnapshotStore(), n.trans)
		if err != nil {
			t.Fatal(err)
		}
		n.raft = r
		t.Cleanup(func() { r.Shutdown() })
		if i == 0 {
			boot := raft.Configuration{Servers: []raft.Server{{ID: rc.LocalID, Address: n.addr, Suffrage: raft.Voter}}}
			if err := r.BootstrapCluster(boot).Error(); err != nil {
				t.Fatal(err)
			}
		}
	}
	return nodes
}

// cut stops every message between n and the others (kill -9 or a
// partition, as far as raft can tell).
func cut(n *raftNode, all []*raftNode) {
	n.inmem.DisconnectAll()
	for _, o := range all {
		o.inmem.Disconnect(n.addr)
	}
}

func waitUntil(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// commit returns the commands proposed straight to c's raft, which must
// lead.
func commit(c *Cluster) *statemachine.Commands {
	return statemachine.NewCommands(raftProposer{c}, c.fsm.FSM, c.cfg.NodeID, c.cfg.Incarnation)
}

// commitErr is the error of a commit.
func commitErr(_ uint64, err error) error { return err }

// raftProposer applies an entry on its cluster's raft, without the
// forwarding and waits of Cluster.Propose.
type raftProposer struct{ c *Cluster }

func (p raftProposer) Propose(_ context.Context, data []byte) (json.RawMessage, uint64, error) {
	f := p.c.raft.Apply(data, 2*time.Second)
	if err := f.Error(); err != nil {
		return nil, 0, err
	}
	if res, ok := f.Response().(*statemachine.Result); ok && res.Err != nil {
		return nil, f.Index(), res.Err
	}
	return json.RawMessage("null"), f.Index(), nil
}

func configVoters(t *testing.T, r *raft.Raft) []string {
	t.Helper()
	future := r.GetConfiguration()
	if err := future.Error(); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, s := range future.Configuration().Servers {
		if s.Suffrage == raft.Voter {
			out = append(out, string(s.ID))
		}
	}
	slices.Sort(out)
	return out
}

// The robustness run that never recovered (seed 1795530086916370419),
// with real raft: five voters; node 2 is cut off and node 4 killed; gossip
// declares node 2 dead while it still reports node 4 alive; then node 2's
// stale "dead" message about node 1, which never failed, commits node 1's
// leave. The old voter management demoted node 3 (its id sorts first)
// instead of the unreachable node 4, then removed node 1: voters {0, 4}
// with node 4 dead, a configuration raft can never commit in, and the
// leader stepped down for good. Now the leader must still commit.
func TestVotersKeepAMajorityThroughAFalseDeath(t *testing.T) {
	ids := []string{id0, id1, id2, id3, id4}
	nodes := startRaftNodes(t, ids...)
	leader := nodes[0]
	waitUntil(t, 5*time.Second, "node 0 to lead", func() bool { return leader.raft.State() == raft.Leader })
	c := &Cluster{
		cfg: Config{NodeID: id0}, logger: slog.New(slog.DiscardHandler), fsm: leader.fsm, applied: statemachine.NewReads(leader.fsm.FSM),
		raft: leader.raft, contact: leader.trans, vetoed: map[string]time.Time{},
	}
	members := map[string]Node{}
	for _, n := range nodes {
		node := Node{ID: n.id, Address: n.id, PeerAddr: string(n.addr), Incarnation: "1"}
		if err := commitErr(commit(c).NodeJoin(context.Background(), node)); err != nil {
			t.Fatal(err)
		}
		members[n.id] = node
	}
	// reconcile runs the leader's voter management until it has nothing
	// left to do (each call makes one change and waits for its commit).
	reconcile := func(what string) {
		t.Helper()
		last := ""
		for range 50 {
			if err := c.reconcileVoters(members); err != nil {
				t.Logf("%s: reconcileVoters: %v", what, err)
			}
			future := leader.raft.GetConfiguration()
			if err := future.Error(); err != nil {
				t.Fatal(err)
			}
			config := fmt.Sprint(future.Configuration().Servers)
			if config == last {
				return
			}
			last = config
		}
		t.Fatalf("%s: the voter management never settled", what)
	}
	waitUntil(t, 10*time.Second, "five voters", func() bool {
		reconcile("start")
		return len(configVoters(t, leader.raft)) == 5
	})

	// Node 2 cut off, node 4 killed: the leader stops reaching both.
	cut(nodes[2], nodes)
	cut(nodes[4], nodes)
	waitUntil(t, 5*time.Second, "the leader to lose contact with nodes 2 and 4", func() bool {
		return !c.reachable(id2) && !c.reachable(id4)
	})
	if err := commitErr(commit(c).NodeLeave(context.Background(), id2, "failure detected by gossip")); err != nil {
		t.Fatal(err)
	}
	delete(members, id2) // node 4 is still in gossip: it has not noticed yet
	reconcile("node 2 left")
	t.Logf("voters after node 2 left: %v", configVoters(t, leader.raft))

	// Node 1's false death (its raft never stopped answering).
	if err := commitErr(commit(c).NodeLeave(context.Background(), id1, "failure detected by gossip")); err != nil {
		t.Fatal(err)
	}
	delete(members, id1)
	reconcile("node 1 left")
	voters := configVoters(t, leader.raft)
	t.Logf("voters after node 1 left: %v", voters)

	// Node 1 refutes and is back in gossip: the leader commits its join.
	members[id1] = Node{ID: id1, Address: id1, PeerAddr: string(nodes[1].addr), Incarnation: "1"}
	err := commitErr(commit(c).NodeJoin(context.Background(), members[id1]))
	if errors.Is(err, raft.ErrLeadershipLost) || errors.Is(err, raft.ErrNotLeader) {
		t.Fatalf("the leader cannot commit any more (%v): voters %v, and it reaches only %v", err, voters, reachedOf(c, ids))
	}
	if err != nil {
		t.Fatal(err)
	}
	reconcile("node 1 back")
	if got := configVoters(t, leader.raft); !slices.Contains(got, id1) || slices.Contains(got, id4) {
		t.Errorf("voters %v once node 1 is back: want node 1 in and node 4 (killed) out", got)
	}
}

// A paused voter is replaced within one reconcileVoters call: demoted,
// and its replacement promoted at once. A tick between the two left the
// configuration at two voters, and the e2e zone test killed one of them
// in that tick: the other could never win an election again.
func TestUnreachableVoterReplacedInOneStep(t *testing.T) {
	ids := []string{id0, id1, id2, id3}
	nodes := startRaftNodes(t, ids...)
	leader := nodes[0]
	waitUntil(t, 5*time.Second, "node 0 to lead", func() bool { return leader.raft.State() == raft.Leader })
	c := &Cluster{
		cfg: Config{NodeID: id0}, logger: slog.New(slog.DiscardHandler), fsm: leader.fsm, applied: statemachine.NewReads(leader.fsm.FSM),
		raft: leader.raft, contact: leader.trans, vetoed: map[string]time.Time{},
	}
	members := map[string]Node{}
	for _, n := range nodes {
		node := Node{ID: n.id, Address: n.id, PeerAddr: string(n.addr), Incarnation: "1"}
		if err := commitErr(commit(c).NodeJoin(context.Background(), node)); err != nil {
			t.Fatal(err)
		}
		members[n.id] = node
	}
	waitUntil(t, 10*time.Second, "three voters", func() bool {
		if err := c.reconcileVoters(members); err != nil {
			t.Logf("reconcileVoters: %v", err)
		}
		return len(configVoters(t, leader.raft)) == 3
	})
	voters := configVoters(t, leader.raft)
	paused := ""
	for _, v := range voters {
		if v != id0 {
			paused = v
		}
	}
	for i, n := range nodes {
		if n.id == paused {
			cut(nodes[i], nodes)
		}
	}
	waitUntil(t, 5*time.Second, "the leader to lose contact with "+paused, func() bool { return !c.reachable(paused) })
	if err := c.reconcileVoters(members); err != nil {
		t.Fatal(err)
	}
	got := configVoters(t, leader.raft)
	if len(got) != 3 || slices.Contains(got, paused) {
		t.Fatalf("voters %v after one reconcileVoters call with %s paused (voters were %v): want it replaced, three voters all reached", got, paused, voters)
	}
}

func reachedOf(c *Cluster, ids []string) []string {
	var out []string
	for _, id := range ids {
		if c.reachable(id) {
			out = append(out, id)
		}
	}
	return out
}

// gossipNode is a Cluster over one in-memory raft server, with real
// gossip (memberlist on the loopback) and the real reconcile loop: all
// of a node but its peer port, so that Close runs as in herd.
func startGossipNodes(t *testing.T, ids ...string) ([]*raftNode, []*Cluster) {
	t.Helper()
	nodes := startRaftNodes(t, ids...)
	key := make([]byte, 32)
	for i := range key {
		key[i] = byte(i)
	}
	var logs syncLog
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the nodes' logs:\n%s", logs.String())
		}
	})
	var clusters []*Cluster
	for i, n := range nodes {
		c := &Cluster{
			cfg: Config{
				NodeID: n.id, Incarnation: "1", BindIP: "127.0.0.1", PeerAddr: string(n.addr), GossipKey: key,
				AdminAddr: "127.0.0.1:1", NBDAddr: "127.0.0.1:2",
			},
			logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo})).With("node", i),
			fsm:    n.fsm, applied: statemachine.NewReads(n.fsm.FSM), raft: n.raft, contact: n.trans, started: time.Now(),
			nudge: make(chan struct{}, 1), halted: make(chan error, 1), stop: make(chan struct{}),
			seen: map[string]gossipState{}, addresses: map[string]gossipAddress{}, refused: map[string]bool{}, vetoed: map[string]time.Time{},
		}
		n.fsm.OnNodeChange = c.poke
		if err := c.startGossip(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if i > 0 {
			if _, err := c.gossip.Join([]string{clusters[0].gossip.LocalNode().Address()}); err != nil {
				t.Fatal(err)
			}
		}
		c.wg.Add(1)
		go c.reconcileLoop()
		clusters = append(clusters, c)
	}
	return nodes, clusters
}

// syncLog collects the nodes' logs, printed if the test fails.
type syncLog struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *syncLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *syncLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// leaderOf returns the index among nodes of the one that leads, or -1.
func leaderOf(nodes []*raftNode, among []int) int {
	for _, i := range among {
		if nodes[i].raft.State() == raft.Leader {
			return i
		}
	}
	return -1
}

// A clean stop (Close) of one node of three, a follower and then the
// leader: the other two keep a leader that commits, and the stopped node
// is out of the voters. Before, Close left gossip while its raft still
// answered, the leader saw two healthy nodes, wanted one voter and
// demoted the other healthy one: voters {leader, stopping node}, and the
// stop took the quorum away (0 of 3 operations worked 15 s later).
func TestCleanStopKeepsTheQuorum(t *testing.T) {
	for _, victim := range []string{"a follower", "the leader"} {
		t.Run(victim, func(t *testing.T) {
			nodes, clusters := startGossipNodes(t, id0, id1, id2)
			waitUntil(t, 20*time.Second, "three voters", func() bool {
				l := leaderOf(nodes, []int{0, 1, 2})
				return l >= 0 && len(configVoters(t, nodes[l].raft)) == 3
			})
			leader := leaderOf(nodes, []int{0, 1, 2})
			stopped := (leader + 1) % 3
			if victim == "the leader" {
				stopped = leader
			}
			rest := []int{0, 1, 2}
			rest = slices.Delete(rest, stopped, stopped+1)
			began := time.Now()
			clusters[stopped].Close()
			closed := time.Since(began)
			cut(nodes[stopped], nodes) // the process exited
			t.Logf("Close of %s took %v", victim, closed.Round(time.Millisecond))
			if closed > departTimeout+3*time.Second {
				t.Errorf("Close took %v", closed)
			}
			// Every check below must pass from now on: the quorum must not
			// be lost even for a moment, so no wait for a new election.
			deadline := time.Now().Add(10 * time.Second)
			var l int
			waitUntil(t, time.Until(deadline), "a leader among the other two", func() bool {
				l = leaderOf(nodes, rest)
				return l >= 0
			})
			if err := nodes[l].raft.Barrier(2 * time.Second).Error(); err != nil {
				t.Fatalf("node %d, leader after the stop, cannot commit: %v (voters %v)", l, err, configVoters(t, nodes[l].raft))
			}
			stoppedID := nodes[stopped].id
			waitUntil(t, time.Until(deadline), "the stopped node's leave and voter role to go", func() bool {
				l = leaderOf(nodes, rest)
				if l < 0 {
					return false
				}
				var alive bool
				clusters[l].fsm.View(func(s *State) { alive = s.Nodes[stoppedID].State == NodeAlive })
				return !alive && !slices.Contains(configVoters(t, nodes[l].raft), stoppedID)
			})
			if err := nodes[l].raft.Barrier(2 * time.Second).Error(); err != nil {
				t.Fatalf("node %d cannot commit once the stopped node left: %v (voters %v)", l, err, configVoters(t, nodes[l].raft))
			}
			t.Logf("voters after the stop: %v; the leader commits", configVoters(t, nodes[l].raft))
		})
	}
}

// The only voter of two nodes stopping: it has the other promoted, hands
// it leadership, and is demoted; the other leads alone and commits.
func TestCleanStopOfTheOnlyVoter(t *testing.T) {
	nodes, clusters := startGossipNodes(t, id0, id1)
	waitUntil(t, 20*time.Second, "node 1 to join as a non-voter", func() bool {
		future := nodes[0].raft.GetConfiguration()
		return future.Error() == nil && len(future.Configuration().Servers) == 2
	})
	if got := configVoters(t, nodes[0].raft); !slices.Equal(got, []string{id0}) {
		t.Fatalf("voters %v, want node 0 alone", got)
	}
	began := time.Now()
	clusters[0].Close()
	t.Logf("Close took %v", time.Since(began).Round(time.Millisecond))
	cut(nodes[0], nodes)
	if nodes[1].raft.State() != raft.Leader {
		t.Fatalf("node 1 is %v once node 0 stopped, want leader (voters %v)", nodes[1].raft.State(), configVoters(t, nodes[1].raft))
	}
	if err := nodes[1].raft.Barrier(2 * time.Second).Error(); err != nil {
		t.Fatalf("node 1 cannot commit: %v (voters %v)", err, configVoters(t, nodes[1].raft))
	}
}

// Every node stopping at once (the whole cluster shut down): none waits
// departTimeout for a hand-over no one can take. (Which voters remain
// depends on the order in which the nodes hear of each other's stop: a
// leader that hears of one before its own stop demotes it, as it would
// one stopped a minute earlier; a leader stopping itself demotes no one.)
func TestCleanStopOfEveryNode(t *testing.T) {
	nodes, clusters := startGossipNodes(t, id0, id1, id2)
	waitUntil(t, 20*time.Second, "three voters", func() bool {
		l := leaderOf(nodes, []int{0, 1, 2})
		return l >= 0 && len(configVoters(t, nodes[l].raft)) == 3
	})
	began := time.Now()
	departed := make([]time.Duration, len(clusters))
	var wg sync.WaitGroup
	for i, c := range clusters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.Depart() // Close's first step, timed alone
			departed[i] = time.Since(began)
			c.Close()
		}()
	}
	wg.Wait()
	took := time.Since(began)
	for i, d := range departed {
		if d >= departTimeout {
			t.Errorf("node %d departed after %v: it waited for a hand-over no one could take", i, d)
		}
	}
	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(nodes[0].id)
	configuration, err := raft.GetConfiguration(rc, newFSM(), nodes[0].store, nodes[0].store, raft.NewInmemSnapshotStore(), nodes[0].inmem)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the nodes departed after %v, Close of every node took %v; configuration left: %v", departed, took.Round(time.Millisecond), configuration.Servers)
}
