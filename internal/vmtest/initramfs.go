package vmtest

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
)

// Markers printed on the guest console.
const (
	// DoneMarker starts the last line /init prints, "HERD-VM-DONE rc=N",
	// where N is the exit code of the guest script.
	DoneMarker = "HERD-VM-DONE"
	// ScriptStartMarker is printed by /init just before the guest script
	// starts, once /dev/vda exists: the end of the boot.
	ScriptStartMarker = "HERD-VM-SCRIPT-START"
	// SetupFailedMarker starts the line /init prints when the guest cannot
	// run the script (a module does not load, /dev/vda never appears).
	SetupFailedMarker = "HERD-VM-SETUP-FAILED"
)

// guestScriptPath is where the guest script lies in the initramfs.
const guestScriptPath = "herd/guest.sh"

// guestModuleDirectory holds the module files in the initramfs.
const guestModuleDirectory = "herd/modules"

// initTemplate is /init; %s is the list of module files to insmod, in order.
const initTemplate = `#!/bin/busybox sh
# /init of the herd vmtest initramfs: prepare the machine, run the guest
# script, report its exit code and power off.
/bin/busybox mkdir -p /bin /sbin /usr/bin /usr/sbin /proc /sys /dev /tmp
/bin/busybox --install -s
export PATH=/bin:/sbin:/usr/bin:/usr/sbin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /tmp

finish() {
	sync
	poweroff -f
	echo o > /proc/sysrq-trigger
	sleep 5
	exit 1
}

setup_failed() {
	echo "HERD-VM-SETUP-FAILED $*"
	dmesg | tail -n 30
	finish
}

for module in %s; do
	insmod "/herd/modules/$module" || setup_failed "insmod $module"
done

waited=0
while [ ! -b /dev/vda ]; do
	[ "$waited" -ge 600 ] && setup_failed "/dev/vda did not appear within 60 s"
	sleep 0.1
	waited=$((waited + 1))
done

echo "HERD-VM-SCRIPT-START"
DISK=/dev/vda sh /herd/guest.sh < /dev/null
rc=$?
sync
sync /dev/vda
echo "HERD-VM-DONE rc=$rc"
finish
`

// baseInitramfsCache holds the compressed base archive per kernel version.
var baseInitramfsCache = struct {
	sync.Mutex
	archives map[string][]byte
}{archives: map[string][]byte{}}

// initramfs returns the gzip-compressed initramfs for this host with
// guestScript in it: the cached base archive followed by a second archive
// holding the script (the kernel unpacks concatenated archives in turn).
func initramfs(machine *host, guestScript string) ([]byte, error) {
	base, err := baseInitramfs(machine)
	if err != nil {
		return nil, err
	}
	var script bytes.Buffer
	compressor := gzip.NewWriter(&script)
	archive := newCPIOWriter(compressor)
	archive.directory("herd")
	archive.file(guestScriptPath, 0o755, []byte(guestScript))
	if err := archive.close(); err != nil {
		return nil, err
	}
	if err := compressor.Close(); err != nil {
		return nil, err
	}
	combined := make([]byte, 0, len(base)+script.Len())
	combined = append(combined, base...)
	return append(combined, script.Bytes()...), nil
}

// baseInitramfs returns the archive with busybox, the modules and /init,
// building it once per kernel version.
func baseInitramfs(machine *host) ([]byte, error) {
	baseInitramfsCache.Lock()
	defer baseInitramfsCache.Unlock()
	if archive, ok := baseInitramfsCache.archives[machine.kernelVersion]; ok {
		return archive, nil
	}
	archive, err := buildBaseInitramfs(machine)
	if err != nil {
		return nil, err
	}
	baseInitramfsCache.archives[machine.kernelVersion] = archive
	return archive, nil
}

// buildBaseInitramfs writes the base archive.
func buildBaseInitramfs(machine *host) ([]byte, error) {
	busybox, err := os.ReadFile(machine.busybox)
	if err != nil {
		return nil, fmt.Errorf("vmtest: reading busybox: %w", err)
	}
	var output bytes.Buffer
	compressor, err := gzip.NewWriterLevel(&output, gzip.BestSpeed)
	if err != nil {
		return nil, err
	}
	archive := newCPIOWriter(compressor)
	for _, directory := range []string{"bin", "sbin", "usr", "usr/bin", "usr/sbin", "dev", "proc", "sys", "tmp", "herd", guestModuleDirectory} {
		archive.directory(directory)
	}
	// The kernel opens /dev/console for init's standard streams before
	// /init can mount devtmpfs.
	archive.characterDevice("dev/console", 0o600, 5, 1)
	archive.file("bin/busybox", 0o755, busybox)
	archive.symlink("bin/sh", "busybox")

	var names []string
	for _, path := range machine.modules {
		contents, err := readModule(path)
		if err != nil {
			return nil, fmt.Errorf("vmtest: %w", err)
		}
		name := moduleName(path) + ".ko"
		archive.file(guestModuleDirectory+"/"+name, 0o644, contents)
		names = append(names, name)
	}
	archive.file("init", 0o755, []byte(fmt.Sprintf(initTemplate, strings.Join(names, " "))))
	if err := archive.close(); err != nil {
		return nil, err
	}
	if err := compressor.Close(); err != nil {
		return nil, err
	}
	return output.Bytes(), nil
}

// readModule returns a module file's contents, decompressed: busybox insmod
// loads what it is given with init_module, and not every kernel or busybox
// build decompresses modules itself.
func readModule(path string) ([]byte, error) {
	switch {
	case strings.HasSuffix(path, ".ko.gz"):
		file, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		defer file.Close()
		reader, err := gzip.NewReader(file)
		if err != nil {
			return nil, fmt.Errorf("decompressing %s: %w", path, err)
		}
		contents, err := io.ReadAll(reader)
		if err != nil {
			return nil, fmt.Errorf("decompressing %s: %w", path, err)
		}
		return contents, nil
	case decompressorFor(path) != "":
		tool := decompressorFor(path)
		var errorOutput bytes.Buffer
		command := exec.Command(tool, "-d", "-c", path)
		command.Stderr = &errorOutput
		contents, err := command.Output()
		if err != nil {
			return nil, fmt.Errorf("%s -d -c %s: %v: %s", tool, path, err, strings.TrimSpace(errorOutput.String()))
		}
		return contents, nil
	default:
		return os.ReadFile(path)
	}
}

// cpioWriter writes a cpio archive in the "newc" format the kernel unpacks
// (see Documentation/driver-api/early-userspace/buffer-format.rst). The
// first error sticks and is returned by close.
type cpioWriter struct {
	output io.Writer
	// inode numbers each entry; the kernel only uses them to find hard
	// links, which entries with one link never are.
	inode uint32
	err   error
}

func newCPIOWriter(output io.Writer) *cpioWriter {
	return &cpioWriter{output: output, inode: 1}
}

// cpio mode bits for the entry types.
const (
	cpioRegular          = 0o100000
	cpioDirectory        = 0o040000
	cpioSymlink          = 0o120000
	cpioCharacterDevices = 0o020000
)

func (writer *cpioWriter) directory(name string) {
	writer.entry(name, cpioDirectory|0o755, 2, 0, 0, nil)
}

func (writer *cpioWriter) file(name string, permissions fs.FileMode, contents []byte) {
	writer.entry(name, cpioRegular|uint32(permissions.Perm()), 1, 0, 0, contents)
}

func (writer *cpioWriter) symlink(name, target string) {
	writer.entry(name, cpioSymlink|0o777, 1, 0, 0, []byte(target))
}

func (writer *cpioWriter) characterDevice(name string, permissions fs.FileMode, major, minor uint32) {
	writer.entry(name, cpioCharacterDevices|uint32(permissions.Perm()), 1, major, minor, nil)
}

// entry writes one header, name and body, each padded to four bytes.
func (writer *cpioWriter) entry(name string, mode, links, deviceMajor, deviceMinor uint32, contents []byte) {
	if writer.err != nil {
		return
	}
	header := fmt.Sprintf("070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		writer.inode, mode, 0, 0, links, 0, len(contents), 0, 0, deviceMajor, deviceMinor, len(name)+1, 0)
	writer.inode++
	var buffer bytes.Buffer
	buffer.WriteString(header)
	buffer.WriteString(name)
	buffer.WriteByte(0)
	padTo4(&buffer)
	if _, err := writer.output.Write(buffer.Bytes()); err != nil {
		writer.err = err
		return
	}
	if _, err := writer.output.Write(contents); err != nil {
		writer.err = err
		return
	}
	if padding := (4 - len(contents)%4) % 4; padding > 0 {
		if _, err := writer.output.Write(make([]byte, padding)); err != nil {
			writer.err = err
		}
	}
}

// close writes the trailer entry.
func (writer *cpioWriter) close() error {
	writer.entry("TRAILER!!!", 0, 1, 0, 0, nil)
	return writer.err
}

func padTo4(buffer *bytes.Buffer) {
	for buffer.Len()%4 != 0 {
		buffer.WriteByte(0)
	}
}

// writeFile writes contents to directory/name and returns the path.
func writeFile(directory, name string, contents []byte) (string, error) {
	path := filepath.Join(directory, name)
	if err := os.WriteFile(path, contents, 0o644); err != nil {
		return "", fmt.Errorf("vmtest: %w", err)
	}
	return path, nil
}
