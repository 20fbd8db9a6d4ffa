package testcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// How the partitionable network is built (see docs/TESTING.md for why):
//
//	root namespace (test process, herd CLI)
//	   hdXXXXXup  10.A.B.254/24
//	      | veth
//	hub namespace hdXXXXXhub:  uplink -- br0 -- v0, v1, v2 ...
//	                                            | veth (one per node)
//	node namespaces hdXXXXXn0, hdXXXXXn1 ...:  eth0 10.A.B.1/24, .2, ...
//
// The bridge lives in a namespace of its own rather than in the root
// namespace because with br_netfilter loaded (Docker loads it) frames crossing
// a bridge go through the root namespace's iptables FORWARD chain, whose
// policy Docker sets to DROP: node-to-node traffic would vanish, and making it
// pass would mean editing the host's firewall. The hub namespace has no rules.
// The root namespace only ever talks to the nodes as an endpoint (INPUT and
// OUTPUT), which the host firewall leaves alone.
//
// Partitions are nftables rules in the input hook of each node's namespace
// that silently drop packets from the node addresses on the other side. Like
// a real partition, sending succeeds and nothing arrives: connections time
// out rather than being refused. (Dropping in the output hook instead would
// make the sender's sendto fail with EPERM, which no real network does.) The
// root namespace at .254 is never cut off.

const (
	// namespaceDirectory is where `ip netns add` mounts named namespaces.
	namespaceDirectory = "/run/netns"
	// recordDirectory holds one ownership record per network, named by the
	// network's prefix, so that a later test process can delete the
	// namespaces of one that died without running its cleanups. It is on
	// tmpfs, like the namespaces: both vanish on reboot.
	recordDirectory = "/run/herd-testcluster"
	// namePrefix starts every network's names; a network's prefix is
	// namePrefix plus prefixRandomLength random characters, and its
	// namespace and link names are that prefix plus a short suffix, well
	// within the 15 characters Linux allows for interface names.
	namePrefix         = "hd"
	prefixRandomLength = 5
	// bridgeName, hubUplinkName and nodeInterfaceName are interfaces inside
	// the network's own namespaces, where they cannot collide with anything.
	bridgeName        = "br0"
	hubUplinkName     = "uplink"
	nodeInterfaceName = "eth0"
	// rootHost is the last octet of the root namespace's address.
	rootHost = 254
	// partitionTable is the nftables table holding a namespace's partition
	// rules; Heal deletes it.
	partitionTable = "herd_partition"
	// commandTimeout bounds one ip or nft command.
	networkCommandTimeout = 30 * time.Second
)

// network is a set of network namespaces joined by a bridge, one per host
// (herd node or helper process), reachable from the root namespace, in which
// links between hosts can be cut. Methods may be called concurrently.
type network struct {
	// prefix starts every name this network creates, e.g. "hdk3x9q".
	prefix string
	// subnet is the network's 10.A.B.0/24.
	subnet netip.Prefix
	// hub is the namespace holding the bridge.
	hub string
	// uplink is the root namespace's end of the veth to the hub.
	uplink string
	// recordPath is this network's ownership record.
	recordPath string
	// ipPath and nftPath are the resolved paths of ip and nft.
	ipPath, nftPath string

	// mu guards the following fields.
	mu sync.Mutex
	// hosts holds each host's namespace, indexed by host.
	hosts []string
}

// namespaceSupport returns the paths of ip and nft, or an error wrapping
// ErrNamespacesUnavailable that says what is missing.
func namespaceSupport() (ipPath, nftPath string, err error) {
	if os.Geteuid() != 0 {
		return "", "", fmt.Errorf("%w: they need root (run the tests as root)", ErrNamespacesUnavailable)
	}
	ipPath, err = exec.LookPath("ip")
	if err != nil {
		return "", "", fmt.Errorf("%w: they need iproute2's ip: %v", ErrNamespacesUnavailable, err)
	}
	nftPath, err = exec.LookPath("nft")
	if err != nil {
		return "", "", fmt.Errorf("%w: partitions need nftables' nft: %v", ErrNamespacesUnavailable, err)
	}
	return ipPath, nftPath, nil
}

// newNetwork creates the hub namespace, its bridge and the uplink from the
// root namespace, with no hosts yet. An error wrapping
// ErrNamespacesUnavailable means namespaces are unusable here (the caller
// skips the test); any other error is a failed setup. Either way nothing is
// left behind.
func newNetwork() (*network, error) {
	ipPath, nftPath, err := namespaceSupport()
	if err != nil {
		return nil, err
	}
	removeStaleNetworks(ipPath)
	if err := os.MkdirAll(recordDirectory, 0o755); err != nil {
		return nil, fmt.Errorf("testcluster: %w", err)
	}
	subnet, err := pickSubnet(ipPath)
	if err != nil {
		return nil, err
	}
	nw := &network{subnet: subnet, ipPath: ipPath, nftPath: nftPath}
	for attempt := 0; nw.prefix == ""; attempt++ {
		if attempt == 10 {
			return nil, errors.New("testcluster: no unused network name prefix")
		}
		prefix := namePrefix + randomName(prefixRandomLength)
		path := filepath.Join(recordDirectory, prefix)
		// O_EXCL reserves the prefix against concurrent test processes; the
		// record exists before anything it names, so a crash at any point
		// leaves a record that removeStaleNetworks can act on.
		file, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
		if errors.Is(err, fs.ErrExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("testcluster: %w", err)
		}
		_, writeError := fmt.Fprintf(file, "%s\n%s\n", ownerRecord(), subnet)
		if err := errors.Join(writeError, file.Close()); err != nil {
			os.Remove(path)
			return nil, fmt.Errorf("testcluster: %w", err)
		}
		nw.prefix, nw.recordPath = prefix, path
	}
	nw.hub = nw.prefix + "hub"
	nw.uplink = nw.prefix + "up"
	rootAddress := netip.PrefixFrom(nw.hostAddress(rootHost-1), subnet.Bits())
	steps := [][]string{
		{"netns", "add", nw.hub},
		{"-n", nw.hub, "link", "set", "lo", "up"},
		{"-n", nw.hub, "link", "add", bridgeName, "type", "bridge"},
		{"-n", nw.hub, "link", "set", bridgeName, "up"},
		{"link", "add", nw.uplink, "type", "veth", "peer", "name", hubUplinkName, "netns", nw.hub},
		{"-n", nw.hub, "link", "set", hubUplinkName, "master", bridgeName, "up"},
		{"address", "add", rootAddress.String(), "dev", nw.uplink},
		{"link", "set", nw.uplink, "up"},
	}
	for number, step := range steps {
		if err := nw.ip(step...); err != nil {
			if number == 0 {
				// The first namespace could not be created: root in an
				// unprivileged container, or a kernel without them.
				err = fmt.Errorf("%w: %v", ErrNamespacesUnavailable, err)
			}
			return nil, errors.Join(err, nw.destroy())
		}
	}
	return nw, nil
}

// hostAddress returns the address of host index (10.A.B.index+1).
func (nw *network) hostAddress(index int) netip.Addr {
	octets := nw.subnet.Addr().As4()
	octets[3] = byte(index + 1)
	return netip.AddrFrom4(octets)
}

// rootAddress returns the root namespace's address in the network.
func (nw *network) rootAddress() netip.Addr {
	return nw.hostAddress(rootHost - 1)
}

// addHost creates the next host's namespace, connected to the bridge, and
// returns its index, namespace name and address.
func (nw *network) addHost() (index int, namespace string, address netip.Addr, err error) {
	nw.mu.Lock()
	defer nw.mu.Unlock()
	index = len(nw.hosts)
	if index+1 >= rootHost {
		return 0, "", netip.Addr{}, fmt.Errorf("testcluster: a network holds at most %d hosts", rootHost-1)
	}
	namespace = nw.prefix + "n" + strconv.Itoa(index)
	address = nw.hostAddress(index)
	hubEnd := "v" + strconv.Itoa(index)
	// Record the namespace before creating it so that destroy removes it
	// even if a later step fails.
	nw.hosts = append(nw.hosts, namespace)
	steps := [][]string{
		{"netns", "add", namespace},
		{"-n", namespace, "link", "set", "lo", "up"},
		{"-n", nw.hub, "link", "add", hubEnd, "type", "veth", "peer", "name", nodeInterfaceName, "netns", namespace},
		{"-n", nw.hub, "link", "set", hubEnd, "master", bridgeName, "up"},
		{"-n", namespace, "address", "add", netip.PrefixFrom(address, nw.subnet.Bits()).String(), "dev", nodeInterfaceName},
		{"-n", namespace, "link", "set", nodeInterfaceName, "up"},
	}
	for _, step := range steps {
		if err := nw.ip(step...); err != nil {
			return 0, "", netip.Addr{}, err
		}
	}
	return index, namespace, address, nil
}

// command returns argv running argv inside host index's namespace. `ip netns
// exec` execs the program without forking, so the pid of the started process
// is the program's own.
func (nw *network) command(index int, argv ...string) []string {
	nw.mu.Lock()
	namespace := nw.hosts[index]
	nw.mu.Unlock()
	return append([]string{nw.ipPath, "netns", "exec", namespace}, argv...)
}

// partition cuts every link between hosts in different groups, in both
// directions, replacing any earlier partition. A host in no group keeps all
// its links (it can bridge the groups). The root namespace keeps reaching
// every host.
func (nw *network) partition(groups [][]int) error {
	nw.mu.Lock()
	defer nw.mu.Unlock()
	groupOf := make(map[int]int)
	for group, members := range groups {
		for _, host := range members {
			if host < 0 || host >= len(nw.hosts) {
				return fmt.Errorf("testcluster: partition: no node %d (the network has %d)", host, len(nw.hosts))
			}
			if earlier, ok := groupOf[host]; ok && earlier != group {
				return fmt.Errorf("testcluster: partition: node %d is in groups %d and %d", host, earlier, group)
			}
			groupOf[host] = group
		}
	}
	var errs []error
	for host, namespace := range nw.hosts {
		var blocked []string
		if group, ok := groupOf[host]; ok {
			for peer := range nw.hosts {
				if peerGroup, ok := groupOf[peer]; ok && peerGroup != group {
					blocked = append(blocked, nw.hostAddress(peer).String())
				}
			}
		}
		errs = append(errs, nw.nft(namespace, partitionRules(blocked)))
	}
	return errors.Join(errs...)
}

// heal removes every partition rule.
func (nw *network) heal() error {
	nw.mu.Lock()
	defer nw.mu.Unlock()
	var errs []error
	for _, namespace := range nw.hosts {
		errs = append(errs, nw.nft(namespace, partitionRules(nil)))
	}
	return errors.Join(errs...)
}

// partitionRules returns an nft script that replaces the partition table
// with one dropping every packet arriving from the blocked addresses, or only
// deletes it when none are blocked. Each namespace drops what it receives, so
// a cut between two nodes is made of one rule on each side.
func partitionRules(blocked []string) string {
	// Declaring the table before deleting it makes the deletion succeed
	// whether or not the table exists; nft applies the script atomically.
	script := "table inet " + partitionTable + "\ndelete table inet " + partitionTable + "\n"
	if len(blocked) == 0 {
		return script
	}
	set := "{ " + strings.Join(blocked, ", ") + " }"
	return script + "table inet " + partitionTable + " {\n" +
		"\tchain input {\n\t\ttype filter hook input priority 0; policy accept;\n\t\tip saddr " + set + " drop\n\t}\n" +
		"}\n"
}

// destroy deletes the uplink and every namespace; deleting a namespace
// deletes the interfaces in it. It may be called on a partly built network
// and more than once. Processes still running inside a namespace keep it
// alive, anonymously, until they exit: kill them first.
func (nw *network) destroy() error {
	var errs []error
	// Deleting one end of a veth deletes both, at once; deleting the hub
	// namespace would also do it, but asynchronously.
	if _, err := net.InterfaceByName(nw.uplink); err == nil {
		errs = append(errs, nw.ip("link", "delete", nw.uplink))
	}
	nw.mu.Lock()
	namespaces := append(slices.Clone(nw.hosts), nw.hub)
	nw.mu.Unlock()
	for _, namespace := range namespaces {
		if _, err := os.Stat(filepath.Join(namespaceDirectory, namespace)); err == nil {
			errs = append(errs, nw.ip("netns", "delete", namespace))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if err := os.Remove(nw.recordPath); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("testcluster: %w", err)
	}
	return nil
}

// ip runs ip with the arguments.
func (nw *network) ip(arguments ...string) error {
	return runCommand("", nw.ipPath, arguments...)
}

// nft runs an nft script inside a namespace.
func (nw *network) nft(namespace, script string) error {
	return runCommand(script, nw.ipPath, "netns", "exec", namespace, nw.nftPath, "-f", "-")
}

// runCommand runs a short configuration command, feeding it stdin, and
// returns its output in the error when it fails.
func runCommand(stdin, program string, arguments ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), networkCommandTimeout)
	defer cancel()
	command := exec.CommandContext(ctx, program, arguments...)
	command.Stdin = strings.NewReader(stdin)
	output, err := command.CombinedOutput()
	if err != nil {
		return fmt.Errorf("testcluster: %s %s: %w: %s", program, strings.Join(arguments, " "), err, bytes.TrimSpace(output))
	}
	return nil
}

// pickSubnet returns a random 10.A.B.0/24 that overlaps no address or route
// of the root namespace and no subnet recorded by another live network.
func pickSubnet(ipPath string) (netip.Prefix, error) {
	used, err := usedPrefixes(ipPath)
	if err != nil {
		return netip.Prefix{}, err
	}
	for range 100 {
		candidate := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(16 + rand.IntN(235)), byte(rand.IntN(256)), 0}), 24)
		if !slices.ContainsFunc(used, candidate.Overlaps) {
			return candidate, nil
		}
	}
	return netip.Prefix{}, errors.New("testcluster: no free 10.x.y.0/24 subnet")
}

// usedPrefixes lists the root namespace's addresses and route destinations
// (except the default route) and the subnets of other networks' records.
func usedPrefixes(ipPath string) ([]netip.Prefix, error) {
	var used []netip.Prefix
	addresses, err := net.InterfaceAddrs()
	if err != nil {
		return nil, fmt.Errorf("testcluster: %w", err)
	}
	for _, address := range addresses {
		if prefix, err := netip.ParsePrefix(address.String()); err == nil {
			used = append(used, prefix.Masked())
		}
	}
	output, err := exec.Command(ipPath, "-4", "-o", "route", "show", "table", "all").Output()
	if err != nil {
		return nil, fmt.Errorf("testcluster: ip route: %w", err)
	}
	for line := range strings.Lines(string(output)) {
		if prefix, ok := routeDestination(line); ok {
			used = append(used, prefix)
		}
	}
	records, _ := filepath.Glob(filepath.Join(recordDirectory, namePrefix+"*"))
	for _, record := range records {
		contents, err := os.ReadFile(record)
		if err != nil {
			continue
		}
		for line := range strings.Lines(string(contents)) {
			if prefix, err := netip.ParsePrefix(strings.TrimSpace(line)); err == nil {
				used = append(used, prefix)
			}
		}
	}
	return used, nil
}

// routeTypes are the route types `ip route` prints before a destination.
var routeTypes = []string{"unicast", "local", "broadcast", "multicast", "throw", "unreachable", "prohibit", "blackhole", "nat", "anycast"}

// routeDestination parses the destination of one `ip -o route` line.
func routeDestination(line string) (netip.Prefix, bool) {
	fields := strings.Fields(line)
	if len(fields) > 0 && slices.Contains(routeTypes, fields[0]) {
		fields = fields[1:]
	}
	if len(fields) == 0 || fields[0] == "default" {
		return netip.Prefix{}, false
	}
	if prefix, err := netip.ParsePrefix(fields[0]); err == nil {
		return prefix.Masked(), true
	}
	if address, err := netip.ParseAddr(fields[0]); err == nil {
		return netip.PrefixFrom(address, address.BitLen()), true
	}
	return netip.Prefix{}, false
}

// removeStaleNetworks deletes the namespaces and uplinks of networks whose
// owner process exited without running its cleanups (a go test -timeout
// panic, a SIGKILL). Its nodes died with it (Pdeathsig), so only the names
// are left. Only names recorded by this package are ever touched.
func removeStaleNetworks(ipPath string) {
	records, _ := filepath.Glob(filepath.Join(recordDirectory, namePrefix+"*"))
	entries, _ := os.ReadDir(namespaceDirectory)
	for _, record := range records {
		contents, err := os.ReadFile(record)
		if err != nil {
			continue
		}
		owner, _, _ := strings.Cut(string(contents), "\n")
		if ownerAlive(owner) {
			continue
		}
		prefix := filepath.Base(record)
		if _, err := net.InterfaceByName(prefix + "up"); err == nil {
			runCommand("", ipPath, "link", "delete", prefix+"up")
		}
		for _, entry := range entries {
			if strings.HasPrefix(entry.Name(), prefix) {
				runCommand("", ipPath, "netns", "delete", entry.Name())
			}
		}
		os.Remove(record)
	}
}

// randomName returns length random lowercase letters and digits.
func randomName(length int) string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	name := make([]byte, length)
	for i := range name {
		name[i] = alphabet[rand.IntN(len(alphabet))]
	}
	return string(name)
}
