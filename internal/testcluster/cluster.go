// Package testcluster starts real herd clusters for integration tests, one
// operating-system process per node built from ./cmd/herd, and injects real
// faults into them: kill -9, SIGTERM, SIGSTOP and SIGCONT, restart on the same
// data directory, and network partitions between nodes that run in Linux
// network namespaces of their own.
//
// It is the second level of herd's tests, after pure unit tests and before
// tests that drive clusters with real NBD clients (see docs/TESTING.md):
//
//	c := testcluster.Start(t, testcluster.Options{Nodes: 3, Namespaces: true})
//	c.Partition([]int{0}, []int{1, 2})
//	testcluster.WaitFor(t, 10*time.Second, "node 0 to fence itself", func() (bool, error) { ... })
//	c.Heal()
//	c.Node(2).Kill()
//	c.Node(2).Restart()
//
// Every node has its own address and the binary's default ports. Without
// namespaces the addresses are 127.A.B.1, .2, ... for a random A.B, so that
// test processes running at the same time do not collide with each other or
// with a developer's cluster on 127.0.0.1-3. With namespaces they are
// 10.A.B.1, .2, ... on a bridge that the test process reaches at 10.A.B.254.
//
// Everything Start creates (processes, namespaces, links, directories) is
// removed by t.Cleanup. Processes are signalled only by pid after checking
// /proc/PID/cmdline, never by name. When the test failed, the cleanup prints
// the end of every node's log. A node that exits without being asked to (a
// crash) fails the test, and so does a race report in a node's log (from a
// binary built with -race, see BinaryVariable).
//
// The methods of Cluster and Node fail the test with t.Fatalf on errors, so
// they must be called from the test's goroutine; Herd, HerdJSON and
// Node.Health return errors instead and may be called from any goroutine.
package testcluster

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/testenv"
)

// TokenVariable is the environment variable through which the herd CLI
// receives the admin token; JoinTokenVariable the one through which a
// joining node receives the join token.
const (
	TokenVariable     = "HERD_TOKEN"
	JoinTokenVariable = "HERD_JOIN_TOKEN"
)

const (
	// tokenFile and joinTokenFile are the files in the first node's data
	// directory holding the admin and join tokens it generated.
	tokenFile     = "admin.token"
	joinTokenFile = "join.token"
	// defaultStartTimeout bounds a node's start until /v1/health answers.
	defaultStartTimeout = 20 * time.Second
	// stopTimeout bounds a clean shutdown after SIGTERM before SIGKILL.
	stopTimeout = 15 * time.Second
	// defaultCommandTimeout bounds a herd CLI command whose context has no
	// deadline.
	defaultCommandTimeout = 60 * time.Second
	// logTailLines is how much of each node's log a failed test prints.
	logTailLines = 60
)

// Options configures a cluster started by Start.
type Options struct {
	// Nodes is the number of nodes Start starts; at least 1.
	Nodes int
	// Zones, when not empty, gives node i (also nodes added later) the zone
	// Zones[i%len(Zones)].
	Zones []string
	// ZoneDelay, with Zones (loopback clusters only), delays every peer
	// connection between nodes of different zones by this much each way
	// (HERD_TEST_PEER_DELAY, internal/peer/knobs_on.go; the nodes run KnobsBinary): zones far apart.
	ZoneDelay time.Duration
	// Namespaces runs every node in a network namespace of its own so that
	// Partition can cut links between nodes. It needs root, ip (iproute2)
	// and nft (nftables); without them Start skips the test, or fails it
	// under CI=true (see internal/testenv).
	Namespaces bool
	// ExtraArgs are appended to every node's `herd server` arguments.
	ExtraArgs []string
	// Capacity, when not empty, is every node's --capacity.
	Capacity string
	// StartTimeout bounds how long a node may take, after it was started,
	// to answer GET /v1/health; 0 means 20 seconds.
	StartTimeout time.Duration
	// Together starts the joining nodes as soon as node 0 has written its
	// join token, without waiting for node 0 (or each other) to be
	// healthy, as a deployment that starts every node at the same moment
	// does (deploy/docker-compose.yml); Start then waits for all of them.
	Together bool

	// Binary, when not empty, is the herd binary the nodes and the CLI
	// run instead of the one Binary builds (an older build, for upgrade
	// tests); Node.SetBinary and Cluster.SetBinary change it later.
	Binary string

	// binary, when not empty, replaces the binary built by Binary; the
	// self-test uses it to run a fake herd.
	binary string
}

// Cluster is a running herd cluster started by Start.
type Cluster struct {
	t       testing.TB
	options Options
	// binary is the herd binary the CLI commands and the nodes without
	// one of their own (Node.SetBinary) run; guarded by mu after Start.
	binary string
	// directory holds every node's data directory and log.
	directory string
	// network is nil unless Options.Namespaces is set.
	network *network
	// loopbackPrefix is "127.A.B." when network is nil.
	loopbackPrefix string

	// mu guards the following fields.
	mu sync.Mutex
	// nodes holds every node ever started, indexed by node index.
	nodes []*Node
	// token is the admin token and joinToken the join token, read from
	// the first node's data directory.
	token, joinToken string
}

// Start starts a cluster of options.Nodes nodes and returns once every node
// answers GET /v1/health. Node 0 starts first, without --join, and creates
// the cluster's CA and tokens; the others join node 0 with --join and the
// join token in $HERD_JOIN_TOKEN. Each node is started once the one before
// it is healthy, unless Options.Together is set.
// Everything is torn down by t.Cleanup.
func Start(t testing.TB, options Options) *Cluster {
	t.Helper()
	if options.Nodes < 1 {
		t.Fatalf("testcluster: Options.Nodes is %d, want at least 1", options.Nodes)
	}
	if options.StartTimeout == 0 {
		options.StartTimeout = defaultStartTimeout
	}
	c := &Cluster{t: t, options: options, binary: options.binary}
	if c.binary == "" {
		c.binary = options.Binary
	}
	if c.binary == "" && options.ZoneDelay > 0 {
		c.binary = KnobsBinary(t) // HERD_TEST_PEER_DELAY
	}
	if c.binary == "" {
		c.binary = Binary(t)
	}
	// The temporary directory is created before the cleanup below is
	// registered, so that it is removed only after the nodes writing into it
	// were killed (cleanups run last registered, first run).
	c.directory = t.TempDir()
	if options.Namespaces {
		network, err := newNetwork()
		if errors.Is(err, ErrNamespacesUnavailable) {
			testenv.Require(t, "network namespaces (Options.Namespaces)", err)
		}
		if err != nil {
			t.Fatalf("%v", err)
		}
		c.network = network
	} else {
		prefix, err := pickLoopbackPrefix(options.Nodes)
		if err != nil {
			t.Fatalf("%v", err)
		}
		c.loopbackPrefix = prefix
	}
	t.Cleanup(c.cleanup)

	var first *Node
	var starting []startedNode
	if options.Together {
		first = c.newNode(nil)
		starting = append(starting, startedNode{first, first.spawn()})
	} else {
		first = c.startNode(nil)
	}
	for _, file := range []struct {
		name string
		into *string
	}{{tokenFile, &c.token}, {joinTokenFile, &c.joinToken}} {
		path := filepath.Join(first.DataDir(), file.name)
		WaitFor(t, options.StartTimeout, "node 0 to write "+path, func() (bool, error) {
			contents, err := os.ReadFile(path)
			if err != nil {
				return false, err
			}
			token := strings.TrimSpace(string(contents))
			c.mu.Lock()
			*file.into = token
			c.mu.Unlock()
			return token != "", errors.New("the file is empty")
		})
	}
	for range options.Nodes - 1 {
		if options.Together {
			node := c.newNode([]string{first.Address()})
			starting = append(starting, startedNode{node, node.spawn()})
		} else {
			c.startNode([]string{first.Address()})
		}
	}
	for _, s := range starting {
		s.node.waitHealthy(s.process)
	}
	return c
}

// startedNode is a node started by Start with Options.Together, not yet
// known to be healthy.
type startedNode struct {
	node    *Node
	process *process
}

// Node returns node index (0 is the first node started).
func (c *Cluster) Node(index int) *Node {
	c.t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if index < 0 || index >= len(c.nodes) {
		c.t.Fatalf("testcluster: no node %d (the cluster has %d)", index, len(c.nodes))
	}
	return c.nodes[index]
}

// Nodes returns every node ever started, running or not, in index order.
func (c *Cluster) Nodes() []*Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*Node(nil), c.nodes...)
}

// Token returns the admin token.
func (c *Cluster) Token() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.token
}

// SetToken replaces the admin token the CLI commands run with (after a
// CA rotation, a token names the new CA).
func (c *Cluster) SetToken(token string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.token = token
}

// SetJoinToken replaces the join token nodes started from now on join
// with.
func (c *Cluster) SetJoinToken(token string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.joinToken = token
}

// JoinToken returns the join token.
func (c *Cluster) JoinToken() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.joinToken
}

// AddNode starts one more node that joins the cluster through every node
// running at that moment, and returns it once it answers GET /v1/health.
func (c *Cluster) AddNode() *Node {
	c.t.Helper()
	return c.AddNodeWith()
}

// AddNodeWith is AddNode with extra `herd server` arguments for this node
// only (after Options.ExtraArgs), e.g. a small --disk.
func (c *Cluster) AddNodeWith(extra ...string) *Node {
	c.t.Helper()
	var join []string
	for _, node := range c.Nodes() {
		if node.Running() {
			join = append(join, node.Address())
		}
	}
	if len(join) == 0 {
		c.t.Fatalf("testcluster: AddNode: no running node to join")
	}
	if c.network == nil {
		address := c.loopbackPrefix + strconv.Itoa(len(c.Nodes())+1)
		if err := portsFree(address); err != nil {
			c.t.Fatalf("testcluster: AddNode: %v", err)
		}
	}
	return c.startNode(join, extra...)
}

// Partition cuts the network between nodes in different groups, in both
// directions, replacing any earlier partition: Partition([]int{0},
// []int{1, 2}) isolates node 0 from nodes 1 and 2, which still reach each
// other. A node listed in no group keeps all its links, so it can bridge the
// groups. Packets are dropped silently, so connections time out as in a real
// partition. The test process reaches every node throughout. Nodes added
// later are not cut off. Partition needs Options.Namespaces.
func (c *Cluster) Partition(groups ...[]int) {
	c.t.Helper()
	if c.network == nil {
		c.t.Fatalf("testcluster: Partition needs Options.Namespaces")
	}
	if err := c.network.partition(groups); err != nil {
		c.t.Fatalf("%v", err)
	}
	c.t.Logf("testcluster: partitioned the cluster into %v", groups)
}

// Heal removes every partition made by Partition.
func (c *Cluster) Heal() {
	c.t.Helper()
	if c.network == nil {
		c.t.Fatalf("testcluster: Heal needs Options.Namespaces")
	}
	if err := c.network.heal(); err != nil {
		c.t.Fatalf("%v", err)
	}
	c.t.Logf("testcluster: healed the partition")
}

// Herd runs `herd --addr ADMIN args...` against node index with the admin
// token in $HERD_TOKEN, and returns its standard output and error. The
// command is killed when ctx is done; without a deadline in ctx it gets 60
// seconds. A non-zero exit is an error that includes stderr.
// HerdCommand is the herd CLI aimed at node index, not started: for a
// test that signals it while it runs (the caller waits for it).
func (c *Cluster) HerdCommand(index int, args ...string) *exec.Cmd {
	c.mu.Lock()
	node, token := c.nodes[index], c.token
	c.mu.Unlock()
	command := exec.Command(c.currentBinary(), append([]string{"--addr", node.AdminAddr()}, args...)...)
	command.Env = childEnvironment(TokenVariable + "=" + token)
	return command
}

func (c *Cluster) Herd(ctx context.Context, index int, args ...string) (stdout, stderr string, err error) {
	c.mu.Lock()
	if index < 0 || index >= len(c.nodes) {
		c.mu.Unlock()
		return "", "", fmt.Errorf("testcluster: no node %d", index)
	}
	node, token := c.nodes[index], c.token
	c.mu.Unlock()
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, defaultCommandTimeout)
		defer cancel()
	}
	command := exec.CommandContext(ctx, c.currentBinary(), append([]string{"--addr", node.AdminAddr()}, args...)...)
	command.Env = childEnvironment(TokenVariable + "=" + token)
	// If the CLI leaves a child holding its output pipes, give up on them
	// shortly after the CLI itself exits.
	command.WaitDelay = 5 * time.Second
	var stdoutBuffer, stderrBuffer strings.Builder
	command.Stdout = &stdoutBuffer
	command.Stderr = &stderrBuffer
	err = command.Run()
	stdout, stderr = stdoutBuffer.String(), stderrBuffer.String()
	if err != nil {
		return stdout, stderr, fmt.Errorf("testcluster: herd --addr %s %s: %w: %s",
			node.AdminAddr(), strings.Join(args, " "), err, strings.TrimSpace(stderr))
	}
	return stdout, stderr, nil
}

// HerdJSON runs `herd --addr ADMIN --json args...` like Herd and decodes its
// standard output into v.
func (c *Cluster) HerdJSON(ctx context.Context, index int, v any, args ...string) error {
	stdout, _, err := c.Herd(ctx, index, append([]string{"--json"}, args...)...)
	if err != nil {
		return err
	}
	if err := json.Unmarshal([]byte(stdout), v); err != nil {
		return fmt.Errorf("testcluster: herd --json %s: decoding %q: %w", strings.Join(args, " "), stdout, err)
	}
	return nil
}

// startNode creates the next node, starts it with --join when join is not
// empty, and waits until it is healthy.
func (c *Cluster) startNode(join []string, extra ...string) *Node {
	c.t.Helper()
	node := c.newNode(join, extra...)
	node.launch()
	return node
}

// newNode creates the next node (address, data directory, arguments: with
// --join when join is not empty) without starting it.
func (c *Cluster) newNode(join []string, extra ...string) *Node {
	c.t.Helper()
	c.mu.Lock()
	index := len(c.nodes)
	c.mu.Unlock()
	node := &Node{cluster: c, index: index}
	if c.network != nil {
		_, namespace, address, err := c.network.addHost()
		if err != nil {
			c.t.Fatalf("%v", err)
		}
		node.namespace, node.address = namespace, address.String()
	} else {
		node.address = c.loopbackPrefix + strconv.Itoa(index+1)
	}
	name := "node" + strconv.Itoa(index)
	node.dataDirectory = filepath.Join(c.directory, name)
	node.logPath = filepath.Join(c.directory, name+".log")
	if err := os.MkdirAll(node.dataDirectory, 0o700); err != nil {
		c.t.Fatalf("testcluster: %v", err)
	}
	var zone string
	if len(c.options.Zones) > 0 {
		zone = c.options.Zones[index%len(c.options.Zones)]
	}
	node.arguments = serverArguments(node.dataDirectory, node.address, join, zone, c.options.Capacity, append(slices.Clone(c.options.ExtraArgs), extra...))
	c.mu.Lock()
	c.nodes = append(c.nodes, node)
	c.mu.Unlock()
	return node
}

// zoneDelay is node index's HERD_TEST_PEER_DELAY: the addresses of the
// nodes (up to 32, started or to be added) in other zones.
func (c *Cluster) zoneDelay(index int) string {
	zones := c.options.Zones
	if c.options.ZoneDelay <= 0 || len(zones) == 0 || c.network != nil {
		return ""
	}
	var far []string
	for j := 0; j < 32; j++ {
		if zones[j%len(zones)] != zones[index%len(zones)] {
			far = append(far, c.loopbackPrefix+strconv.Itoa(j+1))
		}
	}
	return strings.Join(far, ",") + "=" + c.options.ZoneDelay.String()
}

// serverArguments returns the `herd server` arguments of a node.
func serverArguments(dataDirectory, address string, join []string, zone, capacity string, extra []string) []string {
	arguments := []string{"server", "--data", dataDirectory, "--bind", address}
	if len(join) > 0 {
		arguments = append(arguments, "--join", strings.Join(join, ","))
	}
	if zone != "" {
		arguments = append(arguments, "--zone", zone)
	}
	if capacity != "" {
		arguments = append(arguments, "--capacity", capacity)
	}
	return append(arguments, extra...)
}

// cleanup reports nodes that crashed, kills every node, fails the test if a
// node's log holds a race report, prints the nodes' logs if the test failed
// and deletes the network.
func (c *Cluster) cleanup() {
	nodes := c.Nodes()
	for _, node := range nodes {
		if process := node.currentProcess(); process != nil && process.unexpectedExit() {
			exitError, _ := process.exitStatus()
			c.t.Errorf("testcluster: node %d (pid %d) exited without being asked to: %v; its log is %s",
				node.index, process.pid(), exitStatusText(exitError), node.logPath)
		}
	}
	for _, node := range nodes {
		if process := node.currentProcess(); process != nil {
			if err := process.kill(); err != nil {
				c.t.Errorf("testcluster: cleanup of node %d: %v", node.index, err)
			}
		}
	}
	// After the kills, so that every report is complete in the logs.
	for _, node := range nodes {
		node.reportRaces()
	}
	if c.t.Failed() {
		for _, node := range nodes {
			c.t.Logf("%s", node.logReport())
		}
		c.keepLogs(nodes)
	} else if os.Getenv("HERD_TEST_KEEP_LOGS") != "" {
		c.keepLogs(nodes)
	}
	if c.network != nil {
		if err := c.network.destroy(); err != nil {
			c.t.Errorf("testcluster: deleting the network namespaces: %v", err)
		}
	}
}

// keepLogs copies every node's whole log out of the test's temporary
// directory (which is deleted) into $HERD_TEST_LOGS, or a new directory
// under the system's temporary directory, and names it: a failure that
// depends on timing is studied from the logs of the run that failed.
// With HERD_TEST_KEEP_LOGS set, a passing test's logs are kept too.
func (c *Cluster) keepLogs(nodes []*Node) {
	root := os.Getenv("HERD_TEST_LOGS")
	if root == "" {
		root = os.TempDir()
	}
	name := strings.NewReplacer("/", "_", " ", "_").Replace(c.t.Name())
	dir, err := os.MkdirTemp(root, "herd-"+name+"-")
	if err != nil {
		c.t.Logf("testcluster: keeping the node logs: %v", err)
		return
	}
	for _, node := range nodes {
		contents, err := os.ReadFile(node.logPath)
		if err == nil {
			err = os.WriteFile(filepath.Join(dir, filepath.Base(node.logPath)), contents, 0o644)
		}
		if err != nil {
			c.t.Logf("testcluster: keeping node %d's log: %v", node.index, err)
		}
	}
	c.t.Logf("testcluster: the nodes' whole logs are kept in %s", dir)
}

// exitStatusText describes an exec.Cmd.Wait result.
func exitStatusText(exitError error) string {
	if exitError == nil {
		return "exit status 0"
	}
	return exitError.Error()
}

// reportRaces fails the test with an excerpt if the node's log (every
// process it ran) holds a race report.
func (n *Node) reportRaces() {
	log, err := os.Open(n.logPath)
	if errors.Is(err, os.ErrNotExist) {
		return // never started
	}
	if err != nil {
		n.cluster.t.Errorf("testcluster: checking node %d's log for data races: %v", n.index, err)
		return
	}
	defer log.Close()
	count, first, err := raceReports(log)
	if err != nil {
		n.cluster.t.Errorf("testcluster: checking node %d's log for data races: %v", n.index, err)
	}
	if count > 0 {
		n.cluster.t.Errorf("testcluster: node %d reported %d data race(s) (a herd binary built with -race); the first, from %s:\n%s",
			n.index, count, n.logPath, first)
	}
}

// Node is one node of a Cluster: a herd server process, its address and its
// data directory, which survive restarts.
type Node struct {
	cluster *Cluster
	index   int
	// address is the node's own IP address; every port is bound on it.
	address string
	// namespace is the node's network namespace, empty without namespaces.
	namespace     string
	dataDirectory string
	logPath       string
	// arguments are the `herd server` arguments, reused by Restart.
	arguments []string

	// mu guards the following fields.
	mu sync.Mutex
	// process is the node's current or last process.
	process *process
	// binary, when not empty, is the herd binary the node's next start
	// runs (SetBinary); else the cluster's.
	binary string
}

// SetBinary makes the node's next start (Restart) run binary: a node
// upgraded (or downgraded) in place, with the same data directory.
func (n *Node) SetBinary(binary string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.binary = binary
}

func (n *Node) currentBinary() string {
	n.mu.Lock()
	binary := n.binary
	n.mu.Unlock()
	if binary == "" {
		binary = n.cluster.currentBinary()
	}
	return binary
}

// SetBinary makes the CLI commands (Herd, HerdCommand) and the nodes
// without a binary of their own run binary from now on.
func (c *Cluster) SetBinary(binary string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.binary = binary
}

func (c *Cluster) currentBinary() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.binary
}

// Index returns the node's index in its cluster.
func (n *Node) Index() int { return n.index }

// Address returns the node's IP address, on which it binds every port.
func (n *Node) Address() string { return n.address }

// AdminAddr returns the host:port of the node's admin HTTP API.
func (n *Node) AdminAddr() string { return net.JoinHostPort(n.address, strconv.Itoa(AdminPort)) }

// PeerAddr returns the host:port of the node's peer protocol listener.
func (n *Node) PeerAddr() string { return net.JoinHostPort(n.address, strconv.Itoa(PeerPort)) }

// GossipAddr returns the host:port of the node's gossip listener.
func (n *Node) GossipAddr() string { return net.JoinHostPort(n.address, strconv.Itoa(GossipPort)) }

// NBDAddr returns the host:port of the node's NBD server.
func (n *Node) NBDAddr() string { return net.JoinHostPort(n.address, strconv.Itoa(NBDPort)) }

// NBDSocket is the node's local plaintext NBD socket.
func (n *Node) NBDSocket() string { return filepath.Join(n.dataDirectory, "nbd.sock") }

// NBDTLSURI returns the nbds:// URI of an export on this node for a client
// whose certificates are in directory (herd client add --out).
func (n *Node) NBDTLSURI(export, directory string) string {
	return "nbds://" + n.NBDAddr() + "/" + export + "?tls-certificates=" + directory
}

// NBDURI returns the NBD URI of an export (a VDI name, or name@snapshot) on
// this node, as qemu-img, qemu-io and the libnbd tools take it.
// It is the node's local socket: NBD on the TCP port needs TLS with a
// client certificate (NBDTLSURI).
func (n *Node) NBDURI(export string) string {
	return "nbd+unix:///" + export + "?socket=" + n.NBDSocket()
}

// DataDir returns the node's data directory.
func (n *Node) DataDir() string { return n.dataDirectory }

// LogPath returns the file receiving the node's standard output and error,
// across restarts.
func (n *Node) LogPath() string { return n.logPath }

// Namespace returns the node's network namespace, or "" without
// Options.Namespaces. `ip netns exec NAMESPACE ...` runs a command there.
func (n *Node) Namespace() string { return n.namespace }

// PID returns the pid of the node's current (or last) process.
func (n *Node) PID() int {
	if process := n.currentProcess(); process != nil {
		return process.pid()
	}
	return 0
}

// Running reports whether the node's process has not exited; a paused node
// is running.
func (n *Node) Running() bool {
	process := n.currentProcess()
	return process != nil && process.running()
}

// Paused reports whether the node was paused and not resumed.
func (n *Node) Paused() bool {
	process := n.currentProcess()
	return process != nil && process.isPaused()
}

// Kill sends SIGKILL to the node and waits for it to exit: a crash, or a
// power cut as far as data not yet on stable storage is concerned. Killing a
// node that is not running does nothing.
func (n *Node) Kill() {
	n.cluster.t.Helper()
	process := n.currentProcess()
	if process == nil || !process.running() {
		return
	}
	if err := process.kill(); err != nil {
		n.cluster.t.Fatalf("testcluster: kill node %d: %v", n.index, err)
	}
	n.cluster.t.Logf("testcluster: killed node %d (pid %d)", n.index, process.pid())
}

// Stop sends SIGTERM to the node and waits for it to exit, sending SIGKILL
// (and failing the test) if it has not exited after 15 seconds.
func (n *Node) Stop() {
	n.cluster.t.Helper()
	process := n.currentProcess()
	if process == nil || !process.running() {
		return
	}
	clean, err := process.stop(stopTimeout)
	if err != nil {
		n.cluster.t.Fatalf("testcluster: stop node %d: %v", n.index, err)
	}
	if !clean {
		n.cluster.t.Fatalf("testcluster: node %d did not exit within %v of SIGTERM; killed it", n.index, stopTimeout)
	}
	n.cluster.t.Logf("testcluster: stopped node %d (pid %d)", n.index, process.pid())
}

// Pause sends SIGSTOP to the node and waits until every thread of it has
// stopped: it keeps its sockets but answers nothing, like a process stuck in
// a long pause or a frozen virtual machine.
func (n *Node) Pause() {
	n.cluster.t.Helper()
	if err := n.runningProcess("pause").pause(); err != nil {
		n.cluster.t.Fatalf("testcluster: pause node %d: %v", n.index, err)
	}
	n.cluster.t.Logf("testcluster: paused node %d", n.index)
}

// Resume sends SIGCONT to a paused node.
func (n *Node) Resume() {
	n.cluster.t.Helper()
	if err := n.runningProcess("resume").resume(); err != nil {
		n.cluster.t.Fatalf("testcluster: resume node %d: %v", n.index, err)
	}
	n.cluster.t.Logf("testcluster: resumed node %d", n.index)
}

// Restart starts a node that was killed or stopped again, with the same
// data directory, address and arguments (--join), and waits until
// it answers GET /v1/health. Restarting a running node fails the test: kill
// or stop it first, choosing how it goes down.
func (n *Node) Restart() {
	n.cluster.t.Helper()
	if n.Running() {
		n.cluster.t.Fatalf("testcluster: restart node %d: it is still running; Kill or Stop it first", n.index)
	}
	n.launch()
}

// RestartUntilExit starts a node that was killed or stopped again, as
// Restart does, and waits up to timeout for its process to exit on its
// own: a start that must be refused (a binary too old for the cluster's
// log). It returns the process's exit error (nil for status 0); the test
// fails if the process still runs after timeout (it is killed).
func (n *Node) RestartUntilExit(timeout time.Duration) error {
	n.cluster.t.Helper()
	if n.Running() {
		n.cluster.t.Fatalf("testcluster: restart node %d: it is still running; Kill or Stop it first", n.index)
	}
	process := n.spawn()
	if !process.wait(timeout) {
		process.kill()
		n.cluster.t.Fatalf("testcluster: node %d (pid %d) still runs %v after its start; it was expected to exit\n%s", n.index, process.pid(), timeout, n.logReport())
	}
	process.expectExit()
	exitError, _ := process.exitStatus()
	n.cluster.t.Logf("testcluster: node %d (pid %d) exited on its own: %s", n.index, process.pid(), exitStatusText(exitError))
	return exitError
}

// Health asks the node's GET /v1/health and returns nil if it answered 200.
func (n *Node) Health(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, healthRequestTimeout)
	defer cancel()
	request, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+n.AdminAddr()+"/v1/health", nil)
	if err != nil {
		return err
	}
	response, err := healthClient.Do(request)
	if err != nil {
		return fmt.Errorf("testcluster: node %d health: %w", n.index, err)
	}
	defer response.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(response.Body, 512))
	if response.StatusCode != http.StatusOK {
		return fmt.Errorf("testcluster: node %d health: %s: %s", n.index, response.Status, bytes.TrimSpace(body))
	}
	return nil
}

// healthRequestTimeout bounds one health request: a paused node accepts the
// connection (the kernel does) but never answers.
const healthRequestTimeout = 2 * time.Second

// healthClient talks to nodes directly: no proxy from the environment, no
// kept-alive connections to nodes that may be killed at any moment. It
// does not verify the node's certificate: it sends no secret and learns
// only "ok" (the CLI and api.Client verify by the CA fingerprint).
var healthClient = &http.Client{Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true, TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}

// launch starts the node's process and waits until it is healthy, failing
// the test (with the end of the node's log) if it exits or the start
// timeout passes first.
func (n *Node) launch() {
	n.cluster.t.Helper()
	n.waitHealthy(n.spawn())
}

// spawn starts the node's process and returns it without waiting.
func (n *Node) spawn() *process {
	t := n.cluster.t
	t.Helper()
	binary := n.currentBinary()
	argv := append([]string{binary}, n.arguments...)
	if n.namespace != "" {
		argv = n.cluster.network.command(n.index, argv...)
	}
	logFile, err := os.OpenFile(n.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatalf("testcluster: node %d log: %v", n.index, err)
	}
	fmt.Fprintf(logFile, "=== testcluster %s: starting node %d: %s\n",
		time.Now().Format(time.RFC3339Nano), n.index, strings.Join(argv, " "))
	environment := []string{JoinTokenVariable + "=" + n.cluster.JoinToken()}
	if delay := n.cluster.zoneDelay(n.index); delay != "" {
		environment = append(environment, "HERD_TEST_PEER_DELAY="+delay)
	}
	process, err := startProcess(binary, argv, childEnvironment(environment...), logFile)
	// The child has its own copy of the descriptor.
	logFile.Close()
	if err != nil {
		t.Fatalf("testcluster: node %d: %v", n.index, err)
	}
	n.mu.Lock()
	previous := n.process
	n.process = process
	n.mu.Unlock()
	if previous != nil && previous.unexpectedExit() {
		// Restarting must not hide a crash: the cleanup only sees the
		// current process.
		exitError, _ := previous.exitStatus()
		t.Errorf("testcluster: node %d (pid %d) had exited without being asked to before Restart: %s",
			n.index, previous.pid(), exitStatusText(exitError))
	}
	return process
}

// waitHealthy waits until the node's process answers GET /v1/health,
// failing the test (with the end of the node's log) if it exits or the
// start timeout passes first.
func (n *Node) waitHealthy(process *process) {
	t := n.cluster.t
	t.Helper()
	timeout := n.cluster.options.StartTimeout
	lastError, healthy := poll(t.Context(), timeout, func() (bool, error) {
		if exitError, exited := process.exitStatus(); exited {
			return false, finalError{fmt.Errorf("the process exited: %s", exitStatusText(exitError))}
		}
		err := n.Health(t.Context())
		return err == nil, err
	})
	if !healthy {
		if process.running() {
			// Killed here rather than in the cleanup so that the cleanup
			// does not also report it as a crash.
			process.kill()
		} else {
			process.expectExit()
		}
		t.Fatalf("testcluster: node %d (pid %d) did not become healthy (start timeout %v): %v\n%s",
			n.index, process.pid(), timeout, lastError, n.logReport())
	}
	t.Logf("testcluster: node %d healthy: pid %d, address %s, log %s", n.index, process.pid(), n.address, n.logPath)
}

// currentProcess returns the node's current or last process, nil before the
// first start.
func (n *Node) currentProcess() *process {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.process
}

// runningProcess returns the node's process, failing the test if it is not
// running.
func (n *Node) runningProcess(action string) *process {
	n.cluster.t.Helper()
	process := n.currentProcess()
	if process == nil || !process.running() {
		n.cluster.t.Fatalf("testcluster: %s node %d: it is not running", action, n.index)
	}
	return process
}

// logReport returns the end of the node's log for a failed test, and the
// start of the first panic in it, which a goroutine dump may have pushed out
// of the tail.
func (n *Node) logReport() string {
	contents, err := os.ReadFile(n.logPath)
	if err != nil {
		return fmt.Sprintf("--- node %d: no log: %v", n.index, err)
	}
	lines := strings.Split(strings.TrimRight(string(contents), "\n"), "\n")
	tailStart := max(0, len(lines)-logTailLines)
	var report strings.Builder
	for i, line := range lines[:tailStart] {
		if strings.HasPrefix(line, "panic:") || strings.HasPrefix(line, "fatal error:") || strings.HasPrefix(line, "WARNING: DATA RACE") {
			end := min(tailStart, i+logTailLines)
			fmt.Fprintf(&report, "--- node %d (%s): %s, lines %d-%d:\n%s\n", n.index, n.address, n.logPath, i+1, end,
				strings.Join(lines[i:end], "\n"))
			break
		}
	}
	fmt.Fprintf(&report, "--- node %d (%s): last %d lines of %s:\n%s", n.index, n.address, len(lines)-tailStart, n.logPath,
		strings.Join(lines[tailStart:], "\n"))
	return report.String()
}
