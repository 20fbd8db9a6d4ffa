package gateway

import (
	"context"
	"fmt"
	"sort"
	"sync"

	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/object"
)

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
	lastLen     int // length of the write beforeWrite runs for (a test knows the write it is called for)
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
		m.mu.Lock()
		m.lastLen = len(p)
		m.mu.Unlock()
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
