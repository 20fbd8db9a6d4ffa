package e2e

import (
	"encoding/hex"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/herd-storage/herd/internal/api"
	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/testcluster"
)

// verifyingLoad is fio writing and verifying (crc32c, verify_fatal) two
// VDIs at once while secrets rotate: one through a node's local socket,
// one through another node's TLS port with a client certificate, as a VM
// on a hypervisor does.
type verifyingLoad struct {
	names []string
	outs  []*syncBuffer
	done  []chan error
}

func startVerifyingLoad(t *testing.T, c *testcluster.Cluster, step string, runtime time.Duration, socketNode int, socketVDI string, tlsNode int, tlsVDI, tlsDir string) *verifyingLoad {
	t.Helper()
	options := fmt.Sprintf("rw=randwrite\nbs=4k-64k\niodepth=8\nsize=48M\ntime_based=1\nruntime=%d\nverify=crc32c\nverify_fatal=1\nverify_backlog=256\n", int(runtime.Seconds()))
	l := &verifyingLoad{}
	for _, target := range []struct{ name, uri, dir string }{
		{step + "-socket", c.Node(socketNode).NBDURI(socketVDI), ""},
		{step + "-tls", "", tlsDir},
	} {
		if target.name == step+"-tls" {
			if tlsDir == "" {
				continue
			}
			target.uri = tlsProxy(t, c, tlsNode, tlsVDI, tlsDir)
		}
		cmd, out := startFio(t, target.name, target.uri, options)
		done := make(chan error, 1)
		go func(cmd *exec.Cmd) { done <- cmd.Wait() }(cmd)
		l.names, l.outs, l.done = append(l.names, target.name), append(l.outs, out), append(l.done, done)
	}
	return l
}

// tlsProxy serves export of node over a local socket through qemu-nbd,
// whose QEMU NBD client speaks TLS to the node with the client
// certificates in dir (herd client add --out), as a VM's QEMU does: fio's
// libnbd may not read certificate files named in a URI. It returns the
// socket's URI; qemu-nbd is killed at the end of the test.
func tlsProxy(t *testing.T, c *testcluster.Cluster, node int, export, dir string) string {
	t.Helper()
	socket := filepath.Join(t.TempDir(), "proxy.sock")
	host, port, _ := net.SplitHostPort(c.Node(node).NBDAddr())
	cmd := exec.Command("qemu-nbd", "--persistent", "--shared=8", "--export-name="+export, "--socket="+socket,
		"--object", "tls-creds-x509,id=tls0,endpoint=client,dir="+dir,
		"--image-opts", "driver=raw,file.driver=nbd,file.host="+host+",file.port="+port+",file.export="+export+",file.tls-creds=tls0,file.reconnect-delay=10")
	var out syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	testcluster.WaitFor(t, 20*time.Second, "qemu-nbd to connect over TLS", func() (bool, error) {
		if _, err := os.Stat(socket); err != nil {
			return false, fmt.Errorf("no socket yet: %s", out.String())
		}
		return true, nil
	})
	return "nbd+unix:///" + export + "?socket=" + socket
}

// running fails the test if a fio ended already.
func (l *verifyingLoad) running(t *testing.T, when string) {
	t.Helper()
	for i, done := range l.done {
		select {
		case err := <-done:
			done <- err
			t.Fatalf("%s: fio %s ended (%v): it must run across the rotation\n%s", when, l.names[i], err, lastLines(l.outs[i].String(), 15))
		default:
		}
	}
}

// wait waits for every fio and fails the test on any error.
func (l *verifyingLoad) wait(t *testing.T) {
	t.Helper()
	for i, done := range l.done {
		select {
		case err := <-done:
			out := l.outs[i].String()
			if err != nil || strings.Contains(out, "verify: bad") || !strings.Contains(out, "err= 0") {
				t.Fatalf("fio %s: %v\n%s", l.names[i], err, lastLines(out, 20))
			}
			t.Logf("fio %s: %s", l.names[i], strings.TrimSpace(grepLines(out, "err=")))
		case <-time.After(3 * time.Minute):
			t.Fatalf("fio %s did not finish", l.names[i])
		}
	}
}

// gossipKeys reads a node's gossip keyring file (the primary first).
func gossipKeys(t *testing.T, c *testcluster.Cluster, i int) [][]byte {
	t.Helper()
	text, err := os.ReadFile(filepath.Join(c.Node(i).DataDir(), "gossip.key"))
	if err != nil {
		t.Fatal(err)
	}
	var keys [][]byte
	for _, line := range strings.Fields(string(text)) {
		key, err := hex.DecodeString(line)
		if err != nil {
			t.Fatalf("node %d's gossip.key: %v", i, err)
		}
		keys = append(keys, key)
	}
	return keys
}

// gossipPing sends a memberlist ping to node i under key, from a gossip
// node of the test's own (which joins nobody), and says whether it was
// answered.
func gossipPing(t *testing.T, c *testcluster.Cluster, i int, key []byte) error {
	t.Helper()
	keyring, err := memberlist.NewKeyring(nil, key)
	if err != nil {
		t.Fatal(err)
	}
	config := memberlist.DefaultLANConfig()
	config.Name = "rotation-test-" + randomNodeID(t)
	config.BindAddr, config.BindPort, config.AdvertisePort = "127.0.0.1", 0, 0
	config.Keyring = keyring
	config.GossipVerifyIncoming, config.GossipVerifyOutgoing = true, true
	config.ProbeTimeout = time.Second
	config.Logger = log.New(io.Discard, "", 0)
	m, err := memberlist.Create(config)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Shutdown()
	host, port, _ := net.SplitHostPort(c.Node(i).GossipAddr())
	address, err := net.ResolveUDPAddr("udp", net.JoinHostPort(host, port))
	if err != nil {
		t.Fatal(err)
	}
	id := nodeID(t, c, i)
	for range 3 { // UDP: a packet may be lost
		if _, err = m.Ping(id, address); err == nil {
			return nil
		}
	}
	return err
}

// TestRotateGossipKeyUnderLoad: while fio verifies writes through two
// nodes (one over TLS with a client certificate), node 2 is stopped and
// `herd cluster rotate-gossip-key` replaces the gossip key: each step is
// an event, every running node ends with the new key alone, and a
// gossip packet under the old key, answered before, is dropped after.
// Node 2 comes back with only the old key on disk: it fetches the new
// one over mTLS at start, rejoins gossip and the epoch, and serves.
// Zero verify errors.
func TestRotateGossipKeyUnderLoad(t *testing.T) {
	need(t, "fio", "qemu-io")
	c := dataCluster(t, 3, 3, "vm1", "64M")
	herd(t, c, 0, "vdi", "create", "vm2", "64M")
	vms := addClient(t, c, "vmhost", "vm*")
	all := []int{0, 1, 2}
	old := gossipKeys(t, c, 0)
	if len(old) != 1 {
		t.Fatalf("a new node holds %d gossip keys, want 1", len(old))
	}
	if err := gossipPing(t, c, 0, old[0]); err != nil {
		t.Fatalf("a gossip ping under the cluster's key is not answered (the check below would mean nothing): %v", err)
	}

	load := startVerifyingLoad(t, c, "gossip", 40*time.Second, 0, "vm1", 1, "vm2", vms)
	time.Sleep(3 * time.Second)
	load.running(t, "before the rotation")
	c.Node(2).Stop()
	waitAgreement(t, c, []int{0, 1}, time.Minute)

	start := time.Now()
	var rotated cluster.GossipKeyring
	if err := c.HerdJSON(ctx(t), 1, &rotated, "cluster", "rotate-gossip-key"); err != nil {
		t.Fatal(err)
	}
	if info := herd(t, c, 0, "cluster", "info"); !strings.Contains(grepLines(info, "Gossip key:"), rotated.Primary+" (rotated") {
		t.Errorf("cluster info does not show gossip key %s:\n%s", rotated.Primary, info)
	}
	t.Logf("rotate-gossip-key took %v", time.Since(start).Round(time.Millisecond))
	load.running(t, "after the rotation")
	for _, i := range []int{0, 1} {
		keys := gossipKeys(t, c, i)
		if len(keys) != 1 || cluster.GossipKeyID(keys[0]) != rotated.Primary {
			t.Fatalf("node %d holds gossip keys %d after the rotation, want the new key %s alone", i, len(keys), rotated.Primary)
		}
	}
	events := herd(t, c, 0, "events")
	for _, want := range []string{"gossip key rotation started: new key " + rotated.Primary, "installed gossip key " + rotated.Primary,
		"every node holds gossip key " + rotated.Primary, "encrypts gossip with key " + rotated.Primary, "gossip key " + rotated.Primary + " in use on every node"} {
		if !strings.Contains(events, want) {
			t.Errorf("events do not say %q:\n%s", want, lastLines(events, 20))
		}
	}
	if err := gossipPing(t, c, 0, old[0]); err == nil {
		t.Fatal("after the rotation a gossip ping under the old key was answered")
	}
	if err := gossipPing(t, c, 0, gossipKeys(t, c, 0)[0]); err != nil {
		t.Fatalf("a gossip ping under the new key: %v", err)
	}

	// Node 2 missed all of it: only the old key is on its disk.
	if keys := gossipKeys(t, c, 2); len(keys) != 1 || string(keys[0]) != string(old[0]) {
		t.Fatal("node 2's keyring changed while it was down")
	}
	c.Node(2).Restart()
	waitAgreement(t, c, all, time.Minute)
	if keys := gossipKeys(t, c, 2); cluster.GossipKeyID(keys[0]) != rotated.Primary {
		t.Fatalf("node 2 came back encrypting with key %s, want %s", cluster.GossipKeyID(keys[0]), rotated.Primary)
	}
	testcluster.WaitFor(t, 30*time.Second, "node 2 to drop the old key", func() (bool, error) {
		keys := gossipKeys(t, c, 2)
		return len(keys) == 1, fmt.Errorf("it holds %d keys", len(keys))
	})
	if out, err := qemuTLS(t, c, 2, "vm1", vms, true, "read 0 64k"); err != nil {
		t.Fatalf("node 2 does not serve after its return: %v\n%s", err, out)
	}
	load.wait(t)
	waitHealth(t, c, 0, api.HealthOK, 0, "")
	if _, _, err := c.Herd(ctx(t), 0, "cluster", "rotate-gossip-key", "--no-wait"); err != nil {
		t.Fatalf("a second rotation: %v", err)
	}
	// One client, polled: every `herd cluster info` fans out to the
	// other nodes' admin APIs.
	node2 := client(c, 2)
	testcluster.WaitFor(t, 30*time.Second, "the second rotation to end", func() (bool, error) {
		k, err := node2.GossipKey(ctx(t))
		if err != nil {
			return false, err
		}
		if k.Rotation != nil || k.Primary == rotated.Primary {
			return false, fmt.Errorf("not yet: %+v", k)
		}
		return true, nil
	})
}
