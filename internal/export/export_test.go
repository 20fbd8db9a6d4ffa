package export

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/gateway"
	"github.com/herd-storage/herd/internal/layout"
	"github.com/herd-storage/herd/internal/nbd"
	"github.com/herd-storage/herd/internal/object"
)

// fakeCluster is a one-node cluster log with a fixed set of VDIs; it
// counts the lookups and lock acquisitions the gateway makes.
type fakeCluster struct {
	mu      sync.Mutex // guards the fields below
	vdis    []cluster.VDI
	locks   map[string]string // key -> node holding it
	lookups int
	locking int
	// leaderless: the next this many lock acquisitions and lookups of a
	// missing name find no leader (ErrNoQuorum), as right after the
	// leader died; below zero, all of them do.
	leaderless int
}

// noLeader reports whether the next call that needs the leader finds
// none, counting it. c.mu must be held.
func (c *fakeCluster) noLeader() bool {
	if c.leaderless == 0 {
		return false
	}
	if c.leaderless > 0 {
		c.leaderless--
	}
	return true
}

var self = cluster.Node{ID: "node1", Address: "node1", Capacity: 1 << 40, State: cluster.NodeAlive}

func (c *fakeCluster) ID() string    { return self.ID }
func (c *fakeCluster) Epoch() uint64 { return 1 }
func (c *fakeCluster) View() cluster.EpochView {
	return cluster.EpochView{Number: 1, Nodes: []cluster.Node{self}, Placed: []string{self.ID},
		Members: []cluster.Member{cluster.MemberOf(self)}, Format: &cluster.Format{Copies: 1, ObjectSize: 1 << 20}}
}

func (c *fakeCluster) WaitEpoch(ctx context.Context, after uint64) (cluster.EpochView, error) {
	<-ctx.Done()
	return c.View(), ctx.Err()
}

func (c *fakeCluster) Node(id string) (cluster.Node, bool) { return self, id == self.ID }

func (c *fakeCluster) VDI(full string) (cluster.VDI, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.lookups++
	name, tag := cluster.SplitName(full)
	for _, v := range c.vdis {
		if v.Name == name && v.Snapshot == (tag != "") && v.Tag == tag {
			return v, nil
		}
	}
	return cluster.VDI{}, fmt.Errorf("vdi %q %w", full, cluster.ErrNotFound)
}

// LookupVDI is cluster.Cluster's: a miss the leader cannot confirm is
// ErrNoQuorum.
func (c *fakeCluster) LookupVDI(ctx context.Context, name string) (cluster.VDI, error) {
	v, err := c.VDI(name)
	c.mu.Lock()
	defer c.mu.Unlock()
	if errors.Is(err, cluster.ErrNotFound) && c.noLeader() {
		return cluster.VDI{}, fmt.Errorf("vdi %q is not in this node's copy of the log, and the leader's cannot be asked: %w: no leader is known to this node", name, cluster.ErrNoQuorum)
	}
	return v, err
}

func (c *fakeCluster) Tree() []cluster.VDI {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.vdis)
}

// Chain walks the Parent fields, as the cluster's state does.
func (c *fakeCluster) Chain(id uint32) []uint32 {
	c.mu.Lock()
	defer c.mu.Unlock()
	var chain []uint32
	for id != 0 && len(chain) <= len(c.vdis) {
		chain = append(chain, id)
		parent := uint32(0)
		for _, v := range c.vdis {
			if v.ID == id {
				parent = v.Parent
			}
		}
		id = parent
	}
	return chain
}

func (c *fakeCluster) SnapshotVDI(ctx context.Context, name, tag, holder string) (cluster.SnapshotResult, error) {
	return cluster.SnapshotResult{}, errors.New("not in this fake")
}

func (c *fakeCluster) AcquireLock(ctx context.Context, key, session string) (cluster.Lock, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.locking++
	if c.noLeader() {
		return cluster.Lock{}, fmt.Errorf("%w: leader at node0:7000 unreachable", cluster.ErrNoQuorum)
	}
	if holder, held := c.locks[key]; held && holder != self.ID {
		return cluster.Lock{}, &cluster.LockHeldError{Lock: cluster.Lock{Key: key, Node: holder}}
	}
	c.locks[key] = self.ID
	return cluster.Lock{Key: key, Node: self.ID, Session: session}, nil
}

func (c *fakeCluster) ReleaseLock(ctx context.Context, key, session string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.locks, key)
	return nil
}

func (c *fakeCluster) MarkVDIUnclean(ctx context.Context, name string) error { return nil }

func (c *fakeCluster) Lock(key string) (cluster.Lock, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	holder, held := c.locks[key]
	return cluster.Lock{Key: key, Node: holder}, held
}

func (c *fakeCluster) WaitLock(ctx context.Context, key string, done func(cluster.Lock, bool) bool) (cluster.Lock, bool, error) {
	l, held := c.Lock(key)
	if done(l, held) {
		return l, held, nil
	}
	<-ctx.Done()
	return l, held, ctx.Err()
}

// WaitVDI: the fake's VDIs never change their limits.
func (c *fakeCluster) WaitVDI(ctx context.Context, name string, done func(cluster.VDI, error) bool) (cluster.VDI, error) {
	v, err := c.VDI(name)
	if done(v, err) {
		return v, err
	}
	<-ctx.Done()
	return v, ctx.Err()
}

func (c *fakeCluster) WantLock(ctx context.Context, key, session string) (cluster.LockWant, error) {
	l, err := c.AcquireLock(ctx, key, session)
	return cluster.LockWant{Lock: l, Granted: err == nil}, err
}

func (c *fakeCluster) HandOverLock(ctx context.Context, key, session string, to cluster.LockOwner) error {
	return errors.New("not in this fake")
}

func (c *fakeCluster) counts() (lookups, locking int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lookups, c.locking
}

// noReplicas fails every object request: these tests open and describe
// exports, they do not move data.
type noReplicas struct{}

func (noReplicas) Read(context.Context, cluster.Node, object.Epoch, object.OID, []byte, uint32) (object.Epoch, error) {
	return 0, object.ErrUnavailable
}
func (noReplicas) Write(context.Context, cluster.Node, object.Epoch, object.OID, []byte, uint32, object.Flags) error {
	return object.ErrUnavailable
}
func (noReplicas) Zero(context.Context, cluster.Node, object.Epoch, object.OID, uint32, uint32, object.Flags) error {
	return object.ErrUnavailable
}
func (noReplicas) Remove(context.Context, cluster.Node, object.Epoch, object.OID) error {
	return object.ErrUnavailable
}
func (noReplicas) Flush(context.Context, cluster.Node, object.Epoch) error {
	return object.ErrUnavailable
}
func (noReplicas) Recover(context.Context, cluster.Node, object.Epoch, object.OID) error {
	return object.ErrUnavailable
}

// newTestGateway serves alpha (with a snapshot alpha@monday), beta and
// gamma.
func newTestGateway(t *testing.T) (*gateway.Gateway, *fakeCluster) {
	t.Helper()
	c := &fakeCluster{locks: map[string]string{}, vdis: []cluster.VDI{
		{ID: 1, Name: "alpha", Size: 1 << 30, Copies: 1, ObjectSize: 1 << 20, Snapshot: true, Tag: "monday"},
		{ID: 2, Name: "alpha", Size: 1 << 30, Copies: 1, ObjectSize: 1 << 20, Parent: 1},
		{ID: 3, Name: "beta", Size: 1 << 20, Copies: 1, ObjectSize: 1 << 20},
		{ID: 4, Name: "gamma", Size: 1 << 20, Copies: 1, ObjectSize: 1 << 20, Exclusive: true},
	}}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	return gateway.New(c, layout.NewHistory(c, logger), noReplicas{}, logger, gateway.Options{}), c
}

// authorize is the policy of these tests: alice may use alpha and gamma,
// reader everything read-only, revoked nothing.
func authorize(session nbd.Session) (Access, error) {
	switch session.Client {
	case "alice":
		return Access{Match: func(name string) bool { return name == "alpha" || name == "gamma" }}, nil
	case "reader":
		return Access{Match: func(string) bool { return true }, ReadOnly: true}, nil
	case "nobody":
		return Access{}, nil // no Match: nothing
	}
	return Access{}, fmt.Errorf("client certificate %q is revoked", session.Client)
}

func listNames(t *testing.T, backend Backend, session nbd.Session) []string {
	t.Helper()
	exports, err := backend.List(context.Background(), session)
	if err != nil {
		t.Fatalf("List for %q: %v", session.Client, err)
	}
	var names []string
	for _, e := range exports {
		names = append(names, e.Name)
	}
	slices.Sort(names)
	return names
}

func TestListShowsOnlyAllowedVDIs(t *testing.T) {
	gw, _ := newTestGateway(t)
	backend := Backend{Gateway: gw, Authorize: authorize}
	for client, want := range map[string]string{
		"alice":  "[alpha alpha@monday gamma]", // a snapshot follows its VDI
		"reader": "[alpha alpha@monday beta gamma]",
		"nobody": "[]",
	} {
		if got := fmt.Sprint(listNames(t, backend, nbd.Session{Client: client, TLS: true})); got != want {
			t.Errorf("List for %s: %s, want %s", client, got, want)
		}
	}
	if got := fmt.Sprint(listNames(t, Backend{Gateway: gw}, nbd.Session{})); got != "[alpha alpha@monday beta gamma]" {
		t.Errorf("List without Authorize: %s", got)
	}
	_, err := backend.List(context.Background(), nbd.Session{Client: "mallory", TLS: true})
	if !errors.Is(err, nbd.ErrPermission) || !strings.Contains(err.Error(), `client certificate "mallory" is revoked`) {
		t.Errorf("List for a revoked client: %v, want ErrPermission with the reason", err)
	}
}

// TestOpenRefusesLikeUnknown: a name the client may not open is refused
// with the message of a name that does not exist, before the cluster is
// asked anything.
func TestOpenRefusesLikeUnknown(t *testing.T) {
	gw, c := newTestGateway(t)
	backend := Backend{Gateway: gw, Authorize: authorize}
	alice := nbd.Session{Client: "alice", TLS: true}
	open := func(backend Backend, name string, session nbd.Session) error {
		e, err := backend.Open(context.Background(), name, session)
		if err == nil {
			e.Close()
		}
		return err
	}
	unknown := open(Backend{Gateway: gw}, "delta", nbd.Session{})
	if !errors.Is(unknown, nbd.ErrUnknownExport) {
		t.Fatalf("open of a missing VDI: %v", unknown)
	}
	lookupsBefore, _ := c.counts()
	for _, name := range []string{"beta", "ro/beta", "beta@monday", "delta"} {
		err := open(backend, name, alice)
		if !errors.Is(err, nbd.ErrUnknownExport) {
			t.Errorf("alice opening %s: %v, want ErrUnknownExport", name, err)
			continue
		}
		if strings.ReplaceAll(err.Error(), name, "NAME") != strings.ReplaceAll(unknown.Error(), "delta", "NAME") {
			t.Errorf("refusal %q differs from the unknown-export message %q", err, unknown)
		}
	}
	if lookups, _ := c.counts(); lookups != lookupsBefore {
		t.Errorf("%d cluster lookups for refused names, want none", lookups-lookupsBefore)
	}
	for _, name := range []string{"alpha", "ro/alpha", "alpha@monday", "gamma"} {
		if err := open(backend, name, alice); err != nil {
			t.Errorf("alice opening %s: %v", name, err)
		}
	}
	err := open(backend, "alpha", nbd.Session{Client: "mallory", TLS: true})
	if !errors.Is(err, nbd.ErrPermission) || !strings.Contains(err.Error(), "revoked") {
		t.Errorf("open by a revoked client: %v, want ErrPermission with the reason", err)
	}
}

// TestReadOnlyAccess: every export opens read-only, takes no write lock,
// and refuses writes.
func TestReadOnlyAccess(t *testing.T) {
	gw, c := newTestGateway(t)
	backend := Backend{Gateway: gw, Authorize: authorize}
	e, err := backend.Open(context.Background(), "beta", nbd.Session{Client: "reader", TLS: true})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if info := e.Info(); !info.ReadOnly || info.CanTrim || info.CanWriteZeroes {
		t.Fatalf("info %+v, want a read-only export", info)
	}
	if err := e.WriteAt(context.Background(), []byte{1}, 0, false); !errors.Is(err, nbd.ErrReadOnly) {
		t.Fatalf("write: %v, want ErrReadOnly", err)
	}
	if _, locking := c.counts(); locking != 0 {
		t.Fatalf("%d lock acquisitions for a read-only client", locking)
	}
}

// TestInfoOnlyTakesNoLock: NBD_OPT_INFO opens without the write lock (so
// no cluster log entry, and no refusal while another node writes), yet
// describes the export NBD_OPT_GO would open.
func TestInfoOnlyTakesNoLock(t *testing.T) {
	gw, c := newTestGateway(t)
	backend := Backend{Gateway: gw, Authorize: authorize}
	describe := func(name, client string) nbd.ExportInfo {
		t.Helper()
		e, err := backend.Open(context.Background(), name, nbd.Session{Client: client, TLS: true, InfoOnly: true})
		if err != nil {
			t.Fatalf("INFO %s as %s: %v", name, client, err)
		}
		defer e.Close()
		if err := e.WriteAt(context.Background(), []byte{1}, 0, false); !errors.Is(err, nbd.ErrReadOnly) {
			t.Fatalf("write through an INFO open: %v, want ErrReadOnly", err)
		}
		return e.Info()
	}
	if info := describe("alpha", "alice"); info.ReadOnly || !info.CanTrim || !info.CanWriteZeroes {
		t.Errorf("INFO of a writable VDI: %+v, want it described writable", info)
	}
	for _, test := range []struct{ name, client string }{
		{"alpha@monday", "alice"}, {"ro/alpha", "alice"}, {"gamma", "reader"},
	} {
		if info := describe(test.name, test.client); !info.ReadOnly {
			t.Errorf("INFO of %s as %s: %+v, want read-only", test.name, test.client, info)
		}
	}
	if _, locking := c.counts(); locking != 0 {
		t.Fatalf("%d lock acquisitions for NBD_OPT_INFO", locking)
	}

	// Another node writes gamma, an exclusive VDI: INFO still answers,
	// GO is refused.
	c.mu.Lock()
	c.locks[cluster.VDILockKey("gamma")] = "node2"
	c.mu.Unlock()
	if info := describe("gamma", "alice"); info.ReadOnly {
		t.Errorf("INFO of gamma: %+v", info)
	}
	if _, err := backend.Open(context.Background(), "gamma", nbd.Session{Client: "alice", TLS: true}); !errors.Is(err, nbd.ErrExportBusy) {
		t.Errorf("GO of gamma held by another node: %v, want ErrExportBusy", err)
	}
}
