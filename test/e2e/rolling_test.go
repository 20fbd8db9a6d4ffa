package e2e

import (
	"bufio"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/api"
	"github.com/herd-storage/herd/internal/testcluster"
)

// TestRollingRestart: each node of a 3-node cluster (3 copies) is
// restarted in turn with SIGTERM, as a rolling upgrade does. At each
// step fio writes and verifies (crc32c, verify_fatal) one VDI through a
// node that is not restarting, and a QEMU client (qemu-io, its nbd driver
// with reconnect-delay, over the restarting node's socket) writes a
// pattern to another VDI through the restarting node before, during and
// after its restart, one 64 KiB block at a time, and then reads every
// block back through the same connection. No write fails (QEMU sends the
// requests the stopping node left unanswered again once it reconnects),
// fio reports no verify error, the cluster's health is OK after each
// step, and at the end every object has 3 identical copies and both VDIs
// check clean.
func TestRollingRestart(t *testing.T) {
	need(t, "fio", "qemu-io")
	c := dataCluster(t, 3, 3, "fio", "256M")
	if _, stderr, err := c.Herd(ctx(t), 0, "vdi", "create", "vm1", "64M"); err != nil {
		t.Fatalf("vdi create vm1: %v %s", err, stderr)
	}
	all := []int{0, 1, 2}
	block := 0 // the qemu-io writer's next 64 KiB block of vm1
	for _, restarted := range all {
		through := (restarted + 1) % 3
		fio, fioOut := startFio(t, fmt.Sprintf("step%d", restarted), c.Node(through).NBDURI("fio"),
			fmt.Sprintf("rw=randwrite\nbs=16k\niodepth=8\nsize=64M\noffset=%dM\ntime_based=1\nruntime=20\nverify=crc32c\nverify_fatal=1\nverify_backlog=256\n", restarted*64))
		fioDone := make(chan error, 1)
		go func() { fioDone <- fio.Wait() }()

		writer := startQemuWriter(t, c.Node(restarted).NBDSocket(), "vm1")
		first := block
		for range 4 {
			writer.write(block)
			block++
		}
		results := writer.writeUntilStopped(block)
		select {
		case err := <-fioDone:
			t.Fatalf("step %d: fio ended before the restart (%v): it must run across it\n%s", restarted, err, lastLines(fioOut.String(), 10))
		default:
		}
		sigterm := time.Now()
		c.Node(restarted).Stop()
		exited := time.Since(sigterm)
		c.Node(restarted).Restart()
		healthy := time.Now()
		back := writer.waitWrittenAfter(healthy, 3)
		written := writer.stop(results)
		block += len(written)

		failed := 0
		longest, longestBlock := time.Duration(0), -1
		for _, w := range written {
			if w.failure != "" {
				failed++
				t.Errorf("step %d: qemu-io write of block %d through node %d failed: %s", restarted, w.block, restarted, w.failure)
			}
			if d := w.done.Sub(w.sent); d > longest {
				longest, longestBlock = d, w.block
			}
		}
		writer.readBack(first, block)
		writer.quit()
		t.Logf("step %d: node %d exited %v after SIGTERM, was healthy again %v after it; qemu-io's first write through it completed %v after that; its longest write (block %d) took %v; %d blocks written, %d failed",
			restarted, restarted, exited.Round(time.Millisecond), healthy.Sub(sigterm).Round(time.Millisecond), back.Sub(healthy).Round(time.Millisecond),
			longestBlock, longest.Round(time.Millisecond), block-first, failed)
		if exited > sigtermExitBound {
			t.Errorf("step %d: node %d exited %v after SIGTERM; want at most %v", restarted, restarted, exited, sigtermExitBound)
		}

		select {
		case err := <-fioDone:
			if err != nil || strings.Contains(fioOut.String(), "verify: bad") {
				t.Fatalf("step %d: fio through node %d: %v\n%s", restarted, through, err, lastLines(fioOut.String(), 15))
			}
		case <-time.After(5 * time.Minute):
			t.Fatalf("step %d: fio through node %d did not finish", restarted, through)
		}
		t.Logf("step %d: fio through node %d: %s", restarted, through, grepLines(fioOut.String(), "err="))

		waitAgreement(t, c, all, time.Minute)
		waitRecovered(t, c, 3)
		waitHealth(t, c, restarted, api.HealthOK, 0, "")
	}
	waitExactCopies(t, c, 3, all)
	checkReplicas(t, c, 3)
	checkVDIClean(t, c, 0, "fio")
	checkVDIClean(t, c, 1, "vm1")
	// Every block the writers wrote, through another node than the one
	// each step restarted.
	var commands []string
	for b := 0; b < block; b++ {
		commands = append(commands, fmt.Sprintf("read -P 0x%02x %d 64k", rollingPattern(b), b<<16))
	}
	if out, err := qemuIO(t, c.Node(0).NBDURI("vm1"), commands...); err != nil {
		t.Fatalf("reading the %d blocks back through node 0: %v\n%s", block, err, lastLines(out, 5))
	}
}

// rollingPattern is the byte block b of vm1 is written with.
func rollingPattern(b int) int { return b%250 + 1 }

// qemuWriter is one qemu-io process whose commands come from its
// standard input: the nbd driver stays connected and, with
// reconnect-delay, reconnects when its server goes and comes back,
// sending the requests it had in flight again.
type qemuWriter struct {
	t     *testing.T
	cmd   *exec.Cmd
	in    io.WriteCloser
	lines chan string

	mu      sync.Mutex
	written []blockWrite
}

// blockWrite is one write of a 64 KiB block.
type blockWrite struct {
	block      int
	sent, done time.Time
	failure    string // qemu-io's message when it failed
}

// qemuReconnectDelay is how long QEMU holds requests while it reconnects
// before failing them: longer than a node's restart, and QEMU retries its
// connection with a backoff doubling from 1 s to 16 s.
const qemuReconnectDelay = 120

func startQemuWriter(t *testing.T, socket, export string) *qemuWriter {
	t.Helper()
	cmd := exec.Command("qemu-io", "--image-opts",
		fmt.Sprintf("driver=nbd,server.type=unix,server.path=%s,export=%s,reconnect-delay=%d", socket, export, qemuReconnectDelay))
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { in.Close(); cmd.Process.Kill(); cmd.Wait() })
	w := &qemuWriter{t: t, cmd: cmd, in: in, lines: make(chan string, 64)}
	go func() {
		// qemu-io prints a prompt before each command's output, with no
		// newline after it.
		scanner := bufio.NewScanner(out)
		for scanner.Scan() {
			if line := strings.TrimSpace(strings.ReplaceAll(scanner.Text(), "qemu-io>", "")); line != "" {
				w.lines <- line
			}
		}
		close(w.lines)
	}()
	return w
}

// command sends one qemu-io command and returns its first line of
// output: "wrote ...", "read ...", or the error.
func (w *qemuWriter) command(command string) (string, error) {
	if _, err := fmt.Fprintln(w.in, command); err != nil {
		return "", err
	}
	for {
		select {
		case line, ok := <-w.lines:
			if !ok {
				return "", fmt.Errorf("qemu-io exited")
			}
			if strings.HasPrefix(line, "wrote ") || strings.HasPrefix(line, "read ") || strings.Contains(line, "failed") || strings.Contains(line, "error") {
				return line, nil
			}
			// The second line of a result: its rate.
		case <-time.After(3 * time.Minute):
			return "", fmt.Errorf("no answer to %q within 3 minutes", command)
		}
	}
}

// write writes block b and fails the test unless qemu-io says it wrote it.
func (w *qemuWriter) write(b int) {
	w.t.Helper()
	sent := time.Now()
	line, err := w.command(fmt.Sprintf("write -P 0x%02x %d 64k", rollingPattern(b), b<<16))
	if err != nil || !strings.HasPrefix(line, "wrote 65536/65536") {
		w.t.Fatalf("qemu-io write of block %d: %q %v", b, line, err)
	}
	w.mu.Lock()
	w.written = append(w.written, blockWrite{block: b, sent: sent, done: time.Now()})
	w.mu.Unlock()
}

// writeUntilStopped writes blocks from next on, one at a time, until
// the returned background writes are stopped; each write's outcome is
// recorded.
func (w *qemuWriter) writeUntilStopped(next int) *backgroundWrites {
	bg := &backgroundWrites{quit: make(chan struct{}), done: make(chan struct{})}
	w.mu.Lock()
	w.written = nil
	w.mu.Unlock()
	go func() {
		defer close(bg.done)
		for b := next; ; b++ {
			select {
			case <-bg.quit:
				return
			default:
			}
			sent := time.Now()
			line, err := w.command(fmt.Sprintf("write -P 0x%02x %d 64k", rollingPattern(b), b<<16))
			result := blockWrite{block: b, sent: sent, done: time.Now()}
			switch {
			case err != nil:
				result.failure = err.Error()
			case !strings.HasPrefix(line, "wrote 65536/65536"):
				result.failure = line
			}
			w.mu.Lock()
			w.written = append(w.written, result)
			w.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	return bg
}

// backgroundWrites are writeUntilStopped's writes: closing quit stops
// them after the write under way, done is closed once they stopped.
type backgroundWrites struct{ quit, done chan struct{} }

// waitWrittenAfter waits until n writes sent after since have completed
// and returns when the first of them completed.
func (w *qemuWriter) waitWrittenAfter(since time.Time, n int) time.Time {
	w.t.Helper()
	var first time.Time
	testcluster.WaitFor(w.t, 3*time.Minute, "qemu-io to write through the restarted node", func() (bool, error) {
		w.mu.Lock()
		defer w.mu.Unlock()
		count := 0
		for _, r := range w.written {
			if r.done.After(since) {
				if count == 0 {
					first = r.done
				}
				if r.failure != "" {
					return false, fmt.Errorf("block %d: %s", r.block, r.failure)
				}
				count++
			}
		}
		return count >= n, fmt.Errorf("%d writes completed since the restart", count)
	})
	return first
}

// stop ends writeUntilStopped's writes and returns them.
func (w *qemuWriter) stop(bg *backgroundWrites) []blockWrite {
	close(bg.quit)
	<-bg.done
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.written
}

// readBack reads blocks [from, to) through the writer's connection.
func (w *qemuWriter) readBack(from, to int) {
	w.t.Helper()
	for b := from; b < to; b++ {
		line, err := w.command(fmt.Sprintf("read -P 0x%02x %d 64k", rollingPattern(b), b<<16))
		if err != nil || !strings.HasPrefix(line, "read 65536/65536") {
			w.t.Fatalf("qemu-io read of block %d: %q %v", b, line, err)
		}
	}
}

func (w *qemuWriter) quit() {
	w.in.Close()
	if err := w.cmd.Wait(); err != nil {
		w.t.Errorf("qemu-io: %v", err)
	}
}
