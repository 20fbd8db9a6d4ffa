package e2e

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/api"
	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/peer"
	"github.com/herd-storage/herd/internal/pki"
	"github.com/herd-storage/herd/internal/testcluster"
)

// TestJoinTokensExpire: join tokens made with `cluster join-token create`
// admit nodes until they are used up, expire or are revoked, and the
// refusal says which; a revoke and a rotation of the cluster's join
// secret hold on every node as soon as the command returns (the join
// handler reads after a read index: once, a follower accepted the old
// secret a few ms after rotate-join-token returned).
func TestJoinTokensExpire(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Nodes: 3})
	waitAgreement(t, c, []int{0, 1, 2}, 30*time.Second)
	join := func(node int, token string) error {
		t.Helper()
		parsed, err := pki.ParseJoinToken(token)
		if err != nil {
			t.Fatal(err)
		}
		_, err = peer.RequestJoin(ctx(t), c.Node(node).PeerAddr(), parsed, peer.JoinRequest{NodeID: randomNodeID(t), IPs: []string{"127.0.0.1"}, Level: cluster.SupportedLevel})
		return err
	}
	create := func(args ...string) api.JoinTokenCreated {
		t.Helper()
		var created api.JoinTokenCreated
		if err := c.HerdJSON(ctx(t), 0, &created, append([]string{"cluster", "join-token", "create"}, args...)...); err != nil {
			t.Fatal(err)
		}
		return created
	}
	refused := func(err error, want string) {
		t.Helper()
		if !errors.Is(err, peer.ErrJoinRefused) || !strings.Contains(err.Error(), want) {
			t.Fatalf("join: %v; want refused saying %q", err, want)
		}
	}

	once := create("--uses", "1")
	if err := join(1, once.Token); err != nil {
		t.Fatalf("first join with a one-use token: %v", err)
	}
	refused(join(2, once.Token), "used 1 times")

	short := create("--ttl", "2s")
	if err := join(2, short.Token); err != nil {
		t.Fatalf("join with a 2 s token at once: %v", err)
	}
	testcluster.WaitFor(t, 10*time.Second, "the 2 s token to expire", func() (bool, error) {
		return time.Now().After(short.Expires.Add(100 * time.Millisecond)), fmt.Errorf("it expires at %v", short.Expires)
	})
	refused(join(1, short.Token), "expired")

	old := c.JoinToken()
	for round := range 5 {
		revoked := create()
		herd(t, c, 0, "cluster", "join-token", "revoke", revoked.ID)
		for _, node := range []int{1, 2} {
			refused(join(node, revoked.Token), "revoked")
		}
		var rotated api.JoinTokenResponse
		if err := c.HerdJSON(ctx(t), 0, &rotated, "cluster", "rotate-join-token"); err != nil {
			t.Fatal(err)
		}
		for _, node := range []int{1, 2} {
			refused(join(node, old), "wrong join secret")
		}
		if err := join(2, rotated.Token); err != nil {
			t.Fatalf("round %d: the rotated secret: %v", round, err)
		}
		old = rotated.Token
	}

	var tokens []cluster.JoinToken
	if err := c.HerdJSON(ctx(t), 1, &tokens, "cluster", "join-token", "list"); err != nil {
		t.Fatal(err)
	}
	byID := map[string]cluster.JoinToken{}
	for _, tk := range tokens {
		if tk.Hash != "" {
			t.Fatalf("join-token list shows a hash: %+v", tk)
		}
		byID[tk.ID] = tk
	}
	if got := byID[once.ID]; got.Used != 1 || got.Uses != 1 {
		t.Fatalf("the one-use token is listed as %+v", got)
	}
	// (The expired token is gone: a create forgets the tokens expired by
	// its time.)
	if _, listed := byID[short.ID]; listed {
		t.Fatalf("the expired token is still listed after later creates: %+v", byID[short.ID])
	}
	if list := herd(t, c, 2, "cluster", "join-token", "list"); !strings.Contains(list, "used up") || !strings.Contains(list, "revoked") {
		t.Fatalf("join-token list:\n%s", list)
	}
}
