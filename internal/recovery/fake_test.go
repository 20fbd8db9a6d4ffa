package recovery

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/layout"
)

// fakeLog is a cluster log reduced to what the proof reads: nodes, the
// epoch history (recording members as the FSM's newEpoch does) and VDIs.
type fakeLog struct {
	mu      sync.Mutex
	nodes   map[string]cluster.Node
	epochs  []cluster.Epoch
	vdis    map[uint32]cluster.VDI
	copies  int
	changed chan struct{}
}

// newLog starts a log whose epoch 1 holds node00..node(n-1).
func newLog(n, copies int) *fakeLog {
	l := &fakeLog{nodes: map[string]cluster.Node{}, vdis: map[uint32]cluster.VDI{}, copies: copies, changed: make(chan struct{})}
	var ids []string
	for i := 0; i < n; i++ {
		id := fmt.Sprintf("node%02d", i)
		l.nodes[id] = cluster.Node{ID: id, Address: id, Capacity: 1 << 40, State: cluster.NodeAlive}
		ids = append(ids, id)
	}
	l.setNodes(ids...)
	return l
}

// setNodes commits a new epoch with these nodes alive.
func (l *fakeLog) setNodes(ids ...string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	sort.Strings(ids)
	var members []cluster.Member
	for _, id := range ids {
		if _, ok := l.nodes[id]; !ok {
			l.nodes[id] = cluster.Node{ID: id, Address: id, Capacity: 1 << 40, State: cluster.NodeAlive}
		}
		members = append(members, cluster.MemberOf(l.nodes[id]))
	}
	l.epochs = append(l.epochs, cluster.Epoch{Number: uint64(len(l.epochs) + 1), Nodes: ids, Members: members})
	close(l.changed)
	l.changed = make(chan struct{})
}

// rejoin changes a node's capacity as a quick restart with another
// --capacity does, and commits the new epoch that brings.
func (l *fakeLog) rejoin(id string, capacity uint64) {
	l.mu.Lock()
	n := l.nodes[id]
	n.Capacity = capacity
	l.nodes[id] = n
	ids := l.epochs[len(l.epochs)-1].Nodes
	l.mu.Unlock()
	l.setNodes(ids...)
}

// addVDI creates VDI id in the current epoch.
func (l *fakeLog) addVDI(id uint32) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.vdis[id] = cluster.VDI{ID: id, Name: fmt.Sprint(id), Since: l.epochs[len(l.epochs)-1].Number}
}

func (l *fakeLog) Epoch() uint64 { return l.View().Number }

func (l *fakeLog) View() cluster.EpochView {
	l.mu.Lock()
	defer l.mu.Unlock()
	last := l.epochs[len(l.epochs)-1]
	v := cluster.EpochView{Number: last.Number, Placed: last.Placed(), Format: &cluster.Format{Copies: l.copies, ObjectSize: 1 << 20}}
	for _, id := range last.Nodes {
		v.Nodes = append(v.Nodes, l.nodes[id])
	}
	v.Members = last.PlacedMembers(func(id string) (cluster.Member, bool) {
		n, ok := l.nodes[id]
		return cluster.MemberOf(n), ok
	})
	return v
}

func (l *fakeLog) WaitEpoch(ctx context.Context, after uint64) (cluster.EpochView, error) {
	for {
		l.mu.Lock()
		changed := l.changed
		l.mu.Unlock()
		if v := l.View(); v.Number > after {
			return v, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return l.View(), ctx.Err()
		}
	}
}

func (l *fakeLog) Epochs() []cluster.Epoch {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]cluster.Epoch(nil), l.epochs...)
}

func (l *fakeLog) Node(id string) (cluster.Node, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n, ok := l.nodes[id]
	return n, ok
}

func (l *fakeLog) MaintenanceHold(time.Time) (time.Time, []string) { return time.Time{}, nil }

func (l *fakeLog) VDIByID(id uint32) (cluster.VDI, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	v, ok := l.vdis[id]
	return v, ok
}

func (l *fakeLog) VDICopies(id uint32) (int, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	v, ok := l.vdis[id]
	if !ok {
		return 0, false
	}
	if v.Copies == 0 {
		return l.copies, true
	}
	return v.Copies, true
}

// proof returns a prover over the log (with fresh layouts: nothing
// cached from before).
func (l *fakeLog) proof() *Proof {
	return NewProof(l, layout.NewHistory(l, slog.New(slog.NewTextHandler(io.Discard, nil))), nil)
}
