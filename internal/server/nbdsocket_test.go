package server

import (
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// TestNBDSocketModeAndGroup: the local socket is 0660 whatever the umask,
// in the group asked for, nothing is left beside it, a socket in a
// directory the group cannot enter is refused naming the directory, a
// live socket is not taken over, a stale one is, and Close removes it.
func TestNBDSocketModeAndGroup(t *testing.T) {
	old := syscall.Umask(0)
	defer syscall.Umask(old)

	data := t.TempDir()
	if err := os.Chmod(data, 0o700); err != nil { // like a node's data directory
		t.Fatal(err)
	}
	path, l, err := listenNBDSocket(Options{DataDir: data})
	if err != nil {
		t.Fatal(err)
	}
	if path != filepath.Join(data, "nbd.sock") {
		t.Fatalf("default socket %s, want DATA/nbd.sock", path)
	}
	checkSocket(t, path, os.Getgid())
	if _, _, err := listenNBDSocket(Options{DataDir: data}); err == nil || !strings.Contains(err.Error(), "in use by another process") {
		t.Fatalf("a second listen on a live socket: %v, want a refusal", err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(path); !os.IsNotExist(err) {
		t.Fatalf("the socket outlived Close: %v", err)
	}

	// A directory the group may enter, from / down (t.TempDir's are
	// 0700: opened up to the system's temporary directory).
	shared := filepath.Join(t.TempDir(), "run", "herd")
	for dir := filepath.Dir(filepath.Dir(shared)); dir != filepath.Clean(os.TempDir()) && dir != "/"; dir = filepath.Dir(dir) {
		if err := os.Chmod(dir, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	group, gid := someGroup(t)
	_, _, err = listenNBDSocket(Options{DataDir: data, NBDSocket: filepath.Join(data, "nbd.sock"), NBDSocketGroup: group})
	if err == nil || !strings.Contains(err.Error(), "cannot enter "+data+" (mode 0700") {
		t.Fatalf("a group socket in a 0700 directory: %v, want a refusal naming %s and its mode", err, data)
	}
	socket := filepath.Join(shared, "nbd.sock")
	// A stale socket (its process died) is replaced.
	if err := os.MkdirAll(shared, 0o755); err != nil {
		t.Fatal(err)
	}
	stale, err := net.ListenUnix("unix", &net.UnixAddr{Name: socket, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	stale.SetUnlinkOnClose(false)
	stale.Close()
	path, l, err = listenNBDSocket(Options{DataDir: data, NBDSocket: socket, NBDSocketGroup: strconv.Itoa(gid)})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	checkSocket(t, path, gid)
	entries, _ := os.ReadDir(shared)
	if len(entries) != 1 {
		t.Fatalf("%s holds %d entries, want the socket alone", shared, len(entries))
	}

	if _, _, err := listenNBDSocket(Options{DataDir: data, NBDSocket: "none", NBDSocketGroup: group}); err == nil {
		t.Fatal("--nbd-socket none with --nbd-socket-group was accepted")
	}
	if _, _, err := listenNBDSocket(Options{DataDir: data, NBDSocketGroup: "no-such-group-herd"}); err == nil || !strings.Contains(err.Error(), "no group") {
		t.Fatalf("an unknown group: %v", err)
	}
}

func checkSocket(t *testing.T, path string, gid int) {
	t.Helper()
	info, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	if info.Mode()&os.ModeSocket == 0 || info.Mode().Perm() != 0o660 {
		t.Fatalf("%s: mode %v, want a socket with 0660", path, info.Mode())
	}
	if got := int(info.Sys().(*syscall.Stat_t).Gid); got != gid {
		t.Fatalf("%s: group %d, want %d", path, got, gid)
	}
	conn, err := net.Dial("unix", path)
	if err != nil {
		t.Fatalf("connect %s: %v", path, err)
	}
	conn.Close()
}

// someGroup is a group this process may give a file to: as root one it
// is not in (daemon, nogroup), else its own.
func someGroup(t *testing.T) (string, int) {
	t.Helper()
	if os.Geteuid() == 0 {
		for _, name := range []string{"nogroup", "daemon", "bin"} {
			if g, err := user.LookupGroup(name); err == nil {
				gid, _ := strconv.Atoi(g.Gid)
				return name, gid
			}
		}
	}
	gid := os.Getgid()
	if g, err := user.LookupGroupId(strconv.Itoa(gid)); err == nil {
		return g.Name, gid
	}
	return strconv.Itoa(gid), gid
}
