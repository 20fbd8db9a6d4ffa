package e2e

import (
	"context"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/testcluster"
	"github.com/herd-storage/herd/internal/testenv"
)

// TestComposeCluster: the image deploy/build-image.sh builds (FROM
// scratch, the static binary, an unprivileged user) and the three nodes
// of deploy/docker-compose.yml form a cluster; a disk written through
// one container's node reads back through another's, over NBD with TLS
// and a client certificate, and goes on reading and writing after a
// container is killed.
func TestComposeCluster(t *testing.T) {
	need(t, "qemu-io")
	testenv.LookPath(t, "docker", "docker.io")
	testenv.LookPath(t, "docker-compose", "docker-compose")
	if out, err := exec.Command("docker", "info", "--format", "{{.ServerVersion}}").CombinedOutput(); err != nil {
		testenv.Require(t, "a running Docker engine", fmt.Errorf("%v: %s", err, out))
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	id := fmt.Sprintf("herde2e%d", os.Getpid())
	image := "herd:" + id
	// The image holds the tests' own herd when it is static (as
	// testcluster builds it), rather than a second build of the same code.
	build := exec.Command(filepath.Join(root, "deploy/build-image.sh"), image)
	if binary := testcluster.Binary(t); isStatic(t, binary) {
		build.Env = append(os.Environ(), "HERD_IMAGE_BINARY="+binary)
	}
	if out, err := runCommand(t, 5*time.Minute, build); err != nil {
		t.Fatalf("build-image.sh: %v\n%s", err, out)
	}
	t.Cleanup(func() { exec.Command("docker", "rmi", "-f", image).Run() })
	if user := strings.TrimSpace(mustRun(t, time.Minute, "docker", "image", "inspect", "-f", "{{.Config.User}}", image)); user != "65532:65532" {
		t.Errorf("the image runs as %q, want the unprivileged 65532:65532", user)
	}

	// A /24 no other Docker network uses.
	taken := mustRun(t, time.Minute, "sh", "-c", `docker network inspect -f '{{range .IPAM.Config}}{{.Subnet}} {{end}}' $(docker network ls -q)`)
	subnet := ""
	for i := os.Getpid() % 200; i < 256 && subnet == ""; i++ {
		candidate := fmt.Sprintf("10.213.%d", i)
		if !strings.Contains(taken, candidate+".0/") {
			subnet = candidate
		}
	}
	compose := func(timeout time.Duration, args ...string) (string, error) {
		t.Helper()
		full := append([]string{"-p", id, "-f", filepath.Join(root, "deploy/docker-compose.yml")}, args...)
		// Not t.Context(): the clean-up (down) runs after it is cancelled.
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		cmd := exec.CommandContext(ctx, "docker-compose", full...)
		cmd.Env = append(os.Environ(), "HERD_IMAGE="+image, "HERD_NET="+subnet)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := compose(time.Minute, "logs", "--no-color", "--tail", "40")
			t.Logf("the containers' logs:\n%s", out)
		}
		if out, err := compose(2*time.Minute, "down", "-v", "--timeout", "10"); err != nil {
			t.Errorf("docker-compose down: %v\n%s", err, out)
		}
	})
	if out, err := compose(5*time.Minute, "up", "-d"); err != nil {
		t.Fatalf("docker-compose up: %v\n%s", err, out)
	}
	container := func(service string) string {
		out, err := compose(time.Minute, "ps", "-q", service)
		if err != nil || strings.TrimSpace(out) == "" {
			t.Fatalf("docker-compose ps %s: %v %s", service, err, out)
		}
		return strings.TrimSpace(out)
	}
	address := func(node int) string { return fmt.Sprintf("%s.%d", subnet, 10+node) }

	dir := t.TempDir()
	token := filepath.Join(dir, "admin.token")
	testcluster.WaitFor(t, time.Minute, "node1 to write its admin token", func() (bool, error) {
		out, err := exec.Command("docker", "cp", container("node1")+":/data/admin.token", token).CombinedOutput()
		return err == nil, fmt.Errorf("%v: %s", err, out)
	})
	herd := func(args ...string) (string, error) {
		t.Helper()
		return run(t, time.Minute, testcluster.Binary(t), append([]string{"--addr", address(1), "--token-file", token}, args...)...)
	}
	testcluster.WaitFor(t, 2*time.Minute, "three alive nodes", func() (bool, error) {
		out, err := herd("node", "list")
		return err == nil && strings.Count(out, " alive") == 3, fmt.Errorf("%v: %s", err, out)
	})
	for _, args := range [][]string{{"cluster", "format", "--copies", "3"}, {"vdi", "create", "vm1", "64M"}, {"client", "add", "tester", "--vdi", "*", "--out", filepath.Join(dir, "certs")}} {
		if out, err := herd(args...); err != nil {
			t.Fatalf("herd %v: %v\n%s", args, err, out)
		}
	}
	qemu := func(node int, commands ...string) {
		t.Helper()
		args := []string{"--object", "tls-creds-x509,id=tls0,endpoint=client,dir=" + filepath.Join(dir, "certs"),
			"--image-opts", "driver=raw,file.driver=nbd,file.host=" + address(node) + ",file.port=10809,file.export=vm1,file.tls-creds=tls0"}
		for _, c := range commands {
			args = append(args, "-c", c)
		}
		out, err := run(t, 2*time.Minute, "qemu-io", args...)
		if err != nil || strings.Contains(out, "failed") {
			t.Fatalf("qemu-io through node%d %v: %v\n%s", node, commands, err, out)
		}
	}
	qemu(1, "write -P 0x5a 0 8M", "flush")
	qemu(2, "read -P 0x5a 0 8M")

	if out, err := run(t, time.Minute, "docker", "kill", container("node3")); err != nil {
		t.Fatalf("docker kill node3: %v\n%s", err, out)
	}
	qemu(2, "read -P 0x5a 0 8M", "write -P 0x5b 1M 1M", "flush")
	qemu(1, "read -P 0x5a 0 1M", "read -P 0x5b 1M 1M", "read -P 0x5a 2M 6M")
	testcluster.WaitFor(t, time.Minute, "the cluster to drop node3", func() (bool, error) {
		out, err := herd("node", "list")
		return err == nil && strings.Count(out, " alive") == 2, fmt.Errorf("%v: %s", err, out)
	})
}

// TestSystemdUnitVerifies: deploy/herd.service is a unit systemd accepts
// (systemd-analyze verify, with the binary it starts in place), and it
// keeps its hardening.
func TestSystemdUnitVerifies(t *testing.T) {
	analyze := testenv.LookPath(t, "systemd-analyze", "systemd")
	unit, err := os.ReadFile("../../deploy/herd.service")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"User=herd", "ProtectSystem=strict", "NoNewPrivileges=true", "CapabilityBoundingSet=\n", "ExecStart=/usr/local/bin/herd server --data /var/lib/herd",
		// the local socket where libvirt's QEMU can reach it (docs/LIBVIRT.md)
		"RuntimeDirectory=herd\n", "RuntimeDirectoryMode=0755\n", "SupplementaryGroups=libvirt-qemu\n", "--nbd-socket /run/herd/nbd.sock --nbd-socket-group libvirt-qemu "} {
		if !strings.Contains(string(unit), want) {
			t.Errorf("deploy/herd.service lacks %q", want)
		}
	}
	dir := t.TempDir()
	local := strings.ReplaceAll(string(unit), "/usr/local/bin/herd", testcluster.Binary(t))
	if err := os.WriteFile(filepath.Join(dir, "herd.service"), []byte(local), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := run(t, time.Minute, analyze, "verify", filepath.Join(dir, "herd.service")); err != nil || strings.TrimSpace(out) != "" {
		t.Fatalf("systemd-analyze verify deploy/herd.service: %v\n%s", err, out)
	}
}

// isStatic says whether the ELF file at path needs no dynamic loader.
func isStatic(t *testing.T, path string) bool {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return false
		}
	}
	return true
}
