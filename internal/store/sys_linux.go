package store

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// The few system calls the os package does not offer. They run inside
// RawConn.Control, which holds a reference on the fd for the duration of
// the call, so a concurrent Close cannot reuse the number under them.

// fdatasync flushes f's data, and the metadata needed to read it back (size,
// block map), to stable storage: fdatasync(2). It is the default
// Store.datasync.
func fdatasync(f *os.File) error {
	return control(f, "fdatasync", func(fd int) error { return unix.Fdatasync(fd) })
}

// fsyncDir is the default Store.dirsync: fsync(2) of a directory makes its
// entries (created, removed names) durable.
func fsyncDir(f *os.File) error {
	return f.Sync()
}

// fallocate calls fallocate(2) on the byte range [offset, offset+length).
func fallocate(f *os.File, mode uint32, offset, length int64) error {
	return control(f, "fallocate", func(fd int) error { return unix.Fallocate(fd, mode, offset, length) })
}

// syncfs flushes the whole file system that holds path: syncfs(2). Since
// Linux 5.8 it also reports writeback errors no one has seen yet.
func syncfs(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return control(f, "syncfs", func(fd int) error { return unix.Syncfs(fd) })
}

func control(f *os.File, op string, call func(fd int) error) error {
	raw, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var callErr error
	if err := raw.Control(func(fd uintptr) {
		for {
			callErr = call(int(fd))
			if !errors.Is(callErr, unix.EINTR) {
				return
			}
		}
	}); err != nil {
		return err
	}
	if callErr != nil {
		return &os.PathError{Op: op, Path: f.Name(), Err: callErr}
	}
	return nil
}

// classify maps an operating system error to the store's sentinel, or nil
// when none applies.
func classify(err error) error {
	switch {
	case errors.Is(err, unix.ENOSPC), errors.Is(err, unix.EDQUOT):
		return ErrNoSpace
	case errors.Is(err, unix.EIO):
		return ErrIO
	}
	return nil
}

// unsupported reports whether err says the file system does not implement
// an fallocate mode.
func unsupported(err error) bool {
	return errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOSYS)
}
