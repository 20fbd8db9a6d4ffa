package vmtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Defaults for Options fields left zero.
const (
	DefaultMemoryMiB = 512
	DefaultTimeout   = 4 * time.Minute
)

// KernelCommandLine is what the guest kernel boots with: the console on the
// first serial port, a panic ends QEMU at once (with -no-reboot), and few
// kernel messages, since every byte on the emulated serial port costs time.
const KernelCommandLine = "console=ttyS0 panic=-1 quiet"

// exitGracePeriod is how long QEMU may take to exit after the guest printed
// its DoneMarker line before Run kills it.
const exitGracePeriod = 20 * time.Second

// consoleTailLines is how many console lines an error carries.
const consoleTailLines = 40

// Options describes one VM run.
type Options struct {
	// NBDURI is the disk, for example nbd://127.0.0.1:10809/vm1; it is
	// attached as a virtio-blk disk (/dev/vda) with cache=none and
	// discard=unmap, so the guest's flushes and discards reach the server.
	NBDURI string
	// TLSDir, when set, makes QEMU connect with NBD over TLS using the
	// x509 credentials in that directory (ca-cert.pem, client-cert.pem,
	// client-key.pem); NBDURI is then nbd://HOST:PORT/EXPORT.
	TLSDir string
	// GuestScript is a shell script that busybox sh runs inside the guest
	// once /dev/vda exists. It runs as root with PATH set to the busybox
	// applets, DISK=/dev/vda in its environment and /dev/null as its
	// standard input; its output goes to the console. Its exit code is
	// reported in Result.ExitCode.
	GuestScript string
	// MemoryMiB is the guest's memory; 0 means DefaultMemoryMiB.
	MemoryMiB int
	// Timeout bounds the whole run, boot included; 0 means DefaultTimeout.
	Timeout time.Duration
	// QMP, when set, is a unix socket path on which QEMU serves QMP (a
	// test that migrates the VM drives it there).
	QMP string
	// Incoming, when set, starts QEMU waiting for a migration stream on
	// that address ("tcp:127.0.0.1:4444") instead of booting the guest;
	// the guest's console continues here once the migration completes.
	Incoming string
	// Console, when set, also receives the console as it comes.
	Console io.Writer
	// WorkDir receives the initramfs (initramfs.cpio.gz), the console
	// (console.log) and QEMU's own messages (qemu.log), which stay there.
	// Empty means a temporary directory that Run removes.
	WorkDir string
}

// Result is what a VM run printed.
type Result struct {
	// Console is everything the guest printed on ttyS0, with "\r\n" turned
	// into "\n".
	Console string
	// ExitMarker is the line /init printed after the guest script,
	// "HERD-VM-DONE rc=N".
	ExitMarker string
	// ExitCode is N from ExitMarker: the guest script's exit code.
	ExitCode int
	// BootDuration is the time from starting QEMU until the guest script
	// started (ScriptStartMarker appeared on the console).
	BootDuration time.Duration
	// Duration is the time from starting QEMU until it exited.
	Duration time.Duration
}

// doneLine matches the line /init prints after the guest script. It is not
// anchored at the start of a line: the script's last output may lack a
// newline. The last match is /init's.
var doneLine = regexp.MustCompile(`(?m)` + DoneMarker + ` rc=(\d+)\r?$`)

// setupFailedLine matches the line /init prints when it cannot run the script.
var setupFailedLine = regexp.MustCompile(`(?m)^` + SetupFailedMarker + `.*$`)

// Run boots qemu-system-x86_64 under TCG with options.NBDURI as its disk,
// runs options.GuestScript inside it and returns what the guest printed.
//
// The error is nil once the guest printed its DoneMarker line, whatever the
// script's exit code (check Result.ExitCode). Otherwise, when the host lacks
// something (see Available), the guest could not set up, QEMU failed or
// exited early, the context ended or the timeout passed, Run kills QEMU by
// its pid and returns an error that includes the last 40 console lines; the
// Result then holds the console so far.
func Run(ctx context.Context, options Options) (Result, error) {
	if options.NBDURI == "" {
		return Result{}, errors.New("vmtest: Options.NBDURI is empty")
	}
	if options.MemoryMiB <= 0 {
		options.MemoryMiB = DefaultMemoryMiB
	}
	if options.Timeout <= 0 {
		options.Timeout = DefaultTimeout
	}
	machine, err := discoverHost()
	if err != nil {
		return Result{}, err
	}
	workDirectory := options.WorkDir
	if workDirectory == "" {
		workDirectory, err = os.MkdirTemp("", "herd-vmtest-")
		if err != nil {
			return Result{}, fmt.Errorf("vmtest: %w", err)
		}
		defer os.RemoveAll(workDirectory)
	} else if err := os.MkdirAll(workDirectory, 0o755); err != nil {
		return Result{}, fmt.Errorf("vmtest: %w", err)
	}

	archive, err := initramfs(machine, options.GuestScript)
	if err != nil {
		return Result{}, err
	}
	initramfsPath, err := writeFile(workDirectory, "initramfs.cpio.gz", archive)
	if err != nil {
		return Result{}, err
	}
	consoleLog, err := os.Create(filepath.Join(workDirectory, "console.log"))
	if err != nil {
		return Result{}, fmt.Errorf("vmtest: %w", err)
	}
	defer consoleLog.Close()
	qemuLog, err := os.Create(filepath.Join(workDirectory, "qemu.log"))
	if err != nil {
		return Result{}, fmt.Errorf("vmtest: %w", err)
	}
	defer qemuLog.Close()

	runContext, cancel := context.WithTimeout(ctx, options.Timeout)
	defer cancel()
	// graceContext ends exitGracePeriod after the done line appeared, if
	// QEMU has not exited by then.
	graceContext, cancelGrace := context.WithCancel(runContext)
	defer cancelGrace()

	console := &consoleWriter{file: consoleLog, done: make(chan struct{}), copy: options.Console}
	var qemuMessages bytes.Buffer
	command := exec.CommandContext(graceContext, machine.qemu, qemuArguments(machine, initramfsPath, options)...)
	command.Stdout = console
	command.Stderr = io.MultiWriter(&qemuMessages, qemuLog)
	// exec.CommandContext kills QEMU by its pid (os.Process.Kill) when the
	// context ends; Pdeathsig kills it if this process dies first.
	command.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	command.WaitDelay = 5 * time.Second

	started := time.Now()
	console.started = started
	if err := command.Start(); err != nil {
		return Result{}, fmt.Errorf("vmtest: starting %s: %w", machine.qemu, err)
	}
	exited := make(chan struct{})
	go func() {
		select {
		case <-console.done:
			select {
			case <-time.After(exitGracePeriod):
				cancelGrace()
			case <-exited:
			}
		case <-exited:
		}
	}()
	waitError := command.Wait()
	close(exited)

	result := console.result()
	result.Duration = time.Since(started)
	if matches := doneLine.FindAllStringSubmatch(result.Console, -1); matches != nil {
		match := matches[len(matches)-1]
		result.ExitMarker = strings.TrimSuffix(match[0], "\r")
		result.ExitCode, _ = strconv.Atoi(match[1])
		return result, nil
	}
	result.ExitCode = -1

	var reason string
	switch {
	case ctx.Err() != nil:
		reason = fmt.Sprintf("stopped: %v", ctx.Err())
	case runContext.Err() != nil:
		reason = fmt.Sprintf("the guest did not finish within %v", options.Timeout)
	case setupFailedLine.MatchString(result.Console):
		reason = "the guest could not run the script: " + strings.TrimSpace(setupFailedLine.FindString(result.Console))
	default:
		reason = fmt.Sprintf("QEMU exited (%v) before the guest printed %s", waitError, DoneMarker)
	}
	if messages := strings.TrimSpace(qemuMessages.String()); messages != "" {
		reason += "; QEMU said: " + messages
	}
	return result, fmt.Errorf("vmtest: %s; last %d console lines:\n%s", reason, consoleTailLines, lastLines(result.Console, consoleTailLines))
}

// qemuArguments is QEMU's command line: -nographic with the serial port on
// standard output and neither monitor nor default devices (no network card
// whose option ROM would slow the boot).
func qemuArguments(machine *host, initramfsPath string, options Options) []string {
	drive := "file=" + escapeDriveOption(options.NBDURI)
	var tls []string
	if options.TLSDir != "" {
		if u, err := url.Parse(options.NBDURI); err == nil {
			drive = "file.driver=nbd,file.host=" + u.Hostname() + ",file.port=" + u.Port() +
				",file.export=" + escapeDriveOption(strings.TrimPrefix(u.Path, "/")) + ",file.tls-creds=tls0"
			tls = []string{"-object", "tls-creds-x509,id=tls0,endpoint=client,dir=" + escapeDriveOption(options.TLSDir)}
		}
	}
	if options.QMP != "" {
		tls = append(tls, "-qmp", "unix:"+escapeDriveOption(options.QMP)+",server=on,wait=off")
	}
	if options.Incoming != "" {
		tls = append(tls, "-incoming", options.Incoming)
	}
	return append(tls,
		"-accel", "tcg",
		"-m", strconv.Itoa(options.MemoryMiB),
		"-nographic",
		"-nodefaults",
		"-no-user-config",
		"-serial", "stdio",
		"-monitor", "none",
		"-no-reboot",
		"-kernel", machine.kernel,
		"-initrd", initramfsPath,
		"-append", KernelCommandLine,
		"-drive", drive+",format=raw,if=virtio,cache=none,discard=unmap",
	)
}

// escapeDriveOption doubles commas, which QEMU's option parser would
// otherwise take as the end of the value.
func escapeDriveOption(value string) string {
	return strings.ReplaceAll(value, ",", ",,")
}

// lastLines returns the last count lines of text.
func lastLines(text string, count int) string {
	lines := strings.Split(strings.TrimRight(text, "\n"), "\n")
	if len(lines) > count {
		lines = lines[len(lines)-count:]
	}
	return strings.Join(lines, "\n")
}

// consoleWriter collects the guest console, copies it to a log file and
// notes when the script started and when the done line appeared.
type consoleWriter struct {
	file    *os.File
	copy    io.Writer // Options.Console, or nil
	started time.Time
	// done is closed when the done line has appeared.
	done chan struct{}

	mu           sync.Mutex
	output       bytes.Buffer
	bootDuration time.Duration
	sawDone      bool
}

func (writer *consoleWriter) Write(data []byte) (int, error) {
	writer.mu.Lock()
	defer writer.mu.Unlock()
	writer.file.Write(data)
	if writer.copy != nil {
		writer.copy.Write(data)
	}
	// Only the text that may hold a marker split across writes is searched.
	searchFrom := max(0, writer.output.Len()-len(DoneMarker)-len(ScriptStartMarker)-16)
	writer.output.Write(data)
	recent := writer.output.Bytes()[searchFrom:]
	if writer.bootDuration == 0 && bytes.Contains(recent, []byte(ScriptStartMarker)) {
		writer.bootDuration = time.Since(writer.started)
	}
	if !writer.sawDone && doneLine.Match(recent) {
		writer.sawDone = true
		close(writer.done)
	}
	return len(data), nil
}

// result returns the console so far.
func (writer *consoleWriter) result() Result {
	writer.mu.Lock()
	defer writer.mu.Unlock()
	return Result{
		Console:      strings.ReplaceAll(writer.output.String(), "\r\n", "\n"),
		BootDuration: writer.bootDuration,
	}
}
