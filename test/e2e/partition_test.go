package e2e

import (
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/testcluster"
)

// TestPartitionMinorityRefusesMajorityContinues cuts 2 of 5 nodes away
// (network namespaces): the minority must refuse metadata changes with "no
// quorum" and say so in cluster info, the majority must commit an epoch
// without them and keep working, and after healing all five agree again.
func TestPartitionMinorityRefusesMajorityContinues(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Nodes: 5, Namespaces: true})
	all := []int{0, 1, 2, 3, 4}
	waitAgreement(t, c, all, 40*time.Second)
	if _, err := client(c, 0).Format(ctx(t), 3, 4<<20); err != nil {
		t.Fatal(err)
	}
	majority, minority := []int{0, 1, 2}, []int{3, 4}
	minorityIDs := []string{nodeID(t, c, 3), nodeID(t, c, 4)}
	before, err := client(c, 0).Info(ctx(t))
	if err != nil {
		t.Fatal(err)
	}

	c.Partition(majority, minority)
	cut := time.Now()
	for _, i := range minority {
		testcluster.WaitFor(t, failoverDeadline-time.Since(cut), fmt.Sprintf("minority node %d to refuse changes with no quorum", i), func() (bool, error) {
			_, err := client(c, i).CreateVDI(ctx(t), fmt.Sprintf("minority-%d", i), 1<<20)
			if err == nil {
				return false, fmt.Errorf("create through minority node %d succeeded", i)
			}
			if !errors.Is(err, cluster.ErrNoQuorum) || !strings.Contains(err.Error(), "no quorum") {
				return false, err
			}
			info, err := client(c, i).Info(ctx(t))
			if err != nil || info.Quorum {
				return false, fmt.Errorf("cluster info still claims quorum: %+v %v", info, err)
			}
			return true, nil
		})
		// The CLI says it plainly too, and fails fast.
		start := time.Now()
		_, stderr, err := c.Herd(ctx(t), i, "vdi", "create", "refused", "1G")
		if err == nil || !strings.Contains(stderr, "no quorum") {
			t.Fatalf("CLI create on minority node %d: %v %q", i, err, stderr)
		}
		if took := time.Since(start); took > 8*time.Second {
			t.Errorf("refusing took %v: must fail fast, not hang", took)
		}
		stdout, _, err := c.Herd(ctx(t), i, "cluster", "info")
		if err != nil || !strings.Contains(stdout, "NO QUORUM") {
			t.Errorf("cluster info on minority node %d does not say NO QUORUM: %v\n%s", i, err, stdout)
		}
	}
	for _, i := range majority {
		testcluster.WaitFor(t, failoverDeadline, fmt.Sprintf("majority node %d to commit an epoch without the minority", i), func() (bool, error) {
			_, epochs, err := epochsJSON(t, c, i)
			if err != nil {
				return false, err
			}
			last := epochs[len(epochs)-1]
			if last.Number <= before.Epoch || slices.Contains(last.Nodes, minorityIDs[0]) || slices.Contains(last.Nodes, minorityIDs[1]) {
				return false, fmt.Errorf("latest epoch %d: %v", last.Number, last.Nodes)
			}
			return true, nil
		})
	}
	t.Logf("majority committed an epoch without the minority %v after the cut", time.Since(cut).Round(time.Millisecond))
	for _, i := range majority {
		if _, err := client(c, i).CreateVDI(ctx(t), fmt.Sprintf("majority-%d", i), 1<<20); err != nil {
			t.Fatalf("create through majority node %d: %v", i, err)
		}
	}

	c.Heal()
	waitAgreement(t, c, all, 40*time.Second)
	for _, i := range all {
		vdis, err := client(c, i).VDIs(ctx(t))
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, v := range vdis {
			names = append(names, v.Name)
		}
		if !slices.Equal(names, []string{"majority-0", "majority-1", "majority-2"}) {
			t.Fatalf("node %d lists %v after healing", i, names)
		}
	}
	if _, err := client(c, 4).CreateVDI(ctx(t), "after-heal", 1<<20); err != nil {
		t.Fatalf("create through a former minority node after healing: %v", err)
	}
}

// TestPartitionDuringIO: 2 of 5 nodes cut off while a client writes
// through each side: the minority's client gets I/O errors (never stale
// data), the majority's none. After healing, the majority's VDI is
// consistent; the minority's VDI (its writes were never acknowledged on
// the majority) is made consistent by `vdi check --repair`.
func TestPartitionDuringIO(t *testing.T) {
	need(t, "fio")
	c := testcluster.Start(t, testcluster.Options{Nodes: 5, Namespaces: true})
	all := []int{0, 1, 2, 3, 4}
	waitAgreement(t, c, all, 40*time.Second)
	herd(t, c, 0, "cluster", "format", "--copies", "3")
	herd(t, c, 0, "vdi", "create", "major", "256M")
	herd(t, c, 0, "vdi", "create", "minor", "256M")
	const timedWrites = "rw=randwrite\nbs=4k-64k\niodepth=8\nsize=128M\ntime_based\nruntime=25\nverify=crc32c\nverify_fatal=1\nverify_backlog=256\n"
	fio := func(node int, vdi string) (*exec.Cmd, *syncBuffer) {
		return startFio(t, vdi, c.Node(node).NBDURI(vdi), timedWrites)
	}
	majorFio, majorOut := fio(0, "major")
	minorFio, minorOut := fio(4, "minor")
	testcluster.WaitFor(t, 30*time.Second, "both writers to have written", func() (bool, error) {
		tree, err := client(c, 1).Tree(ctx(t))
		if err != nil {
			return false, err
		}
		written := map[string]uint64{}
		for _, v := range tree {
			written[v.Name] = v.AllocatedBytes
		}
		return written["major"] >= 16<<20 && written["minor"] >= 16<<20, fmt.Errorf("allocated: %v", written)
	})
	c.Partition([]int{0, 1, 2}, []int{3, 4})
	majorErr := majorFio.Wait()
	minorErr := minorFio.Wait()
	if majorErr != nil || strings.Contains(majorOut.String(), "verify: bad") {
		t.Fatalf("majority client saw errors: %v\n%s", majorErr, errorLines(majorOut.String()))
	}
	if minorErr == nil {
		t.Fatalf("the minority client saw no error across a partition:\n%s", lastLines(minorOut.String(), 20))
	}
	if strings.Contains(minorOut.String(), "verify: bad") {
		t.Fatalf("the minority client read wrong data:\n%s", lastLines(minorOut.String(), 20))
	}
	t.Logf("minority client failed as it should: %s", lastLines(minorOut.String(), 3))
	c.Heal()
	waitAgreement(t, c, all, 60*time.Second)
	waitRecovered(t, c, 5)
	checkVDIClean(t, c, 1, "major")
	testcluster.WaitFor(t, 30*time.Second, "the minority's writer lock to be released", func() (bool, error) {
		locks, err := client(c, 0).Locks(ctx(t))
		return err == nil && len(locks) == 0, fmt.Errorf("%+v %v", locks, err)
	})
	repair := herd(t, c, 1, "vdi", "check", "minor", "--repair")
	t.Logf("repair of the minority's vdi: %s", strings.TrimSpace(lastLines(repair, 1)))
	if strings.Contains(repair, ": 0 objects") {
		t.Fatalf("the minority's vdi has no objects to check:\n%s", repair)
	}
	checkVDIClean(t, c, 2, "minor")
}

// errorLines returns fio's lines that mention an error.
func errorLines(out string) string {
	var keep []string
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "err") || strings.Contains(l, "verify") {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n")
}
