package store

import (
	"errors"
	"io"
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

// dataWriteChunk bounds the size of one pwrite of object data. Linux (6.x,
// ext4 and others with large folios) caches a buffered write in folios as
// large as the write, up to 2 MiB; a later small write into such a folio
// costs several times one into a 4 KiB page (measured on this project's
// machine, 4 KiB random overwrites of files written in 1 MiB pieces: 15-20
// µs of CPU each against 5-6 µs after 64 KiB pieces, 7 µs after 128 KiB),
// and a VM's disk is typically written sequentially once and then randomly.
// 128 KiB pieces cost sequential writes little (fresh files about 15% more
// CPU in the store's pwrites, overwrites less) and make large folios at
// most 128 KiB.
const dataWriteChunk = 128 << 10

// writeData writes p at file offset off in pieces that end on
// dataWriteChunk boundaries of the file (see there). A failed piece fails
// the write, leaving the pieces before it written, as a short pwrite does.
func writeData(f io.WriterAt, p []byte, off int64) error {
	for len(p) > 0 {
		n := min(int64(len(p)), dataWriteChunk-off%dataWriteChunk)
		if _, err := f.WriteAt(p[:n], off); err != nil {
			return err
		}
		p, off = p[n:], off+n
	}
	return nil
}
