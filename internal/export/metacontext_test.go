package export

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"testing"

	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/gateway"
	"github.com/herd-storage/herd/internal/layout"
	"github.com/herd-storage/herd/internal/nbd"
)

// newChainGateway serves a tree of snapshots and clones:
//
//	vm@s1 (1) <- vm@s2 (2) <- vm (3)
//	vm@s1 (1) <- copy@s1 (4) <- copy (5)    a clone of vm@s1, snapshotted with the same tag
//	secret@x (6) <- secret (7)
func newChainGateway(t *testing.T) (*gateway.Gateway, *fakeCluster) {
	t.Helper()
	vdi := func(id uint32, name, tag string, parent uint32) cluster.VDI {
		return cluster.VDI{ID: id, Name: name, Size: 1 << 30, Copies: 1, ObjectSize: 1 << 20, Snapshot: tag != "", Tag: tag, Parent: parent}
	}
	c := &fakeCluster{locks: map[string]string{}, vdis: []cluster.VDI{
		vdi(1, "vm", "s1", 0), vdi(2, "vm", "s2", 1), vdi(3, "vm", "", 2),
		vdi(4, "copy", "s1", 1), vdi(5, "copy", "", 4),
		vdi(6, "secret", "x", 0), vdi(7, "secret", "", 6),
	}}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	return gateway.New(c, layout.NewHistory(c, logger), noReplicas{}, logger, gateway.Options{}), c
}

func TestMetaContexts(t *testing.T) {
	gw, c := newChainGateway(t)
	all := Backend{Gateway: gw}
	limited := Backend{Gateway: gw, Authorize: func(session nbd.Session) (Access, error) {
		if session.Client == "revoked" {
			return Access{}, errors.New("certificate revoked")
		}
		return Access{Match: func(name string) bool { return name == "vm" || name == "copy" }}, nil
	}}
	client := nbd.Session{Client: "alice", TLS: true}
	const (
		depth = "qemu:allocation-depth"
		b     = "qemu:dirty-bitmap:"
	)
	for _, test := range []struct {
		backend Backend
		export  string
		queries []string
		list    bool
		want    string
	}{
		// Every context of the export: one bitmap per ancestor snapshot,
		// nearest first; a snapshot is not its own ancestor.
		{all, "vm", nil, true, "[qemu:allocation-depth qemu:dirty-bitmap:s2 qemu:dirty-bitmap:s1]"},
		{all, "ro/vm", []string{b}, true, "[qemu:dirty-bitmap:s2 qemu:dirty-bitmap:s1]"},
		{all, "vm@s2", nil, true, "[qemu:allocation-depth qemu:dirty-bitmap:s1]"},
		{all, "vm@s1", []string{"qemu:"}, true, "[qemu:allocation-depth]"},
		// A clone's chain: its own s1 by tag, the origin's by full name.
		{all, "copy", []string{"qemu:", b}, true, "[qemu:allocation-depth qemu:dirty-bitmap:s1 qemu:dirty-bitmap:vm@s1]"},
		{all, "vm", []string{b + "s1", "x-other:y", "nocolon", b + "copy@s1"}, true, "[qemu:dirty-bitmap:s1]"},
		// SET: exact names; either form of an ancestor; wildcards and
		// what is not an ancestor select nothing.
		{all, "copy", []string{b + "vm@s1", "qemu:", b, b + "s1", b + "s2", depth}, false, "[qemu:dirty-bitmap:vm@s1 qemu:dirty-bitmap:s1 qemu:allocation-depth]"},
		{all, "vm", []string{b + "vm@s2", b + "copy@s1", b + "vm@s1"}, false, "[qemu:dirty-bitmap:vm@s2 qemu:dirty-bitmap:vm@s1]"},
		{all, "vm@s2", []string{b + "s2"}, false, "[]"},
		{all, "missing", nil, true, "[]"},
		{all, "missing", []string{depth}, false, "[]"},
		// A client sees no contexts on what it may not open, as on an
		// unknown name.
		{limited, "vm", []string{b}, true, "[qemu:dirty-bitmap:s2 qemu:dirty-bitmap:s1]"},
		{limited, "secret", nil, true, "[]"},
		{limited, "secret@x", []string{depth}, false, "[]"},
		{limited, "nothing", []string{depth}, false, "[]"},
	} {
		got, err := test.backend.MetaContexts(context.Background(), test.export, client, test.queries, test.list)
		if err != nil {
			t.Errorf("%s %q: %v", test.export, test.queries, err)
			continue
		}
		if fmt.Sprint(got) != test.want {
			t.Errorf("%s %q (list %v): %v, want %s", test.export, test.queries, test.list, got, test.want)
		}
	}
	// Refused names cost no cluster lookup (their timing tells nothing).
	before, _ := c.counts()
	for _, name := range []string{"secret", "ro/secret", "secret@x", "nothing"} {
		limited.MetaContexts(context.Background(), name, client, nil, true)
	}
	if after, _ := c.counts(); after != before {
		t.Errorf("%d lookups for names the client may not open", after-before)
	}
	if _, err := limited.MetaContexts(context.Background(), "vm", nbd.Session{Client: "revoked", TLS: true}, nil, true); !errors.Is(err, nbd.ErrPermission) {
		t.Errorf("revoked client: %v, want ErrPermission (NBD_REP_ERR_POLICY, as at NBD_OPT_GO)", err)
	}
}

// TestHasMetaContext: an open export serves the contexts MetaContexts
// offers for its name.
func TestHasMetaContext(t *testing.T) {
	gw, _ := newChainGateway(t)
	backend := Backend{Gateway: gw}
	for _, test := range []struct {
		export string
		has    map[string]bool
	}{
		{"vm@s2", map[string]bool{
			"qemu:allocation-depth": true, "qemu:dirty-bitmap:s1": true, "qemu:dirty-bitmap:vm@s1": true,
			"qemu:dirty-bitmap:s2": false, "qemu:dirty-bitmap:": false, "qemu:": false, "base:allocation": false,
		}},
		{"copy", map[string]bool{
			"qemu:dirty-bitmap:s1": true, "qemu:dirty-bitmap:vm@s1": true, "qemu:dirty-bitmap:copy@s1": true,
			"qemu:dirty-bitmap:s2": false, "qemu:dirty-bitmap:x": false,
		}},
	} {
		e, err := backend.Open(context.Background(), test.export, nbd.Session{InfoOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		statuser := e.(nbd.MetaStatuser)
		for name, want := range test.has {
			if got := statuser.HasMetaContext(name); got != want {
				t.Errorf("%s: HasMetaContext(%q) = %v, want %v", test.export, name, got, want)
			}
		}
		e.Close()
	}
}
