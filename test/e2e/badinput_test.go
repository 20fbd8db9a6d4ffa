package e2e

import (
	"context"
	"crypto/rand"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/pki"
	"github.com/herd-storage/herd/internal/testcluster"
)

// TestBadInput checks that every mistake a user or a stray process can
// make gets a clear error naming the problem, and never a crash.
func TestBadInput(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Nodes: 3})
	waitAgreement(t, c, []int{0, 1, 2}, 30*time.Second)

	cli := func(node int, args ...string) (string, error) {
		stdout, stderr, err := c.Herd(ctx(t), node, args...)
		if strings.Contains(stderr, "panic") || strings.Contains(stderr, "goroutine ") {
			t.Fatalf("herd %v crashed:\n%s", args, stderr)
		}
		return stdout + stderr, err
	}
	expectError := func(want string, args ...string) {
		t.Helper()
		out, err := cli(1, args...)
		if err == nil {
			t.Errorf("herd %v succeeded, want an error containing %q:\n%s", args, want, out)
		} else if !strings.Contains(out, want) {
			t.Errorf("herd %v: %q does not contain %q", args, strings.TrimSpace(out), want)
		}
	}

	expectError("not formatted", "vdi", "create", "early", "1G")
	expectError("--copies is required", "cluster", "format")
	expectError("4 copies need 4 nodes", "cluster", "format", "--copies", "4")
	expectError("copies must be between 1 and", "cluster", "format", "--copies", "0")
	expectError("power of two", "cluster", "format", "--copies", "2", "--object-size", "3M")
	expectError(`invalid size "4Q"`, "cluster", "format", "--copies", "2", "--object-size", "4Q")
	if out, err := cli(0, "cluster", "format", "--copies", "3"); err != nil {
		t.Fatalf("format: %v %s", err, out)
	}
	expectError("already formatted", "cluster", "format", "--copies", "3")
	expectError("already formatted", "cluster", "format", "--copies", "2")

	if out, err := cli(2, "vdi", "create", "disk", "1G"); err != nil {
		t.Fatalf("create: %v %s", err, out)
	}
	expectError(`vdi "nope" not found`, "vdi", "info", "nope")
	expectError(`vdi "nope" not found`, "vdi", "delete", "nope")
	expectError(`vdi "nope" not found`, "vdi", "resize", "nope", "2G")
	expectError(`"disk" already exists`, "vdi", "create", "disk", "2G")
	expectError("shrinking", "vdi", "resize", "disk", "512M")
	for size, want := range map[string]string{
		"10X": `unknown unit "X"`, "0": "greater than zero", "513": "not a multiple of 512", "-1": "no number",
		"1.0001K": "not a whole number", "99999999999999999999": "out of range", "tenG": "no number", "20000P": "too large",
	} {
		expectError(want, "vdi", "create", "--", "sized", size)
	}
	for _, name := range []string{"a b", "-dash", ".dot", "snap@tag", "sl/ash", strings.Repeat("n", 129)} {
		expectError("invalid argument: vdi name", "vdi", "create", "--", name, "1G")
	}
	expectError("usage: herd vdi create NAME SIZE", "vdi", "create", "only-a-name")
	expectError("unknown flag: --bogus", "vdi", "list", "--bogus")
	expectError(`unknown command "frobnicate" for herd vdi`, "vdi", "frobnicate")
	expectError("herd cluster needs a command", "cluster")
	expectError("put -- before the arguments", "vdi", "create", "x", "-1")

	// A wrong token is refused by the admin API with a clear message.
	herdWith := func(token string, args ...string) (string, error) {
		cmd := exec.Command(testcluster.Binary(t), args...)
		cmd.Env = append(os.Environ(), "HERD_TOKEN="+token)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	if out, err := herdWith("not-the-cluster-token", "--addr", c.Node(0).AdminAddr(), "vdi", "list"); err == nil || !strings.Contains(out, "not a herd admin token") {
		t.Errorf("wrong token: %v %q", err, out)
	}
	// A node that is not there.
	if out, err := herdWith(c.Token(), "--addr", spareAddress(c, 201), "--timeout", "5s", "cluster", "info"); err == nil || !strings.Contains(out, "cannot reach herd node") {
		t.Errorf("CLI against a dead address: %v %q", err, out)
	}

	t.Run("join pointed at a non-herd port", func(t *testing.T) {
		l, err := net.Listen("tcp", net.JoinHostPort(c.Node(0).Address(), "0"))
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		go func() {
			for {
				conn, err := l.Accept()
				if err != nil {
					return
				}
				conn.Write([]byte("SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n"))
				conn.Close()
			}
		}()
		out := runServer(t, spareAddress(c, 210), c.JoinToken(), "--join", l.Addr().String())
		if !strings.Contains(out, "not a herd peer") {
			t.Errorf("--join to a non-herd port: %q", out)
		}
		out = runServer(t, spareAddress(c, 211), c.JoinToken(), "--join", net.JoinHostPort(spareAddress(c, 212), "7000"))
		if !strings.Contains(out, "nothing answers there") {
			t.Errorf("--join to a closed port: %q", out)
		}
		out = runServer(t, spareAddress(c, 213), "", "--join", c.Node(0).Address())
		if !strings.Contains(out, "joining needs the cluster's join token") {
			t.Errorf("--join without a token: %q", out)
		}
		out = runServer(t, spareAddress(c, 214), c.JoinToken(), "--join", c.Node(0).Address()+":notaport")
		if !strings.Contains(out, "is not a port") {
			t.Errorf("--join with a bad port: %q", out)
		}
		out = runServer(t, spareAddress(c, 215), "herd-join.nonsense", "--join", c.Node(0).Address())
		if !strings.Contains(out, "join token") {
			t.Errorf("--join with a malformed token: %q", out)
		}
	})

	t.Run("wrong join secret is refused and logged", func(t *testing.T) {
		token, err := pki.ParseJoinToken(c.JoinToken())
		if err != nil {
			t.Fatal(err)
		}
		token.Secret = pki.NewSecret()
		out := runServer(t, spareAddress(c, 220), token.String(), "--join", c.Node(0).Address())
		if !strings.Contains(out, "wrong join secret") {
			t.Errorf("joining with a wrong secret: %q", out)
		}
		testcluster.WaitFor(t, 10*time.Second, "node 0 to log the refused join", func() (bool, error) {
			log, err := os.ReadFile(c.Node(0).LogPath())
			return strings.Contains(string(log), "refused a join: wrong join secret"), err
		})
		nodes, err := client(c, 0).Nodes(ctx(t))
		if err != nil || len(nodes) != 3 {
			t.Fatalf("a node with the wrong secret got in: %d nodes, %v", len(nodes), err)
		}
	})

	t.Run("same data directory twice", func(t *testing.T) {
		cmd := exec.Command(testcluster.Binary(t), "server", "--data", c.Node(1).DataDir(), "--bind", spareAddress(c, 230))
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), "in use by another herd process") {
			t.Errorf("second server on a data directory in use: %v %q", err, out)
		}
	})

	t.Run("random bytes to every port", func(t *testing.T) {
		garbage := make([]byte, 64<<10)
		for round := 0; round < 5; round++ {
			rand.Read(garbage)
			for _, port := range []string{"7000", "7001", "7080", "10809"} {
				for _, i := range []int{0, 1, 2} {
					conn, err := net.DialTimeout("tcp", net.JoinHostPort(c.Node(i).Address(), port), time.Second)
					if err != nil {
						t.Fatalf("dial %s:%s: %v", c.Node(i).Address(), port, err)
					}
					conn.SetDeadline(time.Now().Add(2 * time.Second))
					conn.Write(garbage)
					conn.Close()
					if udp, err := net.Dial("udp", net.JoinHostPort(c.Node(i).Address(), "7001")); err == nil {
						udp.Write(garbage[:1400])
						udp.Close()
					}
				}
			}
		}
		waitAgreement(t, c, []int{0, 1, 2}, 20*time.Second)
		for _, i := range []int{0, 1, 2} {
			if !c.Node(i).Running() {
				t.Fatalf("node %d died from garbage", i)
			}
			if _, err := client(c, i).CreateVDI(ctx(t), fmt.Sprintf("after-garbage-%d", i), 1<<20); err != nil {
				t.Fatalf("node %d after garbage: %v", i, err)
			}
		}
		log, _ := os.ReadFile(c.Node(0).LogPath())
		if !strings.Contains(string(log), "peer: refused connection") {
			t.Errorf("node 0 did not log the refused peer connections")
		}
	})
}

// spareAddress returns an unused address in the cluster's loopback /24.
func spareAddress(c *testcluster.Cluster, last int) string {
	ip := net.ParseIP(c.Node(0).Address()).To4()
	return net.IPv4(ip[0], ip[1], ip[2], byte(last)).String()
}

// runServer runs `herd server` that is expected to fail, and returns its
// output; it must exit by itself, non-zero, within the join timeout.
func runServer(t *testing.T, bind, joinToken string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	full := append([]string{"server", "--data", t.TempDir(), "--bind", bind, "--join-timeout", "2s"}, args...)
	cmd := exec.CommandContext(ctx, testcluster.Binary(t), full...)
	cmd.Env = append(os.Environ(), "HERD_TOKEN=", "HERD_JOIN_TOKEN="+joinToken)
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("herd %v hung", full)
	}
	if err == nil {
		t.Fatalf("herd %v exited 0:\n%s", full, out)
	}
	if strings.Contains(string(out), "panic") {
		t.Fatalf("herd %v crashed:\n%s", full, out)
	}
	return string(out)
}
