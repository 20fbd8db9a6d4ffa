package vmtest

import (
	"fmt"
	"os"
	"path/filepath"
)

// BootFiles writes what another launcher (libvirt's <os> with <kernel> and
// <initrd>) needs to boot the guest Run boots: a copy of the host's kernel
// (vmlinuz) and the initramfs with guestScript in it (initramfs.cpio.gz),
// both mode 0644 in directory, and returns their paths. The kernel is
// copied so that a launcher that changes the ownership of the files it is
// given (libvirt's DAC driver) never touches /boot. Boot the kernel with
// KernelCommandLine; /init runs guestScript once /dev/vda exists, prints
// the DoneMarker line on ttyS0 and powers off.
func BootFiles(directory, guestScript string) (kernel, initrd string, err error) {
	machine, err := discoverHost()
	if err != nil {
		return "", "", err
	}
	contents, err := os.ReadFile(machine.kernel)
	if err != nil {
		return "", "", fmt.Errorf("vmtest: %w", err)
	}
	if kernel, err = writeFile(directory, "vmlinuz", contents); err != nil {
		return "", "", err
	}
	archive, err := initramfs(machine, guestScript)
	if err != nil {
		return "", "", err
	}
	if initrd, err = writeFile(directory, "initramfs.cpio.gz", archive); err != nil {
		return "", "", err
	}
	for _, path := range []string{kernel, initrd} {
		if err := os.Chmod(path, 0o644); err != nil {
			return "", "", fmt.Errorf("vmtest: %w", err)
		}
	}
	return filepath.Clean(kernel), filepath.Clean(initrd), nil
}
