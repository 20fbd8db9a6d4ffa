package e2e

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/testcluster"
)

// Per-VDI QoS on a real 3-node cluster through fio: the rate a limit
// allows is reached (at least 80% of it, the client keeps 32 requests in
// flight) and never exceeded by more than 5% (the burst); a new limit
// set while fio runs applies to the same connection. Only the limit is
// asserted, never a speed without one.
func TestVDIQoSLimits(t *testing.T) {
	need(t, "fio")
	c := dataCluster(t, 3, 3, "vm", "256M")
	herd(t, c, 0, "vdi", "create", "big", "1G")

	// Refusals: nothing to change, negative or absurd values.
	for _, bad := range [][]string{
		{"vdi", "set", "vm"},
		{"vdi", "set", "vm", "--write-iops-limit", "-5"},
		{"vdi", "set", "vm", "--bps-limit", "2P"},
		{"vdi", "set", "vm", "--read-bps-limit", "1K"},
	} {
		_, stderr, err := c.Herd(ctx(t), 0, bad...)
		if err == nil || !strings.Contains(stderr, "limit") {
			t.Fatalf("herd %s: %v %q, want an error naming the limit flags", strings.Join(bad, " "), err, stderr)
		}
	}

	// A change made through one node is seen at once through every other
	// (the admin reads wait for the leader's commit: read-your-writes).
	for i := range 6 {
		limit := fmt.Sprint(100 + i)
		herd(t, c, i%3, "vdi", "set", "vm", "--write-iops-limit", limit)
		if out := herd(t, c, (i+1)%3, "vdi", "info", "vm"); !strings.Contains(out, "write iops "+limit+"/s") {
			t.Fatalf("vdi info through node %d right after vdi set through node %d does not show the limit %s:\n%s", (i+1)%3, i%3, limit, out)
		}
	}
	herd(t, c, 0, "vdi", "set", "vm", "--write-iops-limit", "200")
	if out := herd(t, c, 1, "vdi", "info", "vm"); !strings.Contains(out, "write iops 200/s") {
		t.Fatalf("vdi info does not show the limit:\n%s", out)
	}
	t.Run("write-iops", func(t *testing.T) {
		rates := limitedRun(t, c, "vm", "rw=randwrite\nbs=4k\niodepth=32\nsize=128M\n", "iops", func() {
			herd(t, c, 2, "vdi", "set", "vm", "--write-iops-limit", "400")
		})
		checkRate(t, "write IOPS under --write-iops-limit 200", rates[0], 200)
		checkRate(t, "write IOPS after a live change to 400", rates[1], 400)
	})

	herd(t, c, 0, "vdi", "set", "big", "--bps-limit", "16MiB")
	t.Run("bps", func(t *testing.T) {
		rates := limitedRun(t, c, "big", "rw=write\nbs=1M\niodepth=8\nsize=1G\n", "bw", func() {
			herd(t, c, 1, "vdi", "set", "big", "--bps-limit", "32MiB/s")
		})
		// fio's bandwidth log is in KiB/s.
		checkRate(t, "KiB/s under --bps-limit 16MiB", rates[0], 16<<10)
		checkRate(t, "KiB/s after a live change to 32MiB/s", rates[1], 32<<10)
	})
	if out := herd(t, c, 0, "vdi", "status", "big"); !strings.Contains(out, "bandwidth 32 MiB/s") {
		t.Fatalf("vdi status does not show the limit:\n%s", out)
	}
}

// limitedRun runs fio on one connection to vdi through node 0 for 13 s,
// calls change 7 s after starting it, and returns the mean of fio's
// per-second log (kind "iops" or "bw") over seconds 1-5 and 9-13 of
// fio's clock. fio's clock starts when its job does, up to a second or
// two after the process (connecting): the change lands between 5 and 7 s
// on it. The first second is left out (the burst after a pause), and the
// two after the change (it reaching the gateway, the requests queued
// under the old limit).
func limitedRun(t *testing.T, c *testcluster.Cluster, vdi, options, kind string, change func()) [2]float64 {
	t.Helper()
	prefix := filepath.Join(t.TempDir(), "log")
	fio, out := startFio(t, "qos-"+kind, c.Node(0).NBDURI(vdi), options+
		fmt.Sprintf("time_based=1\nruntime=13\nwrite_%s_log=%s\nlog_avg_msec=1000\n", kind, prefix))
	time.Sleep(7 * time.Second)
	change()
	if err := fio.Wait(); err != nil {
		t.Fatalf("fio: %v\n%s", err, out.String())
	}
	logs, _ := filepath.Glob(prefix + "_" + kind + "*.log")
	if len(logs) != 1 {
		t.Fatalf("fio's %s log: %v\n%s", kind, logs, out.String())
	}
	f, err := os.Open(logs[0])
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var sums, counts [2]float64
	scanner := bufio.NewScanner(f)
	var lines []string
	for scanner.Scan() {
		lines = append(lines, scanner.Text())
		fields := strings.Split(scanner.Text(), ",")
		if len(fields) < 2 {
			continue
		}
		ms, err1 := strconv.Atoi(strings.TrimSpace(fields[0]))
		value, err2 := strconv.ParseFloat(strings.TrimSpace(fields[1]), 64)
		if err1 != nil || err2 != nil {
			continue
		}
		at := time.Duration(ms) * time.Millisecond
		switch {
		case at > time.Second && at <= 5*time.Second:
			sums[0] += value
			counts[0]++
		case at > 9*time.Second && at <= 13*time.Second:
			sums[1] += value
			counts[1]++
		}
	}
	if counts[0] < 3 || counts[1] < 3 {
		t.Fatalf("fio's log has too few samples:\n%s", strings.Join(lines, "\n"))
	}
	t.Logf("fio %s log:\n%s", kind, strings.Join(lines, "\n"))
	return [2]float64{sums[0] / counts[0], sums[1] / counts[1]}
}

// checkRate asserts a limited rate: at most 5% above the limit, at least
// 80% of it.
func checkRate(t *testing.T, what string, got, limit float64) {
	t.Helper()
	t.Logf("%s: %.0f (limit %.0f)", what, got, limit)
	if got > limit*1.05 || got < limit*0.8 {
		t.Errorf("%s: %.0f, want between %.0f and %.0f", what, got, limit*0.8, limit*1.05)
	}
}
