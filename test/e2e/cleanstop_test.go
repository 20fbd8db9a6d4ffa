package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/api"
	"github.com/herd-storage/herd/internal/testcluster"
)

// TestCleanStopKeepsTheQuorum: a clean stop is a departure, not a
// failure. SIGTERM one node of three, a follower and then the leader:
// the other two keep their quorum (`herd cluster health` is no ERR),
// `vdi create` works, a VDI opens and takes writes over NBD; a client
// opening a VDI and writing through another node again and again sees
// no error (the leader's stop: only while it hands leadership over, for
// an election at most); the stopped node restarts, rejoins, is a voter
// again and the cluster is healthy.
// Before, the leader demoted a healthy voter while the stopping node's
// raft still answered: no quorum until the stopped node came back (0 of
// 3 operations worked 15 s after the stop).
func TestCleanStopKeepsTheQuorum(t *testing.T) {
	need(t, "qemu-io")
	c := dataCluster(t, 3, 2, "vm1", "64M")
	all := []int{0, 1, 2}
	for _, role := range []string{"follower", "leader"} {
		leader := leaderIndex(t, c, all)
		victim := leader
		if role == "follower" {
			victim = (leader + 1) % 3
		}
		rest := without(all, victim)
		stopped := time.Now()
		probe := startWriteProbe(c.Node(rest[0]).NBDURI("vm1"), stopped)
		c.Node(victim).Stop()
		t.Logf("%s (node %d) stopped by SIGTERM in %v", role, victim, time.Since(stopped).Round(time.Millisecond))

		name := "after-" + role
		created, wrote := false, false
		testcluster.WaitFor(t, failoverDeadline, fmt.Sprintf("nodes %v to serve after the %s's stop", rest, role), func() (bool, error) {
			for _, i := range rest {
				h, code := health(t, c, i)
				if h.Status == api.HealthErr {
					return false, fmt.Errorf("node %d: cluster health %s (exit %d): %+v", i, h.Status, code, h.Reasons)
				}
			}
			if !created {
				if _, stderr, err := c.Herd(ctx(t), rest[1], "vdi", "create", name, "16M"); err != nil && !strings.Contains(stderr, "exists") {
					return false, fmt.Errorf("vdi create through node %d: %v %s", rest[1], err, strings.TrimSpace(stderr))
				}
				created = true
			}
			if !wrote {
				if out, err := qemuIOWithin(10*time.Second, c.Node(rest[1]).NBDURI(name), "write -P 0x5c 0 1M", "flush"); err != nil {
					return false, fmt.Errorf("write through node %d: %v: %s", rest[1], err, lastLines(out, 3))
				}
				wrote = true
			}
			return true, nil
		})
		served := time.Since(stopped)
		if out, err := qemuIO(t, c.Node(rest[0]).NBDURI(name), "read -P 0x5c 0 1M"); err != nil {
			t.Fatalf("read back through node %d: %v\n%s", rest[0], err, lastLines(out, 5))
		}
		results := probe.stop()
		t.Logf("%s stopped: nodes %v served a create and a write %v after SIGTERM; the writer through node %d: %s",
			role, rest, served.Round(time.Millisecond), rest[0], results)
		// An open that finds no leader fails at once (cluster: no quorum),
		// and a leader's stop is a leader change: from its hand-over
		// (raft's leadership transfer refuses entries) until the others
		// hear of the new leader. It lasts an election at most.
		handover := time.Duration(0)
		if role == "leader" {
			handover = leaderHandover
		}
		if results.ok == 0 || (results.failed > 0 && (role != "leader" || results.lastBegan > handover)) {
			t.Errorf("the writer through node %d, across the %s's stop: %s", rest[0], role, results)
		}

		c.Node(victim).Restart()
		waitAgreement(t, c, all, time.Minute) // three voters again
		waitHealth(t, c, victim, api.HealthOK, 0, "")
	}
}

// leaderHandover bounds how long after a leader's SIGTERM an open may
// fail: the SIGTERM's delivery, the gossip announcement and a raft
// election (1.5 s election timeout), with margin for a loaded machine.
const leaderHandover = 3 * time.Second

// qemuIOWithin is qemuIO with a timeout that is an answer, not a test
// failure: an open without quorum may wait for one.
func qemuIOWithin(timeout time.Duration, uri string, commands ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	args := []string{"-f", "raw"}
	for _, command := range commands {
		args = append(args, "-c", command)
	}
	out, err := exec.CommandContext(ctx, "qemu-io", append(args, uri)...).CombinedOutput()
	if ctx.Err() != nil {
		return string(out), fmt.Errorf("no answer within %v", timeout)
	}
	if err == nil && strings.Contains(string(out), "failed") {
		err = fmt.Errorf("qemu-io reported a failure")
	}
	return string(out), err
}

// writeProbe opens a VDI and writes to it, again and again, from the
// moment it starts until stop: each round a new qemu-io (open, lock,
// write, flush, close). Times are since the fault (since).
type writeProbe struct {
	done    chan struct{}
	wg      sync.WaitGroup
	started time.Time
	mu      sync.Mutex
	results probeResults
}

type probeResults struct {
	ok, failed int
	first      string        // the first failure, and when
	lastBegan  time.Duration // when the last failed round began
}

func (r probeResults) String() string {
	if r.failed == 0 {
		return fmt.Sprintf("%d rounds, none failed", r.ok)
	}
	return fmt.Sprintf("%d rounds worked, %d failed, the last begun %v after the SIGTERM; the first %s", r.ok, r.failed, r.lastBegan.Round(time.Millisecond), r.first)
}

func startWriteProbe(uri string, since time.Time) *writeProbe {
	p := &writeProbe{done: make(chan struct{}), started: since}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for round := 0; ; round++ {
			select {
			case <-p.done:
				return
			default:
			}
			began := time.Since(p.started)
			out, err := qemuIOWithin(10*time.Second, uri, fmt.Sprintf("write -P 0x%02x %d 64k", round%250+1, (round%64)<<20), "flush")
			p.mu.Lock()
			if err != nil {
				if p.results.failed == 0 {
					p.results.first = fmt.Sprintf("began %v after the SIGTERM: %v: %s", began.Round(time.Millisecond), err, strings.TrimSpace(lastLines(out, 2)))
				}
				p.results.failed++
				p.results.lastBegan = began
			} else {
				p.results.ok++
			}
			p.mu.Unlock()
		}
	}()
	return p
}

func (p *writeProbe) stop() probeResults {
	close(p.done)
	p.wg.Wait()
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.results
}
