package server

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/herd-storage/herd/internal/reach"
)

// SharedNBDSocket is where the local NBD socket goes when
// --nbd-socket-group is given without --nbd-socket: a directory other
// users may enter (the data directory is 0700). deploy/herd.service makes
// /run/herd with RuntimeDirectory=herd.
const SharedNBDSocket = "/run/herd/nbd.sock"

// socketPathMax is the longest unix socket path the kernel takes
// (sun_path holds 108 bytes with the terminating NUL).
const socketPathMax = 107

// privateDirectoryPattern names the directory the socket is made in
// before it is moved into place; with its "/s" it adds at most 16 bytes
// to the socket's directory.
const privateDirectoryPattern = ".nbd*"

// listenNBDSocket opens the local plaintext NBD socket: o.NBDSocket, else
// DATA/nbd.sock, or SharedNBDSocket with o.NBDSocketGroup. The socket is
// mode 0660, in group o.NBDSocketGroup when given (else the process's),
// from the moment its name exists: it is made inside a private directory
// (0700) beside the final name, given its mode and group there, and
// renamed into place. With a group, every directory above the socket
// must let that group in, else the node refuses to start, naming the
// directory: a socket its users cannot reach is a configuration error
// best seen at start, not at a VM's.
func listenNBDSocket(o Options) (string, net.Listener, error) {
	path := o.NBDSocket
	if path == "none" {
		if o.NBDSocketGroup != "" {
			return "", nil, errors.New("--nbd-socket-group is for a local NBD socket, and --nbd-socket is none")
		}
		return "", nil, nil
	}
	gid := -1
	var group reach.Who
	if o.NBDSocketGroup != "" {
		var err error
		group, err = reach.Group(o.NBDSocketGroup)
		if err != nil {
			return "", nil, fmt.Errorf("--nbd-socket-group: %w", err)
		}
		gid = group.GIDs[0]
	}
	if path == "" {
		if gid >= 0 {
			path = SharedNBDSocket
		} else {
			path = filepath.Join(o.DataDir, "nbd.sock")
		}
	}
	dir := filepath.Dir(path)
	if len(path) > socketPathMax || len(dir)+16 > socketPathMax {
		return "", nil, fmt.Errorf("--nbd-socket %s: a unix socket path is limited to %d bytes, and its directory's name to %d; give a shorter one", path, socketPathMax, socketPathMax-16)
	}
	if _, err := os.Stat(dir); os.IsNotExist(err) {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return "", nil, fmt.Errorf("NBD socket: %w", err)
		}
		if err := os.Chmod(dir, 0o755); err != nil {
			return "", nil, fmt.Errorf("NBD socket: %w", err)
		}
	}
	if gid >= 0 {
		if err := reach.Directories(dir, group); err != nil {
			hint := ""
			if o.NBDSocket == "" || filepath.Clean(dir) == filepath.Clean(o.DataDir) {
				hint = " (the data directory is 0700 on purpose)"
			}
			return "", nil, fmt.Errorf("--nbd-socket-group %s: the socket %s would be out of the group's reach: %v%s; put it in a directory the group may enter, e.g. --nbd-socket %s", o.NBDSocketGroup, path, err, hint, SharedNBDSocket)
		}
	}
	if info, err := os.Lstat(path); err == nil {
		if info.Mode()&os.ModeSocket == 0 {
			return "", nil, fmt.Errorf("--nbd-socket %s exists and is not a socket", path)
		}
		// A socket that answers belongs to a running process (another
		// node on this host?); one that does not was left by a process
		// that died, and the rename below replaces it.
		if conn, err := net.DialTimeout("unix", path, time.Second); err == nil {
			conn.Close()
			return "", nil, fmt.Errorf("--nbd-socket %s is in use by another process (another herd node on this host? give each its own --nbd-socket)", path)
		}
	}

	private, err := os.MkdirTemp(dir, privateDirectoryPattern)
	if err != nil {
		return "", nil, fmt.Errorf("NBD socket: %w", err)
	}
	defer os.RemoveAll(private)
	if err := os.Chmod(private, 0o700); err != nil {
		return "", nil, fmt.Errorf("NBD socket: %w", err)
	}
	temporary := filepath.Join(private, "s")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: temporary, Net: "unix"})
	if err != nil {
		return "", nil, fmt.Errorf("NBD socket: %w", err)
	}
	// The name it is bound to moves; Close removes the final one.
	l.SetUnlinkOnClose(false)
	fail := func(err error) (string, net.Listener, error) {
		l.Close()
		return "", nil, err
	}
	if gid >= 0 {
		if err := os.Chown(temporary, -1, gid); err != nil {
			if errors.Is(err, syscall.EPERM) {
				return fail(fmt.Errorf("--nbd-socket-group %s: herd runs as %s, which is not in that group, and may not give it a file (usermod -aG %s %s; in the systemd unit SupplementaryGroups=%s)", o.NBDSocketGroup, currentUser(), o.NBDSocketGroup, currentUser(), o.NBDSocketGroup))
			}
			return fail(fmt.Errorf("NBD socket: %w", err))
		}
	}
	if err := os.Chmod(temporary, 0o660); err != nil {
		return fail(fmt.Errorf("NBD socket: %w", err))
	}
	if err := os.Rename(temporary, path); err != nil {
		return fail(fmt.Errorf("NBD socket: %w", err))
	}
	info, err := os.Lstat(path)
	if err != nil {
		return fail(fmt.Errorf("NBD socket: %w", err))
	}
	return path, &socketListener{UnixListener: l, path: path, file: info}, nil
}

// socketListener is the local socket's listener; Close removes the
// socket's name, unless another process has put its own there since.
type socketListener struct {
	*net.UnixListener
	path string
	file os.FileInfo
	once sync.Once
}

func (l *socketListener) Close() error {
	err := l.UnixListener.Close()
	l.once.Do(func() {
		if now, statErr := os.Lstat(l.path); statErr == nil && os.SameFile(now, l.file) {
			os.Remove(l.path)
		}
	})
	return err
}

func currentUser() string {
	if u, err := user.Current(); err == nil {
		return u.Username
	}
	return "uid " + strconv.Itoa(os.Getuid())
}
