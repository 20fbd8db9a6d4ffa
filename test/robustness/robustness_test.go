// Package robustness runs herd under a nemesis: NBD clients write and
// read-verify on a 5-node cluster with 3 copies while nodes are killed
// -9, stopped cleanly (SIGTERM) and restarted, paused and resumed, and
// partitioned away, at most copies-1 of them faulty at once. Every client
// records its history of block writes and reads and checks each read
// against a model: a read returns the last acknowledged write to that
// block, or a write whose outcome the client does not know (it got an
// error). Readers of each VDI's read-only export go through the nodes
// the nemesis faults (a reader whose node goes reconnects through the
// next one), and every VDI's whole history, writer's and readers', is
// checked for linearizability (internal/linearize). At the end every
// block is read back, every object must have 3 identical replicas, and a
// summary is printed.
//
// In CI it runs for a short while (the default); for long runs:
//
//	bench/robustness.sh 30m
package robustness

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/api"
	"github.com/herd-storage/herd/internal/blockmodel"
	"github.com/herd-storage/herd/internal/linearize"
	"github.com/herd-storage/herd/internal/nbdclient"
	"github.com/herd-storage/herd/internal/testcluster"
)

var (
	duration = flag.Duration("robustness.duration", 75*time.Second, "how long clients run under the nemesis")
	seedFlag = flag.Uint64("robustness.seed", 0, "random seed for clients and nemesis (0: from the clock)")
	logLevel = flag.String("robustness.log-level", "info", "the nodes' --log-level (debug keeps every retry in the logs a failed run leaves)")
)

const (
	nodes     = 5
	copies    = 3
	clients   = 3
	vdiSize   = 64 << 20
	blockSize = blockmodel.BlockSize
	blocks    = vdiSize / blockSize
	inFlight  = 8 // operations per client at once, on distinct blocks
)

// The nemesis kills, pauses and cuts off nodes 2, 3 and 4 only: the
// clients' NBD connections go through nodes 0 and 1 (a VM whose host
// dies dies with it). Node 1 is stopped cleanly (SIGTERM) now and then:
// its client's connection ends once its requests in flight are answered,
// and the client reconnects through another node and sends again what
// went unanswered, as QEMU with reconnect-delay does. A rolling restart
// of nodes 1 to 4 ends the faults. Node 0 is the cluster's address for
// the test's admin requests and is never faulted.
var targets = []int{2, 3, 4}

// writerNode is the node whose clean stops move its client elsewhere.
const writerNode = 1

func TestRobustness(t *testing.T) {
	seed := *seedFlag
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (rerun with -robustness.seed=%d), duration %v", seed, seed, *duration)
	c := testcluster.Start(t, testcluster.Options{Nodes: nodes, Namespaces: true, ExtraArgs: []string{"--log-level", *logLevel}})
	all := []int{0, 1, 2, 3, 4}
	waitHealthy(t, c, all)
	herd(t, c, "cluster", "format", "--copies", fmt.Sprint(copies))
	for k := 0; k < clients; k++ {
		herd(t, c, "vdi", "create", fmt.Sprintf("rob%d", k), fmt.Sprint(vdiSize))
	}

	ctx, stop := context.WithCancel(t.Context())
	defer stop()
	var wg sync.WaitGroup
	down := new(downNodes)
	workers := make([]*worker, clients)
	for k := range workers {
		w := &worker{id: uint32(k + 1), c: c, home: k % 2, at: k % 2, down: down, vdi: fmt.Sprintf("rob%d", k), random: rand.New(rand.NewPCG(seed, uint64(k))), acked: make([]uint64, blocks), uncertain: map[int][]uint64{}, history: linearize.NewHistory()}
		workers[k] = w
		wg.Add(2)
		go func() {
			defer wg.Done()
			w.run(ctx)
		}()
		go func() {
			defer wg.Done()
			w.readThrough(ctx, c, rand.New(rand.NewPCG(seed, uint64(100+k))), k)
		}()
	}

	rec := &recoveryLog{times: map[string]time.Duration{}}
	wg.Add(1)
	go func() {
		defer wg.Done()
		rec.poll(ctx, c)
	}()
	nem := &nemesis{t: t, c: c, random: rand.New(rand.NewPCG(seed, 99)), state: map[int]string{}, down: down}
	started := time.Now()
	for time.Since(started) < *duration {
		nem.step()
		select {
		case <-time.After(time.Duration(2000+nem.random.IntN(4000)) * time.Millisecond):
		case <-t.Context().Done():
		}
	}
	// A rolling restart under the same load: every node but node 0 in
	// turn, each back in the epoch before the next goes.
	nem.healAll()
	for _, i := range []int{1, 2, 3, 4} {
		nem.restart(i)
	}
	stop()
	wg.Wait()
	nem.healAll()

	// Every node back, agreed, recovered, surplus removed.
	waitHealthy(t, c, all)
	recoveredAt := time.Now()
	c.WaitRecovered(nodes, 5*time.Minute)
	t.Logf("recovery after the last heal took %v", time.Since(recoveredAt).Round(time.Millisecond))

	// The final state: every block holds its last acknowledged write (or
	// a write of unknown outcome).
	var lost, verifyFailures, ops, errs, flushes int64
	for _, w := range workers {
		w.finalCheck(t)
		lost += w.lost.Load()
		verifyFailures += w.badReads.Load()
		ops += w.ops.Load()
		errs += w.errors.Load()
		flushes += w.flushes.Load()
	}
	exact := waitExactCopies(t, c)

	var readerOps, readerErrors, moves, resent int64
	for _, w := range workers {
		readerOps += w.readerOps.Load()
		readerErrors += w.readerErrors.Load()
		moves += w.moves.Load()
		resent += w.resent.Load()
	}
	t.Logf("summary: %d operations (%d flushes) by %d clients in %v and a rolling restart; %d reads (%d failed, dropped) through the faulted nodes; faults injected: %s; clients moved to another node %d times and sent %d requests again; client errors: %d; verification failures: %d; acknowledged writes lost: %d; %d objects with %d identical replicas each",
		ops, flushes, clients, duration.Round(time.Second), readerOps, readerErrors, nem.summary(), moves, resent, errs, verifyFailures, lost, exact, copies)
	rec.report(t)
	for _, w := range workers {
		visualization := filepath.Join(os.TempDir(), fmt.Sprintf("herd-robustness-%d-client%d.html", seed, w.id))
		if err := w.history.Check(2*time.Minute, visualization); err != nil {
			t.Errorf("client %d (seed %d): %v", w.id, seed, err)
		}
	}
	// The client of node 1 moved away at its stops, and back (a stop
	// that comes before it returned from the last finds it away).
	if moves < 2 {
		t.Errorf("clients moved to another node %d times; node %d, a client's home, was stopped %d times (and once in the rolling restart): want it moved away and back at least once", moves, writerNode, nem.counts["writer stopped"])
	}
	if readerOps == 0 {
		t.Errorf("no read through the faulted nodes succeeded: the readers prove nothing")
	}
	if verifyFailures > 0 || lost > 0 {
		for _, w := range workers {
			for _, f := range w.failures() {
				t.Errorf("client %d: %s", w.id, f)
			}
		}
		t.Fatalf("%d verification failures, %d acknowledged writes lost", verifyFailures, lost)
	}
	if errs > 0 {
		for _, w := range workers {
			for _, e := range w.errorLog() {
				t.Logf("client %d: %s", w.id, e)
			}
		}
		t.Fatalf("clients saw %d I/O errors with at most %d of %d nodes faulty", errs, copies-1, nodes)
	}
	if injected := nem.counts["killed"] + nem.counts["stopped"] + nem.counts["paused"] + nem.counts["partitioned"]; injected == 0 {
		t.Fatalf("the nemesis injected no fault in %v: the run proves nothing", *duration)
	}
	if ops < 1000 {
		t.Fatalf("only %d operations: the clients hardly ran", ops)
	}
}

// downNodes are the nodes a clean stop or restart of the nemesis has
// taken down, or is taking down: clients do not connect through them.
type downNodes [nodes]atomic.Bool

// worker is one NBD client with its model of the disk.
type worker struct {
	id     uint32
	c      *testcluster.Cluster
	home   int // the node it connects through while that one runs
	down   *downNodes
	vdi    string
	random *rand.Rand

	mu        sync.Mutex
	conn      *nbdclient.Conn
	seq       uint64
	busy      map[int]bool
	acked     []uint64         // per block: last acknowledged write (0: never written)
	uncertain map[int][]uint64 // per block: writes that failed (outcome unknown)
	problems  []string
	errs      []string
	history   *linearize.History // the writer's operations and its readers'

	ops, errors, badReads, lost, flushes atomic.Int64
	readerOps, readerErrors              atomic.Int64
	// moves counts the connections made through another node than the
	// last; resent the requests sent again on a new connection.
	moves, resent atomic.Int64
	at            int // the node of the last connection (guarded by mu)
}

// content and decode: the shared block model (internal/blockmodel).
func content(client uint32, block int, seq uint64) []byte {
	return blockmodel.Content(client, block, seq)
}

func decode(client uint32, block int, p []byte) (uint64, error) {
	return blockmodel.Decode(client, block, p)
}

// connect returns the worker's connection, making one through its home
// node, or, while that one is down, through node 0 (never faulted).
func (w *worker) connect(ctx context.Context) (*nbdclient.Conn, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.conn != nil {
		return w.conn, nil
	}
	at := w.home
	if w.down[at].Load() {
		at = 0
	}
	dial, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := nbdclient.Dial(dial, w.c.Node(at).NBDSocket(), w.vdi)
	if err != nil {
		return nil, err
	}
	if at != w.at {
		w.moves.Add(1)
	}
	w.conn, w.at = conn, at
	return conn, nil
}

// awayFromHome says whether the worker's connection goes through another
// node than its home, which is up again.
func (w *worker) awayFromHome() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.conn != nil && w.at != w.home && !w.down[w.home].Load()
}

// resend runs op on the worker's connection, and, when the connection
// ends under it (its node stopping cleanly: the requests it had not read
// get no reply), on a new one, as QEMU with reconnect-delay sends a
// request again after reconnecting. An error the server answered, or a
// connection that cannot be made again within opTimeout, ends it.
func (w *worker) resend(ctx context.Context, op func(ctx context.Context, conn *nbdclient.Conn) error) error {
	opCtx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	for attempt := 0; ; attempt++ {
		conn, err := w.connect(opCtx)
		if err == nil {
			if attempt > 0 {
				w.resent.Add(1)
			}
			err = op(opCtx, conn)
			if err == nil || isCommandError(err) {
				return err
			}
			w.dropConn(conn)
		}
		if opCtx.Err() != nil {
			return err
		}
		// Its node is going or gone: wait for the nemesis to mark it
		// down (or for it to answer again), then connect once more.
		select {
		case <-opCtx.Done():
			return err
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (w *worker) dropConn(conn *nbdclient.Conn) {
	w.mu.Lock()
	if w.conn == conn {
		w.conn = nil
	}
	w.mu.Unlock()
	conn.Close()
}

func (w *worker) run(ctx context.Context) {
	w.busy = map[int]bool{}
	sem := make(chan struct{}, inFlight)
	var wg sync.WaitGroup
	defer wg.Wait()
	for ctx.Err() == nil {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return
		}
		if w.awayFromHome() {
			// Its home node is back: the VM migrates back, between two
			// requests (every slot taken: nothing in flight), and its
			// next request takes the writer lock over there.
			for i := 1; i < inFlight; i++ {
				sem <- struct{}{}
			}
			w.mu.Lock()
			conn := w.conn
			w.mu.Unlock()
			if conn != nil {
				w.dropConn(conn)
			}
			for i := 1; i < inFlight; i++ {
				<-sem
			}
		}
		w.mu.Lock()
		block := w.random.IntN(blocks)
		for w.busy[block] {
			block = w.random.IntN(blocks)
		}
		w.busy[block] = true
		roll := w.random.IntN(100)
		w.mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			defer func() { w.mu.Lock(); delete(w.busy, block); w.mu.Unlock() }()
			switch {
			case roll < 50:
				w.write(ctx, block, roll < 5)
			case roll < 95:
				w.read(ctx, block)
			default:
				w.flush(ctx)
			}
		}()
	}
}

// opTimeout bounds one operation: herd retries internally for at most
// 30 s before it fails a request.
const opTimeout = 2 * time.Minute

func (w *worker) recordError(what string, err error) {
	w.errors.Add(1)
	w.mu.Lock()
	if len(w.errs) < 20 {
		w.errs = append(w.errs, fmt.Sprintf("%s %s: %v", time.Now().Format("15:04:05.000"), what, err))
	}
	w.mu.Unlock()
}

func (w *worker) problem(format string, args ...any) {
	w.mu.Lock()
	if len(w.problems) < 20 {
		w.problems = append(w.problems, fmt.Sprintf(format, args...))
	}
	w.mu.Unlock()
}

func (w *worker) write(ctx context.Context, block int, fua bool) {
	w.mu.Lock()
	w.seq++
	seq := w.seq
	w.mu.Unlock()
	var flags nbdclient.Flag
	if fua {
		flags = nbdclient.FUA
	}
	call := w.history.Invoke(0)
	err := w.resend(ctx, func(ctx context.Context, conn *nbdclient.Conn) error {
		return conn.WriteAt(ctx, content(w.id, block, seq), uint64(block)*blockSize, flags)
	})
	w.history.Write(call, block, seq, err == nil)
	w.ops.Add(1)
	if err != nil {
		w.mu.Lock()
		w.uncertain[block] = append(w.uncertain[block], seq)
		w.mu.Unlock()
		if ctx.Err() == nil {
			w.recordError(fmt.Sprintf("write block %d", block), err)
		}
		return
	}
	w.mu.Lock()
	w.acked[block] = seq
	w.mu.Unlock()
}

func isCommandError(err error) bool {
	var e *nbdclient.Error
	return errors.As(err, &e)
}

func (w *worker) read(ctx context.Context, block int) {
	p := make([]byte, blockSize)
	call := w.history.Invoke(0)
	err := w.resend(ctx, func(ctx context.Context, conn *nbdclient.Conn) error {
		return conn.ReadAt(ctx, p, uint64(block)*blockSize)
	})
	w.ops.Add(1)
	if err != nil {
		if ctx.Err() == nil {
			w.recordError(fmt.Sprintf("read block %d", block), err)
		}
		return
	}
	if seq, err := decode(w.id, block, p); err == nil {
		w.history.Read(call, block, seq)
	}
	w.check(block, p, false)
}

// readerTimeout bounds a read through a faulted node: a paused node
// answers nothing, and its reader moves on to the next node.
const readerTimeout = 5 * time.Second

// readThrough reads random blocks of w's VDI through the read-only
// export of the nodes the nemesis faults, starting with targets[k%3],
// and moves to the next one whenever its connection fails. Every read it
// completes goes into w's history; a failed read returned nothing and is
// dropped.
func (w *worker) readThrough(ctx context.Context, c *testcluster.Cluster, random *rand.Rand, k int) {
	next := k
	var conn *nbdclient.Conn
	defer func() {
		if conn != nil {
			conn.Close()
		}
	}()
	p := make([]byte, blockSize)
	for ctx.Err() == nil {
		if conn == nil {
			node := c.Node(targets[next%len(targets)])
			next++
			if !node.Running() || node.Paused() {
				continue
			}
			dial, cancel := context.WithTimeout(ctx, readerTimeout)
			var err error
			conn, err = nbdclient.Dial(dial, node.NBDSocket(), "ro/"+w.vdi)
			cancel()
			if err != nil {
				w.readerErrors.Add(1)
				conn = nil
				continue
			}
		}
		block := random.IntN(blocks)
		opCtx, cancel := context.WithTimeout(ctx, readerTimeout)
		call := w.history.Invoke(1)
		err := conn.ReadAt(opCtx, p, uint64(block)*blockSize)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				w.readerErrors.Add(1)
			}
			conn.Close()
			conn = nil
			continue
		}
		seq, err := decode(w.id, block, p)
		if err != nil {
			w.badReads.Add(1)
			w.problem("reader through another node: %v", err)
			continue
		}
		w.history.Read(call, block, seq)
		w.readerOps.Add(1)
	}
}

// check compares a read of block with the model.
func (w *worker) check(block int, p []byte, final bool) {
	got, err := decode(w.id, block, p)
	w.mu.Lock()
	want := w.acked[block]
	possible := got == want || slices.Contains(w.uncertain[block], got)
	w.mu.Unlock()
	switch {
	case err != nil:
		w.badReads.Add(1)
		w.problem("block %d: %v (final=%v)", block, err, final)
	case possible:
	case got < want && final:
		w.lost.Add(1)
		w.problem("block %d: holds write #%d at the end, but write #%d was acknowledged", block, got, want)
	case got < want:
		w.badReads.Add(1)
		w.problem("block %d: read write #%d, but write #%d was acknowledged", block, got, want)
	default:
		w.badReads.Add(1)
		w.problem("block %d: read write #%d, never attempted before the read (last acknowledged #%d, final=%v)", block, got, want, final)
	}
}

func (w *worker) flush(ctx context.Context) {
	// A FLUSH sent again through another node covers the writes made
	// through the old one too: a stopping node flushes what its
	// connections wrote before it closes them.
	err := w.resend(ctx, func(ctx context.Context, conn *nbdclient.Conn) error { return conn.Flush(ctx) })
	w.ops.Add(1)
	w.flushes.Add(1)
	if err != nil && ctx.Err() == nil {
		w.recordError("flush", err)
	}
}

// finalCheck reads every block through a new connection.
func (w *worker) finalCheck(t *testing.T) {
	w.mu.Lock()
	if w.conn != nil {
		w.conn.Close()
		w.conn = nil
	}
	w.mu.Unlock()
	conn, err := w.connect(t.Context())
	if err != nil {
		t.Fatalf("client %d: reconnecting for the final check: %v", w.id, err)
	}
	defer conn.Close()
	const chunk = 1 << 20
	p := make([]byte, chunk)
	for offset := 0; offset < vdiSize; offset += chunk {
		if err := conn.ReadAt(t.Context(), p, uint64(offset)); err != nil {
			t.Fatalf("client %d: final read at %d: %v", w.id, offset, err)
		}
		for i := 0; i < chunk; i += blockSize {
			w.check((offset+i)/blockSize, p[i:i+blockSize], true)
		}
	}
}

func (w *worker) failures() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.problems)
}

func (w *worker) errorLog() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.errs)
}

// nemesis injects one fault, or heals one, per step.
type nemesis struct {
	t      *testing.T
	c      *testcluster.Cluster
	random *rand.Rand
	state  map[int]string // faulty node -> "killed", "stopped", "paused", "partitioned"
	counts map[string]int
	down   *downNodes
}

func (n *nemesis) step() {
	if n.counts == nil {
		n.counts = map[string]int{}
	}
	faulty := n.faulty()
	if len(faulty) > 0 && (len(faulty) == copies-1 || n.random.IntN(2) == 0) {
		n.heal(faulty[n.random.IntN(len(faulty))])
		return
	}
	if n.state[writerNode] == "" && n.random.IntN(5) == 0 {
		// Its client moves to another node.
		n.stop(writerNode)
		n.state[writerNode] = "stopped"
		n.counts["stopped"]++
		n.counts["writer stopped"]++
		return
	}
	var healthy []int
	for _, i := range targets {
		if n.state[i] == "" {
			healthy = append(healthy, i)
		}
	}
	victim := healthy[n.random.IntN(len(healthy))]
	kinds := []string{"kill", "pause", "partition", "stop"}
	for _, s := range n.state {
		if s == "partitioned" {
			kinds = slices.DeleteFunc(kinds, func(k string) bool { return k == "partition" }) // one partition at a time
		}
	}
	switch kind := kinds[n.random.IntN(len(kinds))]; kind {
	case "kill":
		n.c.Node(victim).Kill()
		n.state[victim] = "killed"
	case "stop":
		n.stop(victim)
		n.state[victim] = "stopped"
	case "pause":
		n.c.Node(victim).Pause()
		n.state[victim] = "paused"
	case "partition":
		var rest []int
		for i := 0; i < nodes; i++ {
			if i != victim {
				rest = append(rest, i)
			}
		}
		n.c.Partition([]int{victim}, rest)
		n.state[victim] = "partitioned"
	}
	n.counts[n.state[victim]]++
}

// stop stops node i cleanly: SIGTERM, as systemctl stop and docker stop
// send (Stop fails the test if the node does not exit in time). Clients
// connect elsewhere from the moment it begins.
func (n *nemesis) stop(i int) {
	n.down[i].Store(true)
	n.c.Node(i).Stop()
}

// restart is a step of the rolling restart: node i stopped cleanly,
// started again, and back in the epoch.
func (n *nemesis) restart(i int) {
	n.stop(i)
	n.state[i] = "stopped"
	n.heal(i)
	n.counts["rolling restarts"]++
}

func (n *nemesis) faulty() []int {
	var out []int
	for i := range n.state {
		if n.state[i] != "" {
			out = append(out, i)
		}
	}
	sort.Ints(out)
	return out
}

func (n *nemesis) heal(i int) {
	switch n.state[i] {
	case "killed", "stopped":
		n.c.Node(i).Restart()
	case "paused":
		n.c.Node(i).Resume()
	case "partitioned":
		n.c.Heal()
	}
	n.counts["healed"]++
	delete(n.state, i)
	n.waitMember(i)
	n.down[i].Store(false)
}

// waitMember waits until node i is a member of the cluster's latest
// epoch again, as node 0 sees it. Until then the node is still faulty
// for the model: a restarted or resumed node that has not rejoined the
// epoch is no replica and answers no proof of currency, so another
// fault meanwhile would leave more than copies-1 nodes out.
func (n *nemesis) waitMember(i int) {
	address := n.c.Node(i).Address()
	testcluster.WaitFor(n.t, 2*time.Minute, fmt.Sprintf("node %d back in the latest epoch", i), func() (bool, error) {
		ctx, cancel := context.WithTimeout(n.t.Context(), 5*time.Second)
		defer cancel()
		nodes, err := client(n.c, 0).Nodes(ctx)
		if err != nil {
			return false, err
		}
		epochs, err := client(n.c, 0).Epochs(ctx)
		if err != nil || len(epochs) == 0 {
			return false, fmt.Errorf("epochs: %v", err)
		}
		last := epochs[len(epochs)-1]
		for _, node := range nodes {
			if node.Address == address && slices.Contains(last.Nodes, node.ID) {
				return true, nil
			}
		}
		// Say whether the cluster can change at all: a node cannot come
		// back into an epoch while node 0 sees no quorum.
		info, err := client(n.c, 0).Info(ctx)
		if err != nil {
			return false, fmt.Errorf("not in epoch %d (node 0's info: %v)", last.Number, err)
		}
		return false, fmt.Errorf("not in epoch %d (node 0: quorum %v, %s; voters %v)", last.Number, info.Quorum, info.QuorumDetail, info.Voters)
	})
}

func (n *nemesis) healAll() {
	for _, i := range n.faulty() {
		n.heal(i)
	}
}

func (n *nemesis) summary() string {
	return fmt.Sprintf("%d kills, %d clean stops (%d of node %d, whose client moved), %d pauses, %d partitions, %d heals, then a rolling restart of %d nodes", n.counts["killed"], n.counts["stopped"], n.counts["writer stopped"], writerNode, n.counts["paused"], n.counts["partitioned"], n.counts["healed"], n.counts["rolling restarts"])
}

func client(c *testcluster.Cluster, i int) *api.Client {
	return api.NewClient(c.Node(i).AdminAddr(), c.Token())
}

func herd(t *testing.T, c *testcluster.Cluster, args ...string) {
	t.Helper()
	if _, stderr, err := c.Herd(t.Context(), 0, args...); err != nil {
		t.Fatalf("herd %s: %v %s", strings.Join(args, " "), err, stderr)
	}
}

// waitHealthy waits until every listed node is alive in the latest epoch
// as every one of them sees it, with quorum.
func waitHealthy(t *testing.T, c *testcluster.Cluster, list []int) {
	t.Helper()
	testcluster.WaitFor(t, 2*time.Minute, "every node alive, with quorum, in one epoch", func() (bool, error) {
		var epoch uint64
		for _, i := range list {
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			info, err := client(c, i).Info(ctx)
			cancel()
			if err != nil {
				return false, fmt.Errorf("node %d: %v", i, err)
			}
			if !info.Quorum || info.NodesAlive != len(list) {
				return false, fmt.Errorf("node %d: quorum %v, %d alive", i, info.Quorum, info.NodesAlive)
			}
			if epoch != 0 && info.Epoch != epoch {
				return false, fmt.Errorf("node %d at epoch %d, another at %d", i, info.Epoch, epoch)
			}
			epoch = info.Epoch
		}
		return true, nil
	})
}

// waitExactCopies waits until every object has exactly `copies` copies,
// identical, and returns the number of objects, which is never zero: the
// clients wrote, so no object at all would be a comparison of nothing.
func waitExactCopies(t *testing.T, c *testcluster.Cluster) int {
	t.Helper()
	var count int
	testcluster.WaitFor(t, 3*time.Minute, fmt.Sprintf("exactly %d identical copies of every object", copies), func() (bool, error) {
		objects := map[string]map[int][]byte{}
		for _, n := range c.Nodes() {
			root := filepath.Join(n.DataDir(), "objects")
			err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
				if err != nil || d.IsDir() || len(d.Name()) != 16 {
					return nil
				}
				data, err := os.ReadFile(path)
				if err != nil {
					return nil // removed meanwhile
				}
				if len(data) < 4096 {
					return fmt.Errorf("object file %s is shorter than its header", path)
				}
				if objects[d.Name()] == nil {
					objects[d.Name()] = map[int][]byte{}
				}
				objects[d.Name()][n.Index()] = bytes.TrimRight(data[4096:], "\x00")
				return nil
			})
			if err != nil {
				return false, err
			}
		}
		if len(objects) == 0 {
			return false, errors.New("no object files on any node")
		}
		for oid, holders := range objects {
			if len(holders) != copies {
				return false, fmt.Errorf("object %s has %d copies", oid, len(holders))
			}
			var first []byte
			n := 0
			for node, data := range holders {
				if n == 0 {
					first = data
				} else if !bytes.Equal(first, data) {
					return false, fmt.Errorf("object %s differs on node %d", oid, node)
				}
				n++
			}
		}
		count = len(objects)
		return true, nil
	})
	return count
}

// recoveryLog records how long each node's recovery of each epoch took,
// polling node 0 (never faulted).
type recoveryLog struct {
	mu    sync.Mutex
	times map[string]time.Duration // "node@epoch" -> duration
}

func (r *recoveryLog) poll(ctx context.Context, c *testcluster.Cluster) {
	for ctx.Err() == nil {
		ask, cancel := context.WithTimeout(ctx, 3*time.Second)
		entries, err := client(c, 0).Recovery(ask)
		cancel()
		if err == nil {
			r.mu.Lock()
			for _, e := range entries {
				if e.Status.State == "done" && !e.Status.Finished.IsZero() && e.Status.Copied > 0 {
					r.times[fmt.Sprintf("%s@%d", e.Node, e.Status.Epoch)] = e.Status.Finished.Sub(e.Status.Started)
				}
			}
			r.mu.Unlock()
		}
		select {
		case <-ctx.Done():
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func (r *recoveryLog) report(t *testing.T) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var all []time.Duration
	for _, d := range r.times {
		all = append(all, d)
	}
	if len(all) == 0 {
		t.Logf("recovery times: no recovery that copied data was observed")
		return
	}
	slices.Sort(all)
	t.Logf("recovery times (per node and epoch, those that copied data): %d runs, median %v, max %v",
		len(all), all[len(all)/2].Round(time.Millisecond), all[len(all)-1].Round(time.Millisecond))
}
