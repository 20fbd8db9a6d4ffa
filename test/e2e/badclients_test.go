package e2e

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/herd-storage/herd/internal/logging"
	"github.com/herd-storage/herd/internal/nbd/wire"
	"github.com/herd-storage/herd/internal/nbdclient"
	"github.com/herd-storage/herd/internal/pki"
	"github.com/herd-storage/herd/internal/testcluster"
)

// The limits TestBadNBDClients gives its nodes: tighter than the defaults
// so that each bound bites within seconds.
const (
	badMemoryBudget     = 64 << 20
	badReplyTimeout     = 5 * time.Second
	badHandshakeTimeout = 10 * time.Second
	badMaxOptions       = 200
	// badConnections is the number of connections that never
	// read their replies.
	badConnections = 200
	// badConnectionsPerClient: every connection on the Unix socket counts
	// against one client, "local" (nbd.Server.MaxConnectionsPerClient,
	// 64 by default). The test raises the limit above its 200 bad
	// connections and its normal clients rather than spread them over
	// loopback addresses with --insecure-nbd: what is under test is the
	// memory budget and the reply timeout, on the path a hypervisor
	// uses, and the per-client limit has tests of its own (internal/nbd,
	// TestMaxConnectionsPerClient*).
	badConnectionsPerClient = 256
	// badReadLength is the length of every READ the bad clients send: the
	// largest payload the server accepts.
	badReadLength = 32 << 20
	// badReadsEach is how many READs each bad client pipelines: 50 GiB
	// asked for by the 200, 800 times the budget.
	badReadsEach = 8
	// badSlack bounds what 200 connections may cost beyond their
	// payload buffers: a goroutine or two and a 64 KiB read buffer
	// each, about 15 MiB, and the runtime's bookkeeping.
	badSlack = 64 << 20
	// badNormalWait bounds how long another client of the same node may
	// wait while the bad connections hold their share of the budget.
	badNormalWait = 6 * badReplyTimeout
	// badOpens is how many NBD_OPT_INFO opens, and badWritableOpens how
	// many refused writable opens, must leave the raft log alone. Each
	// refused writable open waits the gateway's 2 s lock grace (a
	// release may be on its way), so fewer of them.
	badOpens         = 100
	badWritableOpens = 10
)

// TestBadNBDClients: the bad-client cases of the issue, against a real
// two-node cluster. Node 0 takes the abuse, on its Unix socket, while a
// VDI is held open for writing through it by a client that then sits
// idle; node 1 is the "elsewhere" of refused writers.
//
//   - 200 connections pipeline 32 MiB READs and never read a reply: node
//     0's RSS stays under the bound below; normal clients are served
//     meanwhile, through node 1 and on node 0 (TLS, another client); the reply
//     timeout cuts the bad ones off; what they held is freed;
//   - a zero bomb (WRITE_ZEROES, then TRIM, over a 64 GiB VDI, from QEMU
//     and as 4 GiB requests by hand): completes, the RSS bound holds, a
//     normal client is served meanwhile;
//   - option floods (NBD_OPT_LIST, NBD_OPT_INFO): the connection is
//     closed after --nbd-max-options, the node says so and still serves;
//   - 10 refused writable opens and 200 NBD_OPT_INFO opens: the raft
//     log does not move;
//   - the idle writable open: survives all of the above, costs nothing,
//     keeps its VDI from a second writer elsewhere, with a refusal naming
//     its node.
//
// The RSS bound is node 0's RSS when idle, plus six times the NBD memory
// budget, plus badSlack. The payload buffers in use are bounded by the
// budget; the buffer pool keeps released ones for reuse until two garbage
// collections have passed, up to about twice the budget more in a burst
// (as when the 200 connections end at once); and the collector lets the
// heap grow to twice what it last found live (GOGC=100). It is checked on
// samples taken every 20 ms through the whole test. Without the budget
// the bad clients alone could pin 200 x 64 MiB (the per-connection bound),
// 12.5 GiB.
func TestBadNBDClients(t *testing.T) {
	need(t, "qemu-io")
	c := testcluster.Start(t, testcluster.Options{Nodes: 2, ExtraArgs: []string{
		"--nbd-memory", strconv.Itoa(badMemoryBudget>>20) + "MiB",
		"--nbd-reply-timeout", badReplyTimeout.String(),
		"--nbd-handshake-timeout", badHandshakeTimeout.String(),
		"--nbd-max-options", strconv.Itoa(badMaxOptions),
		"--nbd-max-connections-per-client", strconv.Itoa(badConnectionsPerClient),
	}})
	waitAnswers(t, c)
	waitAgreement(t, c, []int{0, 1}, 30*time.Second)
	if _, stderr, err := c.Herd(ctx(t), 0, "cluster", "format", "--copies", "2"); err != nil {
		t.Fatalf("format: %v %s", err, stderr)
	}
	for _, vdi := range []struct{ name, size, flag string }{
		{"victim", "256M", ""},         // read by the bad clients
		{"good0", "64M", ""},           // a normal client's, through node 0
		{"good1", "64M", ""},           // a normal client's, through node 1
		{"huge", "64G", ""},            // the zero bomb's: 16384 objects of 4 MiB
		{"held", "64M", "--exclusive"}, // held open for writing, then idle; a second writer is refused
	} {
		args := []string{"vdi", "create", vdi.name, vdi.size}
		if vdi.flag != "" {
			args = append(args, vdi.flag)
		}
		if _, stderr, err := c.Herd(ctx(t), 0, args...); err != nil {
			t.Fatalf("create %s: %v %s", vdi.name, err, stderr)
		}
		for index := range 2 {
			testcluster.WaitFor(t, 10*time.Second, fmt.Sprintf("node %d to know vdi %s", index, vdi.name), func() (bool, error) {
				_, err := client(c, index).VDI(ctx(t), vdi.name)
				return err == nil, err
			})
		}
	}
	node, other := c.Node(0), c.Node(1)
	admin := newAdminHTTP(t, c)
	// Data for the bad clients to read, so that some of their READs reach
	// the replicas rather than only holes.
	if out, err := qemuIO(t, node.NBDURI("victim"), "write -P 0x76 0 64M"); err != nil {
		t.Fatalf("writing victim: %v\n%s", err, out)
	}

	// The idle writer: opens "held" for writing through node 0, writes,
	// then does nothing until the last subtest.
	dialContext, cancel := contextWithTimeout(t, 30*time.Second)
	holder, err := (&nbdclient.Dialer{}).Dial(dialContext, node.NBDSocket(), "held")
	cancel()
	if err != nil {
		t.Fatalf("opening held for writing: %v", err)
	}
	t.Cleanup(func() { holder.Close() })
	if err := holder.WriteAt(ctx(t), bytes.Repeat([]byte{0x68}, 64<<10), 0, 0); err != nil {
		t.Fatalf("holder write: %v", err)
	}
	if err := holder.Flush(ctx(t)); err != nil {
		t.Fatalf("holder flush: %v", err)
	}
	heldSince := time.Now()

	baselineRSS, baselineFiles := nodeRSS(t, node), openFiles(t, node)
	baselineHeap := admin.heapInUse(t, 0)
	bound := baselineRSS + 6*badMemoryBudget + badSlack
	monitor := watchRSS(t, node)
	t.Logf("node 0 idle, one writer holding a vdi: RSS %d MiB, heap in use %d MiB, %d open files; RSS bound %d MiB",
		baselineRSS>>20, baselineHeap>>20, baselineFiles, bound>>20)
	checkBound := func(t *testing.T, what string) {
		t.Helper()
		peak := monitor.peak()
		t.Logf("%s: node 0 RSS peak so far %d MiB (bound %d MiB, %d samples)", what, peak>>20, bound>>20, monitor.samples.Load())
		if peak > bound {
			t.Errorf("%s: node 0's RSS reached %d MiB, over the bound of %d MiB (idle %d MiB + 6 x the %d MiB NBD memory budget + %d MiB)",
				what, peak>>20, bound>>20, baselineRSS>>20, badMemoryBudget>>20, badSlack>>20)
		}
	}

	t.Run("200 connections that never read replies", func(t *testing.T) {
		log := logFrom(t, node)
		var bad []*rawNBD
		for i := range badConnections {
			conn, err := dialRaw(node.NBDSocket())
			if err == nil {
				_, _, err = conn.open("ro/victim")
			}
			if err != nil {
				t.Fatalf("bad client %d: %v", i, err)
			}
			t.Cleanup(func() { conn.Close() })
			bad = append(bad, conn)
		}
		sending := time.Now()
		for i, conn := range bad {
			for j := range badReadsEach {
				offset := uint64((i+j)%8) * badReadLength // the 256 MiB, of which 64 MiB written
				if err := conn.request(wire.CmdRead, uint64(j), offset, badReadLength); err != nil {
					t.Fatalf("bad client %d, read %d: %v", i, j, err)
				}
			}
		}
		t.Logf("%d connections sent %d READs of %d MiB each, %d GiB in all, and read no reply",
			badConnections, badReadsEach, badReadLength>>20, badConnections*badReadsEach*badReadLength>>30)
		// One client (the socket) is held to its share of the budget.
		log.waitFor(t, 30*time.Second, "the client's share of the memory budget exhausted")

		// Another client of node 0 (a certificate, over TLS), sharing the
		// node's one NBD memory budget with the socket: the bad
		// connections, all one client ("local"), hold at most their
		// share of it. (A normal client on the same socket is the same
		// client: it waits with them. The local socket is for one
		// trusted hypervisor; docs/SECURITY.md.)
		goodCerts := addClient(t, c, "goodhost", "good*")
		host, port, _ := net.SplitHostPort(node.NBDAddr())
		sameSocket := make(chan commandResult, 1)
		go func() {
			sameSocket <- runWithin(badNormalWait, "qemu-io", "--object", "tls-creds-x509,id=tls0,endpoint=client,dir="+goodCerts,
				"--image-opts", "driver=raw,file.driver=nbd,file.host="+host+",file.port="+port+",file.export=good0,file.tls-creds=tls0",
				"-c", "write -P 0x67 0 1M", "-c", "read -P 0x67 0 1M")
		}()
		// A normal client through the other node.
		start := time.Now()
		if out, err := qemuIO(t, other.NBDURI("good1"), "write -P 0x66 1M 1M", "read -P 0x66 1M 1M"); err != nil {
			t.Errorf("normal client through node 1 while node 0 holds the bad connections: %v\n%s", err, out)
		} else {
			t.Logf("normal client through node 1: wrote and read back 1 MiB in %v", time.Since(start).Round(time.Millisecond))
		}

		// The reply timeout cuts them: the node says so, and the cut
		// connections read to their end (what was queued, then EOF).
		line := log.waitFor(t, badReplyTimeout+30*time.Second, "client did not read its replies within the reply timeout", "reply_timeout="+badReplyTimeout.String())
		t.Logf("node 0: %s", line)
		var cut []*rawNBD
		testcluster.WaitFor(t, 30*time.Second, "a bad connection to be cut", func() (bool, error) {
			cut = hungUp(bad)
			return len(cut) > 0, errors.New("none cut yet")
		})
		if since := time.Since(sending); since < badReplyTimeout {
			t.Errorf("a bad connection was cut %v after its requests, before the %v reply timeout", since, badReplyTimeout)
		}
		queued, err := readToEnd(cut[0].conn, 10*time.Second)
		if err != nil && !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("reading a cut connection: %v after %d bytes, want EOF or a reset", err, queued)
		}
		t.Logf("%v after the requests: %d of %d connections cut; a cut one read %d queued bytes, then %v",
			time.Since(sending).Round(time.Second), len(cut), len(bad), queued, cmp.Or(err, io.EOF))

		t.Run("another client of the same node is served", func(t *testing.T) {
			r := <-sameSocket
			if r.err != nil {
				t.Errorf("a TLS client of node 0 was not served within %v while %d socket connections held replies (%d cut by then): %v\n%s",
					badNormalWait, badConnections, len(hungUp(bad)), r.err, r.out)
			} else {
				t.Logf("a TLS client of node 0: wrote and read back 1 MiB in %v", r.took.Round(time.Millisecond))
			}
		})
		// For the record: a connection the node has cut may still have
		// requests it read before the cut to serve.
		_, readers, handlers := admin.goroutines(t, 0)
		t.Logf("%v after the requests: %d of %d connections cut; node 0 runs %d request readers (one is the idle writer's) and %d request handlers",
			time.Since(sending).Round(time.Second), len(hungUp(bad)), len(bad), readers, handlers)
		checkBound(t, "while the bad connections held replies")

		// The rest go away; everything they held is freed.
		for _, conn := range bad {
			conn.Close()
		}
		closed := time.Now()
		testcluster.WaitFor(t, 60*time.Second, "node 0 to end the bad connections", func() (bool, error) {
			_, readers, handlers := admin.goroutines(t, 0)
			files := openFiles(t, node)
			// One reader is the idle writer's. Open files also count the
			// peer and admin connections, which come and go.
			return readers == 1 && handlers == 0 && files <= baselineFiles+16,
				fmt.Errorf("%d request readers, %d request handlers, %d open files (%d when idle)", readers, handlers, files, baselineFiles)
		})
		t.Logf("node 0 ended the bad connections %v after they closed", time.Since(closed).Round(time.Millisecond))
		checkBound(t, "after the bad connections")
		// Freed, not leaked: after two collections (which the runtime
		// would run on its own, given time or allocations) the heap is
		// back where it was. RSS follows as the runtime returns the free
		// pages to the system, at the pace of its background scavenger:
		// logged, not asserted.
		heap := admin.heapInUse(t, 0)
		if heap > baselineHeap+16<<20 {
			t.Errorf("node 0's heap in use is %d MiB after the bad connections, %d MiB before", heap>>20, baselineHeap>>20)
		}
		t.Logf("after the bad connections: heap in use %d MiB (%d MiB before), RSS %d MiB (%d MiB before)", heap>>20, baselineHeap>>20, nodeRSS(t, node)>>20, baselineRSS>>20)
		if out, err := qemuIO(t, node.NBDURI("good0"), "write -P 0x65 2M 1M", "read -P 0x65 2M 1M"); err != nil {
			t.Errorf("normal client on node 0's socket after the bad connections: %v\n%s", err, out)
		}
	})

	t.Run("zero bomb", func(t *testing.T) {
		// Objects for the bombs to zero and free: 4 KiB every 128 MiB
		// of the 64 GiB, 512 objects with 2 copies each.
		allocate := func() {
			t.Helper()
			var writes []string
			for offset := int64(0); offset < 64<<30; offset += 128 << 20 {
				writes = append(writes, fmt.Sprintf("write -P 0x7a %d 4k", offset+int64(offset>>27)%1024*4096))
			}
			if out, err := qemuIO(t, node.NBDURI("huge"), writes...); err != nil {
				t.Fatalf("writing huge: %v\n%s", err, lastLines(out, 5))
			}
		}
		zeros := []string{"read -P 0 0 4M", "read -P 0 40G 8M", fmt.Sprintf("read -P 0 %d 1M", int64(64<<30)-1<<20)}
		idleGoroutines, err := admin.goroutineCount(0)
		if err != nil {
			t.Fatal(err)
		}
		goroutines := sampleEvery(t, 50*time.Millisecond, func() (int64, error) { return admin.goroutineCount(0) })
		normal := startNormalClient(t, node.NBDURI("good0"))

		// QEMU: WRITE_ZEROES (qemu-io sends them as 32 MiB requests)
		// then TRIM over the whole VDI; qemu-io takes at most 2 GiB a
		// command.
		allocate()
		var commands []string
		for _, command := range []string{"write -z", "discard"} {
			for offset := int64(0); offset < 64<<30; offset += 1 << 30 {
				commands = append(commands, fmt.Sprintf("%s %d %d", command, offset, 1<<30))
			}
		}
		start := time.Now()
		if out, err := qemuIO(t, node.NBDURI("huge"), append(commands, zeros...)...); err != nil {
			t.Errorf("qemu-io zero bomb: %v\n%s", err, lastLines(out, 10))
		}
		t.Logf("qemu-io: write -z and discard over 64 GiB, 512 objects allocated: %v", time.Since(start).Round(time.Millisecond))

		// By hand: 17 WRITE_ZEROES of up to 4 GiB - 4 KiB (NO_HOLE), then
		// 17 TRIMs as large, pipelined: the largest requests the protocol
		// carries.
		allocate()
		conn, err := dialRaw(node.NBDSocket())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		size, flags, err := conn.open("huge")
		if err != nil || size != 64<<30 || flags&wire.FlagSendWriteZeroes == 0 || flags&wire.FlagSendTrim == 0 {
			t.Fatalf("opening huge: size %d flags %#x: %v", size, flags, err)
		}
		// The TRIMs go once the WRITE_ZEROES are answered: overlapping
		// requests in flight together are another matter (the server
		// may run them in any order).
		const bombLength = 1<<32 - 4096
		var cookie uint64
		for _, wave := range []struct {
			name    string
			command uint16
			flags   uint16
		}{{"WRITE_ZEROES", wire.CmdWriteZeroes, wire.CmdFlagNoHole}, {"TRIM", wire.CmdTrim, 0}} {
			start := time.Now()
			sent := cookie
			for offset := uint64(0); offset < size; offset += bombLength {
				if err := conn.requestFlags(wave.command, wave.flags, cookie, offset, uint32(min(bombLength, size-offset))); err != nil {
					t.Fatal(err)
				}
				cookie++
			}
			for range cookie - sent {
				reply, err := conn.simpleReply(5 * time.Minute)
				if err != nil {
					t.Fatalf("zero bomb by hand: %v", err)
				}
				if reply.Error != wire.NoError {
					t.Errorf("zero bomb by hand: %s %d failed with errno %d", wave.name, reply.Cookie, reply.Error)
				}
			}
			t.Logf("by hand: %d x %s of up to 4 GiB over the 64 GiB, 512 objects allocated: %v", cookie-sent, wave.name, time.Since(start).Round(time.Millisecond))
		}
		if out, err := qemuIO(t, node.NBDURI("huge"), zeros...); err != nil {
			t.Errorf("reading zeros after the zero bomb: %v\n%s", err, out)
		}

		served, slowest, failures := normal.stop()
		if served == 0 || len(failures) > 0 {
			t.Errorf("normal client during the zero bombs: %d rounds served, failures: %v", served, failures)
		}
		t.Logf("normal client during the zero bombs: %d rounds of write and read back 1 MiB, slowest %v", served, slowest.Round(time.Millisecond))
		// A connection has at most 64 requests in flight, and the
		// gateway runs at most PiecesPerRequest (16) pieces of each at
		// once: the bombs' goroutines are bounded by that, plus the
		// normal client's, not by the 16384 objects.
		peak := goroutines.stop()
		t.Logf("node 0 goroutines: %d before the bombs, at most %d during them (%d samples)", idleGoroutines, peak, goroutines.samples.Load())
		if peak > idleGoroutines+64*(16+1)+64 {
			t.Errorf("node 0 ran %d goroutines during the zero bombs, %d before", peak, idleGoroutines)
		}
		checkBound(t, "after the zero bombs")
	})

	t.Run("option flood", func(t *testing.T) {
		// The limits that bit in the subtests before logged lines of the
		// same port: wait for a burst window of its own.
		lastLine := time.Now()
		for _, flood := range []struct {
			name   string
			option uint32
			data   []byte
		}{
			{"NBD_OPT_LIST", wire.OptList, nil},
			{"NBD_OPT_INFO", wire.OptInfo, exportRequest("victim")},
		} {
			// The node says why it closed a connection once per address
			// (here the socket, "local") and reason per interval at most
			// (bounded refusal lines, internal/logging): each flood gets
			// its own line.
			testcluster.WaitFor(t, logging.DefaultRefusalInterval+time.Second, "an interval since the last flood's log line", func() (bool, error) {
				return time.Since(lastLine) > logging.DefaultRefusalInterval+100*time.Millisecond, nil
			})
			log := logFrom(t, node)
			conn, err := dialRaw(node.NBDSocket())
			if err != nil {
				t.Fatal(err)
			}
			const sent = 5000
			start := time.Now()
			go func() {
				message := wire.OptionHeader{Option: flood.option, Length: uint32(len(flood.data))}.Append(nil)
				message = append(message, flood.data...)
				conn.conn.Write(bytes.Repeat(message, sent)) // fails once the server hangs up
			}()
			acks, err := conn.countAcks(flood.option, 30*time.Second)
			conn.Close()
			if acks != badMaxOptions || !(errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)) {
				t.Errorf("%d x %s: %d answered, then %v; want %d answered, then the connection closed", sent, flood.name, acks, err, badMaxOptions)
			}
			line := log.waitFor(t, 10*time.Second, "too many options in one handshake", fmt.Sprintf("option %d is beyond the limit of %d", badMaxOptions+1, badMaxOptions))
			lastLine = time.Now()
			t.Logf("%d x %s: %d answered, then closed, in %v; node 0: %s", sent, flood.name, acks, time.Since(start).Round(time.Millisecond), line)
		}
		if out, err := qemuIO(t, node.NBDURI("good0"), "write -P 0x64 3M 1M", "read -P 0x64 3M 1M"); err != nil {
			t.Errorf("normal client after the option floods: %v\n%s", err, out)
		}
		checkBound(t, "after the option floods")
	})

	t.Run("refused and NBD_OPT_INFO opens leave the raft log alone", func(t *testing.T) {
		holderID := nodeID(t, c, 0)
		// Nothing writes to the log in an idle cluster: the index must
		// stay put for a while (after the last subtest's writers' locks
		// are released), so that a move below is the opens' doing.
		before := appliedIndexes(t, c)
		since := time.Now()
		testcluster.WaitFor(t, 30*time.Second, "the raft log to stay put for 3 s in the idle cluster", func() (bool, error) {
			if now := appliedIndexes(t, c); now != before {
				before, since = now, time.Now()
			}
			return time.Since(since) > 3*time.Second, fmt.Errorf("applied indexes %v at %v", before, since.Format(time.StampMilli))
		})
		start := time.Now()
		for i := range badWritableOpens {
			conn, err := dialRaw(other.NBDSocket())
			if err != nil {
				t.Fatal(err)
			}
			_, _, err = conn.open("held")
			conn.Close()
			if err == nil || !strings.Contains(err.Error(), holderID) {
				t.Fatalf("writable open %d of held through node 1: %v; want a refusal naming node %s", i, err, holderID)
			}
		}
		// NBD_OPT_INFO of the held VDI, and of one nobody holds (which a
		// writable open would lock): both say "writable", neither locks.
		for _, name := range []string{"held", "good1"} {
			for i := range badOpens {
				conn, err := dialRaw(other.NBDSocket())
				if err != nil {
					t.Fatal(err)
				}
				size, flags, err := conn.export(wire.OptInfo, name)
				conn.Close()
				if err != nil || size != 64<<20 || flags&wire.FlagReadOnly != 0 {
					t.Fatalf("NBD_OPT_INFO %d of %s through node 1: size %d flags %#x: %v; want 64 MiB, writable", i, name, size, flags, err)
				}
			}
		}
		t.Logf("%d refused writable opens and 2 x %d NBD_OPT_INFO opens through node 1 in %v", badWritableOpens, badOpens, time.Since(start).Round(time.Millisecond))
		if after := appliedIndexes(t, c); after != before {
			t.Errorf("the raft log moved: applied indexes %v before the opens, %v after", before, after)
		} else {
			t.Logf("applied indexes %v before and after", after)
		}
	})

	t.Run("idle writable open", func(t *testing.T) {
		// Idle for longer than both timeouts that could end it wrongly.
		idle := max(badReplyTimeout, badHandshakeTimeout) + time.Second
		testcluster.WaitFor(t, idle, "the writer to have been idle past the reply and handshake timeouts", func() (bool, error) {
			return time.Since(heldSince) > idle, nil
		})
		t.Logf("the writer has held vdi held for %v", time.Since(heldSince).Round(time.Second))
		got := make([]byte, 64<<10)
		if err := holder.ReadAt(ctx(t), got, 0); err != nil || !bytes.Equal(got, bytes.Repeat([]byte{0x68}, len(got))) {
			t.Fatalf("the idle writer's connection after the abuse: %v", err)
		}
		if err := holder.WriteAt(ctx(t), bytes.Repeat([]byte{0x69}, 4096), 1<<20, nbdclient.FUA); err != nil {
			t.Fatalf("the idle writer writing again: %v", err)
		}
		holderID := nodeID(t, c, 0)
		out, err := qemuIO(t, other.NBDURI("held"), "write -P 0x55 0 4096")
		if err == nil || !strings.Contains(out, holderID) {
			t.Errorf("second writer through node 1: %v, want a refusal naming node %s:\n%s", err, holderID, out)
		}
		for i, n := range []*testcluster.Node{node, other} {
			if out, err := qemuIO(t, n.NBDURI(fmt.Sprintf("good%d", i)), fmt.Sprintf("write -P 0x%02x 4M 1M", 0x40+i), fmt.Sprintf("read -P 0x%02x 4M 1M", 0x40+i)); err != nil {
				t.Errorf("another vdi through node %d: %v\n%s", i, err, out)
			}
		}
		if out, err := run(t, time.Minute, "qemu-io", "-r", "-f", "raw", "-c", "read -P 0x68 0 64k", "-c", "read -P 0x69 1M 4k", other.NBDURI("ro/held")); err != nil || strings.Contains(out, "failed") {
			t.Errorf("read-only beside the writer, through node 1: %v\n%s", err, out)
		}

		// Not a leak: after all of the above the heap is back where it
		// was, RSS under the bound.
		heap := admin.heapInUse(t, 0)
		t.Logf("node 0 heap in use %d MiB (%d MiB before the abuse), RSS %d MiB, %d open files (%d before)",
			heap>>20, baselineHeap>>20, nodeRSS(t, node)>>20, openFiles(t, node), baselineFiles)
		if heap > baselineHeap+16<<20 {
			t.Errorf("node 0's heap in use grew from %d MiB to %d MiB", baselineHeap>>20, heap>>20)
		}
		checkBound(t, "at the end")

		// The writer leaves: its lock is released through the log (the
		// index moves: the measure above sees log entries), and node 1
		// may write.
		before := appliedIndexes(t, c)
		holder.Close()
		testcluster.WaitFor(t, 30*time.Second, "node 1 to open held for writing once the writer left", func() (bool, error) {
			out, err := qemuIO(t, other.NBDURI("held"), "write -P 0x56 0 4096", "read -P 0x56 0 4096", "read -P 0x69 1M 4096")
			return err == nil, fmt.Errorf("%v: %s", err, out)
		})
		if after := appliedIndexes(t, c); after[0] <= before[0] || after[1] <= before[1] {
			t.Errorf("releasing and taking the write lock did not move the raft log: %v, then %v", before, after)
		}
	})
}

// waitAnswers waits until every node answers the admin API with the
// cluster's token: a node that just joined learns it from the log.
func waitAnswers(t *testing.T, c *testcluster.Cluster) {
	t.Helper()
	for _, n := range c.Nodes() {
		testcluster.WaitFor(t, 30*time.Second, fmt.Sprintf("node %d to answer with the cluster's token", n.Index()), func() (bool, error) {
			_, err := client(c, n.Index()).Info(ctx(t))
			return err == nil, err
		})
	}
}

// appliedIndexes returns the raft index each node has applied.
func appliedIndexes(t *testing.T, c *testcluster.Cluster) [2]uint64 {
	t.Helper()
	var out [2]uint64
	for i := range out {
		info, err := client(c, i).Info(ctx(t))
		if err != nil {
			t.Fatalf("node %d: %v", i, err)
		}
		out[i] = info.AppliedIndex
	}
	return out
}

// commandResult is the outcome of a command run in the background.
type commandResult struct {
	out  string
	err  error
	took time.Duration
}

// runWithin runs a command (qemu-io: a "failed" in its output is a
// failure), killed after timeout; it may be called from any goroutine.
func runWithin(timeout time.Duration, name string, args ...string) commandResult {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	start := time.Now()
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if ctx.Err() != nil {
		err = fmt.Errorf("not done after %v: %w", timeout, ctx.Err())
	} else if err == nil && strings.Contains(string(out), "failed") {
		err = errors.New("qemu-io reported a failure")
	}
	return commandResult{string(out), err, time.Since(start)}
}

// normalClient writes and reads back 1 MiB with qemu-io, again and
// again, until stopped.
type normalClient struct {
	done     chan struct{}
	finished chan struct{}
	served   int
	slowest  time.Duration
	failures []string
}

func startNormalClient(t *testing.T, uri string) *normalClient {
	n := &normalClient{done: make(chan struct{}), finished: make(chan struct{})}
	go func() {
		defer close(n.finished)
		for round := 0; ; round++ {
			select {
			case <-n.done:
				return
			default:
			}
			pattern := fmt.Sprintf("0x%02x", 0x20+round%32)
			r := runWithin(time.Minute, "qemu-io", "-f", "raw", "-c", "write -P "+pattern+" 8M 1M", "-c", "read -P "+pattern+" 8M 1M", uri)
			if r.err != nil {
				n.failures = append(n.failures, fmt.Sprintf("round %d: %v: %s", round, r.err, r.out))
				continue
			}
			n.served++
			n.slowest = max(n.slowest, r.took)
		}
	}()
	t.Cleanup(func() { n.stop() })
	return n
}

// stop waits for the round under way and returns what was served.
func (n *normalClient) stop() (served int, slowest time.Duration, failures []string) {
	select {
	case <-n.done:
	default:
		close(n.done)
	}
	<-n.finished
	return n.served, n.slowest, n.failures
}

// rawNBD is an NBD connection driven by hand on a node's Unix socket, for
// the clients no real NBD client can be made to be: one that sends
// requests and never reads a reply, one that floods options.
type rawNBD struct {
	conn   net.Conn
	reader *bufio.Reader
}

// dialRaw connects to socket and does the fixed newstyle greeting (spec,
// "Newstyle negotiation").
func dialRaw(socket string) (*rawNBD, error) {
	conn, err := net.Dial("unix", socket)
	if err != nil {
		return nil, err
	}
	c := &rawNBD{conn: conn, reader: bufio.NewReader(conn)}
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	var greeting [18]byte
	if _, err := io.ReadFull(c.reader, greeting[:]); err != nil {
		conn.Close()
		return nil, fmt.Errorf("greeting: %w", err)
	}
	if binary.BigEndian.Uint64(greeting[0:]) != wire.NBDMagic || binary.BigEndian.Uint64(greeting[8:]) != wire.IHaveOptMagic {
		conn.Close()
		return nil, fmt.Errorf("greeting %x is not fixed newstyle", greeting)
	}
	flags := binary.BigEndian.AppendUint32(nil, wire.FlagCFixedNewstyle|wire.FlagCNoZeroes)
	if _, err := conn.Write(flags); err != nil {
		conn.Close()
		return nil, err
	}
	conn.SetDeadline(time.Time{})
	return c, nil
}

func (c *rawNBD) Close() error { return c.conn.Close() }

// sendOption sends one option without waiting for its reply.
func (c *rawNBD) sendOption(option uint32, data []byte) error {
	message := wire.OptionHeader{Option: option, Length: uint32(len(data))}.Append(nil)
	_, err := c.conn.Write(append(message, data...))
	return err
}

// optionReply reads one option reply.
func (c *rawNBD) optionReply() (wire.OptionReplyHeader, []byte, error) {
	var header [wire.OptionReplyHeaderLength]byte
	if _, err := io.ReadFull(c.reader, header[:]); err != nil {
		return wire.OptionReplyHeader{}, nil, err
	}
	reply, err := wire.ParseOptionReplyHeader(header[:])
	if err != nil {
		return reply, nil, err
	}
	if reply.Length > 1<<20 {
		return reply, nil, fmt.Errorf("option reply of %d bytes", reply.Length)
	}
	data := make([]byte, reply.Length)
	_, err = io.ReadFull(c.reader, data)
	return reply, data, err
}

// exportRequest is the data of NBD_OPT_INFO and NBD_OPT_GO asking for no
// particular information (spec, "NBD_OPT_INFO and NBD_OPT_GO").
func exportRequest(name string) []byte {
	data := binary.BigEndian.AppendUint32(nil, uint32(len(name)))
	data = append(data, name...)
	return binary.BigEndian.AppendUint16(data, 0)
}

// export sends NBD_OPT_INFO or NBD_OPT_GO for name and reads the replies
// up to the final one: the export's size and transmission flags, or an
// error carrying the server's message.
func (c *rawNBD) export(option uint32, name string) (size uint64, flags uint16, err error) {
	c.conn.SetDeadline(time.Now().Add(30 * time.Second))
	defer c.conn.SetDeadline(time.Time{})
	if err := c.sendOption(option, exportRequest(name)); err != nil {
		return 0, 0, err
	}
	for {
		reply, data, err := c.optionReply()
		if err != nil {
			return 0, 0, err
		}
		switch {
		case reply.Type == wire.RepAck:
			return size, flags, nil
		case reply.Type == wire.RepInfo:
			if len(data) == 12 && binary.BigEndian.Uint16(data) == wire.InfoExport {
				size, flags = binary.BigEndian.Uint64(data[2:]), binary.BigEndian.Uint16(data[10:])
			}
		case reply.Type&wire.RepFlagError != 0:
			return 0, 0, fmt.Errorf("option %d refused (reply %#x): %s", option, reply.Type, data)
		default:
			return 0, 0, fmt.Errorf("option %d: unexpected reply %#x", option, reply.Type)
		}
	}
}

// open enters the transmission phase on name (NBD_OPT_GO), with simple
// replies.
func (c *rawNBD) open(name string) (size uint64, flags uint16, err error) {
	return c.export(wire.OptGo, name)
}

// request sends one request header in the transmission phase.
func (c *rawNBD) request(command uint16, cookie, offset uint64, length uint32) error {
	return c.requestFlags(command, 0, cookie, offset, length)
}

func (c *rawNBD) requestFlags(command, flags uint16, cookie, offset uint64, length uint32) error {
	header := wire.RequestHeader{Flags: flags, Type: command, Cookie: cookie, Offset: offset, Length: length}.Append(nil)
	c.conn.SetWriteDeadline(time.Now().Add(30 * time.Second))
	defer c.conn.SetWriteDeadline(time.Time{})
	_, err := c.conn.Write(header)
	return err
}

// simpleReply reads one simple reply without payload.
func (c *rawNBD) simpleReply(timeout time.Duration) (wire.SimpleReplyHeader, error) {
	c.conn.SetReadDeadline(time.Now().Add(timeout))
	defer c.conn.SetReadDeadline(time.Time{})
	var header [wire.SimpleReplyHeaderLength]byte
	if _, err := io.ReadFull(c.reader, header[:]); err != nil {
		return wire.SimpleReplyHeader{}, err
	}
	return wire.ParseSimpleReplyHeader(header[:])
}

// countAcks reads option replies until the connection ends or timeout
// passes, and returns the number of NBD_REP_ACKs to option, and why it
// stopped reading. Any other final reply is an error.
func (c *rawNBD) countAcks(option uint32, timeout time.Duration) (int, error) {
	c.conn.SetReadDeadline(time.Now().Add(timeout))
	acks := 0
	for {
		reply, data, err := c.optionReply()
		if err != nil {
			return acks, err
		}
		switch {
		case reply.Option != option:
			return acks, fmt.Errorf("a reply to option %d", reply.Option)
		case reply.Type == wire.RepAck:
			acks++
		case reply.Type&wire.RepFlagError != 0:
			return acks, fmt.Errorf("option %d refused (reply %#x): %s", option, reply.Type, data)
		}
	}
}

// hungUp reports whether the server closed its end, without reading what
// it sent: poll(2) says POLLHUP on a Unix stream socket whose peer is
// gone, whatever is still queued to read.
func (c *rawNBD) hungUp() bool {
	raw, err := c.conn.(*net.UnixConn).SyscallConn()
	if err != nil {
		return false
	}
	var hup bool
	raw.Control(func(fd uintptr) {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		if n, err := unix.Poll(fds, 0); err == nil && n == 1 {
			hup = fds[0].Revents&unix.POLLHUP != 0
		}
	})
	return hup
}

// hungUp returns the connections whose server end is closed.
func hungUp(conns []*rawNBD) []*rawNBD {
	var out []*rawNBD
	for _, c := range conns {
		if c.hungUp() {
			out = append(out, c)
		}
	}
	return out
}

// readToEnd reads and discards until the connection ends, and returns
// the bytes read and the error that ended it (nil for EOF).
func readToEnd(conn net.Conn, timeout time.Duration) (int64, error) {
	conn.SetReadDeadline(time.Now().Add(timeout))
	return io.Copy(io.Discard, conn)
}

// adminHTTP reads a node's pprof endpoints, with the admin token.
type adminHTTP struct {
	cluster *testcluster.Cluster
	client  *http.Client
}

func newAdminHTTP(t *testing.T, c *testcluster.Cluster) *adminHTTP {
	token, err := pki.ParseAdminToken(c.Token())
	if err != nil {
		t.Fatal(err)
	}
	// The node is verified by the CA fingerprint the token carries, as
	// api.Client does; no connection is kept, so that the test adds no
	// open file to the node's count.
	transport := &http.Transport{DisableKeepAlives: true, TLSClientConfig: &tls.Config{
		InsecureSkipVerify: true,
		VerifyPeerCertificate: func(rawCerts [][]byte, _ [][]*x509.Certificate) error {
			_, err := pki.VerifyServerChain(rawCerts, token.Fingerprint)
			return err
		},
	}}
	return &adminHTTP{cluster: c, client: &http.Client{Timeout: 30 * time.Second, Transport: transport}}
}

func (a *adminHTTP) get(t *testing.T, index int, path string) string {
	t.Helper()
	body, err := a.fetch(ctx(t), index, path)
	if err != nil {
		t.Fatal(err)
	}
	return body
}

// fetch is get for any goroutine.
func (a *adminHTTP) fetch(ctx context.Context, index int, path string) (string, error) {
	request, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+a.cluster.Node(index).AdminAddr()+path, nil)
	if err != nil {
		return "", err
	}
	request.Header.Set("Authorization", "Bearer "+a.cluster.Token())
	response, err := a.client.Do(request)
	if err != nil {
		return "", fmt.Errorf("node %d %s: %w", index, path, err)
	}
	defer response.Body.Close()
	body, err := io.ReadAll(response.Body)
	if err == nil && response.StatusCode != http.StatusOK {
		err = errors.New(response.Status)
	}
	if err != nil {
		return "", fmt.Errorf("node %d %s: %w", index, path, err)
	}
	return string(body), nil
}

// goroutineCount returns the node's number of goroutines; it may be
// called from any goroutine.
func (a *adminHTTP) goroutineCount(index int) (int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	profile, err := a.fetch(ctx, index, "/debug/pprof/goroutine?debug=1")
	if err != nil {
		return 0, err
	}
	first, _, _ := strings.Cut(profile, "\n")
	count, ok := strings.CutPrefix(first, "goroutine profile: total ")
	if !ok {
		return 0, fmt.Errorf("node %d goroutine profile starts %q", index, first)
	}
	return strconv.ParseInt(count, 10, 64)
}

// goroutines returns the node's goroutines in all, those reading NBD
// requests (one per connection in the transmission phase) and those
// serving one.
func (a *adminHTTP) goroutines(t *testing.T, index int) (total, readers, handlers int) {
	t.Helper()
	for _, block := range strings.Split(a.get(t, index, "/debug/pprof/goroutine?debug=2"), "\n\n") {
		if !strings.HasPrefix(block, "goroutine ") {
			continue
		}
		total++
		if strings.Contains(block, "(*transmission).readRequests(") {
			readers++
		}
		if strings.Contains(block, "(*transmission).handle(") {
			handlers++
		}
	}
	return total, readers, handlers
}

// heapInUse returns the node's heap in use (runtime.MemStats.HeapInuse)
// after two garbage collections, the second of which drops what the
// buffer pools kept from before the first.
func (a *adminHTTP) heapInUse(t *testing.T, index int) int64 {
	t.Helper()
	a.get(t, index, "/debug/pprof/heap?gc=1&debug=1")
	profile := a.get(t, index, "/debug/pprof/heap?gc=1&debug=1")
	for _, line := range strings.Split(profile, "\n") {
		if value, ok := strings.CutPrefix(line, "# HeapInuse = "); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(value), 10, 64)
			if err != nil {
				t.Fatalf("node %d heap profile: %q", index, line)
			}
			return n
		}
	}
	t.Fatalf("node %d heap profile has no HeapInuse", index)
	return 0
}

// rss returns the node's resident set size in bytes (VmRSS of
// /proc/PID/status).
func nodeRSS(t *testing.T, node *testcluster.Node) int64 {
	t.Helper()
	n, err := readRSS(node.PID())
	if err != nil {
		t.Fatalf("node %d: %v", node.Index(), err)
	}
	return n
}

func readRSS(pid int) (int64, error) {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(status), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			fields := strings.Fields(rest)
			if len(fields) != 2 || fields[1] != "kB" {
				return 0, fmt.Errorf("/proc/%d/status: %q", pid, line)
			}
			kilobytes, err := strconv.ParseInt(fields[0], 10, 64)
			return kilobytes << 10, err
		}
	}
	return 0, fmt.Errorf("/proc/%d/status has no VmRSS", pid)
}

// openFiles counts the node's file descriptors: each NBD connection is
// one.
func openFiles(t *testing.T, node *testcluster.Node) int {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join("/proc", strconv.Itoa(node.PID()), "fd"))
	if err != nil {
		t.Fatalf("node %d: %v", node.Index(), err)
	}
	return len(entries)
}

// sampler reads a value (a node's RSS, its goroutines) every interval,
// from its own goroutine, and keeps the peak.
type sampler struct {
	peakValue atomic.Int64
	samples   atomic.Int64
	done      chan struct{}
	stopped   sync.WaitGroup
	stopOnce  sync.Once
}

func sampleEvery(t *testing.T, interval time.Duration, read func() (int64, error)) *sampler {
	s := &sampler{done: make(chan struct{})}
	s.stopped.Add(1)
	go func() {
		defer s.stopped.Done()
		ticker := time.NewTicker(interval)
		defer ticker.Stop()
		for {
			if n, err := read(); err == nil {
				s.samples.Add(1)
				for {
					peak := s.peakValue.Load()
					if n <= peak || s.peakValue.CompareAndSwap(peak, n) {
						break
					}
				}
			}
			select {
			case <-s.done:
				return
			case <-ticker.C:
			}
		}
	}()
	t.Cleanup(func() { s.stop() })
	return s
}

// watchRSS samples a node's RSS every 20 ms.
func watchRSS(t *testing.T, node *testcluster.Node) *sampler {
	pid := node.PID()
	return sampleEvery(t, 20*time.Millisecond, func() (int64, error) { return readRSS(pid) })
}

func (s *sampler) peak() int64 { return s.peakValue.Load() }

// stop stops sampling and returns the peak.
func (s *sampler) stop() int64 {
	s.stopOnce.Do(func() { close(s.done) })
	s.stopped.Wait()
	return s.peakValue.Load()
}

// nodeLog reads a node's log from an offset on: the lines written since
// it was made.
type nodeLog struct {
	path   string
	offset int64
}

func logFrom(t *testing.T, node *testcluster.Node) *nodeLog {
	t.Helper()
	info, err := os.Stat(node.LogPath())
	if err != nil {
		t.Fatal(err)
	}
	return &nodeLog{path: node.LogPath(), offset: info.Size()}
}

// text returns what the node logged since the nodeLog was made.
func (l *nodeLog) text() (string, error) {
	f, err := os.Open(l.path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	if _, err := f.Seek(l.offset, io.SeekStart); err != nil {
		return "", err
	}
	data, err := io.ReadAll(f)
	return string(data), err
}

// waitFor waits until a line containing every one of parts was logged,
// and returns it.
func (l *nodeLog) waitFor(t *testing.T, timeout time.Duration, parts ...string) string {
	t.Helper()
	var found string
	testcluster.WaitFor(t, timeout, fmt.Sprintf("the node to log %q", parts), func() (bool, error) {
		text, err := l.text()
		if err != nil {
			return false, err
		}
	lines:
		for _, line := range strings.Split(text, "\n") {
			for _, part := range parts {
				if !strings.Contains(line, part) {
					continue lines
				}
			}
			found = line
			return true, nil
		}
		return false, errors.New("not logged yet")
	})
	return found
}
