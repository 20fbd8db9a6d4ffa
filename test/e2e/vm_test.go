package e2e

import (
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/testcluster"
	"github.com/herd-storage/herd/internal/testenv"
	"github.com/herd-storage/herd/internal/vmtest"
)

// TestVMOnHerdDisk boots a real VM (QEMU under TCG) whose disk is a herd
// VDI served by node 0 over NBD with TLS and a client certificate (herd
// client add); the guest writes, flushes, drops its caches and reads back;
// then the host verifies the same bytes through node 2.
func TestVMOnHerdDisk(t *testing.T) {
	testenv.Require(t, "a VM (qemu-system-x86, a kernel, busybox-static)", vmtest.Available())
	c := dataCluster(t, 3, 3, "vm", "256M")
	runDiskCheckVM(t, c, "vm", "herd-vm-e2e", 32, func() {})
	checkReplicas(t, c, 3)
}

// runDiskCheckVM boots a VM whose disk is vdi, served by node 0 over
// NBD with TLS and a client certificate; the guest writes megabytes
// from seed, flushes, drops its caches and reads back. Then afterGuest
// runs, and the host verifies the same bytes through node 2.
func runDiskCheckVM(t *testing.T, c *testcluster.Cluster, vdi, seed string, megabytes int, afterGuest func()) {
	t.Helper()
	ctx, cancel := contextWithTimeout(t, 6*time.Minute)
	defer cancel()
	certificates := addClient(t, c, "vmhost", vdi)
	result, err := vmtest.Run(ctx, vmtest.Options{
		NBDURI:      "nbd://" + c.Node(0).NBDAddr() + "/" + vdi,
		TLSDir:      certificates,
		GuestScript: vmtest.DiskCheckScript(seed, megabytes),
		WorkDir:     t.TempDir(),
	})
	if err != nil {
		t.Fatalf("vm: %v", err)
	}
	t.Logf("guest booted in %v, ran in %v", result.BootDuration.Round(time.Millisecond), result.Duration.Round(time.Millisecond))
	if result.ExitCode != 0 || !containsLine(result.Console, vmtest.CheckOK) {
		t.Fatalf("guest disk check failed (rc=%d):\n%s", result.ExitCode, lastLines(result.Console, 30))
	}
	afterGuest()
	if err := vmtest.VerifyFromHost(ctx, c.Node(2).NBDURI(vdi), seed, megabytes); err != nil {
		t.Fatalf("host verification through another node: %v", err)
	}
}

func containsLine(text, line string) bool {
	for _, l := range splitLines(text) {
		if l == line {
			return true
		}
	}
	return false
}
