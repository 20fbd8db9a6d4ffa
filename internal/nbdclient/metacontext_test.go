package nbdclient

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/herd-storage/herd/internal/nbd"
	"github.com/herd-storage/herd/internal/nbd/wire"
	"github.com/herd-storage/herd/internal/nbdclient/nbdtest"
)

const (
	bitmapS1 = "qemu:dirty-bitmap:s1"
	depth    = "qemu:allocation-depth"
)

// TestMetaStatus: extra metadata contexts against herd's real server,
// beside base:allocation, and without it.
func TestMetaStatus(t *testing.T) {
	disk := nbdtest.NewDisk("vm1", 1<<20)
	disk.Meta = map[string][]nbd.MetaExtent{
		bitmapS1: {{Length: 4096, Flags: 0}, {Length: 8192, Flags: 1}, {Length: 1<<20 - 12288, Flags: 0}},
		depth:    {{Length: 65536, Flags: 1}, {Length: 65536, Flags: 2}, {Length: 1<<20 - 131072, Flags: 0}},
	}
	address := serve(t, disk)
	disk.WriteAt(make([]byte, 4096), 8192)

	c := dial(t, &Dialer{MetaContexts: []string{bitmapS1, depth, "qemu:dirty-bitmap:nope", bitmapS1}}, address, "vm1")
	if got := fmt.Sprint(c.MetaContexts()); got != "[qemu:allocation-depth qemu:dirty-bitmap:s1]" {
		t.Fatalf("selected %s", got)
	}
	if !c.CanBlockStatus() || !c.CanMetaStatus(bitmapS1) || c.CanMetaStatus("qemu:dirty-bitmap:nope") {
		t.Fatalf("can: block status %v, s1 %v", c.CanBlockStatus(), c.CanMetaStatus(bitmapS1))
	}
	ctx := testContext(t)
	for _, test := range []struct {
		context        string
		offset, length uint64
		want           string
	}{
		{bitmapS1, 0, 1 << 20, "[{4096 0} {8192 1} {1036288 0}]"},
		{bitmapS1, 6000, 100, "[{100 1}]"},
		{bitmapS1, 100, 10000, "[{3996 0} {6004 1}]"},
		{depth, 60000, 200000, "[{5536 1} {65536 2} {128928 0}]"},
	} {
		got, err := c.MetaStatus(ctx, test.context, test.offset, test.length)
		if err != nil || fmt.Sprint(got) != test.want {
			t.Errorf("MetaStatus(%s, %d, %d): %v %v, want %s", test.context, test.offset, test.length, got, err, test.want)
		}
	}
	// base:allocation still reads, from the same replies.
	extents, err := c.BlockStatus(ctx, 0, 1<<20)
	if err != nil || fmt.Sprint(extents) != "[{8192 true true} {4096 false false} {1036288 true true}]" {
		t.Errorf("BlockStatus: %v %v", extents, err)
	}
	if _, err := c.MetaStatus(ctx, "qemu:dirty-bitmap:nope", 0, 10); !errors.Is(err, ErrUnsupported) {
		t.Errorf("MetaStatus of an unselected context: %v", err)
	}
	if _, err := c.MetaStatus(ctx, depth, 1<<20-10, 11); !errors.Is(err, ErrInvalid) {
		t.Errorf("MetaStatus past the end: %v", err)
	}

	// Without base:allocation: the extra contexts alone.
	c = dial(t, &Dialer{NoMetaContext: true, MetaContexts: []string{depth}}, address, "vm1")
	if c.CanBlockStatus() || !c.CanMetaStatus(depth) {
		t.Fatalf("NoMetaContext with MetaContexts: block status %v, depth %v", c.CanBlockStatus(), c.CanMetaStatus(depth))
	}
	if got, err := c.MetaStatus(ctx, depth, 0, 1<<20); err != nil || fmt.Sprint(got) != "[{65536 1} {65536 2} {917504 0}]" {
		t.Errorf("MetaStatus alone: %v %v", got, err)
	}
	// Nothing asked: nothing selected, as before.
	c = dial(t, nil, address, "vm1")
	if len(c.MetaContexts()) != 0 || !c.CanBlockStatus() {
		t.Errorf("default dialer: %v %v", c.MetaContexts(), c.CanBlockStatus())
	}
	// Names the option cannot carry are refused before dialling.
	for _, names := range [][]string{{"nocolon"}, {":leaf"}, {"qemu:"}, make([]string, MaximumMetaContexts+1)} {
		d := Dialer{MetaContexts: names}
		if _, err := d.Dial(ctx, address, "vm1"); !errors.Is(err, ErrInvalid) {
			t.Errorf("MetaContexts %q: %v", names, err)
		}
	}
}

// TestMetaStatusViolations: a BLOCK_STATUS reply must carry exactly one
// chunk per selected context, each for a selected id.
func TestMetaStatusViolations(t *testing.T) {
	script := defaultScript()
	script.extra = []selectedContext{{bitmapS1, 8}}
	good := func(r request, id uint32, flags uint32) []byte {
		return chunk(0, wire.ReplyTypeBlockStatus, r.handle, be32(id), be32(r.length), be32(flags))
	}
	done := func(r request, id uint32, flags uint32) []byte {
		return chunk(wire.ReplyFlagDone, wire.ReplyTypeBlockStatus, r.handle, be32(id), be32(r.length), be32(flags))
	}
	cases := map[string]func(r request) []byte{
		"valid":              func(r request) []byte { return append(good(r, 7, 3), done(r, 8, 1)...) },
		"valid, other order": func(r request) []byte { return append(good(r, 8, 1), done(r, 7, 0)...) },
		"missing context":    func(r request) []byte { return done(r, 7, 0) },
		"context twice":      func(r request) []byte { return append(good(r, 8, 1), done(r, 8, 1)...) },
		"unselected id":      func(r request) []byte { return append(good(r, 7, 0), append(good(r, 9, 0), done(r, 8, 1)...)...) },
		"bad other context": func(r request) []byte {
			return append(chunk(0, wire.ReplyTypeBlockStatus, r.handle, be32(7), be32(0), be32(0)), done(r, 8, 1)...)
		},
	}
	for name, reply := range cases {
		t.Run(name, func(t *testing.T) {
			address := scriptedServer(t, script.bytes(), func(r request, w io.Writer) bool {
				w.Write(reply(r))
				return true
			})
			c, err := (&Dialer{MetaContexts: []string{bitmapS1}}).Dial(testContext(t), address, "vm1")
			if err != nil {
				t.Fatal(err)
			}
			extents, err := c.MetaStatus(testContext(t), bitmapS1, 0, 65536)
			if strings.HasPrefix(name, "valid") {
				if err != nil || fmt.Sprint(extents) != "[{65536 1}]" {
					t.Fatalf("MetaStatus: %v %v", extents, err)
				}
				c.Close()
				return
			}
			if !errors.Is(err, ErrProtocol) {
				t.Fatalf("MetaStatus: %v %v, want ErrProtocol", extents, err)
			}
			c.Close()
		})
	}
	// Handshake: two contexts with one id, or one context twice.
	for name, extra := range map[string][]selectedContext{
		"shared id":   {{bitmapS1, 7}},
		"twice":       {{bitmapS1, 8}, {bitmapS1, 9}},
		"unrequested": {{depth, 8}},
	} {
		s := defaultScript()
		s.extra = extra
		_, err := (&Dialer{MetaContexts: []string{bitmapS1}}).Dial(testContext(t), scriptedServer(t, s.bytes(), nil), "vm1")
		if !errors.Is(err, ErrProtocol) {
			t.Errorf("%s: %v, want ErrProtocol", name, err)
		}
	}
}
