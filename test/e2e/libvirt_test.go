package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/testcluster"
	"github.com/herd-storage/herd/internal/testenv"
	"github.com/herd-storage/herd/internal/vmtest"
)

// libvirtQEMUUser is the user and group Debian's libvirt runs QEMU as.
const libvirtQEMUUser = "libvirt-qemu"

// libvirtDomain is the test's domain around the disks docs/LIBVIRT.md
// gives: TCG, the host's kernel and a busybox initramfs, the console in a
// file, powered off (and so ended) by the guest.
const libvirtDomain = `<domain type='qemu'>
  <name>herd-libvirt-e2e</name>
  <memory unit='MiB'>256</memory>
  <vcpu>1</vcpu>
  <os>
    <type arch='x86_64' machine='pc'>hvm</type>
    <kernel>%s</kernel>
    <initrd>%s</initrd>
    <cmdline>%s</cmdline>
  </os>
  <features><acpi/></features>
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>destroy</on_reboot>
  <on_crash>destroy</on_crash>
  <devices>
%s
    <serial type='file'>
      <source path='%s'/>
      <target port='0'/>
    </serial>
    <memballoon model='none'/>
  </devices>
</domain>
`

// TestLibvirtUnprivilegedQEMU: Debian's libvirtd, with the installed
// configuration and QEMU as the unprivileged libvirt-qemu user, runs a
// domain whose disks are docs/LIBVIRT.md's XML, one through the node's
// local socket (--nbd-socket-group libvirt-qemu), one over NBD with TLS
// (herd client add --owner libvirt-qemu); the guest writes, flushes and
// reads back both, and the host finds the data in herd.
//
// The test starts virtlogd and libvirtd itself (CI has no systemd), in a
// mount namespace of their own (see libvirtSandbox), and stops only them,
// by pid. What it changes in libvirt's configuration, in qemu.conf only:
// user and group set to libvirt-qemu (Debian's default, said explicitly
// so that QEMU never runs as root here), the docs' nbd_tls_x509_cert_dir,
// and security_driver = "none": AppArmor or SELinux confinement needs the
// host's LSM and libvirt's profiles loaded, which a CI container may lack;
// the DAC driver (QEMU as libvirt-qemu) stays on. Cgroups, namespaces and
// everything else are as installed.
func TestLibvirtUnprivilegedQEMU(t *testing.T) {
	testenv.RequireRoot(t, "libvirt's system daemon, a mount namespace, files given to libvirt-qemu")
	testenv.Require(t, "a VM (qemu-system-x86, a kernel, busybox-static)", vmtest.Available())
	need(t, "qemu-img")
	libvirtd := sbinProgram(t, "libvirtd", "libvirt-daemon-system")
	virtlogd := sbinProgram(t, "virtlogd", "libvirt-daemon-system")
	virsh := testenv.LookPath(t, "virsh", "libvirt-clients")
	testenv.LookPath(t, "mount", "mount")
	qemuUser, err := user.Lookup(libvirtQEMUUser)
	testenv.Require(t, "the libvirt-qemu user (libvirt-daemon-system)", err)
	qemuGroup, err := user.LookupGroup(libvirtQEMUUser)
	testenv.Require(t, "the libvirt-qemu group (libvirt-daemon-system)", err)

	doc, err := os.ReadFile("../../docs/LIBVIRT.md")
	if err != nil {
		t.Fatal(err)
	}
	disks := fencedBlock(t, string(doc), "xml", "<disk")
	qemuConfLine := fencedBlock(t, string(doc), "conf", "nbd_tls_x509_cert_dir")
	for _, want := range []string{"socket='/run/herd/nbd.sock'", "tls='yes'", "<host name='10.0.0.11' port='10809'/>", "name='vm1'", "name='vm1-data'"} {
		if !strings.Contains(disks, want) {
			t.Fatalf("docs/LIBVIRT.md's disks lack %s:\n%s", want, disks)
		}
	}

	sandbox := newLibvirtSandbox(t)
	socket := filepath.Join(sandbox.directory, "run/herd/nbd.sock")
	c := dataClusterWith(t, testcluster.Options{Nodes: 1, ExtraArgs: []string{"--nbd-socket", socket, "--nbd-socket-group", libvirtQEMUUser}}, 1, "vm1", "64M")
	if _, stderr, err := c.Herd(ctx(t), 0, "vdi", "create", "vm1-data", "64M"); err != nil {
		t.Fatalf("vdi create vm1-data: %v %s", err, stderr)
	}
	checkOwnership(t, socket, 0o660, -1, qemuGroup.Gid)

	// A directory libvirt-qemu could not enter is refused before any
	// certificate is issued.
	closed := sandbox.mkdir(t, "closed")
	if err := os.Chmod(closed, 0o700); err != nil {
		t.Fatal(err)
	}
	_, stderr, err := c.Herd(ctx(t), 0, "client", "add", "kvm0", "--vdi", "vm*", "--out", filepath.Join(closed, "herd-nbd"), "--owner", libvirtQEMUUser)
	if err == nil || !strings.Contains(stderr, "user libvirt-qemu cannot enter "+closed+" (mode 0700") {
		t.Fatalf("client add --owner into a directory libvirt-qemu cannot enter: %v %s", err, stderr)
	}
	if stdout, _, err := c.Herd(ctx(t), 0, "client", "list"); err != nil || strings.Contains(stdout, "kvm0") {
		t.Fatalf("client list after the refused add: %v\n%s", err, stdout)
	}

	certificates := filepath.Join(sandbox.directory, "pki/herd-nbd")
	if _, stderr, err := c.Herd(ctx(t), 0, "client", "add", "kvm1", "--vdi", "vm*", "--out", certificates, "--owner", libvirtQEMUUser); err != nil {
		t.Fatalf("client add --owner: %v %s", err, stderr)
	}
	checkOwnership(t, certificates, 0o700, mustAtoi(t, qemuUser.Uid), "")
	for _, name := range []string{"ca-cert.pem", "client-cert.pem", "client-key.pem"} {
		checkOwnership(t, filepath.Join(certificates, name), 0o600, mustAtoi(t, qemuUser.Uid), "")
	}

	const seedSocket, seedTLS, megabytes = "herd-libvirt-socket", "herd-libvirt-tls", 8
	kernel, initrd, err := vmtest.BootFiles(sandbox.mkdir(t, "boot"), twoDiskScript(seedSocket, seedTLS, megabytes))
	if err != nil {
		t.Fatal(err)
	}

	conf := strings.ReplaceAll(qemuConfLine, "/etc/pki/herd-nbd", certificates)
	sandbox.writeQEMUConf(t, fmt.Sprintf("user = %q\ngroup = %q\nsecurity_driver = \"none\"\n%s\n", libvirtQEMUUser, libvirtQEMUUser, conf))
	sandbox.start(t, virtlogd)
	sandbox.start(t, libvirtd)
	sandbox.waitReady(t, virsh)

	console := filepath.Join(sandbox.directory, "console.log")
	domainDisks := strings.Replace(disks, "10.0.0.11", c.Node(0).Address(), 1)
	xml := fmt.Sprintf(libvirtDomain, kernel, initrd, vmtest.KernelCommandLine, domainDisks, console)
	domainFile := filepath.Join(sandbox.directory, "domain.xml")
	if err := os.WriteFile(domainFile, []byte(xml), 0o644); err != nil {
		t.Fatal(err)
	}
	const domain = "herd-libvirt-e2e"
	sandbox.virsh(t, virsh, "define", domainFile)
	t.Cleanup(func() {
		sandbox.virshQuiet(virsh, "destroy", domain)
		sandbox.virshQuiet(virsh, "undefine", domain)
	})
	started := time.Now()
	sandbox.virsh(t, virsh, "start", domain)

	// Its QEMU runs as libvirt-qemu (caught while the guest runs: it
	// powers off a few seconds after the boot).
	pidFile := filepath.Join(sandbox.directory, "run/libvirt/qemu", domain+".pid")
	uids, gids := qemuCredentials(t, pidFile)
	if uids != strings.Repeat(qemuUser.Uid+"\t", 3)+qemuUser.Uid || gids != strings.Repeat(qemuGroup.Gid+"\t", 3)+qemuGroup.Gid {
		t.Fatalf("QEMU runs as uids %q, gids %q; want libvirt-qemu's %s and %s", uids, gids, qemuUser.Uid, qemuGroup.Gid)
	}
	t.Logf("QEMU runs as %s (uid %s, gid %s)", libvirtQEMUUser, qemuUser.Uid, qemuGroup.Gid)

	testcluster.WaitFor(t, 2*time.Minute, "the guest to power off", func() (bool, error) {
		state, err := sandbox.virshOutput(virsh, "domstate", domain)
		return strings.TrimSpace(state) == "shut off", fmt.Errorf("domstate %q %v", strings.TrimSpace(state), err)
	})
	t.Logf("the domain ran %v", time.Since(started).Round(time.Millisecond))
	output, err := os.ReadFile(console)
	if err != nil {
		t.Fatal(err)
	}
	text := strings.ReplaceAll(string(output), "\r\n", "\n")
	if !containsLine(text, vmtest.DoneMarker+" rc=0") || strings.Count(text, vmtest.CheckOK+"\n") != 2 {
		t.Fatalf("the guest's check failed on a disk; console:\n%s\nQEMU log:\n%s", lastLines(text, 40), sandbox.qemuLog(domain))
	}
	ctx, cancel := contextWithTimeout(t, time.Minute)
	defer cancel()
	for vdi, seed := range map[string]string{"vm1": seedSocket, "vm1-data": seedTLS} {
		if err := vmtest.VerifyFromHost(ctx, "nbd+unix:///"+vdi+"?socket="+socket, seed, megabytes); err != nil {
			t.Fatalf("%s read back through herd: %v", vdi, err)
		}
	}
}

// twoDiskScript is the guest script: vmtest's disk check on /dev/vda (the
// socket disk) and /dev/vdb (the TLS disk), one after the other.
func twoDiskScript(seedA, seedB string, megabytes int) string {
	return fmt.Sprintf(`waited=0
while [ ! -b /dev/vdb ]; do
	[ "$waited" -ge 600 ] && { echo "HERD-VM-CHECK FAIL /dev/vdb did not appear"; exit 1; }
	sleep 0.1
	waited=$((waited + 1))
done
cat > /tmp/vda.sh <<'HERD_CHECK_END'
%s
HERD_CHECK_END
cat > /tmp/vdb.sh <<'HERD_CHECK_END'
%s
HERD_CHECK_END
echo "checking /dev/vda (the local socket)"
DISK=/dev/vda sh /tmp/vda.sh || exit 1
echo "checking /dev/vdb (NBD over TLS)"
DISK=/dev/vdb sh /tmp/vdb.sh || exit 1
`, vmtest.DiskCheckScript(seedA, megabytes), vmtest.DiskCheckScript(seedB, megabytes))
}

// fencedBlock returns the first ```language block of doc that contains
// want.
func fencedBlock(t *testing.T, doc, language, want string) string {
	t.Helper()
	blocks := regexp.MustCompile("(?ms)^```"+regexp.QuoteMeta(language)+"\n(.*?)^```").FindAllStringSubmatch(doc, -1)
	for _, block := range blocks {
		if strings.Contains(block[1], want) {
			return block[1]
		}
	}
	t.Fatalf("docs/LIBVIRT.md has no ```%s block with %s", language, want)
	return ""
}

// sbinProgram finds a daemon in PATH or /usr/sbin (a test's PATH may lack
// the sbin directories).
func sbinProgram(t *testing.T, name, debianPackage string) string {
	t.Helper()
	if path, err := exec.LookPath(name); err == nil {
		return path
	}
	path := filepath.Join("/usr/sbin", name)
	_, err := os.Stat(path)
	if err != nil {
		err = fmt.Errorf("%s not in PATH nor /usr/sbin (Debian package %s)", name, debianPackage)
	}
	testenv.Require(t, name, err)
	return path
}

func mustAtoi(t *testing.T, text string) int {
	t.Helper()
	n, err := strconv.Atoi(text)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// checkOwnership checks a file's permission bits, and its owner (uid, or
// -1: any) and group (gid, or "": any).
func checkOwnership(t *testing.T, path string, mode os.FileMode, uid int, gid string) {
	t.Helper()
	info, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	stat := info.Sys().(*syscall.Stat_t)
	if info.Mode().Perm() != mode || (uid >= 0 && int(stat.Uid) != uid) || (gid != "" && strconv.Itoa(int(stat.Gid)) != gid) {
		t.Fatalf("%s: mode %04o, uid %d, gid %d; want mode %04o, uid %d, gid %s", path, info.Mode().Perm(), stat.Uid, stat.Gid, mode, uid, gid)
	}
}

// qemuCredentials reads the Uid and Gid lines of the QEMU process whose
// pid libvirt wrote to pidFile, checking first that the pid is a QEMU.
func qemuCredentials(t *testing.T, pidFile string) (uids, gids string) {
	t.Helper()
	testcluster.WaitFor(t, 30*time.Second, "libvirt's QEMU and its pid file", func() (bool, error) {
		contents, err := os.ReadFile(pidFile)
		if err != nil {
			return false, err
		}
		pid := strings.TrimSpace(string(contents))
		command, err := os.ReadFile("/proc/" + pid + "/cmdline")
		if err != nil {
			return false, err
		}
		if !bytes.Contains(command, []byte("qemu-system")) {
			return false, fmt.Errorf("pid %s is not QEMU: %q", pid, command)
		}
		status, err := os.ReadFile("/proc/" + pid + "/status")
		if err != nil {
			return false, err
		}
		for _, line := range strings.Split(string(status), "\n") {
			if value, ok := strings.CutPrefix(line, "Uid:"); ok {
				uids = strings.TrimSpace(value)
			}
			if value, ok := strings.CutPrefix(line, "Gid:"); ok {
				gids = strings.TrimSpace(value)
			}
		}
		return uids != "" && gids != "", errors.New("no Uid or Gid line")
	})
	return uids, gids
}

// libvirtSandbox is where the test's libvirt daemons keep their state: a
// directory under /var/tmp (its path must stay short for unix sockets, and
// libvirt-qemu must be able to enter it) whose subdirectories replace, in
// the daemons' mount namespace, /run, /etc/libvirt/qemu (domain
// definitions), /var/lib/libvirt, /var/cache/libvirt and /var/log/libvirt,
// with qemu.conf replacing /etc/libvirt/qemu.conf. The host's own libvirt
// state and any libvirtd of the host are left alone, and the domain's
// /run/herd/nbd.sock is the sandbox's run/herd/nbd.sock.
type libvirtSandbox struct {
	directory string
	binds     [][2]string // source in the sandbox, target on the host
}

func newLibvirtSandbox(t *testing.T) *libvirtSandbox {
	t.Helper()
	directory, err := os.MkdirTemp("/var/tmp", "herd-libvirt-")
	if err != nil {
		t.Fatal(err)
	}
	// Removed after the daemons stopped: cleanups run last first.
	t.Cleanup(func() {
		if t.Failed() {
			for _, name := range []string{"virtlogd.log", "libvirtd.log"} {
				if contents, err := os.ReadFile(filepath.Join(directory, name)); err == nil {
					t.Logf("%s:\n%s", name, lastLines(string(contents), 30))
				}
			}
		}
		os.RemoveAll(directory)
	})
	if err := os.Chmod(directory, 0o755); err != nil {
		t.Fatal(err)
	}
	s := &libvirtSandbox{directory: directory}
	for _, bind := range [][2]string{
		{"run", "/run"},
		{"etc-qemu", "/etc/libvirt/qemu"},
		{"lib", "/var/lib/libvirt"},
		{"cache", "/var/cache/libvirt"},
		{"log", "/var/log/libvirt"},
	} {
		if _, err := os.Stat(bind[1]); err != nil {
			testenv.Require(t, "libvirt's directories (libvirt-daemon-system)", err)
		}
		s.mkdir(t, bind[0])
		s.binds = append(s.binds, [2]string{filepath.Join(directory, bind[0]), bind[1]})
	}
	s.mkdir(t, "run/libvirt")
	return s
}

// mkdir makes a directory of the sandbox, mode 0755.
func (s *libvirtSandbox) mkdir(t *testing.T, name string) string {
	t.Helper()
	path := filepath.Join(s.directory, name)
	if err := os.MkdirAll(path, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

// writeQEMUConf writes the daemons' qemu.conf: the installed one with
// settings appended.
func (s *libvirtSandbox) writeQEMUConf(t *testing.T, settings string) {
	t.Helper()
	installed, err := os.ReadFile("/etc/libvirt/qemu.conf")
	testenv.Require(t, "/etc/libvirt/qemu.conf (libvirt-daemon-system)", err)
	path := filepath.Join(s.directory, "qemu.conf")
	contents := string(installed) + "\n# herd e2e (test/e2e/libvirt_test.go)\n" + settings
	if err := os.WriteFile(path, []byte(contents), 0o600); err != nil {
		t.Fatal(err)
	}
	s.binds = append(s.binds, [2]string{path, "/etc/libvirt/qemu.conf"})
}

// start runs a libvirt daemon in a mount namespace of its own with the
// sandbox's bind mounts, its output in the sandbox; the cleanup stops it
// by its pid (SIGTERM, then SIGKILL after 15 s).
func (s *libvirtSandbox) start(t *testing.T, program string) {
	t.Helper()
	var script strings.Builder
	script.WriteString("set -e\n")
	for _, bind := range s.binds {
		fmt.Fprintf(&script, "mount --bind '%s' '%s'\n", bind[0], bind[1])
	}
	fmt.Fprintf(&script, "exec '%s'\n", program)
	name := filepath.Base(program)
	logFile, err := os.Create(filepath.Join(s.directory, name+".log"))
	if err != nil {
		t.Fatal(err)
	}
	command := exec.Command("/bin/sh", "-c", script.String())
	command.Stdout, command.Stderr = logFile, logFile
	// CLONE_NEWNS: Go makes the new namespace's mounts private, so the
	// binds never reach the host.
	command.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS, Setsid: true, Pdeathsig: syscall.SIGKILL}
	if err := command.Start(); err != nil {
		logFile.Close()
		t.Fatalf("starting %s: %v", name, err)
	}
	exited := make(chan struct{})
	go func() {
		command.Wait()
		logFile.Close()
		close(exited)
	}()
	t.Cleanup(func() {
		select {
		case <-exited:
			return
		default:
		}
		// The child is not reaped until exited closes, so its pid is
		// still this daemon's.
		command.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			t.Logf("%s did not stop on SIGTERM within 15 s: killed", name)
			command.Process.Kill()
			<-exited
		}
	})
}

// waitReady waits until libvirtd answers on the sandbox's socket.
func (s *libvirtSandbox) waitReady(t *testing.T, virsh string) {
	t.Helper()
	testcluster.WaitFor(t, 60*time.Second, "libvirtd to answer", func() (bool, error) {
		out, err := s.virshOutput(virsh, "version")
		return err == nil, fmt.Errorf("%v: %s", err, strings.TrimSpace(out))
	})
}

func (s *libvirtSandbox) uri() string {
	return "qemu:///system?socket=" + filepath.Join(s.directory, "run/libvirt/libvirt-sock")
}

func (s *libvirtSandbox) virshOutput(virsh string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, virsh, append([]string{"-c", s.uri()}, args...)...).CombinedOutput()
	return string(out), err
}

func (s *libvirtSandbox) virsh(t *testing.T, virsh string, args ...string) {
	t.Helper()
	if out, err := s.virshOutput(virsh, args...); err != nil {
		t.Fatalf("virsh %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

func (s *libvirtSandbox) virshQuiet(virsh string, args ...string) { s.virshOutput(virsh, args...) }

// qemuLog is the end of the domain's QEMU log.
func (s *libvirtSandbox) qemuLog(domain string) string {
	contents, err := os.ReadFile(filepath.Join(s.directory, "log/qemu", domain+".log"))
	if err != nil {
		return err.Error()
	}
	return lastLines(string(contents), 20)
}
