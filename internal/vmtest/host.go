package vmtest

import (
	"bufio"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// QEMUProgram is the emulator Run starts, looked up in PATH.
const QEMUProgram = "qemu-system-x86_64"

// guestModules are the kernel modules /init loads, in this order, unless the
// kernel has them built in. Their dependencies from modules.dep are loaded
// first; on Debian 12 the order is exactly this list.
var guestModules = []string{
	"virtio_ring",
	"virtio",
	"virtio_pci_legacy_dev",
	"virtio_pci_modern_dev",
	"virtio_pci",
	"virtio_blk",
}

// optionalGuestModules may be absent altogether: kernels before 5.14 have no
// separate virtio_pci_legacy_dev and virtio_pci_modern_dev.
var optionalGuestModules = map[string]bool{
	"virtio_pci_legacy_dev": true,
	"virtio_pci_modern_dev": true,
}

// busyboxCandidates are tried after busybox in PATH.
var busyboxCandidates = []string{"/bin/busybox", "/usr/bin/busybox"}

// host is what Run needs from the machine it runs on.
type host struct {
	// qemu is the path of qemu-system-x86_64.
	qemu string
	// kernel is the path of the guest kernel, /boot/vmlinuz-VERSION.
	kernel string
	// kernelVersion is VERSION, which names /lib/modules/VERSION.
	kernelVersion string
	// modules are the paths of the module files to load, in load order.
	modules []string
	// busybox is the path of a statically linked x86-64 busybox.
	busybox string
}

// Available reports whether Run can work on this machine: it returns nil
// when qemu-system-x86_64, a kernel in /boot/vmlinuz-*, that kernel's virtio
// modules under /lib/modules/VERSION and a statically linked busybox are all
// present, and otherwise an error naming everything that is missing (tests
// pass it to testenv.Require).
func Available() error {
	_, err := discoverHost()
	return err
}

// discoverHost finds everything Run needs, or says what is missing.
func discoverHost() (*host, error) {
	var problems []error
	found := &host{}

	if path, err := exec.LookPath(QEMUProgram); err == nil {
		found.qemu = path
	} else {
		problems = append(problems, fmt.Errorf("%s not found in PATH (Debian package qemu-system-x86)", QEMUProgram))
	}

	if path, err := findStaticBusybox(); err == nil {
		found.busybox = path
	} else {
		problems = append(problems, err)
	}

	kernel, version, err := findKernel()
	if err != nil {
		problems = append(problems, err)
	} else {
		found.kernel, found.kernelVersion = kernel, version
		modules, err := findModules(filepath.Join("/lib/modules", version))
		if err != nil {
			problems = append(problems, err)
		}
		found.modules = modules
	}

	if len(problems) > 0 {
		return nil, fmt.Errorf("vmtest: cannot boot a VM on this machine: %w", errors.Join(problems...))
	}
	return found, nil
}

// findStaticBusybox returns the path of a statically linked x86-64 busybox.
func findStaticBusybox() (string, error) {
	candidates := busyboxCandidates
	if path, err := exec.LookPath("busybox"); err == nil {
		candidates = append([]string{path}, candidates...)
	}
	var reasons []string
	for _, path := range candidates {
		err := checkStaticExecutable(path)
		if err == nil {
			return path, nil
		}
		if !errors.Is(err, os.ErrNotExist) {
			reasons = append(reasons, err.Error())
		}
	}
	if len(reasons) == 0 {
		return "", errors.New("busybox not found (Debian package busybox-static)")
	}
	return "", fmt.Errorf("no statically linked busybox (Debian package busybox-static): %s", strings.Join(reasons, "; "))
}

// checkStaticExecutable returns nil if path is an x86-64 ELF executable
// without a dynamic loader, so that it runs alone in the initramfs.
func checkStaticExecutable(path string) error {
	file, err := elf.Open(path)
	if err != nil {
		return err
	}
	defer file.Close()
	if file.Machine != elf.EM_X86_64 {
		return fmt.Errorf("%s is not an x86-64 program", path)
	}
	for _, program := range file.Progs {
		if program.Type == elf.PT_INTERP {
			return fmt.Errorf("%s is dynamically linked", path)
		}
	}
	return nil
}

// findKernel chooses the guest kernel among /boot/vmlinuz-*: only kernels
// whose /lib/modules/VERSION/modules.dep exists qualify; the running kernel's
// version wins if it qualifies, otherwise the highest version.
func findKernel() (path string, version string, err error) {
	kernels, _ := filepath.Glob("/boot/vmlinuz-*")
	if len(kernels) == 0 {
		return "", "", errors.New("no kernel in /boot/vmlinuz-* (Debian package linux-image-amd64)")
	}
	running := ""
	if release, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		running = strings.TrimSpace(string(release))
	}
	var withoutModules []string
	for _, candidate := range kernels {
		candidateVersion := strings.TrimPrefix(filepath.Base(candidate), "vmlinuz-")
		if _, statError := os.Stat(filepath.Join("/lib/modules", candidateVersion, "modules.dep")); statError != nil {
			withoutModules = append(withoutModules, candidateVersion)
			continue
		}
		if path == "" || candidateVersion == running ||
			(version != running && compareVersions(candidateVersion, version) > 0) {
			path, version = candidate, candidateVersion
		}
	}
	if path == "" {
		return "", "", fmt.Errorf("no modules in /lib/modules for kernels %s (Debian package linux-image-amd64)", strings.Join(withoutModules, ", "))
	}
	file, err := os.Open(path)
	if err != nil {
		return "", "", fmt.Errorf("kernel %s is not readable: %w", path, err)
	}
	file.Close()
	return path, version, nil
}

// compareVersions orders kernel version strings, comparing runs of digits
// as numbers: 6.1.0-10 sorts after 6.1.0-9.
func compareVersions(a, b string) int {
	for a != "" && b != "" {
		aPart, aRest := leadingRun(a)
		bPart, bRest := leadingRun(b)
		aDigits, bDigits := isDigit(aPart[0]), isDigit(bPart[0])
		switch {
		case aDigits && bDigits:
			aPart, bPart = strings.TrimLeft(aPart, "0"), strings.TrimLeft(bPart, "0")
			if len(aPart) != len(bPart) {
				return len(aPart) - len(bPart)
			}
			if comparison := strings.Compare(aPart, bPart); comparison != 0 {
				return comparison
			}
		default:
			if comparison := strings.Compare(aPart, bPart); comparison != 0 {
				return comparison
			}
		}
		a, b = aRest, bRest
	}
	return len(a) - len(b)
}

// leadingRun splits text after its first run of digits or of non-digits.
func leadingRun(text string) (run, rest string) {
	digits := isDigit(text[0])
	end := 1
	for end < len(text) && isDigit(text[end]) == digits {
		end++
	}
	return text[:end], text[end:]
}

func isDigit(character byte) bool { return character >= '0' && character <= '9' }

// moduleName turns a module file path into the kernel's name for it:
// kernel/drivers/virtio/virtio_pci.ko.xz becomes virtio_pci.
func moduleName(path string) string {
	name := filepath.Base(path)
	if index := strings.Index(name, ".ko"); index >= 0 {
		name = name[:index]
	}
	return strings.ReplaceAll(name, "-", "_")
}

// findModules returns the module files to load, dependencies first, from the
// module directory of one kernel.
func findModules(directory string) ([]string, error) {
	dependencies, paths, err := readModulesDep(filepath.Join(directory, "modules.dep"))
	if err != nil {
		return nil, err
	}
	builtin := readModulesBuiltin(filepath.Join(directory, "modules.builtin"))

	var order []string
	loaded := map[string]bool{}
	var missing []string
	var load func(name string, depth int)
	load = func(name string, depth int) {
		if loaded[name] || depth > 32 {
			return
		}
		loaded[name] = true
		for _, dependency := range dependencies[name] {
			load(dependency, depth+1)
		}
		order = append(order, filepath.Join(directory, paths[name]))
	}
	for _, name := range guestModules {
		switch {
		case paths[name] != "":
			load(name, 0)
		case builtin[name], optionalGuestModules[name]:
		default:
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("kernel modules %s not found in %s", strings.Join(missing, ", "), directory)
	}
	for _, path := range order {
		if _, err := os.Stat(path); err != nil {
			return nil, fmt.Errorf("kernel module: %w", err)
		}
		if tool := decompressorFor(path); tool != "" {
			if _, err := exec.LookPath(tool); err != nil {
				return nil, fmt.Errorf("%s is needed to decompress %s", tool, path)
			}
		}
	}
	return order, nil
}

// readModulesDep parses modules.dep ("path: dependency-path ..."), returning
// each module's dependencies by name and each module's path by name.
func readModulesDep(path string) (dependencies map[string][]string, paths map[string]string, err error) {
	file, err := os.Open(path)
	if err != nil {
		return nil, nil, fmt.Errorf("kernel modules: %w", err)
	}
	defer file.Close()
	dependencies = map[string][]string{}
	paths = map[string]string{}
	scanner := bufio.NewScanner(file)
	scanner.Buffer(make([]byte, 64<<10), 1<<20)
	for scanner.Scan() {
		modulePath, dependencyList, found := strings.Cut(scanner.Text(), ":")
		if !found {
			continue
		}
		name := moduleName(modulePath)
		paths[name] = modulePath
		for _, dependency := range strings.Fields(dependencyList) {
			dependencies[name] = append(dependencies[name], moduleName(dependency))
		}
	}
	if err := scanner.Err(); err != nil {
		return nil, nil, fmt.Errorf("reading %s: %w", path, err)
	}
	return dependencies, paths, nil
}

// readModulesBuiltin returns the names of the modules built into the kernel;
// a missing file means none.
func readModulesBuiltin(path string) map[string]bool {
	builtin := map[string]bool{}
	contents, err := os.ReadFile(path)
	if err != nil {
		return builtin
	}
	for line := range strings.Lines(string(contents)) {
		if line = strings.TrimSpace(line); line != "" {
			builtin[moduleName(line)] = true
		}
	}
	return builtin
}

// decompressorFor names the program that decompresses a module file, or ""
// when the file is plain or gzip (which the standard library reads).
func decompressorFor(path string) string {
	switch {
	case strings.HasSuffix(path, ".ko.xz"):
		return "xz"
	case strings.HasSuffix(path, ".ko.zst"):
		return "zstd"
	}
	return ""
}
