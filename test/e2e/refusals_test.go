package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
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
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/nbd/wire"
	"github.com/herd-storage/herd/internal/peer"
	"github.com/herd-storage/herd/internal/pki"
	"github.com/herd-storage/herd/internal/testcluster"
)

// Floods and slot grabs, done as an attacker with the docs in hand did them.

const (
	// logBoundPerPort is what a minute of each flood may add to the log,
	// per port.
	logBoundPerPort = 16 << 10
	// floodDuration is how long each flood lasts.
	floodDuration = 60 * time.Second
)

// logPorts sorts a node's log lines by the port whose refusals they
// report: what each port's flood added.
func logPorts(text string) map[string]int {
	bytes := map[string]int{}
	for _, line := range strings.SplitAfter(text, "\n") {
		switch {
		case line == "":
		case strings.Contains(line, `msg="admin API:`):
			bytes["admin"] += len(line)
		case strings.Contains(line, `msg="peer:`), strings.Contains(line, `msg="refused a join`), strings.Contains(line, `msg="cluster: refused a forwarding`):
			bytes["peer"] += len(line)
		case strings.Contains(line, `msg="nbd:`):
			bytes["nbd"] += len(line)
		case strings.Contains(line, "gossip"), strings.Contains(line, "memberlist"):
			bytes["gossip"] += len(line)
		default:
			bytes["other"] += len(line)
		}
	}
	return bytes
}

// TestRefusalFloodsBoundTheLog: for a minute, at once, against one node:
// unauthenticated admin requests with 900 KB paths; joins with 64 KB node
// ids (a wrong secret, and the right one); five NBD connections at a time
// sending 1,023 NBD_OPT_INFO options with 4 KB names each, with a revoked
// client certificate and with one whose pattern allows none of them; and
// garbage UDP to the gossip port. Each port's refusal lines stay under
// 16 KiB, and still say who was refused and why, with the count of the
// lines left out. Before bounded refusal lines the node logged +18 MB for
// 20 such admin requests, 130 KB per join, 22 MB for 5 NBD connections
// (the test stops a flood as soon as a port passes the bound).
func TestRefusalFloodsBoundTheLog(t *testing.T) {
	c := dataCluster(t, 1, 1, "vm1", "64M")
	node := c.Node(0)
	revokedDir := addClient(t, c, "flooder", "vm*")
	if _, stderr, err := c.Herd(ctx(t), 0, "client", "revoke", "flooder"); err != nil {
		t.Fatalf("client revoke: %v %s", err, stderr)
	}
	allowedDir := addClient(t, c, "vmhost", "vm*")
	log := logFrom(t, node)

	flood, stop := context.WithTimeout(t.Context(), floodDuration)
	defer stop()
	var (
		wg                                  sync.WaitGroup
		adminRequests, joins, options, udps atomic.Int64
		overflow                            atomic.Value
	)
	// The monitor ends every flood as soon as one port is over the
	// bound, so a failing run does not fill the disk.
	wg.Add(1)
	go func() {
		defer wg.Done()
		for flood.Err() == nil {
			time.Sleep(500 * time.Millisecond)
			text, err := log.text()
			if err != nil {
				continue
			}
			for port, n := range logPorts(text) {
				if port != "other" && n > logBoundPerPort {
					overflow.Store(fmt.Sprintf("%s: %d bytes after %d admin requests, %d joins, %d NBD options, %d gossip packets", port, n, adminRequests.Load(), joins.Load(), options.Load(), udps.Load()))
					stop()
				}
			}
		}
	}()

	// The admin port: GET /v1/vdis/<900 KB> without a token, and with a
	// malformed one.
	wg.Add(1)
	go func() {
		defer wg.Done()
		client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
		defer client.CloseIdleConnections()
		path := "https://" + node.AdminAddr() + "/v1/vdis/" + strings.Repeat("a", 900_000)
		for i := 0; flood.Err() == nil; i++ {
			request, _ := http.NewRequestWithContext(flood, http.MethodGet, path, nil)
			if i%2 == 1 {
				request.Header.Set("Authorization", "Bearer herd-admin."+strings.Repeat("b", 50_000))
			}
			if response, err := client.Do(request); err == nil {
				io.Copy(io.Discard, response.Body)
				response.Body.Close()
				adminRequests.Add(1)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()

	// The peer port: joins with a 60 KB node id, with a wrong secret and
	// with the right one.
	wg.Add(1)
	go func() {
		defer wg.Done()
		right, err := pki.ParseJoinToken(c.JoinToken())
		if err != nil {
			t.Error(err)
			return
		}
		wrong := right
		wrong.Secret = pki.NewSecret()
		id := strings.Repeat("f", 60_000)
		for i := 0; flood.Err() == nil; i++ {
			token := right
			if i%2 == 0 {
				token = wrong
			}
			attempt, cancel := context.WithTimeout(flood, 10*time.Second)
			_, err := peer.RequestJoin(attempt, node.PeerAddr(), token, peer.JoinRequest{NodeID: id, IPs: []string{"127.0.0.1"}, Secret: token.Secret})
			cancel()
			if err != nil && flood.Err() == nil {
				joins.Add(1)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()

	// The NBD port: five connections at a time, each 1,023 NBD_OPT_INFO
	// with 4 KB names, then a new connection.
	for i := range 5 {
		dir := revokedDir
		if i%2 == 1 {
			dir = allowedDir
		}
		config := clientTLSConfig(t, dir, node.Address())
		wg.Add(1)
		go func() {
			defer wg.Done()
			for flood.Err() == nil {
				conn, err := dialRawTLS(node.NBDAddr(), "", config)
				if err != nil {
					time.Sleep(100 * time.Millisecond)
					continue
				}
				go io.Copy(io.Discard, conn.reader) // the replies
				var batch []byte
				for range 1023 {
					name := strings.Repeat(string(rune('a'+i)), 4000)
					batch = wire.OptionHeader{Option: wire.OptInfo, Length: uint32(len(exportRequest(name)))}.Append(batch)
					batch = append(batch, exportRequest(name)...)
				}
				conn.conn.SetWriteDeadline(time.Now().Add(20 * time.Second))
				if _, err := conn.conn.Write(batch); err == nil {
					options.Add(1023)
				}
				conn.Close()
				time.Sleep(100 * time.Millisecond)
			}
		}()
	}

	// The gossip port: garbage UDP packets.
	wg.Add(1)
	go func() {
		defer wg.Done()
		conn, err := net.Dial("udp", node.GossipAddr())
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close()
		garbage := make([]byte, 1024)
		for flood.Err() == nil {
			rand.Read(garbage)
			if _, err := conn.Write(garbage); err == nil {
				udps.Add(1)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	wg.Wait()
	time.Sleep(time.Second) // the last refusals' lines
	if over, ok := overflow.Load().(string); ok {
		t.Fatalf("a flood passed the log bound of %d bytes per port: %s", logBoundPerPort, over)
	}
	text, err := log.text()
	if err != nil {
		t.Fatal(err)
	}
	ports := logPorts(text)
	t.Logf("%v of floods: %d admin requests, %d joins, %d NBD options, %d gossip packets; log bytes per port: %v",
		floodDuration, adminRequests.Load(), joins.Load(), options.Load(), udps.Load(), ports)
	if testing.Verbose() {
		t.Logf("what the floods logged:\n%s", text)
	}
	for _, port := range []string{"admin", "peer", "nbd", "gossip"} {
		if ports[port] > logBoundPerPort {
			t.Errorf("the %s port's refusals logged %d bytes, over %d", port, ports[port], logBoundPerPort)
		}
	}
	// Enough that unbounded lines would be far over the bound (20 lines of
	// 900 KB paths, of 60 KB ids, 200 gossip lines), reachable on a
	// loaded 2-core CI machine (58 admin requests and 84 joins in 60 s
	// were seen there).
	if adminRequests.Load() < 20 || joins.Load() < 20 || options.Load() < 10*1023 || udps.Load() < 200 {
		t.Errorf("the floods were too weak to tell: %d admin requests, %d joins, %d NBD options, %d gossip packets",
			adminRequests.Load(), joins.Load(), options.Load(), udps.Load())
	}
	// The lines say who and why, values cut, with counts.
	for _, want := range [][]string{
		{`msg="admin API: refused request"`, "from=", "(900009 bytes)", "suppressed="},
		{`msg="peer: refused a joining node"`, "from=", "(60000 bytes)", "suppressed="},
		{`msg="nbd: cannot open export"`, "remote=", "(4000 bytes)", "suppressed="},
		{"gossip", "from=", "suppressed="},
	} {
		found := false
		for _, line := range strings.Split(text, "\n") {
			all := true
			for _, part := range want {
				all = all && strings.Contains(line, part)
			}
			if all {
				found = true
				if len(line) > 1024 {
					t.Errorf("a refusal line of %d bytes: %.300s...", len(line), line)
				}
				break
			}
		}
		if !found {
			t.Errorf("no line with %q in what the floods logged:\n%s", want, lastLines(text, 40))
		}
	}
	// The node still serves.
	if _, stderr, err := c.Herd(ctx(t), 0, "vdi", "list"); err != nil {
		t.Errorf("vdi list after the floods: %v %s", err, stderr)
	}
}

// clientTLSConfig is the TLS configuration of the NBD client whose
// certificate (herd client add) is in dir, verifying a node at host.
func clientTLSConfig(t *testing.T, dir, host string) *tls.Config {
	t.Helper()
	certificate, err := tls.LoadX509KeyPair(filepath.Join(dir, "client-cert.pem"), filepath.Join(dir, "client-key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	caPEM, err := os.ReadFile(filepath.Join(dir, "ca-cert.pem"))
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caPEM) {
		t.Fatal("no CA certificate in ca-cert.pem")
	}
	return &tls.Config{Certificates: []tls.Certificate{certificate}, RootCAs: roots, ServerName: host}
}

// dialRawTLS connects to an NBD port (from the local address source, if
// given), does the fixed newstyle greeting and NBD_OPT_STARTTLS, and runs
// the TLS handshake with config: a raw NBD connection over TLS.
func dialRawTLS(address, source string, config *tls.Config) (*rawNBD, error) {
	dialer := net.Dialer{Timeout: 10 * time.Second}
	if source != "" {
		dialer.LocalAddr = &net.TCPAddr{IP: net.ParseIP(source)}
	}
	conn, err := dialer.Dial("tcp", address)
	if err != nil {
		return nil, err
	}
	conn.SetDeadline(time.Now().Add(20 * time.Second))
	reader := bufio.NewReader(conn)
	var greeting [18]byte
	if _, err := io.ReadFull(reader, greeting[:]); err != nil {
		conn.Close()
		return nil, fmt.Errorf("greeting: %w", err)
	}
	message := binary.BigEndian.AppendUint32(nil, wire.FlagCFixedNewstyle|wire.FlagCNoZeroes)
	message = wire.OptionHeader{Option: wire.OptStartTLS}.Append(message)
	if _, err := conn.Write(message); err != nil {
		conn.Close()
		return nil, err
	}
	raw := &rawNBD{conn: conn, reader: reader}
	reply, data, err := raw.optionReply()
	if err != nil || reply.Type != wire.RepAck {
		conn.Close()
		return nil, fmt.Errorf("NBD_OPT_STARTTLS: %#x %q %v", reply.Type, data, err)
	}
	tlsConn := tls.Client(conn, config)
	if err := tlsConn.Handshake(); err != nil {
		conn.Close()
		return nil, err
	}
	conn.SetDeadline(time.Time{})
	return &rawNBD{conn: tlsConn, reader: bufio.NewReader(tlsConn)}, nil
}

// strangers holds connections to a port from several loopback addresses,
// each opened again a second after the node closes it, as an attacker
// keeping a port's slots does; with handshake, each completes a TLS
// handshake (trusting anything) and then stays silent.
type strangers struct {
	held   atomic.Int64
	opened atomic.Int64
	stop   context.CancelFunc
	done   sync.WaitGroup
}

func holdConnections(t *testing.T, address string, sources []string, each int, handshake bool) *strangers {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	s := &strangers{stop: cancel}
	for _, source := range sources {
		for range each {
			s.done.Add(1)
			go func() {
				defer s.done.Done()
				dialer := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(source)}, Timeout: 10 * time.Second}
				for ctx.Err() == nil {
					conn, err := dialer.DialContext(ctx, "tcp", address)
					if err == nil {
						s.opened.Add(1)
						if handshake {
							conn.SetDeadline(time.Now().Add(10 * time.Second))
							tlsConn := tls.Client(conn, &tls.Config{InsecureSkipVerify: true})
							if tlsConn.HandshakeContext(ctx) == nil {
								conn = tlsConn
							}
							conn.SetDeadline(time.Time{})
						}
						s.held.Add(1)
						stop := context.AfterFunc(ctx, func() { conn.Close() })
						io.Copy(io.Discard, conn) // until the node closes it
						stop()
						conn.Close()
						s.held.Add(-1)
					}
					select {
					case <-ctx.Done():
					case <-time.After(time.Second):
					}
				}
			}()
		}
	}
	t.Cleanup(s.close)
	return s
}

func (s *strangers) close() {
	s.stop()
	s.done.Wait()
}

// strangerSources are n loopback addresses outside the cluster's.
func strangerSources(n int) []string {
	var sources []string
	for i := range n {
		sources = append(sources, fmt.Sprintf("127.201.%d.%d", 10+i, 10+i))
	}
	return sources
}

// established counts the node's established TCP connections on port
// (from /proc: the sockets among its file descriptors).
func established(t *testing.T, node *testcluster.Node, port int) int {
	t.Helper()
	inodes := map[string]bool{}
	fds := filepath.Join("/proc", strconv.Itoa(node.PID()), "fd")
	entries, err := os.ReadDir(fds)
	if err != nil {
		t.Fatal(err)
	}
	for _, entry := range entries {
		if target, err := os.Readlink(filepath.Join(fds, entry.Name())); err == nil && strings.HasPrefix(target, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(target, "socket:["), "]")] = true
		}
	}
	table, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(node.PID()), "net", "tcp"))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(string(table), "\n")[1:] {
		fields := strings.Fields(line)
		if len(fields) < 10 || fields[3] != "01" || !inodes[fields[9]] {
			continue
		}
		if local := fields[1]; strings.HasSuffix(local, fmt.Sprintf(":%04X", port)) {
			n++
		}
	}
	return n
}

// TestStrangersCannotTakeEverySlot: 16 addresses x 64 silent connections
// (1,024) to the NBD port (a node with a lower connection cap, 128),
// each reconnected a second after the node closes it, do not keep out a
// client with a certificate: qemu-io over TLS writes and reads, nbdinfo
// answers, each within its handshake. The admin port holds only its
// bounded number of strangers' connections (4 addresses x 50 that finish
// TLS and stay silent; a pool of 32) and the CLI still gets through.
// Before: the strangers took every NBD slot (qemu-io refused), and the
// admin port held every connection.
func TestStrangersCannotTakeEverySlot(t *testing.T) {
	need(t, "qemu-io", "nbdinfo")
	const (
		nbdMaxConnections    = 128
		adminUnauthenticated = 32
		adminConnections     = 16
	)
	c := dataClusterWith(t, testcluster.Options{Nodes: 1, ExtraArgs: []string{
		"--nbd-max-connections", strconv.Itoa(nbdMaxConnections),
		"--nbd-max-unauthenticated", "64", "--nbd-max-unauthenticated-per-source", "16",
		"--admin-max-connections", strconv.Itoa(adminConnections),
		"--admin-max-unauthenticated", strconv.Itoa(adminUnauthenticated), "--admin-max-unauthenticated-per-source", "8",
	}}, 1, "vm1", "64M")
	node := c.Node(0)
	vms := addClient(t, c, "vmhost", "vm*")
	sources := strangerSources(4)

	// 16 addresses x 64: over 1,000 strangers' connections at the NBD
	// port, reconnected as the node closes them.
	nbd := holdConnections(t, node.NBDAddr(), strangerSources(16), 64, false)
	testcluster.WaitFor(t, 60*time.Second, "the strangers to have opened 1,024 NBD connections", func() (bool, error) {
		return nbd.opened.Load() >= 1024, fmt.Errorf("%d opened", nbd.opened.Load())
	})
	time.Sleep(2 * time.Second) // and to reconnect what the node closed
	t.Logf("NBD: the strangers hold %d connections (%d opened); the node %d", nbd.held.Load(), nbd.opened.Load(), established(t, node, testcluster.NBDPort))
	for round := range 3 {
		start := time.Now()
		if out, err := qemuTLS(t, c, 0, "vm1", vms, false, fmt.Sprintf("write -P 0x%x 0 1M", 0x41+round), fmt.Sprintf("read -P 0x%x 0 1M", 0x41+round)); err != nil {
			t.Fatalf("qemu-io over TLS while strangers hold the NBD port (round %d): %v\n%s", round, err, out)
		}
		qemu := time.Since(start)
		start = time.Now()
		if out, err := run(t, 30*time.Second, "nbdinfo", "--size", node.NBDTLSURI("vm1", vms)); err != nil || strings.TrimSpace(out) != "67108864" {
			t.Fatalf("nbdinfo over TLS while strangers hold the NBD port (round %d): %v %q", round, err, out)
		}
		t.Logf("round %d: qemu-io %v, nbdinfo %v; strangers hold %d, opened %d", round, qemu.Round(time.Millisecond), time.Since(start).Round(time.Millisecond), nbd.held.Load(), nbd.opened.Load())
	}
	if n := established(t, node, testcluster.NBDPort); n > 64+4 {
		t.Errorf("the node holds %d NBD connections, more than its pool of 64 strangers' (and a few clients')", n)
	}
	nbd.close()

	admin := holdConnections(t, node.AdminAddr(), sources, 50, true)
	testcluster.WaitFor(t, 30*time.Second, "the strangers to have opened 200 admin connections", func() (bool, error) {
		return admin.opened.Load() >= 200, fmt.Errorf("%d opened", admin.opened.Load())
	})
	time.Sleep(2 * time.Second)
	peak := 0
	for range 5 {
		start := time.Now()
		if _, stderr, err := c.Herd(ctx(t), 0, "--timeout", "10s", "vdi", "list"); err != nil {
			t.Fatalf("the CLI while strangers hold the admin port: %v %s", err, stderr)
		}
		n := established(t, node, testcluster.AdminPort)
		peak = max(peak, n)
		t.Logf("admin: vdi list in %v; the node holds %d admin connections, the strangers %d (%d opened)", time.Since(start).Round(time.Millisecond), n, admin.held.Load(), admin.opened.Load())
		time.Sleep(500 * time.Millisecond)
	}
	if peak > adminUnauthenticated+adminConnections {
		t.Errorf("the node held %d admin connections, more than its %d without a token and %d with one", peak, adminUnauthenticated, adminConnections)
	}
	admin.close()
}

// TestStrangersCannotTakeThePeerPort: 16 addresses x 64 silent
// connections (1,024) to the peer port of the node that holds the CA key,
// each reconnected a second after the node closes it, do not keep the
// members or a joining node out: the node holds at most its pool of
// strangers' connections (128) and its members', a new node joins (its
// certificate signed by that node), raft keeps its leader and commits
// what the new node forwards.
// Before: the port held a goroutine and a socket for every stranger's
// connection until its handshake timeout.
func TestStrangersCannotTakeThePeerPort(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Nodes: 3})
	all := []int{0, 1, 2}
	waitAgreement(t, c, all, 30*time.Second)
	leader := nodeID(t, c, leaderIndex(t, c, all))
	node := c.Node(0)

	peer := holdConnections(t, node.PeerAddr(), strangerSources(16), 64, false)
	testcluster.WaitFor(t, 60*time.Second, "the strangers to have opened 1,024 peer connections", func() (bool, error) {
		return peer.opened.Load() >= 1024, fmt.Errorf("%d opened", peer.opened.Load())
	})
	time.Sleep(2 * time.Second) // and to reconnect what the node closed
	held := established(t, node, testcluster.PeerPort)
	t.Logf("peer: the strangers hold %d connections (%d opened); the node %d", peer.held.Load(), peer.opened.Load(), held)
	// The pool, and the members' own (raft, objects, forwarding).
	if held > 128+32 {
		t.Errorf("the node holds %d peer connections, more than its pool of 128 strangers' and the members'", held)
	}

	start := time.Now()
	added := c.AddNode()
	t.Logf("a node joined in %v while strangers hold node 0's peer port (%d opened)", time.Since(start).Round(time.Millisecond), peer.opened.Load())
	waitAgreement(t, c, []int{0, 1, 2, 3}, 60*time.Second)
	if _, err := os.Stat(filepath.Join(added.DataDir(), "node.crt")); err != nil {
		t.Fatalf("the new node has no certificate: %v", err)
	}
	// A commit through the new node (forwarded to the leader, a change
	// of credentials that a running member may make).
	herd(t, c, 3, "token", "create", "probe")
	if now := nodeID(t, c, leaderIndex(t, c, all)); now != leader {
		t.Errorf("the leader changed from %s to %s while strangers held node 0's peer port", leader, now)
	}
	if n := established(t, node, testcluster.PeerPort); n > 128+40 {
		t.Errorf("after the join the node holds %d peer connections", n)
	}
	peer.close()
}

// TestNBDRefusesWeakTLS: the NBD port speaks TLS 1.3, or 1.2 with AEAD
// suites only: a TLS 1.2 client offering only CBC suites (SHA-1 MACs) is
// refused; 1.2 with AES-GCM and 1.3 are served, and QEMU's GnuTLS (1.3)
// still connects. Before: the CBC handshake succeeded.
func TestNBDRefusesWeakTLS(t *testing.T) {
	need(t, "qemu-io")
	c := dataCluster(t, 1, 1, "vm1", "64M")
	node := c.Node(0)
	dir := addClient(t, c, "vmhost", "vm*")
	for _, tc := range []struct {
		name     string
		version  uint16
		suites   []uint16
		accepted bool
	}{
		{"TLS 1.2, CBC with SHA-1", tls.VersionTLS12, []uint16{tls.TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA, tls.TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA}, false},
		{"TLS 1.2, CBC with SHA-256", tls.VersionTLS12, []uint16{tls.TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256}, false},
		{"TLS 1.2, AES-GCM", tls.VersionTLS12, []uint16{tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256}, true},
		{"TLS 1.3", tls.VersionTLS13, nil, true},
	} {
		config := clientTLSConfig(t, dir, node.Address())
		config.MaxVersion, config.CipherSuites = tc.version, tc.suites
		conn, err := dialRawTLS(node.NBDAddr(), "", config)
		if err == nil {
			state := conn.conn.(*tls.Conn).ConnectionState()
			_, _, openErr := conn.export(wire.OptGo, "vm1")
			conn.Close()
			if !tc.accepted {
				t.Errorf("%s: served (%s, %s)", tc.name, tls.VersionName(state.Version), tls.CipherSuiteName(state.CipherSuite))
			} else if openErr != nil {
				t.Errorf("%s: opening vm1: %v", tc.name, openErr)
			}
			continue
		}
		if tc.accepted {
			t.Errorf("%s: refused: %v", tc.name, err)
		} else {
			t.Logf("%s: refused: %v", tc.name, err)
		}
	}
	if out, err := qemuTLS(t, c, 0, "vm1", dir, false, "write -P 0x5c 0 64k", "read -P 0x5c 0 64k"); err != nil {
		t.Fatalf("qemu-io over TLS: %v\n%s", err, out)
	}
}

// TestLooseTokenFilesRefused: a node whose DATA/admin.token or
// DATA/join.token others may read refuses to start, naming the file and
// its mode; so does the CLI with such a --token-file, and herd server
// with such a --join-token-file. Before: the node skipped the file
// silently and started.
func TestLooseTokenFilesRefused(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Nodes: 1})
	node := c.Node(0)
	for _, tc := range []struct {
		file string
		mode os.FileMode
	}{{"admin.token", 0o644}, {"join.token", 0o640}} {
		path := filepath.Join(node.DataDir(), tc.file)
		node.Stop()
		if err := os.Chmod(path, tc.mode); err != nil {
			t.Fatal(err)
		}
		before, _ := os.ReadFile(node.LogPath())
		if err := node.RestartUntilExit(30 * time.Second); err == nil {
			t.Fatalf("the node started with %s at mode %04o (exit status 0)", tc.file, tc.mode)
		}
		logged, _ := os.ReadFile(node.LogPath())
		want := fmt.Sprintf("%s has mode %04o", path, tc.mode)
		if !bytes.Contains(logged[len(before):], []byte(want)) || !bytes.Contains(logged[len(before):], []byte("chmod 600")) {
			t.Errorf("the node's last words do not say %q and how to fix it:\n%s", want, lastLines(string(logged[len(before):]), 10))
		}
		os.Chmod(path, 0o600)
		node.Restart()
	}
	if _, stderr, err := c.Herd(ctx(t), 0, "vdi", "list"); err != nil {
		t.Fatalf("after the modes were fixed: %v %s", err, stderr)
	}

	// The CLI's --token-file, herd server's --join-token-file.
	dir := t.TempDir()
	file := filepath.Join(dir, "admin.token")
	os.WriteFile(file, []byte(c.Token()+"\n"), 0o644)
	command := exec.Command(testcluster.Binary(t), "--addr", node.AdminAddr(), "--token-file", file, "vdi", "list")
	command.Env = append(os.Environ(), "HERD_TOKEN=")
	out, err := command.CombinedOutput()
	if err == nil || !strings.Contains(string(out), file+" has mode 0644") {
		t.Errorf("--token-file at 0644: %v %s", err, out)
	}
	joinFile := filepath.Join(dir, "join.token")
	os.WriteFile(joinFile, []byte(c.JoinToken()+"\n"), 0o644)
	command = exec.Command(testcluster.Binary(t), "server", "--data", filepath.Join(dir, "data"), "--bind", spareAddress(c, 240), "--join", node.Address(), "--join-token-file", joinFile)
	command.Env = append(os.Environ(), "HERD_JOIN_TOKEN=")
	out, err = command.CombinedOutput()
	if err == nil || !strings.Contains(string(out), joinFile+" has mode 0644") {
		t.Errorf("--join-token-file at 0644: %v %s", err, out)
	}
	if errors.Is(err, exec.ErrNotFound) {
		t.Fatal(err)
	}
}
