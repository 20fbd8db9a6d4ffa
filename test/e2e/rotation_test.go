package e2e

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
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
	"github.com/herd-storage/herd/internal/peer"
	"github.com/herd-storage/herd/internal/pki"
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
	ended map[int]bool // waited for
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

// fioOptions are the verifying writes of a verifyingLoad.
func fioOptions(runtime time.Duration) string {
	return fmt.Sprintf("rw=randwrite\nbs=4k-64k\niodepth=8\nsize=48M\ntime_based=1\nruntime=%d\nverify=crc32c\nverify_fatal=1\nverify_backlog=256\n", int(runtime.Seconds()))
}

// add starts one more fio of the load, on uri.
func (l *verifyingLoad) add(t *testing.T, name, uri string, runtime time.Duration) {
	t.Helper()
	cmd, out := startFio(t, name, uri, fioOptions(runtime))
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	l.names, l.outs, l.done = append(l.names, name), append(l.outs, out), append(l.done, done)
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

// wait waits for the fio named only (every fio: "") and fails the test on
// any error.
func (l *verifyingLoad) wait(t *testing.T, only string) {
	t.Helper()
	for i, done := range l.done {
		if (only != "" && l.names[i] != only) || l.ended[i] {
			continue
		}
		if l.ended == nil {
			l.ended = map[int]bool{}
		}
		l.ended[i] = true
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
	load.wait(t, "")
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

// refusalsBefore returns the lines of node logs that say a connection was
// refused (peer port, NBD TLS, admin tokens) before the time until.
func refusalsBefore(t *testing.T, c *testcluster.Cluster, until time.Time) []string {
	t.Helper()
	var out []string
	for _, n := range c.Nodes() {
		data, err := os.ReadFile(n.LogPath())
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(data), "\n") {
			if !strings.Contains(line, "refused connection") && !strings.Contains(line, "TLS handshake failed") && !strings.Contains(line, "refused request") && !strings.Contains(line, "certificate") {
				continue
			}
			if !strings.Contains(line, "level=WARN") && !strings.Contains(line, "level=ERROR") {
				continue
			}
			if strings.Contains(line, "unknown protocol") {
				// A node starting refuses the object protocol until its
				// cluster has started: not a refusal of trust.
				continue
			}
			stamp, _, _ := strings.Cut(strings.TrimPrefix(line, "time="), " ")
			at, err := time.Parse(time.RFC3339Nano, stamp)
			if err == nil && at.Before(until) {
				out = append(out, fmt.Sprintf("node %d: %s", n.Index(), line))
			}
		}
	}
	return out
}

// TestRotateCAUnderLoad follows docs/SECURITY.md's CA rotation while VMs
// write: fio verifies through node 0's socket all along, and through
// node 1's TLS port with a client certificate (QEMU's NBD client), first
// with the client's old certificate, then with the renewed one. Node 2
// is stopped before `herd cluster rotate-ca` and comes back during the
// rotation: it learns the new CA over its old mTLS identity and gets its
// certificate. Then the client is renewed, the admin token refreshed,
// `rotate-ca --finish`. Zero verify errors; no connection refused on any
// node before the finish; after it the old CA is gone: the old client
// certificate, a node's old certificate, and node certificates minted
// with a copy of the old CA key (for a member's id and for a new one)
// are refused, the old admin token too; node 2 serves. Last, a second
// rotation finished with --force while node 2 is down: node 2 refuses to
// start, saying what to do.
func TestRotateCAUnderLoad(t *testing.T) {
	need(t, "fio", "qemu-io", "qemu-nbd", "nbdinfo")
	c := dataCluster(t, 3, 3, "vm1", "64M")
	herd(t, c, 0, "vdi", "create", "vm2", "64M")
	oldClient := addClient(t, c, "vmhost", "vm*")
	all := []int{0, 1, 2}
	read := func(i int, name string) []byte {
		t.Helper()
		data, err := os.ReadFile(filepath.Join(c.Node(i).DataDir(), name))
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	oldCA, err := pki.ParseCA(read(0, "ca.crt"), read(0, "ca.key"))
	if err != nil {
		t.Fatal(err)
	}
	oldNode1 := [2][]byte{read(1, "node.crt"), read(1, "node.key")}
	oldToken := c.Token()

	load := &verifyingLoad{}
	load.add(t, "ca-socket", c.Node(0).NBDURI("vm1"), 100*time.Second)
	load.add(t, "ca-tls-old", tlsProxy(t, c, 1, "vm2", oldClient), 35*time.Second)
	time.Sleep(3 * time.Second)
	c.Node(2).Stop()
	waitAgreement(t, c, []int{0, 1}, time.Minute)

	// The rotation starts through node 1, which does not hold the CA key:
	// node 0 makes the new CA.
	var started cluster.CAState
	if err := c.HerdJSON(ctx(t), 1, &started, "cluster", "rotate-ca"); err != nil {
		t.Fatal(err)
	}
	r := started.Rotation
	if r == nil || r.Holder != nodeID(t, c, 0) {
		t.Fatalf("rotate-ca answered %+v, want a rotation whose key is on node 0", started)
	}
	newFP := r.Fingerprint
	t.Logf("new CA %s", newFP)
	load.running(t, "after rotate-ca")
	if _, err := os.Stat(filepath.Join(c.Node(1).DataDir(), "ca-next.key")); err == nil {
		t.Fatal("node 1 holds the new CA's key")
	}
	var info struct{ cluster.Info }
	if err := c.HerdJSON(ctx(t), 0, &info, "cluster", "info"); err != nil {
		t.Fatal(err)
	}
	if info.CA == nil || info.CA.Rotation == nil || info.CA.Rotation.Fingerprint != newFP || len(info.CA.Rotation.Down) != 1 {
		t.Fatalf("cluster info during the rotation: %+v, want the rotation with node 2 down", info.CA)
	}
	families, _ := scrape(t, c.Node(1).AdminAddr(), c.Token())
	if v := value(families, "herd_ca_rotation_in_progress", nil); v != 1 {
		t.Errorf("herd_ca_rotation_in_progress during the rotation: %v, want 1", v)
	}
	for _, kind := range []string{"ca", "node", "client"} {
		if v := value(families, "herd_certificate_earliest_expiry_timestamp_seconds", map[string]string{"kind": kind}); v < float64(time.Now().Add(4*365*24*time.Hour).Unix()) {
			t.Errorf("herd_certificate_earliest_expiry_timestamp_seconds{kind=%q} = %v, want years ahead", kind, v)
		}
	}
	if v := value(families, "herd_ca_age_seconds", nil); v < 0 || v > 86400 {
		t.Errorf("herd_ca_age_seconds of a new cluster's CA: %v", v)
	}
	if _, _, err := c.Herd(ctx(t), 0, "cluster", "rotate-ca", "--finish"); err == nil || !strings.Contains(err.Error(), "are down") {
		t.Fatalf("--finish while node 2 has no certificate from the new CA: %v, want refused naming the node down", err)
	}

	// Node 2 comes back during the rotation.
	c.Node(2).Restart()
	waitAgreement(t, c, all, time.Minute)
	testcluster.WaitFor(t, 30*time.Second, "node 2 to have a certificate from the new CA", func() (bool, error) {
		ca, err := client(c, 0).CA(ctx(t))
		if err != nil || ca.Rotation == nil {
			return false, fmt.Errorf("%+v %v", ca, err)
		}
		return len(ca.Rotation.Done) == 3, fmt.Errorf("done on %v", ca.Rotation.Done)
	})

	// Renew the client into a new directory (a host would replace its
	// files and restart QEMU's TLS object) and move the TLS writer to it.
	newClient := filepath.Join(t.TempDir(), "renewed")
	herd(t, c, 1, "client", "add", "vmhost", "--renew", "--out", newClient)
	if pem := string(mustRead(t, filepath.Join(newClient, "ca-cert.pem"))); strings.Count(pem, "BEGIN CERTIFICATE") != 2 {
		t.Fatalf("the renewed client's ca-cert.pem holds %d CA certificates during the rotation, want both", strings.Count(pem, "BEGIN CERTIFICATE"))
	}
	if out, err := qemuTLS(t, c, 2, "vm1", oldClient, true, "read 0 64k"); err != nil {
		t.Fatalf("during the rotation the client's old certificate is refused by node 2: %v\n%s", err, out)
	}
	load.add(t, "ca-tls-new", tlsProxy(t, c, 1, "vm2", newClient), 45*time.Second)
	// Admin tokens: the same id and secret with the new fingerprint.
	refreshed := strings.TrimSpace(herd(t, c, 2, "token", "refresh"))
	if !strings.HasPrefix(refreshed, "herd-admin."+newFP+".") {
		t.Fatalf("token refresh printed %q, want a token naming CA %s", refreshed, newFP)
	}
	c.SetToken(refreshed)
	if _, err := client(c, 1).Info(ctx(t)); err != nil {
		t.Fatalf("the refreshed token during the rotation: %v", err)
	}
	// The first TLS writer ends before the finish (its certificate will
	// be refused then, and so its connection cut).
	load.wait(t, "ca-tls-old")

	finished := time.Now()
	var final cluster.CAState
	if err := c.HerdJSON(ctx(t), 0, &final, "cluster", "rotate-ca", "--finish"); err != nil {
		t.Fatal(err)
	}
	if final.Fingerprint != newFP {
		t.Fatalf("--finish answered CA %q, want %s", final.Fingerprint, newFP)
	}
	if refused := refusalsBefore(t, c, finished); len(refused) > 0 {
		t.Errorf("connections were refused before the finish:\n%s", strings.Join(refused, "\n"))
	}
	testcluster.WaitFor(t, 20*time.Second, "every node to trust the new CA only", func() (bool, error) {
		for _, i := range all {
			cert, err := pki.ParseCertificate(read(i, "ca.crt"))
			if err != nil || pki.Fingerprint(cert) != newFP {
				return false, fmt.Errorf("node %d's ca.crt is not the new CA (%v)", i, err)
			}
			if _, err := os.Stat(filepath.Join(c.Node(i).DataDir(), "ca-next.crt")); err == nil {
				return false, fmt.Errorf("node %d still has ca-next.crt", i)
			}
		}
		return true, nil
	})
	if _, err := os.Stat(filepath.Join(c.Node(0).DataDir(), "ca.key")); err != nil {
		t.Fatalf("node 0, which made the new CA, holds no ca.key: %v", err)
	}
	if token := strings.TrimSpace(string(read(0, "admin.token"))); token != refreshed {
		t.Errorf("node 0's admin.token was not given the new fingerprint")
	}

	// The old CA is gone: the client's old certificate, node 1's old
	// certificate, certificates minted with the old CA key.
	if out, err := run(t, time.Minute, "nbdinfo", c.Node(0).NBDTLSURI("vm1", oldClient)); err == nil {
		t.Errorf("after the finish the client's old certificate was served:\n%s", out)
	}
	if out, err := qemuTLS(t, c, 2, "vm1", newClient, true, "read 0 64k"); err != nil {
		t.Fatalf("after the finish the renewed client through node 2: %v\n%s", err, out)
	}
	newCA := read(0, "ca.crt")
	asNode := func(certPEM, keyPEM []byte) *peer.Credentials {
		t.Helper()
		leaf, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			t.Fatal(err)
		}
		ca, _ := pki.ParseCertificate(newCA)
		pool := x509.NewCertPool()
		pool.AddCert(ca)
		return &peer.Credentials{Certificate: leaf, CA: pool}
	}
	mint := func(id string) *peer.Credentials {
		t.Helper()
		certPEM, keyPEM, err := oldCA.IssueNode(id, []net.IP{net.ParseIP("127.0.0.1")})
		if err != nil {
			t.Fatal(err)
		}
		return asNode(certPEM, keyPEM)
	}
	for what, creds := range map[string]*peer.Credentials{
		"node 1's certificate from the old CA":                  asNode(oldNode1[0], oldNode1[1]),
		"a certificate minted with the old CA key for node 1":   mint(nodeID(t, c, 1)),
		"a certificate minted with the old CA key for a new id": mint(randomNodeID(t)),
	} {
		for _, i := range all {
			if conn, err := peer.Dial(ctx(t), c.Node(i).PeerAddr(), creds, peer.ProtocolForward); err == nil {
				conn.Close()
				t.Errorf("after the finish %s reached node %d", what, i)
			} else if !errors.Is(err, peer.ErrCertificateRefused) {
				t.Errorf("after the finish %s on node %d: %v, want its certificate refused", what, i, err)
			}
		}
	}
	if _, err := api.NewClient(c.Node(0).AdminAddr(), oldToken).Info(ctx(t)); err == nil {
		t.Error("after the finish the admin token with the old fingerprint still works")
	}
	load.wait(t, "")
	waitHealth(t, c, 0, api.HealthOK, 0, "")
	families, _ = scrape(t, c.Node(2).AdminAddr(), c.Token())
	if v := value(families, "herd_ca_rotation_in_progress", nil); v != 0 {
		t.Errorf("herd_ca_rotation_in_progress after the finish: %v, want 0", v)
	}
	if info := herd(t, c, 2, "cluster", "info"); !strings.Contains(grepLines(info, "CA:"), newFP) || strings.Contains(info, "CA rotation:") {
		t.Errorf("cluster info after the finish does not show the new CA alone:\n%s", info)
	}
	events := herd(t, c, 0, "events")
	for _, want := range []string{"CA rotation started: new CA " + newFP, "has a certificate from the new CA " + newFP, "client vmhost renewed", "CA rotation finished: CA " + newFP + " is the cluster's"} {
		if !strings.Contains(events, want) {
			t.Errorf("events do not say %q:\n%s", want, lastLines(events, 20))
		}
	}

	// A node down through a whole rotation finished with --force is told
	// what to do.
	node2 := nodeID(t, c, 2)
	c.Node(2).Stop()
	waitAgreement(t, c, []int{0, 1}, time.Minute)
	herd(t, c, 0, "cluster", "rotate-ca")
	var second cluster.CAState
	if err := c.HerdJSON(ctx(t), 0, &second, "cluster", "rotate-ca", "--finish", "--force", "--token-out", filepath.Join(t.TempDir(), "token")); err != nil {
		t.Fatal(err)
	}
	c.SetToken(strings.Replace(refreshed, newFP, second.Fingerprint, 1))
	err = c.Node(2).RestartUntilExit(30 * time.Second)
	if err == nil {
		t.Fatal("node 2, left behind by a rotation, started")
	}
	if log := string(mustRead(t, c.Node(2).LogPath())); !strings.Contains(log, "herd node remove "+node2) || !strings.Contains(log, "join token") {
		t.Fatalf("node 2, left behind, does not say what to do:\n%s", lastLines(log, 5))
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}
