package gateway

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/layout"
	"github.com/herd-storage/herd/internal/object"
)

// fakeCluster is an in-memory cluster log: nodes, epochs, VDIs, locks.
type fakeCluster struct {
	self string

	mu      sync.Mutex
	nodes   map[string]cluster.Node
	epochs  []cluster.Epoch
	format  cluster.Format
	vdis    map[string]cluster.VDI // writable, by name
	frozen  map[uint32]cluster.VDI // snapshots, by id
	nextID  uint32
	locks   map[string]cluster.Lock
	changed chan struct{}
	// grants numbers lock grants; lockChanged is closed and replaced
	// whenever a lock changes.
	grants      uint64
	lockChanged chan struct{}
}

type fakeWorld struct {
	cluster  *fakeCluster
	replicas *memoryReplicas
}

func newWorld(t *testing.T, nodes int, copies int) *fakeWorld {
	c := &fakeCluster{nodes: map[string]cluster.Node{}, vdis: map[string]cluster.VDI{}, frozen: map[uint32]cluster.VDI{}, nextID: 100, locks: map[string]cluster.Lock{}, changed: make(chan struct{}), lockChanged: make(chan struct{}),
		format: cluster.Format{Copies: copies, ObjectSize: 1 << 20}}
	var ids []string
	for i := 0; i < nodes; i++ {
		id := fmt.Sprintf("node%02d", i)
		c.nodes[id] = cluster.Node{ID: id, Address: id, Capacity: 1 << 40, State: cluster.NodeAlive}
		ids = append(ids, id)
	}
	c.self = ids[0]
	c.epochs = []cluster.Epoch{{Number: 0, Nodes: ids}}
	c.commitLocked(ids) // epoch 1
	c.epochs = c.epochs[1:]
	return &fakeWorld{cluster: c, replicas: newMemoryReplicas(c)}
}

func (w *fakeWorld) gateway(self string) *Gateway {
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	return w.gatewayWith(self, logger, Options{})
}

func (w *fakeWorld) gatewayWith(self string, logger *slog.Logger, options Options) *Gateway {
	c := &selfCluster{fakeCluster: w.cluster, self: self}
	return New(c, layout.NewHistory(c, logger), w.replicas, logger, options)
}

// selfCluster is the fake cluster as seen from one node.
type selfCluster struct {
	*fakeCluster
	self string
	// forwarded: lock refusals come back as the leader's refusal of a
	// forwarded proposal does on a real follower, an error code and a
	// message (cluster.RemoteError), not a cluster.LockHeldError.
	forwarded bool
}

// refusal is err as this node sees it (see forwarded).
func (c *selfCluster) refusal(err error) error {
	if c.forwarded {
		return cluster.ErrorFromCode(cluster.ErrorCode(err), err.Error())
	}
	return err
}

func (c *selfCluster) ID() string { return c.self }

func (c *selfCluster) AcquireLock(ctx context.Context, key, session string) (cluster.Lock, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if l, ok := c.locks[key]; ok {
		if l.Node != c.self || l.Session != session {
			return cluster.Lock{}, c.refusal(&cluster.LockHeldError{Lock: l})
		}
		return l, nil
	}
	return c.grantLocked(key, cluster.LockOwner{Node: c.self, Session: session}), nil
}

// grantLocked gives key to owner with the next generation.
func (c *fakeCluster) grantLocked(key string, owner cluster.LockOwner) cluster.Lock {
	c.grants++
	l := cluster.Lock{Key: key, Node: owner.Node, Session: owner.Session, Generation: c.grants}
	c.locks[key] = l
	c.lockChangedLocked()
	return l
}

func (c *fakeCluster) lockChangedLocked() {
	close(c.lockChanged)
	c.lockChanged = make(chan struct{})
}

func (c *selfCluster) ReleaseLock(ctx context.Context, key, session string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if l, ok := c.locks[key]; !ok || l.Node != c.self {
		return cluster.ErrNotLockOwner
	}
	delete(c.locks, key)
	c.lockChangedLocked()
	return nil
}

func (c *selfCluster) WantLock(ctx context.Context, key, session string) (cluster.LockWant, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	l, ok := c.locks[key]
	switch {
	case !ok:
		return cluster.LockWant{Lock: c.grantLocked(key, cluster.LockOwner{Node: c.self, Session: session}), Granted: true}, nil
	case l.Node == c.self && l.Session == session:
		return cluster.LockWant{Lock: l, Granted: true}, nil
	}
	if name, ok := strings.CutPrefix(key, "vdi/"); ok && c.vdis[name].Exclusive {
		return cluster.LockWant{}, c.refusal(&cluster.LockHeldError{Lock: l})
	}
	l.Wanted = &cluster.LockOwner{Node: c.self, Session: session}
	c.locks[key] = l
	c.lockChangedLocked()
	return cluster.LockWant{Lock: l}, nil
}

func (c *selfCluster) HandOverLock(ctx context.Context, key, session string, to cluster.LockOwner) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	l, ok := c.locks[key]
	if !ok {
		return cluster.ErrNotFound
	}
	if l.Node != c.self || l.Session != session {
		return cluster.ErrNotLockOwner
	}
	c.grantLocked(key, to)
	if name, ok := strings.CutPrefix(key, "vdi/"); ok {
		v := c.vdis[name]
		v.Handovers++
		c.vdis[name] = v
	}
	return nil
}

// dropLock takes key away as a node's leaving does: the VDI is unclean,
// a new epoch begins, but nothing is recorded as broken.
func (c *fakeCluster) dropLock(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.locks, key)
	if name, ok := strings.CutPrefix(key, "vdi/"); ok {
		v := c.vdis[name]
		v.Unclean = true
		c.vdis[name] = v
	}
	c.lockChangedLocked()
	c.commitLocked(c.epochs[len(c.epochs)-1].Nodes)
}

// breakLock takes key away from its holder, as `herd vdi unlock --force`
// does: the lock goes, the VDI is unclean, and a new epoch begins.
func (c *fakeCluster) breakLock(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	broken := c.locks[key]
	delete(c.locks, key)
	if name, ok := strings.CutPrefix(key, "vdi/"); ok {
		v := c.vdis[name]
		v.Unclean = true
		v.BrokenGeneration = broken.Generation
		c.vdis[name] = v
	}
	c.lockChangedLocked()
	c.commitLocked(c.epochs[len(c.epochs)-1].Nodes)
}

func (c *fakeCluster) Lock(key string) (cluster.Lock, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	l, ok := c.locks[key]
	return l, ok
}

func (c *fakeCluster) WaitLock(ctx context.Context, key string, done func(cluster.Lock, bool) bool) (cluster.Lock, bool, error) {
	for {
		c.mu.Lock()
		changed := c.lockChanged
		l, held := c.locks[key]
		c.mu.Unlock()
		if done(l, held) {
			return l, held, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return l, held, ctx.Err()
		}
	}
}

func (c *fakeCluster) View() cluster.EpochView {
	c.mu.Lock()
	defer c.mu.Unlock()
	last := c.epochs[len(c.epochs)-1]
	v := cluster.EpochView{Number: last.Number}
	f := c.format
	v.Format = &f
	for _, id := range last.Nodes {
		v.Nodes = append(v.Nodes, c.nodes[id])
	}
	v.Members = last.PlacedMembers(func(id string) (cluster.Member, bool) {
		n, ok := c.nodes[id]
		return cluster.MemberOf(n), ok
	})
	return v
}

func (c *fakeCluster) WaitEpoch(ctx context.Context, after uint64) (cluster.EpochView, error) {
	for {
		c.mu.Lock()
		changed := c.changed
		c.mu.Unlock()
		if v := c.View(); v.Number > after {
			return v, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return c.View(), ctx.Err()
		}
	}
}

// setNodes commits a new epoch with these nodes alive.
func (c *fakeCluster) setNodes(ids ...string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	sort.Strings(ids)
	for _, id := range ids {
		if _, ok := c.nodes[id]; !ok {
			c.nodes[id] = cluster.Node{ID: id, Address: id, Capacity: 1 << 40, State: cluster.NodeAlive}
		}
	}
	c.commitLocked(ids)
}

// commitLocked appends an epoch of these nodes, recording each one's
// placement as the node table has it now (as the FSM's newEpoch does).
func (c *fakeCluster) commitLocked(ids []string) {
	var members []cluster.Member
	for _, id := range ids {
		members = append(members, cluster.MemberOf(c.nodes[id]))
	}
	c.epochs = append(c.epochs, cluster.Epoch{Number: c.epochs[len(c.epochs)-1].Number + 1, Nodes: ids, Members: members})
	close(c.changed)
	c.changed = make(chan struct{})
}

// rejoin changes a node's capacity as a quick restart with another
// --capacity does, and commits the new epoch that brings.
func (c *fakeCluster) rejoin(id string, capacity uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.nodes[id]
	n.Capacity = capacity
	c.nodes[id] = n
	c.commitLocked(c.epochs[len(c.epochs)-1].Nodes)
}

func (c *fakeCluster) epoch() uint64 { return c.View().Number }

func (c *fakeCluster) Epoch() uint64 { return c.epoch() }

func (c *fakeCluster) Epochs() []cluster.Epoch {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]cluster.Epoch(nil), c.epochs...)
}

func (c *fakeCluster) Node(id string) (cluster.Node, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n, ok := c.nodes[id]
	return n, ok
}

func (c *fakeCluster) VDI(full string) (cluster.VDI, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	name, tag := cluster.SplitName(full)
	if tag != "" {
		for _, v := range c.frozen {
			if v.Name == name && v.Tag == tag {
				return v, nil
			}
		}
		return cluster.VDI{}, cluster.ErrNotFound
	}
	v, ok := c.vdis[name]
	if !ok {
		return v, cluster.ErrNotFound
	}
	return v, nil
}

func (c *fakeCluster) LookupVDI(ctx context.Context, name string) (cluster.VDI, error) {
	return c.VDI(name)
}

func (c *fakeCluster) Tree() []cluster.VDI {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []cluster.VDI
	for _, v := range c.vdis {
		out = append(out, v)
	}
	for _, v := range c.frozen {
		out = append(out, v)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

func (c *fakeCluster) byID(id uint32) (cluster.VDI, bool) {
	if v, ok := c.frozen[id]; ok {
		return v, true
	}
	for _, v := range c.vdis {
		if v.ID == id {
			return v, true
		}
	}
	return cluster.VDI{}, false
}

func (c *fakeCluster) VDIByID(id uint32) (cluster.VDI, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.byID(id)
}

func (c *fakeCluster) Chain(id uint32) []uint32 {
	c.mu.Lock()
	defer c.mu.Unlock()
	var chain []uint32
	for v, ok := c.byID(id); ok; v, ok = c.byID(v.Parent) {
		chain = append(chain, v.ID)
		if v.Parent == 0 {
			break
		}
	}
	return chain
}

func (c *fakeCluster) SnapshotVDI(ctx context.Context, name, tag, holder string) (cluster.SnapshotResult, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	v, ok := c.vdis[name]
	if !ok {
		return cluster.SnapshotResult{}, cluster.ErrNotFound
	}
	h := ""
	if l, held := c.locks[cluster.VDILockKey(name)]; held {
		h = l.Node
	}
	if h != holder {
		return cluster.SnapshotResult{}, cluster.ErrBusy
	}
	snap := v
	snap.Snapshot, snap.Tag = true, tag
	c.frozen[v.ID] = snap
	c.nextID++
	child := cluster.VDI{ID: c.nextID, Name: name, Size: v.Size, Copies: v.Copies, ObjectSize: v.ObjectSize, Parent: v.ID}
	c.vdis[name] = child
	return cluster.SnapshotResult{Snapshot: snap, VDI: child}, nil
}

// clone makes a writable child of a snapshot.
func (c *fakeCluster) clone(snapshot uint32, name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	parent := c.frozen[snapshot]
	c.nextID++
	c.vdis[name] = cluster.VDI{ID: c.nextID, Name: name, Size: parent.Size, Copies: parent.Copies, ObjectSize: parent.ObjectSize, Parent: snapshot}
}

func (c *fakeCluster) addVDI(name string, id uint32, size uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.vdis[name] = cluster.VDI{ID: id, Name: name, Size: size, Copies: c.format.Copies, ObjectSize: c.format.ObjectSize, Since: c.epochs[len(c.epochs)-1].Number}
}

// setLimits changes a VDI's QoS limits, as `herd vdi set` does.
func (c *fakeCluster) setLimits(name string, limits cluster.Limits) {
	c.mu.Lock()
	defer c.mu.Unlock()
	v := c.vdis[name]
	v.Limits = limits
	c.vdis[name] = v
	c.lockChangedLocked() // lockChanged tells WaitVDI too
}

// WaitVDI is cluster's: done is called again whenever a lock or a VDI's
// limits change.
func (c *fakeCluster) WaitVDI(ctx context.Context, name string, done func(cluster.VDI, error) bool) (cluster.VDI, error) {
	for {
		c.mu.Lock()
		changed := c.lockChanged
		c.mu.Unlock()
		v, err := c.VDI(name)
		if done(v, err) {
			return v, err
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return v, ctx.Err()
		}
	}
}

func (c *fakeCluster) setExclusive(name string, exclusive bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	v := c.vdis[name]
	v.Exclusive = exclusive
	c.vdis[name] = v
}

// memoryReplicas stores objects per node in memory and enforces epochs
// like a real replica.
type memoryReplicas struct {
	cluster *fakeCluster

	mu          sync.Mutex
	objects     map[string]map[object.OID][]byte
	stamps      map[string]map[object.OID]object.Epoch
	unavailable map[string]bool
	damaged     map[string]bool // reads of these nodes' copies fail as corrupt, until removed
	flushes     map[string]int
	// beforeWrite, when set, runs before every write (fault injection).
	beforeWrite func(node string, oid object.OID)
	// before, when set, runs first in every Read, Write, Zero and Remove
	// ("read", "write", "zero", "remove"), without the fake's lock held:
	// tests hold operations there to count what is in flight.
	before func(op, node string, oid object.OID, p []byte)
}

func newMemoryReplicas(c *fakeCluster) *memoryReplicas {
	return &memoryReplicas{cluster: c, objects: map[string]map[object.OID][]byte{}, stamps: map[string]map[object.OID]object.Epoch{}, unavailable: map[string]bool{}, damaged: map[string]bool{}, flushes: map[string]int{}}
}

func (m *memoryReplicas) check(node cluster.Node, epoch object.Epoch) error {
	if m.unavailable[node.ID] {
		return fmt.Errorf("%w: %s", object.ErrUnavailable, node.ID)
	}
	if current := object.Epoch(m.cluster.epoch()); current != epoch {
		return &object.StaleEpochError{Current: current}
	}
	return nil
}

func (m *memoryReplicas) Read(ctx context.Context, node cluster.Node, epoch object.Epoch, oid object.OID, p []byte, offset uint32) (object.Epoch, error) {
	if m.before != nil {
		m.before("read", node.ID, oid, p)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.check(node, epoch); err != nil {
		return 0, err
	}
	data, ok := m.objects[node.ID][oid]
	if !ok {
		return 0, object.ErrNotFound
	}
	if m.damaged[node.ID] {
		return 0, fmt.Errorf("%w: header checksum mismatch", object.ErrCorrupt)
	}
	clear(p)
	if int(offset) < len(data) {
		copy(p, data[offset:])
	}
	return m.stamps[node.ID][oid], nil
}

func (m *memoryReplicas) Write(ctx context.Context, node cluster.Node, epoch object.Epoch, oid object.OID, p []byte, offset uint32, flags object.Flags) error {
	if m.before != nil {
		m.before("write", node.ID, oid, p)
	}
	return m.write(node, epoch, oid, p, offset, flags)
}

// StartWrite implements Starter as the peer client does: the write
// is on its way (here, in a goroutine) when it returns, so every test
// that writes goes through the gateway's started path.
func (m *memoryReplicas) StartWrite(ctx context.Context, node cluster.Node, epoch object.Epoch, oid object.OID, p *object.Payload, offset uint32, flags object.Flags) func() error {
	done := make(chan error, 1)
	go func() {
		if p.Checksum() != object.Checksum(p.Data) {
			done <- fmt.Errorf("payload changed after its checksum was taken")
			return
		}
		done <- m.Write(ctx, node, epoch, oid, p.Data, offset, flags)
	}()
	return func() error { return <-done }
}

// StartFlush implements Starter. It starts a flush to every node but the
// gateway's own, which it leaves to Flush as the peer client does, so that
// both of the gateway's paths are taken.
func (m *memoryReplicas) StartFlush(ctx context.Context, node cluster.Node, epoch object.Epoch) func() error {
	if node.ID == m.cluster.self {
		return nil
	}
	done := make(chan error, 1)
	go func() { done <- m.Flush(ctx, node, epoch) }()
	return func() error { return <-done }
}

func (m *memoryReplicas) write(node cluster.Node, epoch object.Epoch, oid object.OID, p []byte, offset uint32, flags object.Flags) error {
	if m.beforeWrite != nil {
		m.beforeWrite(node.ID, oid)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.check(node, epoch); err != nil {
		return err
	}
	if m.objects[node.ID] == nil {
		m.objects[node.ID] = map[object.OID][]byte{}
		m.stamps[node.ID] = map[object.OID]object.Epoch{}
	}
	data, ok := m.objects[node.ID][oid]
	if !ok && !flags.Has(object.FlagCreate) {
		return object.ErrNotFound
	}
	if flags.Has(object.FlagFresh) {
		data = nil
	}
	if end := int(offset) + len(p); end > len(data) {
		data = append(data, make([]byte, end-len(data))...)
	}
	copy(data[offset:], p)
	m.objects[node.ID][oid] = data
	m.stamps[node.ID][oid] = epoch
	return nil
}

func (m *memoryReplicas) Zero(ctx context.Context, node cluster.Node, epoch object.Epoch, oid object.OID, offset, length uint32, flags object.Flags) error {
	if m.before != nil {
		m.before("zero", node.ID, oid, nil)
	}
	return m.write(node, epoch, oid, make([]byte, length), offset, flags&object.FlagSync)
}

func (m *memoryReplicas) Remove(ctx context.Context, node cluster.Node, epoch object.Epoch, oid object.OID) error {
	if m.before != nil {
		m.before("remove", node.ID, oid, nil)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.check(node, epoch); err != nil {
		return err
	}
	delete(m.objects[node.ID], oid)
	delete(m.damaged, node.ID)
	return nil
}

func (m *memoryReplicas) Flush(ctx context.Context, node cluster.Node, epoch object.Epoch) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.check(node, epoch); err != nil {
		return err
	}
	m.flushes[node.ID]++
	return nil
}

// Stat returns the copy's stamp; no digest (unknown).
func (m *memoryReplicas) Stat(ctx context.Context, node cluster.Node, epoch object.Epoch, oid object.OID) (object.Epoch, uint64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.check(node, epoch); err != nil {
		return 0, 0, err
	}
	if _, ok := m.objects[node.ID][oid]; !ok {
		return 0, 0, object.ErrNotFound
	}
	return m.stamps[node.ID][oid], 0, nil
}

// holders returns the nodes holding oid.
func (m *memoryReplicas) holders(oid object.OID) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for node, objects := range m.objects {
		if _, ok := objects[oid]; ok {
			out = append(out, node)
		}
	}
	sort.Strings(out)
	return out
}

func (m *memoryReplicas) Fetch(ctx context.Context, node cluster.Node, epoch object.Epoch, oid object.OID, p []byte) (object.Epoch, error) {
	return m.Read(ctx, node, epoch, oid, p, 0)
}

// Recover gives node the copy with the newest stamp, restamped: the fake
// keeps no history, so there is no proof to make (fence.go's proof has
// its own tests and the end-to-end Fig. 4 test).
func (m *memoryReplicas) Recover(ctx context.Context, node cluster.Node, epoch object.Epoch, oid object.OID) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.check(node, epoch); err != nil {
		return err
	}
	var best []byte
	var bestStamp object.Epoch
	found := false
	for id, objects := range m.objects {
		if m.unavailable[id] {
			continue
		}
		if data, ok := objects[oid]; ok && (!found || m.stamps[id][oid] > bestStamp) {
			best, bestStamp, found = data, m.stamps[id][oid], true
		}
	}
	if !found {
		return object.ErrNotFound
	}
	if m.objects[node.ID] == nil {
		m.objects[node.ID] = map[object.OID][]byte{}
		m.stamps[node.ID] = map[object.OID]object.Epoch{}
	}
	m.objects[node.ID][oid] = append([]byte(nil), best...)
	m.stamps[node.ID][oid] = epoch
	return nil
}

func (c *fakeCluster) MarkVDIUnclean(ctx context.Context, name string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	v, ok := c.vdis[name]
	if !ok {
		return cluster.ErrNotFound
	}
	v.Unclean = true
	c.vdis[name] = v
	return nil
}

func (c *fakeCluster) MarkVDIRepaired(ctx context.Context, name string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	v, ok := c.vdis[name]
	if !ok {
		return cluster.ErrNotFound
	}
	v.Unclean = false
	c.vdis[name] = v
	return nil
}
