package e2e

import (
	"testing"
	"time"

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
	const seed, megabytes = "herd-vm-e2e", 32
	ctx, cancel := contextWithTimeout(t, 6*time.Minute)
	defer cancel()
	certificates := addClient(t, c, "vmhost", "vm")
	result, err := vmtest.Run(ctx, vmtest.Options{
		NBDURI:      "nbd://" + c.Node(0).NBDAddr() + "/vm",
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
	if err := vmtest.VerifyFromHost(ctx, c.Node(2).NBDURI("vm"), seed, megabytes); err != nil {
		t.Fatalf("host verification through another node: %v", err)
	}
	checkReplicas(t, c, 3)
}

func containsLine(text, line string) bool {
	for _, l := range splitLines(text) {
		if l == line {
			return true
		}
	}
	return false
}
