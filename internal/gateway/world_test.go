package gateway

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/cluster/statemachine"
	"github.com/herd-storage/herd/internal/layout"
)

// world is the gateway tests' cluster on the real cluster log:
// cluster.Local, the simulator's in-process log, applies every entry
// with the production state machine (internal/cluster/statemachine), and
// each node's gateway runs on its node's cluster.LocalMember, as in
// internal/sim. The replicas are memoryReplicas.
type world struct {
	cluster  *logCluster
	replicas *memoryReplicas
}

// fakeWorld and fakeCluster are the names the tests and memoryReplicas
// knew the in-memory fake by, which this world replaces.
type (
	fakeWorld   = world
	fakeCluster = logCluster
)

// logCluster is the cluster's log as the leader and the operator see it:
// its reads (the embedded Local's) are the committed state. The helpers
// commit what the leader (a node joining or leaving) or an operator
// (herd vdi create, set, clone, unlock --force, herd node set) would, and
// then wait until every member applied it, so that a gateway sees it at
// once as it saw the fake's.
type logCluster struct {
	*cluster.Local
	t testing.TB
	// self is memoryReplicas's: the node whose flushes it leaves to
	// Flush (the first gateway's, node00).
	self string
	// ops are the operator's commands, proposed to the leader. Their FSM
	// is never read: of the commands, only CreateVDI and the CA
	// rotation's read the proposer's applied state, and VDIs are created
	// through Local.
	ops *statemachine.Commands

	mu      sync.Mutex
	members map[string]*cluster.LocalMember
	bumps   int
}

func newWorld(t *testing.T, nodes int, copies int) *world {
	return newWorldWith(t, nodes, copies, 1<<20)
}

// newWorldWith is newWorld formatted with objects of objectSize: the
// nodes join, named node00, node01, ..., each with its member of the log
// (connected: it applies every entry and may commit), and the cluster is
// formatted.
func newWorldWith(t testing.TB, nodes, copies int, objectSize uint64) *world {
	t.Helper()
	log := cluster.NewLocal()
	t.Cleanup(log.Close)
	c := &logCluster{Local: log, t: t, self: "node00", ops: statemachine.NewCommands(log, statemachine.New(), "", ""), members: map[string]*cluster.LocalMember{}}
	for i := range nodes {
		c.join(fmt.Sprintf("node%02d", i), 1<<40)
	}
	if _, err := log.Format(copies, objectSize); err != nil {
		t.Fatalf("format: %v", err)
	}
	c.sync()
	return &world{cluster: c, replicas: newMemoryReplicas(c)}
}

func (w *world) gateway(self string) *Gateway {
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	return w.gatewayWith(self, logger, Options{})
}

// gatewayWith is node self's gateway, on its member of the log.
func (w *world) gatewayWith(self string, logger *slog.Logger, options Options) *Gateway {
	m := w.cluster.member(self)
	return New(m, layout.NewHistory(m, logger), w.replicas, logger, options)
}

// member is node id's process's member of the log, started (connected)
// on first use.
func (c *logCluster) member(id string) *cluster.LocalMember {
	c.mu.Lock()
	defer c.mu.Unlock()
	m, ok := c.members[id]
	if !ok {
		m = c.Local.Member(id, id+".1", 0)
		m.SetConnected(true)
		c.members[id] = m
	}
	return m
}

// nodeIDs are the nodes the log knows, alive or not, sorted.
func (c *logCluster) nodeIDs() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var ids []string
	for id := range c.members {
		if _, ok := c.Node(id); ok {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}

// join commits node id as alive, as the leader does when gossip sees
// its process.
func (c *logCluster) join(id string, capacity uint64) {
	c.t.Helper()
	m := c.member(id)
	if _, err := c.NodeJoin(cluster.Node{ID: id, Address: id, PeerAddr: id, Capacity: capacity, Incarnation: m.Incarnation()}); err != nil {
		c.t.Fatalf("node %s joining: %v", id, err)
	}
}

// leave commits node id as gone, as the leader does when gossip declares
// it dead. The leader first waits until any lease it granted the node
// has run out (2.5 s after its last renewal or the log's creation: the
// members renew theirs all along).
func (c *logCluster) leave(id string) {
	c.t.Helper()
	if _, err := c.NodeLeave(id, "the test"); err != nil {
		c.t.Fatalf("node %s leaving: %v", id, err)
	}
}

// sync waits until every member applied the whole log.
func (c *logCluster) sync() {
	c.t.Helper()
	c.mu.Lock()
	members := make([]*cluster.LocalMember, 0, len(c.members))
	for _, m := range c.members {
		members = append(members, m)
	}
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, m := range members {
		if err := m.Sync(ctx); err != nil {
			c.t.Fatalf("member %s applying the log: %v", m.ID(), err)
		}
	}
}

// setNodes makes these nodes the alive ones: the others leave, the new
// ones join, each change an epoch. With the nodes alive already it
// begins one new epoch of the same nodes: the log does that only when a
// lock is broken, so it breaks one that no VDI depends on.
func (c *logCluster) setNodes(ids ...string) {
	c.t.Helper()
	var alive []string
	for _, n := range c.View().Nodes {
		alive = append(alive, n.ID)
	}
	slices.Sort(ids)
	if slices.Equal(alive, ids) {
		c.newEpoch()
		return
	}
	for _, id := range ids {
		if !slices.Contains(alive, id) {
			c.join(id, 1<<40)
		}
	}
	for _, id := range alive {
		if !slices.Contains(ids, id) {
			c.leave(id)
		}
	}
	c.sync()
}

// newEpoch begins an epoch of the same nodes: the first alive node takes
// a lock of its own, and the operator breaks it (`herd vdi unlock --force` on any lock).
func (c *logCluster) newEpoch() {
	c.t.Helper()
	c.mu.Lock()
	c.bumps++
	key := fmt.Sprintf("test/epoch-%d", c.bumps)
	c.mu.Unlock()
	ctx := context.Background()
	if _, err := c.member(c.View().Nodes[0].ID).AcquireLock(ctx, key, "bump"); err != nil {
		c.t.Fatalf("taking %s: %v", key, err)
	}
	if _, err := c.ops.BreakLock(ctx, key, "the test"); err != nil {
		c.t.Fatalf("breaking %s: %v", key, err)
	}
	c.sync()
}

// dropLock takes key away as its holder's leaving does: the node leaves
// and comes back (the same process: it was only missed for a while), so
// the VDI is unclean and two epochs begin, but nothing is recorded as
// broken.
func (c *logCluster) dropLock(key string) {
	c.t.Helper()
	l, held := c.Lock(key)
	if !held {
		c.t.Fatalf("dropping %s: not held", key)
	}
	c.leave(l.Node)
	c.join(l.Node, 1<<40)
	c.sync()
}

// breakLock takes key away from its holder, as `herd vdi unlock --force`
// does: the lock goes, the VDI is unclean, and a new epoch begins.
func (c *logCluster) breakLock(key string) {
	c.t.Helper()
	if _, err := c.ops.BreakLock(context.Background(), key, "the test"); err != nil {
		c.t.Fatalf("breaking %s: %v", key, err)
	}
	c.sync()
}

// rejoin changes a node's capacity, as `herd node set --capacity` does,
// and so begins a new epoch (if the capacity is another).
func (c *logCluster) rejoin(id string, capacity uint64) {
	c.t.Helper()
	if _, err := c.ops.SetNode(context.Background(), id, cluster.NodeSettings{Capacity: &capacity}); err != nil {
		c.t.Fatalf("setting node %s's capacity: %v", id, err)
	}
	c.sync()
}

// setZone puts a node in a zone, as `herd node set --zone` does.
func (c *logCluster) setZone(id, zone string) {
	c.t.Helper()
	if _, err := c.ops.SetNode(context.Background(), id, cluster.NodeSettings{Zone: &zone}); err != nil {
		c.t.Fatalf("setting node %s's zone: %v", id, err)
	}
	c.sync()
}

func (c *logCluster) epoch() uint64 { return c.Epoch() }

// addVDI creates a VDI, as `herd vdi create` does. The log numbers VDIs
// itself, in order: to give the VDI the id the test names its objects
// by, addVDI first creates and deletes VDIs that take the ids before it.
func (c *logCluster) addVDI(name string, id uint32, size uint64) {
	c.t.Helper()
	for next := c.nextVDIID(); next < id; next++ {
		unused := fmt.Sprintf("unused-%d", next)
		if _, err := c.CreateVDI(unused, size); err != nil {
			c.t.Fatalf("creating vdi %s: %v", unused, err)
		}
		if err := c.DeleteVDI(unused); err != nil {
			c.t.Fatalf("deleting vdi %s: %v", unused, err)
		}
	}
	v, err := c.CreateVDI(name, size)
	if err != nil {
		c.t.Fatalf("creating vdi %s: %v", name, err)
	}
	if v.ID != id {
		c.t.Fatalf("vdi %s has id %d, the test expects %d", name, v.ID, id)
	}
	c.sync()
}

// setVDI changes a VDI's settings, as `herd vdi set` does.
func (c *logCluster) setVDI(name string, settings cluster.VDISettings) {
	c.t.Helper()
	if _, err := c.ops.SetVDI(context.Background(), name, settings); err != nil {
		c.t.Fatalf("setting vdi %s: %v", name, err)
	}
	c.sync()
}

// setLimits changes a VDI's QoS limits, as `herd vdi set` does.
func (c *logCluster) setLimits(name string, limits cluster.Limits) {
	c.setVDI(name, cluster.VDISettings{LimitSettings: cluster.LimitSettings{
		IOPS: &limits.IOPS, ReadIOPS: &limits.ReadIOPS, WriteIOPS: &limits.WriteIOPS,
		BPS: &limits.BPS, ReadBPS: &limits.ReadBPS, WriteBPS: &limits.WriteBPS,
	}})
}

func (c *logCluster) setExclusive(name string, exclusive bool) {
	c.setVDI(name, cluster.VDISettings{Exclusive: &exclusive})
}

// clone makes a writable child of a snapshot, as `herd vdi clone` does.
func (c *logCluster) clone(snapshot uint32, name string) {
	c.t.Helper()
	s, ok := c.VDIByID(snapshot)
	if !ok || !s.Snapshot {
		c.t.Fatalf("cloning %d: no such snapshot", snapshot)
	}
	if _, err := c.ops.CloneVDI(context.Background(), s.Name+"@"+s.Tag, name); err != nil {
		c.t.Fatalf("cloning %s@%s: %v", s.Name, s.Tag, err)
	}
	c.sync()
}

// deleteVDI deletes a VDI or a snapshot (NAME@TAG), as `herd vdi delete`
// does: one with descendants stays, hidden, marked deleted.
func (c *logCluster) deleteVDI(name string) {
	c.t.Helper()
	if err := c.DeleteVDI(name); err != nil {
		c.t.Fatalf("deleting %s: %v", name, err)
	}
	c.sync()
}

// finalize raises the cluster's feature level, as `herd cluster
// finalize-upgrade` does (the log starts at the lowest).
func (c *logCluster) finalize(level int) {
	c.t.Helper()
	if _, err := c.FinalizeUpgrade(level); err != nil {
		c.t.Fatalf("finalizing level %d: %v", level, err)
	}
	c.sync()
}

// forwarded is a node's member whose refusals come back as on a real
// follower: the leader refuses the forwarded proposal, and its error
// crosses the network as a code and a message (cluster.RemoteError), not
// as a cluster.LockHeldError. A member of Local commits through the
// leader's own FSM and gets its error value itself, so this much stays
// fake.
type forwarded struct{ *cluster.LocalMember }

func (c forwarded) AcquireLock(ctx context.Context, key, session string) (cluster.Lock, error) {
	l, err := c.LocalMember.AcquireLock(ctx, key, session)
	return l, remote(err)
}

func (c forwarded) WantLock(ctx context.Context, key, session string) (cluster.LockWant, error) {
	w, err := c.LocalMember.WantLock(ctx, key, session)
	return w, remote(err)
}

// remote is err as the leader's answer to a forwarded proposal carries it.
func remote(err error) error {
	if err == nil {
		return nil
	}
	return cluster.ErrorFromCode(cluster.ErrorCode(err), err.Error())
}

// flatten asks for a VDI to be flattened, as `herd vdi flatten` does.
func (c *logCluster) flatten(name string) {
	c.t.Helper()
	if _, err := c.FlattenVDI(name); err != nil {
		c.t.Fatalf("flattening %s: %v", name, err)
	}
	c.sync()
}

// nextVDIID is the id the log gives the next VDI: one more than any it
// gave, live or garbage.
func (c *logCluster) nextVDIID() uint32 {
	var last uint32
	for _, v := range c.Tree() {
		last = max(last, v.ID)
	}
	for _, g := range c.Garbage() {
		last = max(last, g.ID)
	}
	return last + 1
}
