package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/backup"
	"github.com/herd-storage/herd/internal/gateway"
	"github.com/herd-storage/herd/internal/testcluster"
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

// backupSummary is the JSON of herd backup create.
type backupSummary struct {
	ID       string `json:"id"`
	Kind     string `json:"kind"`
	Snapshot string `json:"snapshot"`
	Parent   string `json:"parent"`
	Stats    struct {
		ReadBytes       uint64 `json:"read_bytes"`
		NewBytes        uint64 `json:"new_bytes"`
		NewChunks       int    `json:"new_chunks"`
		UnchangedChunks int    `json:"unchanged_chunks"`
	} `json:"stats"`
}

func backupCreate(t *testing.T, c *testcluster.Cluster, node int, args ...string) backupSummary {
	t.Helper()
	out := herd(t, c, node, append([]string{"--json", "backup", "create"}, args...)...)
	var s backupSummary
	if err := json.Unmarshal([]byte(out), &s); err != nil || s.ID == "" {
		t.Fatalf("backup create %v: %v\n%s", args, err, out)
	}
	t.Logf("backup %s (%s): read %d bytes, added %d", s.ID, s.Kind, s.Stats.ReadBytes, s.Stats.NewBytes)
	return s
}

// TestBackupIncrementalRestore: a full backup of 128 MiB of random data
// reads and stores 128 MiB; after 2 MiB in two objects change, the
// incremental backup reads the two objects (8 MiB) and stores 2 MiB; the
// incremental restored on a second cluster is byte-identical to its
// snapshot; prune --keep-last 1 frees exactly the two replaced chunks, and
// a backup of a second VDI holding the original data stores just them
// again (deduplication across VDIs); verify catches a flipped byte in a
// chunk, naming the backups that use it, and a restore of one fails and
// leaves no VDI; a backup killed -9 half way leaves no backup.
func TestBackupIncrementalRestore(t *testing.T) {
	need(t, "qemu-io", "qemu-img")
	a := dataCluster(t, 3, 2, "vm", "256M")
	source := randomFile(t, 128*mib)
	herd(t, a, 0, "vdi", "import", "vm", source)
	store := filepath.Join(t.TempDir(), "store")

	first := backupCreate(t, a, 1, "vm", store)
	if first.Kind != "full" || first.Stats.ReadBytes != 128*mib || first.Stats.NewBytes != 128*mib {
		t.Fatalf("full backup: %+v", first)
	}
	if out, err := qemuIO(t, a.Node(0).NBDURI("vm"), "write -P 0x77 10M 1M", "write -P 0x78 100M 1M"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	second := backupCreate(t, a, 2, "vm", store)
	if second.Kind != "incremental" || second.Parent != first.ID || second.Stats.ReadBytes != 8*mib || second.Stats.NewBytes != 2*mib || second.Stats.NewChunks != 2 {
		t.Fatalf("incremental backup after 2 MiB changed: %+v", second)
	}
	if _, err := client(a, 0).VDI(ctx(t), first.Snapshot); err == nil {
		t.Fatalf("the first backup's snapshot %s is still there after the second backup", first.Snapshot)
	}

	// Restored on another cluster: identical to the snapshot it was read from.
	b := dataCluster(t, 2, 2, "unrelated", "1M")
	out := herd(t, b, 1, "--json", "backup", "restore", store, second.ID, "restored")
	if !strings.Contains(out, `"data_bytes": 134217728`) {
		t.Fatalf("restore: %s", out)
	}
	mustRun(t, 2*time.Minute, "qemu-img", "compare", "-f", "raw", "-F", "raw", b.Node(0).NBDURI("restored"), a.Node(1).NBDURI(second.Snapshot))
	if _, stderr, err := b.Herd(ctx(t), 0, "backup", "restore", store, second.ID, "restored"); err == nil || !strings.Contains(stderr, "exists") {
		t.Fatalf("restore over an existing vdi: %v %s", err, stderr)
	}

	// Prune keeps the newest: the two chunks only the first used go.
	pruned := herd(t, a, 0, "--json", "backup", "prune", store, "--keep-last", "1")
	var report struct {
		Deleted     []string `json:"deleted"`
		FreedChunks int      `json:"freed_chunks"`
		FreedBytes  uint64   `json:"freed_bytes"`
	}
	if err := json.Unmarshal([]byte(pruned), &report); err != nil || !slices.Equal(report.Deleted, []string{first.ID}) || report.FreedChunks != 2 || report.FreedBytes != 2*mib {
		t.Fatalf("prune --keep-last 1: %+v %v\n%s", report, err, pruned)
	}
	// Another VDI with the original data: only the two freed chunks are new.
	herd(t, a, 0, "vdi", "create", "twin", "256M")
	herd(t, a, 0, "vdi", "import", "twin", source)
	twin := backupCreate(t, a, 0, "twin", store)
	if twin.Kind != "full" || twin.Stats.NewBytes != 2*mib {
		t.Fatalf("backup of a vdi holding the same data as stored chunks: %+v", twin)
	}

	// A flipped byte in a chunk: verify names it and the backups using it.
	herd(t, a, 0, "backup", "verify", store)
	chunks, err := filepath.Glob(filepath.Join(store, "chunks", "*", "*"))
	if err != nil || len(chunks) != 130 {
		t.Fatalf("%d chunk files (%v), want 130 (128 of the source, 2 changed)", len(chunks), err)
	}
	// A chunk of the source data: both remaining vm's and twin's backups use it.
	changed := map[string]bool{backup.Hash(bytes.Repeat([]byte{0x77}, mib)): true, backup.Hash(bytes.Repeat([]byte{0x78}, mib)): true}
	victim := chunks[0]
	for _, path := range chunks {
		if !changed[filepath.Base(path)] {
			victim = path
			break
		}
	}
	raw, err := os.ReadFile(victim)
	if err != nil {
		t.Fatal(err)
	}
	raw[12345] ^= 0x40
	if err := os.WriteFile(victim, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	verifyOut, stderr, err := a.Herd(ctx(t), 0, "--json", "backup", "verify", store)
	var verified struct {
		Damaged  []string `json:"damaged"`
		Affected []string `json:"affected"`
	}
	if err == nil || json.Unmarshal([]byte(verifyOut), &verified) != nil || !slices.Equal(verified.Damaged, []string{filepath.Base(victim)}) || len(verified.Affected) != 2 {
		t.Fatalf("verify of a store with a flipped byte: %v %+v\n%s%s", err, verified, verifyOut, stderr)
	}
	if _, stderr, err := b.Herd(ctx(t), 0, "backup", "restore", store, second.ID, "again"); err == nil || !strings.Contains(stderr, "does not match its hash") {
		t.Fatalf("restore of a backup with a damaged chunk: %v %s", err, stderr)
	}
	if _, err := client(b, 0).VDI(ctx(t), "again"); err == nil {
		t.Fatal("a failed restore left its vdi behind")
	}
	if err := os.WriteFile(victim, append(raw[:12345:12345], append([]byte{raw[12345] ^ 0x40}, raw[12346:]...)...), 0o600); err != nil {
		t.Fatal(err)
	}
	herd(t, a, 0, "backup", "verify", store)

	// Killed half way: no backup recorded; prune removes what it stored.
	herd(t, a, 0, "vdi", "create", "big", "256M")
	herd(t, a, 0, "vdi", "import", "big", randomFile(t, 256*mib))
	before, _ := filepath.Glob(filepath.Join(store, "chunks", "*", "*"))
	cmd := a.HerdCommand(0, "backup", "create", "big", store)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	testcluster.WaitFor(t, time.Minute, "the backup to store 16 chunks", func() (bool, error) {
		now, _ := filepath.Glob(filepath.Join(store, "chunks", "*", "*"))
		return len(now) >= len(before)+16, fmt.Errorf("%d chunks", len(now)-len(before))
	})
	cmd.Process.Kill()
	cmd.Wait()
	listed := herd(t, a, 0, "--json", "backup", "list", store)
	if strings.Contains(listed, `"vdi": "big"`) {
		t.Fatalf("a backup killed half way is listed:\n%s", listed)
	}
	pruned = herd(t, a, 0, "--json", "backup", "prune", store, "--keep-last", "1")
	if err := json.Unmarshal([]byte(pruned), &report); err != nil || report.FreedChunks < 16 || len(report.Deleted) != 0 {
		t.Fatalf("prune after a killed backup: %+v %v", report, err)
	}
	herd(t, a, 0, "backup", "verify", store)
}
