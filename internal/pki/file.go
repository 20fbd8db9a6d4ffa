package pki

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// Files that hold secrets (the CA key, a node key, tokens) are the node's
// credentials: another user who reads one can join or administer the
// cluster. They are written with mode 0600, in directories of mode 0700,
// and reading refuses one that others could have read, rather than use a
// secret that may already be known.

// WriteSecretFile replaces path with data, mode 0600, durably: a crash
// leaves the old file or the new one, never a part. The order follows the
// usual rule for atomic replacement: write a temporary file in the same
// directory, fsync it, rename it over path, fsync the directory so that
// the rename itself survives a crash.
func WriteSecretFile(path string, data []byte) (err error) {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	f, err := os.CreateTemp(dir, "."+base+".tmp*") // mode 0600
	if err != nil {
		return fmt.Errorf("pki: write %s: %w", path, err)
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
		}
	}()
	// CreateTemp's mode is 0600 already; say so for any future umask or
	// implementation change.
	if err := f.Chmod(0o600); err != nil {
		return fmt.Errorf("pki: write %s: %w", path, err)
	}
	if _, err := f.Write(data); err != nil {
		return fmt.Errorf("pki: write %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("pki: write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("pki: write %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("pki: write %s: %w", path, err)
	}
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("pki: write %s: sync directory: %w", path, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("pki: write %s: sync directory: %w", path, err)
	}
	return nil
}

// ReadSecretFile reads a file written by WriteSecretFile. It refuses one
// whose mode gives the group or others any access (a *ModeError naming
// the chmod that fixes it), and anything but a regular file.
func ReadSecretFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	// Check the file opened, not the path: a rename between a stat and
	// the open cannot slip another file in.
	info, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !info.Mode().IsRegular() {
		return nil, fmt.Errorf("pki: %s is not a regular file", path)
	}
	if perm := info.Mode().Perm(); perm&0o077 != 0 {
		return nil, &ModeError{Path: path, Mode: perm, Want: 0o600}
	}
	return io.ReadAll(f)
}

// CheckDirMode refuses a directory holding secrets (a data directory)
// that the group or others may access at all: 0700 is expected.
func CheckDirMode(path string) error {
	info, err := os.Stat(path)
	if err != nil {
		return err
	}
	if !info.IsDir() {
		return fmt.Errorf("pki: %s is not a directory", path)
	}
	if perm := info.Mode().Perm(); perm&0o077 != 0 {
		return &ModeError{Path: path, Mode: perm, Want: 0o700, Dir: true}
	}
	return nil
}
