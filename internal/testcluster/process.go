package testcluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// process is one child process started by this package: a herd node or a
// self-test helper.
//
// It is only ever signalled by pid, and only after /proc/PID/cmdline was
// checked to still name program: the test may share the machine with other
// test processes and a developer's own cluster, and nothing this package did
// not start may ever be signalled. (While the child is unreaped its pid cannot
// be reused, and os.Process signals through a pidfd on Linux, so the check is
// a second line of defence, not the only one.)
type process struct {
	command *exec.Cmd
	// program is the path that must appear as an argument in
	// /proc/PID/cmdline before the process is signalled.
	program string
	// done is closed once the process has exited and was reaped.
	done chan struct{}

	// mu guards the following fields.
	mu sync.Mutex
	// exitError is the result of exec.Cmd.Wait, valid once done is closed.
	exitError error
	// exitExpected is set when this package asked the process to exit (Kill,
	// Stop); an exit without it is a crash that the cluster cleanup reports.
	exitExpected bool
	// paused is set between SIGSTOP and SIGCONT.
	paused bool
}

// startProcess starts argv with the given environment, sending its stdout
// and stderr to output. program is the path checked in /proc/PID/cmdline
// before any signal; it is argv[0] or, under `ip netns exec`, a later
// argument that becomes argv[0] once ip has exec'd it.
func startProcess(program string, argv []string, environment []string, output io.Writer) (*process, error) {
	command := exec.Command(argv[0], argv[1:]...)
	command.Env = environment
	command.Stdout = output
	command.Stderr = output
	// Pdeathsig kills the child if the test process dies without running its
	// cleanups (go test -timeout panics, SIGKILL): leaked herd nodes would
	// otherwise hold ports and data directories forever. ip netns exec keeps
	// the setting because it execs herd rather than forking. (The signal is
	// tied to the thread that forked; the Go runtime only ends threads that
	// a goroutine locked and never unlocked, which this package never does.)
	command.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := command.Start(); err != nil {
		return nil, fmt.Errorf("testcluster: start %s: %w", strings.Join(argv, " "), err)
	}
	p := &process{command: command, program: program, done: make(chan struct{})}
	go func() {
		err := command.Wait()
		p.mu.Lock()
		p.exitError = err
		p.mu.Unlock()
		close(p.done)
	}()
	return p, nil
}

// pid returns the process id.
func (p *process) pid() int {
	return p.command.Process.Pid
}

// running reports whether the process has not exited yet (a paused process
// is running).
func (p *process) running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// exitStatus returns the exit error of an exited process (nil for exit
// status 0) and whether the process has exited.
func (p *process) exitStatus() (exitError error, exited bool) {
	if p.running() {
		return nil, false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exitError, true
}

// unexpectedExit reports whether the process exited without this package
// asking it to.
func (p *process) unexpectedExit() bool {
	if p.running() {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return !p.exitExpected
}

// expectExit records that the coming exit is requested, not a crash.
func (p *process) expectExit() {
	p.mu.Lock()
	p.exitExpected = true
	p.mu.Unlock()
}

// signal sends sig after checking /proc/PID/cmdline. It returns
// errProcessExited when the process has already exited.
func (p *process) signal(sig syscall.Signal) error {
	if !p.running() {
		return errProcessExited
	}
	pid := p.pid()
	cmdline, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil || !slices.Contains(strings.Split(string(cmdline), "\x00"), p.program) {
		// A zombie has an empty cmdline: the process exited and the Wait
		// goroutine is about to reap it.
		select {
		case <-p.done:
			return errProcessExited
		case <-time.After(time.Second):
		}
		return fmt.Errorf("testcluster: refusing to signal pid %d: /proc/%d/cmdline %q does not name %s (read error: %v)",
			pid, pid, strings.ReplaceAll(string(cmdline), "\x00", " "), p.program, err)
	}
	err = p.command.Process.Signal(sig)
	if errors.Is(err, os.ErrProcessDone) {
		return errProcessExited
	}
	if err != nil {
		return fmt.Errorf("testcluster: signal %v to pid %d: %w", sig, pid, err)
	}
	return nil
}

// wait waits up to timeout for the process to exit and reports whether it
// did.
func (p *process) wait(timeout time.Duration) bool {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-p.done:
		return true
	case <-timer.C:
		return false
	}
}

// killTimeout bounds the wait for a SIGKILLed process to be reaped; only a
// process stuck in the kernel (uninterruptible sleep) takes longer.
const killTimeout = 10 * time.Second

// kill sends SIGKILL and waits for the process to exit. Killing a process
// that already exited is not an error.
func (p *process) kill() error {
	p.expectExit()
	if err := p.signal(syscall.SIGKILL); err != nil && !errors.Is(err, errProcessExited) {
		return err
	}
	if !p.wait(killTimeout) {
		return fmt.Errorf("testcluster: pid %d did not exit %v after SIGKILL", p.pid(), killTimeout)
	}
	return nil
}

// stop sends SIGTERM, waits up to timeout for a clean exit and then kills
// the process. It reports whether the process exited before the timeout.
func (p *process) stop(timeout time.Duration) (clean bool, err error) {
	p.expectExit()
	if err := p.signal(syscall.SIGTERM); err != nil {
		if errors.Is(err, errProcessExited) {
			return true, nil
		}
		return false, err
	}
	p.mu.Lock()
	paused := p.paused
	p.mu.Unlock()
	if paused {
		// A stopped process only acts on SIGTERM once continued.
		if err := p.resume(); err != nil && !errors.Is(err, errProcessExited) {
			return false, err
		}
	}
	if p.wait(timeout) {
		return true, nil
	}
	return false, p.kill()
}

// pauseTimeout bounds the wait for a SIGSTOPped process to stop; only a
// thread stuck in the kernel (uninterruptible sleep) takes longer.
const pauseTimeout = 10 * time.Second

// cldStopped is CLD_STOPPED, the si_code of a child whose group stop has
// completed.
const cldStopped = 5

// pause sends SIGSTOP and waits until the process has stopped: then it keeps
// its sockets open but answers nothing, like a node stuck in a long garbage
// collection or a frozen VM.
//
// kill(2) returns before the process stops. The kernel queues SIGSTOP and
// wakes one thread, which must be scheduled to dequeue it before the other
// threads are told to stop too; until the last thread has stopped, the
// others run on (and answer requests). On a loaded machine that takes
// milliseconds, so pause waits for the end of the group stop, which waitid
// reports to the parent, this test process.
func (p *process) pause() error {
	if err := p.signal(syscall.SIGSTOP); err != nil {
		return err
	}
	p.mu.Lock()
	p.paused = true
	p.mu.Unlock()
	return p.waitStopped(pauseTimeout)
}

// waitStopped waits up to timeout for the group stop of the process to
// complete, that is for every one of its threads to have stopped.
func (p *process) waitStopped(timeout time.Duration) error {
	lastError, stopped := poll(context.Background(), timeout, func() (bool, error) {
		if !p.running() {
			return false, finalError{errProcessExited}
		}
		// WNOWAIT leaves the stop reportable; SIGCONT clears it.
		var info unix.Siginfo
		err := unix.Waitid(unix.P_PID, p.pid(), &info, unix.WSTOPPED|unix.WNOHANG|unix.WNOWAIT, nil)
		if err != nil {
			// ECHILD: the process exited and was reaped meanwhile; the
			// next evaluation sees it.
			return false, fmt.Errorf("waitid: %w", err)
		}
		if info.Signo == int32(syscall.SIGCHLD) && info.Code == cldStopped {
			return true, nil
		}
		return false, errors.New("some of its threads still run")
	})
	if !stopped {
		if errors.Is(lastError, errProcessExited) {
			return errProcessExited
		}
		return fmt.Errorf("testcluster: pid %d did not stop within %v of SIGSTOP: %v", p.pid(), timeout, lastError)
	}
	return nil
}

// resume sends SIGCONT to a paused process.
func (p *process) resume() error {
	if err := p.signal(syscall.SIGCONT); err != nil {
		return err
	}
	p.mu.Lock()
	p.paused = false
	p.mu.Unlock()
	return nil
}

// isPaused reports whether pause was called without a later resume.
func (p *process) isPaused() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.paused && p.running()
}

// childEnvironment returns the test process's environment without the
// variables that would change what a child does behind the test's back, plus
// extra. HERD_* is removed so that a developer's HERD_TOKEN cannot make the
// first node join an unrelated cluster instead of creating one; proxy
// variables are removed so that HTTP to node addresses never goes through a
// proxy. GORACE gets atexit_sleep_ms=0: a binary built with -race otherwise
// sleeps a second before exiting, which would add a second to every CLI
// command.
func childEnvironment(extra ...string) []string {
	var environment []string
	raceOptions := "atexit_sleep_ms=0"
	for _, variable := range os.Environ() {
		name, value, _ := strings.Cut(variable, "=")
		switch strings.ToUpper(name) {
		case "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY":
			continue
		}
		if strings.HasPrefix(name, "HERD_") {
			continue
		}
		if name == "GORACE" {
			if !strings.Contains(value, "atexit_sleep_ms") {
				raceOptions = strings.TrimSpace(value + " " + raceOptions)
			} else {
				raceOptions = value
			}
			continue
		}
		environment = append(environment, variable)
	}
	environment = append(environment, "GORACE="+raceOptions)
	return append(environment, extra...)
}

// processStartTime returns field 22 of /proc/PID/stat (start time in clock
// ticks since boot); together with the pid it names a process uniquely
// across pid reuse.
func processStartTime(pid int) (string, error) {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return "", err
	}
	// The command name (field 2) is in parentheses and may contain spaces:
	// count fields after the last ')'. Field 3 is the first one after it.
	closing := strings.LastIndexByte(string(stat), ')')
	if closing < 0 {
		return "", fmt.Errorf("testcluster: malformed /proc/%d/stat", pid)
	}
	fields := strings.Fields(string(stat[closing+1:]))
	const startTimeField = 22
	if len(fields) < startTimeField-2 {
		return "", fmt.Errorf("testcluster: short /proc/%d/stat", pid)
	}
	return fields[startTimeField-3], nil
}

// ownerRecord returns "PID STARTTIME" for the test process, written into
// ownership records of things that outlive a crashed test process (build
// directories, namespaces) so that a later run can tell they are stale.
func ownerRecord() string {
	start, err := processStartTime(os.Getpid())
	if err != nil {
		start = "unknown"
	}
	return strconv.Itoa(os.Getpid()) + " " + start
}

// ownerAlive reports whether the process named by an ownerRecord line still
// runs. An unreadable record counts as alive: when in doubt, leave it.
func ownerAlive(record string) bool {
	pidText, start, found := strings.Cut(strings.TrimSpace(record), " ")
	pid, err := strconv.Atoi(pidText)
	if !found || err != nil {
		return true
	}
	current, err := processStartTime(pid)
	if err != nil {
		return !errors.Is(err, os.ErrNotExist)
	}
	return current == start
}
