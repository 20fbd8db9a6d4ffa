package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"testing"

	"github.com/herd-storage/herd/internal/peer"
)
import "github.com/herd-storage/herd/internal/cluster/statemachine"

// fakeMembers answers the secrets protocol for a test: the keyring each
// member (by peer address) holds, or an error.
type fakeMembers struct {
	rings  map[string][][]byte
	errs   map[string]error
	called []string
}

func (f *fakeMembers) fetch(_ context.Context, member string) ([][]byte, error) {
	f.called = append(f.called, member)
	if err := f.errs[member]; err != nil {
		return nil, err
	}
	return f.rings[member], nil
}

// nodeOf is a Cluster of node id on fsm with keyring keys (primary
// first) that fetches from members: enough for RefreshGossipKeys.
func nodeOf(t *testing.T, id string, fsm *FSM, members *fakeMembers, keys ...[]byte) (*Cluster, *GossipKeys) {
	t.Helper()
	g, err := NewGossipKeys(keys, nil, members.fetch)
	if err != nil {
		t.Fatal(err)
	}
	return &Cluster{cfg: Config{NodeID: id, GossipKeys: g}, fsm: fsm, applied: statemachine.NewReads(fsm.FSM), logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, g
}

// TestGossipKeyringOfANodeThatMissedTheRotation: a node that was down
// while the gossip key rotated asks a member for its keyring when it
// starts (RefreshGossipKeys) and must then hold the key the cluster
// encrypts with and encrypt with it, whatever point of the rotation it
// stopped at: before the start (old key only), after it installed the
// new key but before the switch (both keys, the old one its primary),
// after the switch; whether the member is still in the rotation (both
// keys) or past its end (new key only). A member that refuses its
// certificate is tried after; all refusing is ErrTrustLost and changes
// nothing.
func TestGossipKeyringOfANodeThatMissedTheRotation(t *testing.T) {
	old, next := bytes.Repeat([]byte{1}, 32), bytes.Repeat([]byte{2}, 32)
	oldID, nextID := GossipKeyID(old), GossipKeyID(next)
	// The log a member has: c went down, the rotation ran to its end.
	h := securityHarness(t)
	for _, id := range []string{"a", "b", "c"} {
		h.state().Nodes[id].PeerAddr = id + ":7000" // where the secrets protocol answers
	}
	ctx := context.Background()
	for _, step := range []func() error{
		func() error { _, err := h.as("a").NodeLeave(ctx, "c", "killed"); return err },
		func() error { _, err := h.as("a").StartGossipKeyRotation(ctx, nextID, "a"); return err },
		func() error { return h.as("a").ReportGossipKey(ctx, nextID, false) },
		func() error { return h.as("b").ReportGossipKey(ctx, nextID, false) },
		func() error { return h.as("a").GossipKeyStep(ctx, GossipKeyOpSwitch, nextID) },
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	for _, stopped := range []struct {
		name string
		keys [][]byte // c's keyring when it stopped, the primary first
	}{
		{"before the start", [][]byte{old}},
		{"installed, not switched", [][]byte{old, next}},
		{"switched", [][]byte{next, old}},
	} {
		for _, member := range []struct {
			name string
			ring [][]byte
		}{
			{"in the use phase", [][]byte{next, old}},
			{"past the end", [][]byte{next}},
		} {
			t.Run(stopped.name+"/member "+member.name, func(t *testing.T) {
				members := &fakeMembers{rings: map[string][][]byte{"a:7000": member.ring, "b:7000": member.ring}, errs: map[string]error{"a:7000": peer.ErrCertificateRefused}}
				c, g := nodeOf(t, "c", h.fsm, members, stopped.keys...)
				if err := c.RefreshGossipKeys(context.Background()); err != nil {
					t.Fatal(err)
				}
				// It must send under a key the member reads, and past
				// the end that is the new key alone.
				if !slices.ContainsFunc(member.ring, func(key []byte) bool { return GossipKeyID(key) == g.PrimaryID() }) {
					t.Errorf("the node encrypts with %s after the refresh, which the member (keyring %d keys, primary %s) cannot read (its keyring %v)", g.PrimaryID(), len(member.ring), nextID, g.IDs())
				}
				for _, key := range member.ring {
					if g.byID(GossipKeyID(key)) == nil {
						t.Errorf("the node lacks key %s the member holds (keyring %v)", GossipKeyID(key), g.IDs())
					}
				}
				if !slices.Equal(members.called, []string{"a:7000", "b:7000"}) {
					t.Errorf("asked %v, want a member that refused, then the next", members.called)
				}
			})
		}
	}
	t.Run("every member refuses", func(t *testing.T) {
		members := &fakeMembers{errs: map[string]error{"a:7000": peer.ErrCertificateRefused, "b:7000": fmt.Errorf("%w: x", peer.ErrWrongCluster)}}
		c, g := nodeOf(t, "c", h.fsm, members, old)
		if err := c.RefreshGossipKeys(context.Background()); !errors.Is(err, ErrTrustLost) {
			t.Fatalf("every member refusing: %v, want ErrTrustLost", err)
		}
		if ids := g.IDs(); !slices.Equal(ids, []string{oldID}) {
			t.Fatalf("the refused node's keyring changed: %v", ids)
		}
	})
}
