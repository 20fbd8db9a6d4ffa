package statemachine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/herd-storage/herd/internal/ec"
)

// ecHarness is a formatted cluster of 3 copies whose nodes are in
// zones (zones[i] for node i, "" for none), at level.
func ecHarness(t *testing.T, level int, zones ...string) *harness {
	t.Helper()
	h := newHarness(t)
	for i, zone := range zones {
		h.join(string(rune('a'+i)), zone, "1")
	}
	if _, err := h.apply(commandFormat, formatCommand{Copies: 3, ObjectSize: 4 << 20, Time: t0}); err != nil {
		t.Fatal(err)
	}
	if level > LevelBase {
		if _, err := h.apply(commandFeatureLevel, featureLevelCommand{Level: level, Time: t0}); err != nil {
			t.Fatal(err)
		}
	}
	return h
}

func (h *harness) mustApply(ct commandType, payload any) any {
	h.t.Helper()
	v, err := h.apply(ct, payload)
	if err != nil {
		h.t.Fatalf("command %d %+v: %v", ct, payload, err)
	}
	return v
}

func (h *harness) check() {
	h.t.Helper()
	if err := checkState(h.state()); err != nil {
		h.t.Fatal(err)
	}
}

// TestErasureCodingGatedByLevel: below LevelErasureCoding a create's
// scheme is ignored, as a binary older than the field (which drops it)
// applies the entry; from the level on the VDI is erasure-coded with M+1
// copies. The proposer refuses a scheme below the level with the error
// requires gives, and refuses a bad scheme and a scheme with copies
// before anything is proposed.
func TestErasureCodingGatedByLevel(t *testing.T) {
	six := []string{"", "", "", "", "", ""}
	h := ecHarness(t, LevelSessionProof, six...)
	v := h.mustApply(commandVDICreate, vdiCreateCommand{Name: "early", Size: 1 << 30, EC: "4+2", Time: t0}).(VDI)
	if v.EC != "" || v.Copies != 3 {
		t.Fatalf("at level %d a create with a scheme made %+v; an older binary makes a VDI of the format's 3 copies", LevelSessionProof, v)
	}
	if _, ok := h.state().SchemeOf(v.ID); ok {
		t.Fatal("SchemeOf says the VDI of copies is erasure-coded")
	}

	// The proposer: below the level, refused with requires' error; a
	// bad scheme and a scheme with copies are refused whatever the
	// level, and nothing reaches the proposer (nil: it would panic).
	c := NewCommands(nil, h.fsm, "", "")
	upgrade := errors.New("upgrade first")
	var asked Feature
	requires := func(f Feature) error { asked = f; return upgrade }
	if _, err := c.CreateVDI(context.Background(), "db", 1<<30, false, 0, "4+2", requires); !errors.Is(err, upgrade) || asked != FeatureErasureCoding {
		t.Fatalf("a scheme below the level: %v (asked for %+v), want requires' error for FeatureErasureCoding", err, asked)
	}
	for _, bad := range []struct{ scheme, want string }{
		{"4+0", `ec: invalid scheme 4+0: M (parity chunks) must be 1..3, not 0`},
		{"9+1", `ec: invalid scheme 9+1: K (data chunks) must be 2..8, not 9`},
		{"x", `ec: invalid scheme "x": want K+M data and parity chunks, as in "4+2"`},
		{"4+2 ", `write it without spaces`},
	} {
		_, err := c.CreateVDI(context.Background(), "db", 1<<30, false, 0, bad.scheme, nil)
		if !errors.Is(err, ErrInvalid) || !errors.Is(err, ec.ErrScheme) || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("scheme %q: %v, want ErrInvalid saying %q", bad.scheme, err, bad.want)
		}
	}
	if _, err := c.CreateVDI(context.Background(), "db", 1<<30, false, 2, "4+2", nil); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "copies 2 and erasure coding 4+2 cannot be asked for together") {
		t.Fatalf("copies with a scheme: %v", err)
	}

	h.mustApply(commandFeatureLevel, featureLevelCommand{Level: LevelErasureCoding, Time: t0})
	v = h.mustApply(commandVDICreate, vdiCreateCommand{Name: "db", Size: 1 << 30, EC: "4+2", Time: t0}).(VDI)
	if v.EC != "4+2" || v.Copies != 3 {
		t.Fatalf("at level %d: %+v, want erasure coding 4+2 with 3 copies", LevelErasureCoding, v)
	}
	v = h.mustApply(commandVDICreate, vdiCreateCommand{Name: "small", Size: 1 << 30, EC: "2+1", Time: t0}).(VDI)
	if v.EC != "2+1" || v.Copies != 2 {
		t.Fatalf("2+1: %+v, want 2 copies (M+1)", v)
	}
	if scheme, ok := h.state().SchemeOf(v.ID); !ok || scheme != (ec.Scheme{K: 2, M: 1}) {
		t.Fatalf("SchemeOf(%d) = %v, %v", v.ID, scheme, ok)
	}
	reads := NewReads(h.fsm)
	if scheme, ok := reads.VDIScheme(v.ID); !ok || scheme.String() != "2+1" {
		t.Fatalf("Reads.VDIScheme(%d) = %v, %v", v.ID, scheme, ok)
	}
	if f := v.SpaceFactor(); f != 1.5 {
		t.Fatalf("2+1's space factor %v, want 1.5", f)
	}
	// The apply refuses what a proposer should not have sent.
	if _, err := h.apply(commandVDICreate, vdiCreateCommand{Name: "both", Size: 1 << 30, EC: "2+1", Copies: 2, Time: t0}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("an entry with copies and a scheme: %v, want ErrInvalid", err)
	}
	if _, err := h.apply(commandVDICreate, vdiCreateCommand{Name: "bad", Size: 1 << 30, EC: "2+4", Time: t0}); !errors.Is(err, ErrInvalid) || !errors.Is(err, ec.ErrScheme) {
		t.Fatalf("an entry with scheme 2+4: %v, want ErrInvalid", err)
	}
	if _, ok := h.state().VDIs["both"]; ok {
		t.Fatal("a refused create made a VDI")
	}
	events := h.state().Events
	if last := events[len(events)-1].Text; !strings.Contains(last, `vdi "small" created (1073741824 bytes, erasure coding 2+1)`) {
		t.Fatalf("the create's event says %q", last)
	}
	h.check()
}

// TestErasureCodingNeedsNodes: a create is refused when the nodes
// cannot hold K+M chunks, one per node and, with zones, at most M per
// zone; the message names the numbers and the zones.
func TestErasureCodingNeedsNodes(t *testing.T) {
	h := ecHarness(t, LevelErasureCoding, "", "", "")
	_, err := h.apply(commandVDICreate, vdiCreateCommand{Name: "db", Size: 1 << 30, EC: "4+2", Time: t0})
	if !errors.Is(err, ErrTooFewNodes) || !strings.Contains(err.Error(), "erasure coding 4+2 needs 6 nodes, the cluster has 3") {
		t.Fatalf("4+2 on 3 nodes: %v", err)
	}
	// A draining node does not count.
	h = ecHarness(t, LevelErasureCoding, "", "", "", "")
	h.mustApply(commandNodeDrain, nodeDrainCommand{ID: "d", Drain: true, Time: t0})
	_, err = h.apply(commandVDICreate, vdiCreateCommand{Name: "db", Size: 1 << 30, EC: "2+2", Time: t0})
	if !errors.Is(err, ErrTooFewNodes) || !strings.Contains(err.Error(), "erasure coding 2+2 needs 4 nodes, besides 1 node draining, the cluster has 3") {
		t.Fatalf("2+2 on 4 nodes, one draining: %v", err)
	}

	// Zones: 6 nodes in z1 (3), z2 (2), z3 (1) hold 2+2+1 = 5 chunks of
	// 4+2, not 6.
	z := ecHarness(t, LevelErasureCoding, "z1", "z1", "z1", "z2", "z2", "z3")
	_, err = z.apply(commandVDICreate, vdiCreateCommand{Name: "db", Size: 1 << 30, EC: "4+2", Time: t0})
	want := "erasure coding 4+2 needs 6 nodes with at most 2 in a zone, the cluster has zones that hold 5 chunks: z1 (3 nodes, 2 chunks), z2 (2 nodes, 2 chunks), z3 (1 node, 1 chunk)"
	if !errors.Is(err, ErrTooFewNodes) || !strings.Contains(err.Error(), want) {
		t.Fatalf("4+2 in zones of 3, 2 and 1 nodes: %v\nwant it to say %s", err, want)
	}
	// 3+2 fits (5 chunks). 3+3's chunks fit (3+2+1 = 6), not the 4
	// copies of its map objects in 3 zones.
	z.mustApply(commandVDICreate, vdiCreateCommand{Name: "db", Size: 1 << 30, EC: "3+2", Time: t0})
	if _, err := z.apply(commandVDICreate, vdiCreateCommand{Name: "wide", Size: 1 << 30, EC: "3+3", Time: t0}); !errors.Is(err, ErrTooFewNodes) || !strings.Contains(err.Error(), "4 copies need 4 zones") {
		t.Fatalf("3+3 in 3 zones: %v", err)
	}
	// 2+2 fits its chunks in two zones of two, but its 3 copies of map
	// objects need 3 zones.
	two := newHarness(t)
	for i, zone := range []string{"z1", "z1", "z2", "z2"} {
		two.join(string(rune('a'+i)), zone, "1")
	}
	two.mustApply(commandFormat, formatCommand{Copies: 2, ObjectSize: 4 << 20, Time: t0})
	two.mustApply(commandFeatureLevel, featureLevelCommand{Level: LevelErasureCoding, Time: t0})
	_, err = two.apply(commandVDICreate, vdiCreateCommand{Name: "db", Size: 1 << 30, EC: "2+2", Time: t0})
	if !errors.Is(err, ErrTooFewNodes) || !strings.Contains(err.Error(), "erasure coding 2+2 keeps 3 copies of its map objects and recent writes") || !strings.Contains(err.Error(), "3 copies need 3 zones") {
		t.Fatalf("2+2 in 2 zones: %v", err)
	}
	// Nodes without a zone among zoned ones are a zone of their own.
	mixed := ecHarness(t, LevelErasureCoding, "z1", "z1", "", "", "z2", "z2")
	_, err = mixed.apply(commandVDICreate, vdiCreateCommand{Name: "db", Size: 1 << 30, EC: "3+1", Time: t0})
	if !errors.Is(err, ErrTooFewNodes) || !strings.Contains(err.Error(), "the cluster has zones that hold 3 chunks: (no zone) (2 nodes, 1 chunk), z1 (2 nodes, 1 chunk), z2 (2 nodes, 1 chunk)") {
		t.Fatalf("3+1 in two zones of 2 and 2 nodes without one: %v", err)
	}
	z.check()
}

// TestErasureCodingInherited: snapshots, clones and rollbacks keep the
// scheme and its copies, so does a garbage record; SchemeOf finds it by
// id for all of them.
func TestErasureCodingInherited(t *testing.T) {
	h := ecHarness(t, LevelErasureCoding, "", "", "", "", "", "")
	db := h.mustApply(commandVDICreate, vdiCreateCommand{Name: "db", Size: 1 << 30, EC: "4+2", Time: t0}).(VDI)
	snap := h.mustApply(commandVDISnapshot, vdiSnapshotCommand{Name: "db", Tag: "s1", Time: t0}).(SnapshotResult)
	clone := h.mustApply(commandVDIClone, vdiCloneCommand{Snapshot: "db@s1", Name: "clone", Time: t0}).(VDI)
	h.mustApply(commandVDISnapshot, vdiSnapshotCommand{Name: "db", Tag: "s2", Time: t0})
	afterS2 := h.state().VDIs["db"].ID
	back := h.mustApply(commandVDIRollback, vdiRollbackCommand{Name: "db", Tag: "s1", Time: t0}).(VDI)
	// The VDI the rollback replaced had no snapshot below it: garbage.
	s := h.state()
	var garbage *Garbage
	for i := range s.Garbage {
		if s.Garbage[i].ID == afterS2 {
			garbage = &s.Garbage[i]
		}
	}
	if garbage == nil || garbage.EC != "4+2" || garbage.Copies != 3 {
		t.Fatalf("the garbage record of the VDI a rollback replaced: %+v, want erasure coding 4+2 and 3 copies", garbage)
	}
	for _, c := range []struct {
		what string
		v    VDI
	}{
		{"the snapshot", *s.Snapshots[db.ID]},
		{"the VDI continuing the name after the snapshot", snap.VDI},
		{"the clone", clone},
		{"the rollback", back},
		{"the clone as the state holds it", *s.VDIs["clone"]},
	} {
		if c.v.EC != "4+2" || c.v.Copies != 3 {
			t.Errorf("%s: erasure coding %q, %d copies; want 4+2 and 3", c.what, c.v.EC, c.v.Copies)
		}
		if scheme, ok := s.SchemeOf(c.v.ID); !ok || scheme.String() != "4+2" {
			t.Errorf("%s: SchemeOf = %v, %v", c.what, scheme, ok)
		}
	}
	if scheme, ok := s.SchemeOf(afterS2); !ok || scheme.String() != "4+2" {
		t.Errorf("a garbage record: SchemeOf = %v, %v", scheme, ok)
	}
	if copies, ok := s.CopiesOf(afterS2); !ok || copies != 3 {
		t.Errorf("a garbage record: CopiesOf = %d, %v", copies, ok)
	}
	h.mustApply(commandGarbageDone, garbageDoneCommand{ID: afterS2})
	if _, ok := h.state().SchemeOf(afterS2); ok {
		t.Error("a VDI freed for good still has a scheme")
	}
	if _, ok := h.state().SchemeOf(h.state().NextVDIID); ok {
		t.Error("an id not handed out has a scheme")
	}
	// The snapshot's JSON (the admin API's, the log snapshot's) has it.
	data, err := json.Marshal(*s.Snapshots[db.ID])
	if err != nil || !strings.Contains(string(data), `"ec":"4+2"`) {
		t.Fatalf("a snapshot's JSON: %s, %v", data, err)
	}
	h.check()
}

// TestErasureCodingAckZoneRefused: --ack zone is for copies; a rollback
// that would give an erasure-coded snapshot to a name set to --ack zone
// is refused too.
func TestErasureCodingAckZoneRefused(t *testing.T) {
	h := ecHarness(t, LevelErasureCoding, "z1", "z2", "z3", "z1", "z2", "z3")
	h.mustApply(commandVDICreate, vdiCreateCommand{Name: "x", Size: 1 << 30, EC: "4+2", Time: t0})
	zone, all := AckZone, AckAll
	_, err := h.apply(commandVDISet, vdiSetCommand{Name: "x", Settings: VDISettings{Ack: &zone, Exclusive: ptr(true)}})
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), `vdi "x" is erasure-coded (4+2): --ack zone needs copies`) {
		t.Fatalf("--ack zone on an erasure-coded VDI: %v", err)
	}
	if v := h.state().VDIs["x"]; v.Ack != "" || v.Exclusive {
		t.Fatalf("a refused set changed the VDI: %+v", v)
	}
	h.mustApply(commandVDISet, vdiSetCommand{Name: "x", Settings: VDISettings{Ack: &all}})

	// x@s1 is erasure-coded; x is deleted and created again with copies
	// and --ack zone; a rollback to s1 would make it erasure-coded.
	h.mustApply(commandVDISnapshot, vdiSnapshotCommand{Name: "x", Tag: "s1", Time: t0})
	h.mustApply(commandVDIDelete, vdiDeleteCommand{Name: "x"})
	h.mustApply(commandVDICreate, vdiCreateCommand{Name: "x", Size: 1 << 30, Time: t0})
	h.mustApply(commandVDISet, vdiSetCommand{Name: "x", Settings: VDISettings{Ack: &zone}})
	_, err = h.apply(commandVDIRollback, vdiRollbackCommand{Name: "x", Tag: "s1", Time: t0})
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "set --ack all first") {
		t.Fatalf("a rollback giving an erasure-coded snapshot to a VDI of --ack zone: %v", err)
	}
	h.mustApply(commandVDISet, vdiSetCommand{Name: "x", Settings: VDISettings{Ack: &all}})
	if v := h.mustApply(commandVDIRollback, vdiRollbackCommand{Name: "x", Tag: "s1", Time: t0}).(VDI); v.EC != "4+2" || v.Copies != 3 {
		t.Fatalf("the rollback: %+v", v)
	}
	h.check()
}

// TestErasureCodingKeepsNodesOnDrain: a drain and a zone change must
// leave the nodes (zones) an erasure-coded VDI's chunks need, a deleted
// one waiting to be freed too.
func TestErasureCodingKeepsNodesOnDrain(t *testing.T) {
	h := ecHarness(t, LevelErasureCoding, "", "", "", "", "", "", "")
	v := h.mustApply(commandVDICreate, vdiCreateCommand{Name: "db", Size: 1 << 30, EC: "4+2", Time: t0}).(VDI)
	h.mustApply(commandNodeDrain, nodeDrainCommand{ID: "g", Drain: true, Time: t0})
	_, err := h.apply(commandNodeDrain, nodeDrainCommand{ID: "f", Drain: true, Time: t0})
	if !errors.Is(err, ErrTooFewNodes) || !strings.Contains(err.Error(), `draining node f: vdi "db": erasure coding 4+2 needs 6 nodes, the drain would leave 5; add a node first`) {
		t.Fatalf("draining a second of 7 nodes under 4+2: %v", err)
	}
	h.mustApply(commandVDIDelete, vdiDeleteCommand{Name: "db"})
	_, err = h.apply(commandNodeDrain, nodeDrainCommand{ID: "f", Drain: true, Time: t0})
	if !errors.Is(err, ErrTooFewNodes) || !strings.Contains(err.Error(), fmt.Sprintf("deleted vdi %d (its objects not freed yet): erasure coding 4+2 needs 6 nodes", v.ID)) {
		t.Fatalf("draining while the 4+2 VDI waits to be freed: %v", err)
	}
	h.mustApply(commandGarbageDone, garbageDoneCommand{ID: v.ID})
	h.mustApply(commandNodeDrain, nodeDrainCommand{ID: "f", Drain: true, Time: t0})
	h.check()

	// Zones: z1 z1 z2 z2 z3 z3 hold the 6 chunks of 4+2 (2 a zone);
	// moving a node from z3 to z1 leaves 5.
	z := ecHarness(t, LevelErasureCoding, "z1", "z1", "z2", "z2", "z3", "z3")
	z.mustApply(commandVDICreate, vdiCreateCommand{Name: "db", Size: 1 << 30, EC: "4+2", Time: t0})
	zone := "z1"
	_, err = z.apply(commandNodeSet, nodeSetCommand{ID: "f", Settings: NodeSettings{Zone: &zone}, Time: t0})
	want := `zone "z1" for node f: not enough nodes: vdi "db": erasure coding 4+2 needs 6 nodes with at most 2 in a zone, the change would leave zones that hold 5 chunks: z1 (3 nodes, 2 chunks), z2 (2 nodes, 2 chunks), z3 (1 node, 1 chunk)`
	if !errors.Is(err, ErrTooFewNodes) || err.Error() != want {
		t.Fatalf("a zone change under 4+2:\n got %v\nwant %s", err, want)
	}
	if n := z.state().Nodes["f"]; n.Zone != "z3" {
		t.Fatalf("a refused zone change left node f in zone %q", n.Zone)
	}
	_, err = z.apply(commandNodeDrain, nodeDrainCommand{ID: "a", Drain: true, Time: t0})
	if !errors.Is(err, ErrTooFewNodes) || !strings.Contains(err.Error(), "the drain would leave 5") {
		t.Fatalf("draining one of 6 nodes under 4+2: %v", err)
	}
	z.check()
}

// TestCheckFindsSchemeDamage: State.Check refuses a scheme that does not
// parse, is not written canonically, has other copies than M+1, is
// recorded below the level, differs from its parent's, or comes with
// --ack zone; in a garbage record too.
func TestCheckFindsSchemeDamage(t *testing.T) {
	base := func(t *testing.T) *harness {
		h := ecHarness(t, LevelErasureCoding, "", "", "", "", "", "")
		h.mustApply(commandVDICreate, vdiCreateCommand{Name: "db", Size: 1 << 30, EC: "4+2", Time: t0})
		h.mustApply(commandVDISnapshot, vdiSnapshotCommand{Name: "db", Tag: "s1", Time: t0})
		h.mustApply(commandVDICreate, vdiCreateCommand{Name: "gone", Size: 1 << 30, EC: "2+1", Time: t0})
		h.mustApply(commandVDIDelete, vdiDeleteCommand{Name: "gone"})
		h.check()
		return h
	}
	for name, test := range map[string]struct {
		damage func(s *State)
		want   string
	}{
		"no scheme":        {func(s *State) { s.VDIs["db"].EC = "x" }, `invalid scheme "x"`},
		"bad scheme":       {func(s *State) { s.VDIs["db"].EC = "4+0" }, `invalid scheme 4+0`},
		"copies not M+1":   {func(s *State) { s.VDIs["db"].Copies = 2 }, `erasure coding "4+2" (4+2) with 2 copies, want 3`},
		"below the level":  {func(s *State) { s.FeatureLevel = LevelSessionProof }, "erasure coding \"4+2\" at feature level 5"},
		"not its parent's": {func(s *State) { s.VDIs["db"].EC, s.VDIs["db"].Copies = "3+2", 3 }, `vdi db has erasure coding "3+2", its parent db@s1 "4+2"`},
		"ack zone":         {func(s *State) { s.VDIs["db"].Ack = AckZone }, "erasure-coded (4+2) and acknowledges in the writer's zone"},
		"garbage":          {func(s *State) { s.Garbage[0].Copies = 3 }, `erasure coding "2+1" (2+1) with 3 copies, want 2`},
	} {
		t.Run(name, func(t *testing.T) {
			h := base(t)
			test.damage(h.state())
			if err := checkState(h.state()); err == nil || !strings.Contains(err.Error(), test.want) {
				t.Fatalf("Check = %v, want an error saying %q", err, test.want)
			}
		})
	}
}
