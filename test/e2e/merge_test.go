package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/herd-storage/herd/internal/api"
	"github.com/herd-storage/herd/internal/testcluster"
)

// Space that comes back (docs/ARCHITECTURE.md, "Snapshots, clones,
// rollback: the VDI tree"): a deleted snapshot with one child is merged
// into it in the background, and `vdi flatten` copies a clone's
// inherited objects, on real multi-process clusters with real NBD
// clients.

// chainOf returns the chain of the writable VDI name, itself first, as
// the tree has it.
func chainOf(tree []api.TreeEntry, name string) []api.TreeEntry {
	byID := map[uint32]api.TreeEntry{}
	var v *api.TreeEntry
	for i, e := range tree {
		byID[e.ID] = e
		if e.Name == name && !e.Snapshot && !e.Deleted {
			v = &tree[i]
		}
	}
	if v == nil {
		return nil
	}
	chain := []api.TreeEntry{*v}
	for parent := v.Parent; parent != 0 && len(chain) < 1000; {
		e, ok := byID[parent]
		if !ok {
			break
		}
		chain = append(chain, e)
		parent = e.Parent
	}
	return chain
}

// describeChain names a chain's members for a failure message.
func describeChain(chain []api.TreeEntry) string {
	var out []string
	for _, e := range chain {
		s := e.FullName()
		if e.Deleted {
			s += " (deleted)"
		}
		out = append(out, fmt.Sprintf("%s [%d]", s, e.ID))
	}
	return strings.Join(out, " -> ")
}

// usedBytes is the space every node's object files take (node list's
// USED: st_blocks of each node's objects), summed over the nodes.
func usedBytes(c *testcluster.Cluster, through int) (uint64, error) {
	nodes, err := client(c, through).Nodes(context.Background())
	if err != nil {
		return 0, err
	}
	var used uint64
	for _, n := range nodes {
		if n.UsageError != "" {
			return 0, fmt.Errorf("node %s: %s", n.ID, n.UsageError)
		}
		used += n.UsedBytes
	}
	return used, nil
}

// mergeCounters is a node's herd_merge_* metrics.
type mergeCounters struct {
	running, copied, merged, flattened float64
}

// scrapeMerge reads a node's herd_merge_* metrics; an error (not a
// test failure) when the node does not answer.
func scrapeMerge(c *testcluster.Cluster, i int) (mergeCounters, error) {
	httpClient := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	request, _ := http.NewRequest("GET", "https://"+c.Node(i).AdminAddr()+"/metrics", nil)
	request.Header.Set("Authorization", "Bearer "+c.Token())
	response, err := httpClient.Do(request)
	if err != nil {
		return mergeCounters{}, err
	}
	defer response.Body.Close()
	if response.StatusCode != http.StatusOK {
		io.Copy(io.Discard, response.Body)
		return mergeCounters{}, fmt.Errorf("node %d: /metrics: HTTP %d", i, response.StatusCode)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(response.Body)
	if err != nil {
		return mergeCounters{}, err
	}
	m := mergeCounters{
		running:   value(families, "herd_merge_running", nil),
		copied:    value(families, "herd_merge_objects_copied_total", nil),
		merged:    value(families, "herd_merge_layers_merged_total", nil),
		flattened: value(families, "herd_merge_flattened_total", nil),
	}
	if m.running < 0 || m.copied < 0 || m.merged < 0 || m.flattened < 0 {
		return m, fmt.Errorf("node %d: herd_merge_* metrics missing: %+v", i, m)
	}
	return m, nil
}

// mergeTotals sums the herd_merge_* counters of the given nodes.
func mergeTotals(t *testing.T, c *testcluster.Cluster, nodes []int) mergeCounters {
	t.Helper()
	var sum mergeCounters
	for _, i := range nodes {
		m, err := scrapeMerge(c, i)
		if err != nil {
			t.Fatal(err)
		}
		sum.running += m.running
		sum.copied += m.copied
		sum.merged += m.merged
		sum.flattened += m.flattened
	}
	return sum
}

// writeModel applies a qemu-io "write -P PATTERN OFFSET LENGTH" to a
// local image file, the model of the disk.
func writeModel(t *testing.T, path string, pattern byte, offset, length int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(bytes.Repeat([]byte{pattern}, int(length)), offset); err != nil {
		t.Fatal(err)
	}
}

// copyFile copies a file (the model image) to a new one.
func copyFile(t *testing.T, from, to string) {
	t.Helper()
	data, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// backupCycles is how many backups TestBackupCyclesMergeSpace takes:
// HERD_MERGE_CYCLES (bench/merge-cycles.sh runs 30), by default a CI
// smoke run of 8 with the same assertions.
func backupCycles(t *testing.T) int {
	if s := os.Getenv("HERD_MERGE_CYCLES"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 2 {
			t.Fatalf("HERD_MERGE_CYCLES=%q: a number of backups, at least 2", s)
		}
		return n
	}
	return 8
}

// TestBackupCyclesMergeSpace: a 64 MiB VDI of random data, backed up
// again and again with 1% of it (640 KiB, at a random offset, through
// NBD with qemu-io) changed before each backup. Each backup deletes the
// previous backup's snapshot, which the cluster merges into the new one
// in the background: after every backup, within a deadline, the deleted
// snapshot is gone from the tree and the VDI's chain is 2 deep (the
// current backup snapshot and the VDI), never more. At the end the
// space the nodes' object files take (node list) comes back to within
// 10% of (data + one backup's changes) x copies, every merge is counted
// in herd_merge_layers_merged_total, the VDI and its last backup
// snapshot read exactly as the local model of the disk, and every
// object's replicas are identical. HERD_MERGE_CYCLES sets the number
// of backups (default 8; bench/merge-cycles.sh runs 30).
func TestBackupCyclesMergeSpace(t *testing.T) {
	need(t, "qemu-io", "qemu-img")
	const (
		size   = 64 * mib
		change = size / 100 / 4096 * 4096 // 1%, in 4 KiB blocks: 652 KiB
		copies = 2
	)
	cycles := backupCycles(t)
	started := time.Now()
	c := dataCluster(t, 3, copies, "vm", "64M")
	model := randomFile(t, size)
	herd(t, c, 0, "vdi", "import", "vm", model)
	store := filepath.Join(t.TempDir(), "store")
	uri := c.Node(1).NBDURI("vm")
	random := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	var last backupSummary
	for cycle := 1; cycle <= cycles; cycle++ {
		if cycle > 1 {
			offset := random.Int64N((size-change)/4096) * 4096
			pattern := byte(cycle%250 + 1)
			if out, err := qemuIO(t, uri, fmt.Sprintf("write -P %d %d %d", pattern, offset, change)); err != nil {
				t.Fatalf("cycle %d: %v\n%s", cycle, err, out)
			}
			writeModel(t, model, pattern, offset, change)
		}
		b := backupCreate(t, c, cycle%3, "vm", store)
		if cycle > 1 && (b.Kind != "incremental" || b.Parent != last.ID) {
			t.Fatalf("cycle %d: backup %+v, want an incremental one after %s", cycle, b, last.ID)
		}
		last = b
		var chain []api.TreeEntry
		testcluster.WaitFor(t, time.Minute, fmt.Sprintf("cycle %d: the previous backup snapshot merged away", cycle), func() (bool, error) {
			tree, err := client(c, 0).Tree(context.Background())
			if err != nil {
				return false, err
			}
			for _, e := range tree {
				if e.Deleted {
					return false, fmt.Errorf("%s (vdi %d) is deleted, not merged yet", e.FullName(), e.ID)
				}
			}
			chain = chainOf(tree, "vm")
			return len(chain) == 2 && chain[1].FullName() == b.Snapshot, fmt.Errorf("chain %s", describeChain(chain))
		})
		if len(chain) > 2 {
			t.Fatalf("cycle %d: the chain is %d deep: %s", cycle, len(chain), describeChain(chain))
		}
	}
	totals := mergeTotals(t, c, []int{0, 1, 2})
	if totals.merged != float64(cycles-1) {
		t.Fatalf("herd_merge_layers_merged_total adds up to %v over the nodes, want %d (one per backup after the first)", totals.merged, cycles-1)
	}
	// Each merge copies into the new backup snapshot every object of the
	// old one the new one does not own: every object that did not change.
	t.Logf("the %d merges copied %v objects of 4 MiB (%.1f each; the vdi has %d)", cycles-1, totals.copied, totals.copied/float64(cycles-1), size/(4*mib))
	// Space: the last backup snapshot holds the data (its merge copied
	// every object the VDI has into it), the VDI nothing yet; each deleted
	// snapshot's objects are freed by the garbage collector.
	want := float64((size + change) * copies)
	var used uint64
	testcluster.WaitFor(t, time.Minute, "the space used to come back within 10% of (data + one backup's changes) x copies", func() (bool, error) {
		var err error
		used, err = usedBytes(c, 0)
		if err != nil {
			return false, err
		}
		return float64(used) <= 1.1*want && float64(used) >= 0.9*want, fmt.Errorf("%d MiB used, want %.0f MiB +-10%%", used>>20, want/mib)
	})
	t.Logf("%d backups: %d MiB used on the nodes, (data + one backup's changes) x copies = %.1f MiB; without merges the snapshots would hold about %d MiB more", cycles, used>>20, want/mib, (cycles-1)*4*copies)
	// Content: all those merges later, the VDI and its last backup read exactly
	// as the model.
	mustRun(t, 2*time.Minute, "qemu-img", "compare", "-f", "raw", "-F", "raw", model, c.Node(2).NBDURI("vm"))
	mustRun(t, 2*time.Minute, "qemu-img", "compare", "-f", "raw", "-F", "raw", model, c.Node(0).NBDURI(last.Snapshot))
	// The VDI owns no object yet: every object is the last backup
	// snapshot's.
	checkVDIClean(t, c, 1, last.Snapshot)
	t.Logf("%d backup cycles in %v", cycles, time.Since(started).Round(time.Second))
}

// TestMergeKilledHalfWay: a deleted snapshot is merged slowly
// (--merge-rate 4MiB/s: one 4 MiB object a second); once a node's
// metrics show the merge under way (herd_merge_running 1, at least one
// object copied) and the tree still shows the layer, that node is
// killed -9. While it is down the child reads exactly as before the
// delete (qemu-img compare against a copy exported first); a new leader
// resumes the merge, which copies only what the killed node had not
// (the copies it made are kept); after the node's restart the merge
// has finished: the layer is gone, the child has no parent, its
// content is still the copy's and its replicas are identical.
func TestMergeKilledHalfWay(t *testing.T) {
	need(t, "qemu-io", "qemu-img")
	c := dataClusterWith(t, testcluster.Options{Nodes: 3, ExtraArgs: []string{"--merge-rate", "4MiB/s"}}, 2, "vm", "32M")
	herd(t, c, 0, "vdi", "import", "vm", randomFile(t, 32*mib))
	herd(t, c, 0, "vdi", "snapshot", "vm", "--tag", "s1")
	// The child owns objects 1 and 5; the merge copies the other 6.
	if out, err := qemuIO(t, c.Node(0).NBDURI("vm"), "write -P 0x5a 4M 1M", "write -P 0x5b 20M 64K"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	const toCopy = 6
	before := filepath.Join(t.TempDir(), "before.img")
	mustRun(t, 2*time.Minute, "qemu-img", "convert", "-f", "raw", "-O", "raw", c.Node(1).NBDURI("vm"), before)
	herd(t, c, 0, "vdi", "delete", "vm@s1")

	runner, over := -1, ""
	var copiedBefore float64
	testcluster.WaitFor(t, 30*time.Second, "a node to be half way through the merge", func() (bool, error) {
		tree, err := client(c, 0).Tree(context.Background())
		if err != nil {
			return false, err
		}
		if chain := chainOf(tree, "vm"); len(chain) != 2 || !chain[1].Deleted {
			over = describeChain(chain)
			return true, nil
		}
		var seen []string
		for i := range 3 {
			m, err := scrapeMerge(c, i)
			if err != nil {
				return false, err
			}
			seen = append(seen, fmt.Sprintf("node %d: %+v", i, m))
			if m.running == 1 && m.copied >= 1 && m.copied < toCopy {
				runner, copiedBefore = i, m.copied
				return true, nil
			}
		}
		return false, fmt.Errorf("%s", strings.Join(seen, "; "))
	})
	if runner < 0 {
		t.Fatalf("the merge was over before it was seen under way: chain %s", over)
	}
	c.Node(runner).Kill()
	t.Logf("killed node %d after it copied %v of the %d objects", runner, copiedBefore, toCopy)
	others := without([]int{0, 1, 2}, runner)
	testcluster.WaitFor(t, 30*time.Second, "a leader among the nodes left", func() (bool, error) {
		info, err := client(c, others[0]).Info(context.Background())
		if err != nil {
			return false, err
		}
		return info.Leader != "" && info.Leader != nodeID0(c, runner), fmt.Errorf("leader %q", info.Leader)
	})
	// Half way, through a node left: exactly the content before.
	mustRun(t, 2*time.Minute, "qemu-img", "compare", "-f", "raw", "-F", "raw", before, c.Node(others[0]).NBDURI("vm"))
	c.Node(runner).Restart()
	testcluster.WaitFor(t, time.Minute, "the merge to finish after the restart", func() (bool, error) {
		tree, err := client(c, others[1]).Tree(context.Background())
		if err != nil {
			return false, err
		}
		chain := chainOf(tree, "vm")
		return len(chain) == 1 && len(tree) == 1, fmt.Errorf("chain %s, %d vdis in the tree", describeChain(chain), len(tree))
	})
	after := mergeTotals(t, c, []int{0, 1, 2})
	if after.merged != 1 || after.copied > toCopy-copiedBefore {
		t.Fatalf("after the kill the nodes merged %v layers and copied %v objects; want 1, and at most the %v objects the killed node had not copied", after.merged, after.copied, toCopy-copiedBefore)
	}
	t.Logf("resumed: %v objects copied after the kill", after.copied)
	for _, i := range []int{runner, others[1]} {
		mustRun(t, 2*time.Minute, "qemu-img", "compare", "-f", "raw", "-F", "raw", before, c.Node(i).NBDURI("vm"))
	}
	checkVDIClean(t, c, 0, "vm")
}

// nodeID0 is a node's id, or "" when it does not answer (killed).
func nodeID0(c *testcluster.Cluster, i int) string {
	info, err := client(c, i).Info(context.Background())
	if err != nil {
		return ""
	}
	return info.NodeID
}

// TestFlattenWhileFioVerifies: a 64 MiB VDI of random data is
// snapshotted; fio writes and verifies (crc32c, verify_backlog) the
// first half of the child through NBD while `herd vdi flatten` copies
// every object the child still reads from the snapshot, on the node
// fio's connection holds the writer lock through, and while the
// snapshot is then deleted and its objects freed. fio must see no
// verify error and no I/O error; the flatten must end while fio still
// writes; the second half, never written, must still read as the
// random data; the snapshot's space must come back (the nodes' object
// files add up to the child's data x copies, within 10%) and the
// child's replicas are identical.
func TestFlattenWhileFioVerifies(t *testing.T) {
	need(t, "fio", "qemu-img")
	const copies = 2
	c := dataCluster(t, 3, copies, "vm", "64M")
	source := randomFile(t, 64*mib)
	herd(t, c, 0, "vdi", "import", "vm", source)
	herd(t, c, 0, "vdi", "snapshot", "vm", "--tag", "s1")
	fio, fioOut := startFio(t, "flatten", c.Node(1).NBDURI("vm"), "rw=randwrite\nbs=4k-64k\niodepth=8\noffset=0\nsize=32M\ntime_based=1\nruntime=25\nverify=crc32c\nverify_fatal=1\nverify_backlog=256\n")
	fioDone := make(chan error, 1)
	go func() { fioDone <- fio.Wait() }()
	testcluster.WaitFor(t, 30*time.Second, "fio to have written through node 1", func() (bool, error) {
		tree, err := client(c, 0).Tree(context.Background())
		if err != nil {
			return false, err
		}
		chain := chainOf(tree, "vm")
		if len(chain) == 0 {
			return false, fmt.Errorf("no vm in the tree")
		}
		return chain[0].UniqueBytes >= 4*mib, fmt.Errorf("vm owns %d bytes", chain[0].UniqueBytes)
	})
	start := time.Now()
	herd(t, c, 2, "vdi", "flatten", "vm")
	tookFlatten := time.Since(start)
	select {
	case err := <-fioDone:
		t.Fatalf("fio ended (%v) before the flatten did (%v): the flatten ran beside no writes\n%s", err, tookFlatten, lastLines(fioOut.String(), 10))
	default:
	}
	flattened := mergeTotals(t, c, []int{0, 1, 2})
	if flattened.flattened != 1 || flattened.copied == 0 {
		t.Fatalf("herd_merge_* after the flatten: %+v; want one flatten and some objects copied", flattened)
	}
	if m, err := scrapeMerge(c, 1); err != nil || m.flattened != 1 {
		t.Fatalf("node 1, where fio holds the writer lock, did not flatten: %+v %v", m, err)
	}
	v, err := client(c, 0).VDI(ctx(t), "vm")
	if err != nil || v.Parent != 0 || v.Flatten {
		t.Fatalf("vm after flatten: %+v %v", v, err)
	}
	// The snapshot nothing reads any more: deleted and freed at once,
	// while fio goes on.
	herd(t, c, 0, "vdi", "delete", "vm@s1")
	var used uint64
	var want float64
	testcluster.WaitFor(t, time.Minute, "the snapshot's space to come back", func() (bool, error) {
		tree, err := client(c, 0).Tree(context.Background())
		if err != nil {
			return false, err
		}
		if len(tree) != 1 || tree[0].Name != "vm" {
			return false, fmt.Errorf("tree still has %d entries", len(tree))
		}
		want = float64(tree[0].AllocatedBytes * copies)
		used, err = usedBytes(c, 0)
		if err != nil {
			return false, err
		}
		return float64(used) <= 1.1*want, fmt.Errorf("%d MiB used, want about %.0f MiB (vm's %d MiB x %d copies)", used>>20, want/mib, tree[0].AllocatedBytes>>20, copies)
	})
	if err := <-fioDone; err != nil || strings.Contains(fioOut.String(), "verify: bad") {
		t.Fatalf("fio: %v\n%s", err, errorLines(fioOut.String()))
	}
	if !strings.Contains(fioOut.String(), "err= 0") {
		t.Fatalf("fio did not report err=0:\n%s", lastLines(fioOut.String(), 20))
	}
	t.Logf("flatten took %v beside fio; after deleting the snapshot %d MiB used (vm's data x %d copies: %.0f MiB)", tookFlatten.Round(time.Millisecond), used>>20, copies, want/mib)
	// The half fio never wrote still reads as the snapshot's data.
	image := filepath.Join(t.TempDir(), "vm.img")
	mustRun(t, 2*time.Minute, "qemu-img", "convert", "-f", "raw", "-O", "raw", c.Node(0).NBDURI("vm"), image)
	got, err := os.ReadFile(image)
	if err != nil {
		t.Fatal(err)
	}
	wantData, err := os.ReadFile(source)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(wantData) || !bytes.Equal(got[32*mib:], wantData[32*mib:]) {
		t.Fatalf("the half fio never wrote differs from the snapshot's data after the flatten and the snapshot's delete")
	}
	checkVDIClean(t, c, 2, "vm")
}
