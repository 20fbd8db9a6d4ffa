package testcluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/testenv"
)

// echoPort is where the echo helpers listen inside their namespaces.
const echoPort = 7000

// requireNamespaces skips the test when network namespaces are unusable
// (fails it under CI=true).
func requireNamespaces(t *testing.T) {
	t.Helper()
	_, _, err := namespaceSupport()
	testenv.Require(t, "network namespaces", err)
}

// TestNetworkPartition checks the namespace, bridge and partition mechanics
// with echo helpers: every host reaches every other one, Partition cuts
// exactly the links between groups in both directions while the root
// namespace still reaches everyone, Heal restores them, and nothing is left
// once the network is destroyed.
func TestNetworkPartition(t *testing.T) {
	requireNamespaces(t)
	var nw *network
	t.Run("partition", func(t *testing.T) {
		var err error
		nw, err = newNetwork()
		if errors.Is(err, ErrNamespacesUnavailable) {
			testenv.Require(t, "network namespaces", err)
		}
		if err != nil {
			t.Fatal(err)
		}
		// Registered first, so it runs after the helpers were killed.
		t.Cleanup(func() {
			if err := nw.destroy(); err != nil {
				t.Error(err)
			}
		})
		const hosts = 3
		for range hosts {
			index, _, address, err := nw.addHost()
			if err != nil {
				t.Fatal(err)
			}
			startEchoHelper(t, nw, index, address)
		}
		for index := range hosts {
			address := echoAddress(nw, index)
			WaitFor(t, 10*time.Second, "the root namespace to reach the echo helper at "+address, func() (bool, error) {
				err := echoRoundTrip(address)
				return err == nil, err
			})
		}
		all := [][2]int{{0, 1}, {0, 2}, {1, 0}, {1, 2}, {2, 0}, {2, 1}}
		checkLinks(t, nw, "before any partition", all, nil)

		if err := nw.partition([][]int{{0}, {1, 2}}); err != nil {
			t.Fatal(err)
		}
		checkLinks(t, nw, "after Partition({0}, {1, 2})",
			[][2]int{{1, 2}, {2, 1}},
			[][2]int{{0, 1}, {0, 2}, {1, 0}, {2, 0}})
		checkRootReachesAll(t, nw, hosts)

		// Host 2 is in no group: it keeps both links and bridges the groups.
		if err := nw.partition([][]int{{0}, {1}}); err != nil {
			t.Fatal(err)
		}
		checkLinks(t, nw, "after Partition({0}, {1})",
			[][2]int{{0, 2}, {2, 0}, {1, 2}, {2, 1}},
			[][2]int{{0, 1}, {1, 0}})
		checkRootReachesAll(t, nw, hosts)

		if err := nw.heal(); err != nil {
			t.Fatal(err)
		}
		checkLinks(t, nw, "after Heal", all, nil)

		for _, groups := range [][][]int{{{0}, {0, 1}}, {{0}, {3}}, {{-1}}} {
			if err := nw.partition(groups); err == nil {
				t.Errorf("partition(%v) succeeded, want an error", groups)
			}
		}
	})
	if nw == nil {
		return
	}
	checkNothingLeft(t, nw.prefix)
}

// checkNothingLeft fails the test if a namespace, a link or the ownership
// record of the network with this prefix is left.
func checkNothingLeft(t *testing.T, prefix string) {
	t.Helper()
	namespaces, err := exec.Command("ip", "netns", "list").CombinedOutput()
	if err != nil {
		t.Fatalf("ip netns list: %v: %s", err, namespaces)
	}
	if strings.Contains(string(namespaces), prefix) {
		t.Errorf("namespaces named %s* left behind:\n%s", prefix, namespaces)
	}
	links, err := exec.Command("ip", "-o", "link", "show").CombinedOutput()
	if err != nil {
		t.Fatalf("ip link show: %v: %s", err, links)
	}
	if strings.Contains(string(links), prefix) {
		t.Errorf("links named %s* left behind:\n%s", prefix, links)
	}
	if _, err := os.Stat(filepath.Join(recordDirectory, prefix)); !os.IsNotExist(err) {
		t.Errorf("ownership record %s left behind (stat: %v)", prefix, err)
	}
}

// echoAddress returns host index's echo helper address.
func echoAddress(nw *network, index int) string {
	return net.JoinHostPort(nw.hostAddress(index).String(), strconv.Itoa(echoPort))
}

// startEchoHelper starts an echo helper inside host index's namespace,
// killed by pid when the test ends.
func startEchoHelper(t *testing.T, nw *network, index int, address netip.Addr) {
	t.Helper()
	executable, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	output, err := os.Create(filepath.Join(t.TempDir(), "echo.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer output.Close()
	environment := childEnvironment(helperVariable+"=echo",
		helperAddressVariable+"="+net.JoinHostPort(address.String(), strconv.Itoa(echoPort)))
	helper, err := startProcess(executable, nw.command(index, executable), environment, output)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := helper.kill(); err != nil {
			t.Error(err)
		}
	})
}

// dialFrom runs the dial helper inside host from's namespace against host
// to's echo helper.
func dialFrom(nw *network, from, to int) error {
	executable, err := os.Executable()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	argv := nw.command(from, executable)
	command := exec.CommandContext(ctx, argv[0], argv[1:]...)
	command.Env = childEnvironment(helperVariable+"=dial", helperAddressVariable+"="+echoAddress(nw, to))
	if output, err := command.CombinedOutput(); err != nil {
		return fmt.Errorf("%w: %s", err, strings.TrimSpace(string(output)))
	}
	return nil
}

// checkLinks checks that every (from, to) pair in open connects and every
// pair in cut does not.
func checkLinks(t *testing.T, nw *network, when string, open, cut [][2]int) {
	t.Helper()
	for _, pair := range open {
		if err := dialFrom(nw, pair[0], pair[1]); err != nil {
			t.Errorf("%s: host %d cannot reach host %d: %v", when, pair[0], pair[1], err)
		}
	}
	for _, pair := range cut {
		err := dialFrom(nw, pair[0], pair[1])
		if err == nil {
			t.Errorf("%s: host %d reaches host %d, want it cut off", when, pair[0], pair[1])
		} else if !strings.Contains(err.Error(), "i/o timeout") {
			// A partition loses packets silently: no error on send, no
			// refusal, only a timeout.
			t.Errorf("%s: host %d to host %d failed with %v, want only a timeout", when, pair[0], pair[1], err)
		}
	}
}

// checkRootReachesAll checks that the test process reaches every host.
func checkRootReachesAll(t *testing.T, nw *network, hosts int) {
	t.Helper()
	for index := range hosts {
		if err := echoRoundTrip(echoAddress(nw, index)); err != nil {
			t.Errorf("the root namespace cannot reach host %d: %v", index, err)
		}
	}
}

// TestNetworkRemovesStale checks that a network recorded by a test process
// that has exited is deleted by the next newNetwork.
func TestNetworkRemovesStale(t *testing.T) {
	requireNamespaces(t)
	stale, err := newNetwork()
	if errors.Is(err, ErrNamespacesUnavailable) {
		testenv.Require(t, "network namespaces", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stale.destroy() })
	if _, _, _, err := stale.addHost(); err != nil {
		t.Fatal(err)
	}
	// Pretend the owner died: a pid above pid_max never runs.
	record, err := os.ReadFile(stale.recordPath)
	if err != nil {
		t.Fatal(err)
	}
	_, rest, _ := strings.Cut(string(record), "\n")
	if err := os.WriteFile(stale.recordPath, []byte("2147483647 1\n"+rest), 0o644); err != nil {
		t.Fatal(err)
	}
	fresh, err := newNetwork()
	if err != nil {
		t.Fatal(err)
	}
	if err := fresh.destroy(); err != nil {
		t.Error(err)
	}
	checkNothingLeft(t, stale.prefix)
	checkNothingLeft(t, fresh.prefix)
}

func TestPartitionRules(t *testing.T) {
	heal := partitionRules(nil)
	if strings.Contains(heal, "drop") || !strings.Contains(heal, "delete table inet "+partitionTable) {
		t.Errorf("partitionRules(nil) = %q, want only the deletion of the table", heal)
	}
	rules := partitionRules([]string{"10.1.2.1", "10.1.2.3"})
	if !strings.Contains(rules, "ip saddr { 10.1.2.1, 10.1.2.3 } drop") || !strings.Contains(rules, "hook input") {
		t.Errorf("partitionRules lacks the input rule:\n%s", rules)
	}
	// Dropping on output would make sendto fail with EPERM, unlike a real
	// partition.
	if strings.Contains(rules, "hook output") {
		t.Errorf("partitionRules drops on output:\n%s", rules)
	}
}

func TestRouteDestination(t *testing.T) {
	for _, test := range []struct {
		line string
		want string
	}{
		{"default via 192.0.2.1 dev eth0", ""},
		{"172.17.0.0/16 dev docker0 proto kernel scope link src 172.17.0.1 linkdown", "172.17.0.0/16"},
		{"local 127.0.0.1 dev lo table local proto kernel scope host src 127.0.0.1", "127.0.0.1/32"},
		{"broadcast 192.0.2.255 dev eth0 table local proto kernel scope link src 192.0.2.2", "192.0.2.255/32"},
		{"blackhole 10.9.0.0/16", "10.9.0.0/16"},
		{"10.1.2.3/24 dev x", "10.1.2.0/24"},
		{"", ""},
	} {
		prefix, ok := routeDestination(test.line)
		got := ""
		if ok {
			got = prefix.String()
		}
		if got != test.want {
			t.Errorf("routeDestination(%q) = %q, want %q", test.line, got, test.want)
		}
	}
}

func TestPickSubnet(t *testing.T) {
	ipPath := testenv.LookPath(t, "ip", "iproute2")
	subnet, err := pickSubnet(ipPath)
	if err != nil {
		t.Fatal(err)
	}
	used, err := usedPrefixes(ipPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, prefix := range used {
		if prefix.Overlaps(subnet) {
			t.Errorf("pickSubnet() = %v, which overlaps %v in use", subnet, prefix)
		}
	}
	if subnet.Bits() != 24 || subnet.Addr().As4()[0] != 10 {
		t.Errorf("pickSubnet() = %v, want a 10.x.y.0/24", subnet)
	}
}
