// Package vmtest boots a real virtual machine whose disk is an NBD export,
// runs a shell script inside it and reports what the guest printed, so that
// herd's integration tests can prove that an unmodified Linux guest writes,
// flushes and reads back data on a herd VDI.
//
// The machine is qemu-system-x86_64 under TCG (no KVM is needed), booting the
// host's own kernel from /boot/vmlinuz-VERSION with a small initramfs built
// on the fly: busybox-static, the virtio modules copied from
// /lib/modules/VERSION, and an /init that mounts /proc, /sys and /dev, loads
// the modules, waits for /dev/vda (the NBD export, attached as a virtio-blk
// disk with cache=none and discard=unmap), runs the caller's script, prints
//
//	HERD-VM-DONE rc=<exit code of the script>
//
// and powers the machine off. The initramfs is cached per kernel version for
// the life of the process; the guest script travels in a second, tiny cpio
// archive appended to it.
//
// A typical test:
//
//	testenv.Require(t, "a VM", vmtest.Available()) // skips, or fails under CI=true
//	result, err := vmtest.Run(ctx, vmtest.Options{
//		NBDURI:      "nbd://127.0.0.1:10809/vm1",
//		GuestScript: vmtest.DiskCheckScript("seed-1", 8),
//		WorkDir:     t.TempDir(),
//	})
//	// err is nil once the guest printed HERD-VM-DONE; then check
//	// result.ExitCode == 0 and strings.Contains(result.Console, vmtest.CheckOK),
//	// and, after the VM is gone, vmtest.VerifyFromHost(ctx, uri, "seed-1", 8).
//
// The host needs (Debian 12 package names):
//
//	qemu-system-x86 busybox-static linux-image-amd64
//
// plus qemu-utils (qemu-img) or libnbd-bin (nbdcopy) for VerifyFromHost, and
// nbdkit for this package's own self-test. Available reports what is missing.
// A boot under TCG takes roughly ten seconds on a small machine.
package vmtest
