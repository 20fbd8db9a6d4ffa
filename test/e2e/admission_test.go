package e2e

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/api"
	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/peer"
	"github.com/herd-storage/herd/internal/pki"
	"github.com/herd-storage/herd/internal/testcluster"
)

// TestAdmissionBeforeCredentials does what an attacker with the join token
// did to the herd before admission records: (1) a join with the token
// alone yields a node certificate, the CA certificate and nothing else: no
// CA key and no gossip key, and the new id is recorded (events, node
// remove works on it); (2) with the CA key copied off the first node's
// disk, a node certificate for an id never admitted, and one for a
// member's id with another serial, are refused on every peer protocol of
// every node; the certificate the join gave gets in, but changes no
// credential: a token create it forwards to the leader is refused, and
// the holder of the CA key signs it no session for the admin token's id;
// (3) once removed, the certificate the join gave is refused too. Nodes that joined the cluster hold no CA key; a client certificate
// asked through one of them is signed by the node that holds it.
func TestAdmissionBeforeCredentials(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Nodes: 3})
	all := []int{0, 1, 2}
	waitAgreement(t, c, all, 30*time.Second)
	var info cluster.Info
	if err := c.HerdJSON(ctx(t), 1, &info, "cluster", "info"); err != nil {
		t.Fatal(err)
	}
	if info.Level != cluster.SupportedLevel {
		t.Fatalf("a new cluster is at feature level %d, want %d", info.Level, cluster.SupportedLevel)
	}
	for i := 1; i < 3; i++ {
		if _, err := os.Stat(filepath.Join(c.Node(i).DataDir(), "ca.key")); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("node %d, which joined, holds the CA key (%v)", i, err)
		}
	}
	caCert, err := os.ReadFile(filepath.Join(c.Node(0).DataDir(), "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	caKey, err := os.ReadFile(filepath.Join(c.Node(0).DataDir(), "ca.key"))
	if err != nil {
		t.Fatal(err)
	}
	token, err := pki.ParseJoinToken(c.JoinToken())
	if err != nil {
		t.Fatal(err)
	}

	// (1) The join token alone.
	attacker := randomNodeID(t)
	response, err := peer.RequestJoin(ctx(t), c.Node(1).PeerAddr(), token, peer.JoinRequest{NodeID: attacker, IPs: []string{"127.0.0.1"}, Level: cluster.SupportedLevel})
	if err != nil {
		t.Fatalf("join with the token through node 1 (which does not hold the CA key): %v", err)
	}
	if len(response.CAKey) != 0 || len(response.GossipKey) != 0 {
		t.Fatalf("the join answered a CA key (%d bytes) and a gossip key (%d bytes); want neither", len(response.CAKey), len(response.GossipKey))
	}
	joined, err := peer.NewCredentials(response.NodeCert, response.NodeKey, response.CACert, nil)
	if err != nil {
		t.Fatal(err)
	}
	events := herd(t, c, 2, "events")
	if !strings.Contains(events, "node "+attacker+" admitted") {
		t.Fatalf("the admission is not in the events:\n%s", lastLines(events, 10))
	}
	// A second join of the same id (whoever holds the token) is refused.
	if _, err := peer.RequestJoin(ctx(t), c.Node(0).PeerAddr(), token, peer.JoinRequest{NodeID: attacker, IPs: []string{"127.0.0.1"}, Level: cluster.SupportedLevel}); !errors.Is(err, peer.ErrJoinRefused) {
		t.Fatalf("a second join of id %s: %v, want refused", attacker, err)
	}

	// (2) Certificates minted with a stolen CA key.
	ca, err := pki.ParseCA(caCert, caKey)
	if err != nil {
		t.Fatal(err)
	}
	mint := func(id string) *peer.Credentials {
		t.Helper()
		certPEM, keyPEM, err := ca.IssueNode(id, []net.IP{net.ParseIP("127.0.0.1")})
		if err != nil {
			t.Fatal(err)
		}
		creds, err := peer.NewCredentials(certPEM, keyPEM, caCert, nil)
		if err != nil {
			t.Fatal(err)
		}
		return creds
	}
	never := mint(randomNodeID(t))
	impostor := mint(nodeID(t, c, 1))
	protocols := []peer.Protocol{peer.ProtocolRaft, peer.ProtocolObject, peer.ProtocolForward, peer.ProtocolSecrets, peer.ProtocolSign}
	refusedEverywhere := func(what string, creds *peer.Credentials) {
		t.Helper()
		for _, i := range all {
			for _, protocol := range protocols {
				conn, err := peer.Dial(ctx(t), c.Node(i).PeerAddr(), creds, protocol)
				if err == nil {
					conn.Close()
					t.Errorf("%s reached protocol %d of node %d", what, protocol, i)
				} else if !errors.Is(err, peer.ErrNodeRemoved) {
					t.Errorf("%s on protocol %d of node %d: %v, want refused as not admitted", what, protocol, i, err)
				}
			}
		}
	}
	refusedEverywhere("a certificate for an id never admitted", never)
	refusedEverywhere("a certificate for member "+nodeID(t, c, 1)+" with another serial", impostor)
	// The admitted certificate does get in (so the refusals above are
	// about admission, not about minted certificates).
	if conn, err := peer.Dial(ctx(t), c.Node(2).PeerAddr(), joined, peer.ProtocolForward); err != nil {
		t.Fatalf("the admitted certificate: %v", err)
	} else {
		conn.Close()
	}

	// It changes no credential: the leader refuses an admin token it
	// forwards with a hash of its choosing, and the holder of the CA key
	// signs it no session for the admin token's id (it does not hold
	// that token's secret). A member still gets one, through a node
	// without the key (the holder checks the secret it passes on).
	leader := leaderIndex(t, c, all)
	backdoor := pki.NewSecret()
	payload, err := json.Marshal(cluster.Token{ID: pki.NewTokenID(), Name: "backdoor", Hash: pki.HashSecret(backdoor), Created: time.Now().UTC()})
	if err != nil {
		t.Fatal(err)
	}
	if status, body := forwardOnce(t, c.Node(leader).PeerAddr(), joined, append([]byte{16}, payload...)); status != 1 || !strings.Contains(body, "may not change credentials") {
		t.Fatalf("a token create forwarded to the leader (node %d) by the admitted id: status %d, %q; want refused", leader, status, body)
	}
	if list := herd(t, c, leader, "token", "list"); strings.Contains(list, "backdoor") {
		t.Fatalf("the forwarded token was created:\n%s", list)
	}
	admin, err := pki.ParseAdminToken(c.Token())
	if err != nil {
		t.Fatal(err)
	}
	request, err := json.Marshal(map[string]any{"kind": "session", "name": "token-admin", "token_id": admin.ID})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := peer.Call(ctx(t), c.Node(0).PeerAddr(), joined, peer.ProtocolSign, request); err == nil || !errors.Is(err, peer.ErrCallRefused) {
		t.Fatalf("a session for the admin token's id signed for the admitted id: %v, want refused", err)
	}
	if session, err := client(c, 2).NBDSession(ctx(t)); err != nil || session.ClientCert == "" {
		t.Fatalf("a session through node 2 (no CA key) with the admin token: %v", err)
	}

	// (3) Removed: refused too.
	herd(t, c, 0, "node", "remove", attacker)
	testcluster.WaitFor(t, 10*time.Second, "every node to refuse the removed id", func() (bool, error) {
		for _, i := range all {
			if conn, err := peer.Dial(ctx(t), c.Node(i).PeerAddr(), joined, peer.ProtocolForward); err == nil {
				conn.Close()
				return false, errors.New("node " + c.Node(i).Address() + " still accepts it")
			}
		}
		return true, nil
	})
	refusedEverywhere("the removed node's own certificate", joined)

	// A client certificate asked through a node without the CA key.
	out := filepath.Join(t.TempDir(), "client")
	herd(t, c, 2, "client", "add", "viewer", "--vdi", "vm*", "--out", out)
	certPEM, err := os.ReadFile(filepath.Join(out, "client-cert.pem"))
	if err != nil {
		t.Fatalf("client add through node 2 wrote no certificate: %v", err)
	}
	cert, err := pki.ParseCertificate(certPEM)
	if err != nil || cert.CheckSignatureFrom(ca.Cert) != nil {
		t.Fatalf("the client certificate through node 2: %v", err)
	}
	var nodes []api.NodeEntry
	if err := c.HerdJSON(ctx(t), 0, &nodes, "node", "list"); err != nil {
		t.Fatal(err)
	}
	holders := 0
	for _, n := range nodes {
		if n.Build != nil && n.Build.Signs {
			holders++
		}
	}
	if holders != 1 {
		t.Fatalf("%d nodes report holding the CA key, want 1 (the first)", holders)
	}
}

func randomNodeID(t *testing.T) string {
	t.Helper()
	b := make([]byte, 8)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// forwardOnce sends one command on the forwarding protocol (cluster/forward.go:
// request length(4) id(8) command; response length(4) id(8) index(8)
// status(1) body) as creds, and returns the status and body of the answer.
func forwardOnce(t *testing.T, address string, creds *peer.Credentials, command []byte) (byte, string) {
	t.Helper()
	conn, err := peer.Dial(ctx(t), address, creds, peer.ProtocolForward)
	if err != nil {
		t.Fatalf("forwarding connection to %s: %v", address, err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	frame := binary.BigEndian.AppendUint32(nil, uint32(8+len(command)))
	frame = binary.BigEndian.AppendUint64(frame, 1)
	if _, err := conn.Write(append(frame, command...)); err != nil {
		t.Fatal(err)
	}
	var length [4]byte
	if _, err := io.ReadFull(conn, length[:]); err != nil {
		t.Fatalf("no answer to the forwarded command: %v", err)
	}
	response := make([]byte, binary.BigEndian.Uint32(length[:]))
	if len(response) < 17 {
		t.Fatalf("a response of %d bytes", len(response))
	}
	if _, err := io.ReadFull(conn, response); err != nil {
		t.Fatal(err)
	}
	return response[16], string(response[17:])
}
