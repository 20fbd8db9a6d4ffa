package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/gateway"
)

const mib = 1 << 20

// TestSnapshotDiffExportImport: `herd vdi diff` lists exactly the objects
// written, trimmed or zeroed after a snapshot (for the VDI, a later
// snapshot and a clone); `vdi export NAME@S2 --since S1` writes them as a
// diff file, `vdi import --diff` applies it to a VDI holding S1's content
// and takes S2, byte-identical to the source's (qemu-img compare); a VDI
// without S1, one changed since S1, and a damaged file are refused, and
// the refused import changed nothing.
func TestSnapshotDiffExportImport(t *testing.T) {
	need(t, "qemu-io", "qemu-img")
	c := dataCluster(t, 3, 2, "vm", "64M")
	uri := c.Node(0).NBDURI("vm")
	if out, err := qemuIO(t, uri, "write -P 0x11 0 8M", "write -P 0x12 40M 4M", "write -P 0x13 52M 4M"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	herd(t, c, 0, "vdi", "snapshot", "vm", "--tag", "s1")
	// After s1: one 4 KiB block in object 1, object 10 trimmed whole,
	// object 13 zeroed in part, object 15 written (never before).
	if out, err := qemuIO(t, uri, "write -P 0x21 4100K 4K", "discard 40M 4M", "write -z 52M 64K", "write -P 0x22 60M 1M"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	herd(t, c, 1, "vdi", "snapshot", "vm", "--tag", "s2")
	if out, err := qemuIO(t, uri, "write -P 0x31 20M 4K"); err != nil { // object 5, after s2
		t.Fatalf("%v\n%s", err, out)
	}
	diff := func(from, to string) gateway.Diff {
		t.Helper()
		var d gateway.Diff
		out := herd(t, c, 2, "--json", "vdi", "diff", from, to)
		if err := json.Unmarshal([]byte(out), &d); err != nil {
			t.Fatalf("vdi diff %s %s: %v\n%s", from, to, err, out)
		}
		return d
	}
	want := []gateway.DiffExtent{{Offset: 4 * mib, Length: 4 * mib}, {Offset: 40 * mib, Length: 4 * mib, Zero: true}, {Offset: 52 * mib, Length: 4 * mib}, {Offset: 60 * mib, Length: 4 * mib}}
	if d := diff("vm@s1", "vm@s2"); !slices.Equal(d.Extents, want) || d.ChangedBytes != 16*mib || d.ZeroBytes != 4*mib {
		t.Fatalf("vdi diff vm@s1 vm@s2: %+v, want %+v", d, want)
	}
	withLater := append([]gateway.DiffExtent{want[0], {Offset: 20 * mib, Length: 4 * mib}}, want[1:]...)
	if d := diff("vm@s1", "vm"); !slices.Equal(d.Extents, withLater) {
		t.Fatalf("vdi diff vm@s1 vm: %+v, want %+v", d.Extents, withLater)
	}
	if d := diff("vm@s2", "vm"); !slices.Equal(d.Extents, []gateway.DiffExtent{{Offset: 20 * mib, Length: 4 * mib}}) {
		t.Fatalf("vdi diff vm@s2 vm: %+v", d.Extents)
	}
	herd(t, c, 0, "vdi", "clone", "vm@s1", "fork")
	if out, err := qemuIO(t, c.Node(1).NBDURI("fork"), "write -P 0x41 12M 4K"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if d := diff("vm@s1", "fork"); !slices.Equal(d.Extents, []gateway.DiffExtent{{Offset: 12 * mib, Length: 4 * mib}}) {
		t.Fatalf("vdi diff vm@s1 fork: %+v", d.Extents)
	}
	if _, stderr, err := c.Herd(ctx(t), 0, "vdi", "diff", "vm@s2", "vm@s1"); err == nil || !strings.Contains(stderr, `snapshot "vm@s2" not found: vm@s1 has no snapshot before it`) {
		t.Fatalf("vdi diff of an earlier snapshot since a later one: %v %s", err, stderr)
	}
	text := herd(t, c, 0, "vdi", "diff", "vm@s1", "vm@s2")
	if !strings.Contains(text, "16 MiB changed in 4 extents (4 MiB of it zeroed)") {
		t.Fatalf("vdi diff text:\n%s", text)
	}

	// The full image of s1 and the diff s1..s2.
	dir := t.TempDir()
	full, changes := filepath.Join(dir, "s1.img"), filepath.Join(dir, "s1-s2.diff")
	herd(t, c, 1, "vdi", "export", "vm@s1", full)
	out := herd(t, c, 2, "--json", "vdi", "export", "vm@s2", "--since", "s1", changes)
	var summary map[string]any
	if err := json.Unmarshal([]byte(out), &summary); err != nil {
		t.Fatalf("export --since JSON: %v\n%s", err, out)
	}
	// Objects 1, 13 and 15 are data (12 MiB, of which zero blocks are
	// sent as zero records), object 10 zeroes.
	if data := summary["data_bytes"].(float64); data > 12*mib || data < 4*mib+4096 {
		t.Fatalf("export --since: %v", summary)
	}
	info, err := os.Stat(changes)
	if err != nil || info.Size() > 13*mib {
		t.Fatalf("the diff file: %v %v", info, err)
	}
	t.Logf("diff s1..s2: %.0f bytes of data, %.0f zeroed, file %d bytes", summary["data_bytes"], summary["zero_bytes"], info.Size())

	// Applied on a copy holding s1's content, snapshotted as s1.
	herd(t, c, 0, "vdi", "create", "copy", "64M")
	herd(t, c, 0, "vdi", "import", "copy", full)
	herd(t, c, 0, "vdi", "snapshot", "copy", "--tag", "s1")
	herd(t, c, 1, "vdi", "import", "copy", "--diff", changes)
	mustRun(t, 2*time.Minute, "qemu-img", "compare", "-f", "raw", "-F", "raw", c.Node(0).NBDURI("copy@s2"), c.Node(1).NBDURI("vm@s2"))
	mustRun(t, 2*time.Minute, "qemu-img", "compare", "-f", "raw", "-F", "raw", c.Node(2).NBDURI("copy"), c.Node(1).NBDURI("vm@s2"))

	// Refusals, each leaving the target as it was.
	herd(t, c, 0, "vdi", "create", "bare", "64M")
	if _, stderr, err := c.Herd(ctx(t), 0, "vdi", "import", "bare", "--diff", changes); err == nil || !strings.Contains(stderr, `has no snapshot "s1"`) {
		t.Fatalf("import --diff into a vdi without s1: %v %s", err, stderr)
	}
	herd(t, c, 0, "vdi", "create", "moved", "64M")
	herd(t, c, 0, "vdi", "import", "moved", full)
	herd(t, c, 0, "vdi", "snapshot", "moved", "--tag", "s1")
	if out, err := qemuIO(t, c.Node(0).NBDURI("moved"), "write -P 0x55 30M 4K"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if _, stderr, err := c.Herd(ctx(t), 0, "vdi", "import", "moved", "--diff", changes); err == nil || !strings.Contains(stderr, "changed since its snapshot") {
		t.Fatalf("import --diff into a vdi changed since s1: %v %s", err, stderr)
	}
	herd(t, c, 0, "vdi", "create", "third", "64M")
	herd(t, c, 0, "vdi", "import", "third", full)
	herd(t, c, 0, "vdi", "snapshot", "third", "--tag", "s1")
	raw, err := os.ReadFile(changes)
	if err != nil {
		t.Fatal(err)
	}
	raw[len(raw)*2/3] ^= 0x01
	damaged := filepath.Join(dir, "damaged.diff")
	if err := os.WriteFile(damaged, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, stderr, err := c.Herd(ctx(t), 0, "vdi", "import", "third", "--diff", damaged); err == nil || !strings.Contains(stderr, "not a valid herd diff") {
		t.Fatalf("import of a damaged diff: %v %s", err, stderr)
	}
	if d := diff("third@s1", "third"); d.ChangedBytes != 0 {
		t.Fatalf("a refused import changed the vdi: %+v", d)
	}
	if err := os.WriteFile(damaged, raw[:len(raw)/2], 0o600); err != nil {
		t.Fatal(err)
	}
	if _, stderr, err := c.Herd(ctx(t), 0, "vdi", "import", "third", "--diff", damaged); err == nil || !strings.Contains(stderr, "cut short") {
		t.Fatalf("import of a cut diff: %v %s", err, stderr)
	}
	if d := diff("third@s1", "third"); d.ChangedBytes != 0 {
		t.Fatalf("a refused import changed the vdi: %+v", d)
	}
	if _, stderr, err := c.Herd(ctx(t), 0, "vdi", "export", "vm", "--since", "s1", filepath.Join(dir, "live.diff")); err == nil || !strings.Contains(stderr, "give NAME@TAG") {
		t.Fatalf("export --since of a live vdi: %v %s", err, stderr)
	}
}
