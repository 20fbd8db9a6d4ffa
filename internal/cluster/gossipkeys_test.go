package cluster

import (
	"bytes"
	"io"
	"log"
	"net"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
)

// TestGossipKeyringSteps: the node's keyring through a rotation, each
// change saved, the primary first; a key being made for a rotation this
// node starts is not cleaned away.
func TestGossipKeyringSteps(t *testing.T) {
	old, next := bytes.Repeat([]byte{1}, 32), bytes.Repeat([]byte{2}, 32)
	var saved [][][]byte
	g, err := NewGossipKeys([][]byte{old}, func(keys [][]byte) error {
		saved = append(saved, keys)
		return nil
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.add([][]byte{next}, false); err != nil {
		t.Fatal(err)
	}
	if g.PrimaryID() != GossipKeyID(old) || len(g.IDs()) != 2 {
		t.Fatalf("after add: primary %s, keys %v", g.PrimaryID(), g.IDs())
	}
	if err := g.add([][]byte{next}, false); err != nil || len(saved) != 1 {
		t.Fatalf("adding a key held already: %v, %d saves (want 1)", err, len(saved))
	}
	if err := g.use(GossipKeyID(next)); err != nil {
		t.Fatal(err)
	}
	if last := saved[len(saved)-1]; !bytes.Equal(last[0], next) || !bytes.Equal(last[1], old) {
		t.Fatalf("saved after use: %x", last)
	}
	g.pending = old
	if err := g.keepPrimaryOnly(); err != nil || len(g.IDs()) != 2 {
		t.Fatalf("cleaning while a rotation is being started: %v, keys %v", err, g.IDs())
	}
	g.pending = nil
	if err := g.keepPrimaryOnly(); err != nil {
		t.Fatal(err)
	}
	if ids := g.IDs(); len(ids) != 1 || ids[0] != GossipKeyID(next) {
		t.Fatalf("after the old key was removed: %v", ids)
	}
	if err := g.use(GossipKeyID(old)); err == nil {
		t.Fatal("using a key the keyring does not hold")
	}
}

// TestGossipPacketsUnderTheOldKeyAreDropped: two memberlist nodes go
// through the steps of a rotation (both add the key, both use it, both
// drop the old one) and keep answering each other's pings throughout; a
// sender holding only the old key is answered before the switch and
// dropped after it.
func TestGossipPacketsUnderTheOldKeyAreDropped(t *testing.T) {
	old, next := bytes.Repeat([]byte{1}, 32), bytes.Repeat([]byte{2}, 32)
	start := func(name string, keys ...[]byte) (*memberlist.Memberlist, *GossipKeys) {
		t.Helper()
		g, err := NewGossipKeys(keys, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		mc := memberlist.DefaultLocalConfig()
		mc.Name, mc.BindAddr, mc.BindPort, mc.AdvertisePort = name, "127.0.0.1", 0, 0
		mc.Keyring = g.Keyring
		mc.GossipVerifyIncoming, mc.GossipVerifyOutgoing = true, true
		mc.ProbeTimeout = 300 * time.Millisecond
		mc.Logger = log.New(io.Discard, "", 0)
		m, err := memberlist.Create(mc)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Shutdown() })
		return m, g
	}
	a, ga := start("a", old)
	b, gb := start("b", old)
	stale, _ := start("stale", old)
	address := func(m *memberlist.Memberlist) net.Addr {
		return &net.UDPAddr{IP: net.ParseIP("127.0.0.1"), Port: int(m.LocalNode().Port)}
	}
	ping := func(from, to *memberlist.Memberlist, name string) error {
		var err error
		for range 3 { // UDP: a packet may be lost
			if _, err = from.Ping(name, address(to)); err == nil {
				return nil
			}
		}
		return err
	}
	pingBoth := func(when string) {
		t.Helper()
		if err := ping(a, b, "b"); err != nil {
			t.Fatalf("%s: a cannot ping b: %v", when, err)
		}
		if err := ping(b, a, "a"); err != nil {
			t.Fatalf("%s: b cannot ping a: %v", when, err)
		}
	}
	pingBoth("before")
	if err := ping(stale, a, "a"); err != nil {
		t.Fatalf("before the rotation a sender with the old key is not answered: %v", err)
	}
	for _, g := range []*GossipKeys{ga, gb} {
		if err := g.add([][]byte{next}, false); err != nil {
			t.Fatal(err)
		}
	}
	pingBoth("installed")
	if err := ga.use(GossipKeyID(next)); err != nil {
		t.Fatal(err)
	}
	pingBoth("a switched, b not yet")
	if err := gb.use(GossipKeyID(next)); err != nil {
		t.Fatal(err)
	}
	pingBoth("both switched")
	for _, g := range []*GossipKeys{ga, gb} {
		if err := g.keepPrimaryOnly(); err != nil {
			t.Fatal(err)
		}
	}
	pingBoth("old key removed")
	if _, err := stale.Ping("a", address(a)); err == nil {
		t.Fatal("after the rotation a ping under the old key was answered")
	}
}
