// Package nbdtest serves in-memory disks over NBD with herd's real server
// (internal/nbd), for tests of NBD clients: nbdclient itself and the
// commands built on it (`herd vdi import|export`).
package nbdtest

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/exportname"
	"github.com/herd-storage/herd/internal/nbd"
)

// BlockSize is the allocation unit of a Disk: holes are tracked per block.
const BlockSize = 4096

// Disk is an in-memory sparse disk. Its methods are safe for concurrent
// use.
type Disk struct {
	Name string
	// Info holds the features the disk advertises; Size is taken from the
	// disk. Change it before serving.
	Info nbd.ExportInfo
	// Fail, if set, is called before every I/O operation ("read",
	// "write", "flush", "trim", "zero", "block-status"); a non-nil error
	// is returned to the client.
	Fail func(operation string, offset, length uint64) error
	// Meta are metadata contexts served besides base:allocation, each
	// with the extents it answers from offset 0 (for instance
	// "qemu:dirty-bitmap:s1"). Set before serving.
	Meta map[string][]nbd.MetaExtent

	size uint64

	// Operation counters.
	Writes, WriteBytes, Zeroes, Trims, Flushes, Reads, BlockStatuses atomic.Int64

	mu     sync.RWMutex // guards blocks
	blocks map[uint64][]byte
}

// NewDisk returns an empty (all holes) disk that advertises every feature:
// flush, FUA, trim, write zeroes, fast zero, multi-conn.
func NewDisk(name string, size uint64) *Disk {
	return &Disk{
		Name: name,
		size: size,
		Info: nbd.ExportInfo{
			CanFlush: true, CanFUA: true, CanTrim: true, CanWriteZeroes: true, CanFastZero: true,
			CanMultiConn: true, BlockSizeMinimum: 1, BlockSizePreferred: 4096, PayloadSizeMaximum: 32 << 20,
		},
		blocks: make(map[uint64][]byte),
	}
}

// Size is the disk's size in bytes.
func (d *Disk) Size() uint64 { return d.size }

// Contents returns a copy of the whole disk.
func (d *Disk) Contents() []byte {
	data := make([]byte, d.size)
	d.ReadAt(data, 0)
	return data
}

// AllocatedBytes is the number of bytes in allocated blocks.
func (d *Disk) AllocatedBytes() uint64 {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return uint64(len(d.blocks)) * BlockSize
}

// ReadAt copies the disk's bytes at off into p.
func (d *Disk) ReadAt(p []byte, off uint64) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	for done := 0; done < len(p); {
		position := off + uint64(done)
		index, within := position/BlockSize, position%BlockSize
		n := min(len(p)-done, int(BlockSize-within))
		if block, ok := d.blocks[index]; ok {
			copy(p[done:done+n], block[within:])
		} else {
			clear(p[done : done+n])
		}
		done += n
	}
}

// WriteAt writes p at off, allocating the blocks it touches.
func (d *Disk) WriteAt(p []byte, off uint64) {
	d.update(off, uint64(len(p)), func(block []byte, within, n, done uint64) []byte {
		if block == nil {
			block = make([]byte, BlockSize)
		}
		copy(block[within:within+n], p[done:done+n])
		return block
	})
}

// Punch makes the range read as zeroes, freeing whole blocks.
func (d *Disk) Punch(off, length uint64) {
	d.update(off, length, func(block []byte, within, n, done uint64) []byte {
		if block == nil || n == BlockSize {
			return nil
		}
		clear(block[within : within+n])
		return block
	})
}

func (d *Disk) update(off, length uint64, fill func(block []byte, within, n, done uint64) []byte) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for done := uint64(0); done < length; {
		position := off + done
		index, within := position/BlockSize, position%BlockSize
		n := min(length-done, BlockSize-within)
		if block := fill(d.blocks[index], within, n, done); block != nil {
			d.blocks[index] = block
		} else {
			delete(d.blocks, index)
		}
		done += n
	}
}

// Backend is an nbd.Backend of Disks. Export names: "NAME" opens a disk
// read-write, "ro/NAME" read-only (herd's gateway convention), "NAME@TAG" a
// disk added under that exact name, read-only (a snapshot).
type Backend struct {
	mu    sync.Mutex // guards disks
	disks map[string]*Disk
}

// NewBackend returns a Backend serving disks.
func NewBackend(disks ...*Disk) *Backend {
	b := &Backend{disks: make(map[string]*Disk)}
	for _, disk := range disks {
		b.Add(disk)
	}
	return b
}

// Add serves disk under its name.
func (b *Backend) Add(disk *Disk) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.disks[disk.Name] = disk
}

// List implements nbd.Backend.
func (b *Backend) List(ctx context.Context, session nbd.Session) ([]nbd.ExportSummary, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var list []nbd.ExportSummary
	for name := range b.disks {
		list = append(list, nbd.ExportSummary{Name: name})
	}
	return list, nil
}

// MetaContexts implements nbd.MetaContexter with the disk's Meta: SET
// selects exact names, a LIST query ending in ':' matches every name it
// prefixes, no query every name.
func (b *Backend) MetaContexts(ctx context.Context, exportName string, session nbd.Session, queries []string, list bool) ([]string, error) {
	name := exportname.Parse(exportName).Full()
	b.mu.Lock()
	disk := b.disks[name]
	b.mu.Unlock()
	if disk == nil {
		return nil, nil
	}
	var names []string
	for context := range disk.Meta {
		names = append(names, context)
	}
	sort.Strings(names)
	var out []string
	for _, context := range names {
		matched := list && len(queries) == 0
		for _, query := range queries {
			matched = matched || query == context || (list && strings.HasSuffix(query, ":") && strings.HasPrefix(context, query))
		}
		if matched {
			out = append(out, context)
		}
	}
	return out, nil
}

// Open implements nbd.Backend.
func (b *Backend) Open(ctx context.Context, name string, session nbd.Session) (nbd.Export, error) {
	parsed := exportname.Parse(name)
	readOnly, name := !parsed.Writable(), parsed.Full()
	b.mu.Lock()
	disk := b.disks[name]
	b.mu.Unlock()
	if disk == nil {
		return nil, fmt.Errorf("%w: vdi %q not found", nbd.ErrUnknownExport, name)
	}
	info := disk.Info
	info.Size = disk.size
	info.ReadOnly = info.ReadOnly || readOnly
	return &export{disk: disk, info: info}, nil
}

type export struct {
	disk *Disk
	info nbd.ExportInfo
}

func (e *export) Info() nbd.ExportInfo { return e.info }

func (e *export) check(operation string, off, length uint64) error {
	if e.disk.Fail != nil {
		return e.disk.Fail(operation, off, length)
	}
	return nil
}

func (e *export) ReadAt(ctx context.Context, p []byte, off uint64) error {
	e.disk.Reads.Add(1)
	if err := e.check("read", off, uint64(len(p))); err != nil {
		return err
	}
	e.disk.ReadAt(p, off)
	return nil
}

func (e *export) WriteAt(ctx context.Context, p []byte, off uint64, fua bool) error {
	e.disk.Writes.Add(1)
	e.disk.WriteBytes.Add(int64(len(p)))
	if err := e.check("write", off, uint64(len(p))); err != nil {
		return err
	}
	e.disk.WriteAt(p, off)
	return nil
}

func (e *export) Flush(ctx context.Context) error {
	e.disk.Flushes.Add(1)
	return e.check("flush", 0, 0)
}

func (e *export) Trim(ctx context.Context, off, length uint64, fua bool) error {
	e.disk.Trims.Add(1)
	if err := e.check("trim", off, length); err != nil {
		return err
	}
	e.disk.Punch(off, length)
	return nil
}

func (e *export) WriteZeroes(ctx context.Context, off, length uint64, noHole, fua bool) error {
	e.disk.Zeroes.Add(1)
	if err := e.check("zero", off, length); err != nil {
		return err
	}
	if !noHole {
		e.disk.Punch(off, length)
		return nil
	}
	e.disk.update(off, length, func(block []byte, within, n, done uint64) []byte {
		if block == nil {
			return make([]byte, BlockSize)
		}
		clear(block[within : within+n])
		return block
	})
	return nil
}

func (e *export) BlockStatus(ctx context.Context, off, length uint64) ([]nbd.Extent, error) {
	e.disk.BlockStatuses.Add(1)
	if err := e.check("block-status", off, length); err != nil {
		return nil, err
	}
	e.disk.mu.RLock()
	defer e.disk.mu.RUnlock()
	var extents []nbd.Extent
	end := min(off+length, e.disk.size)
	for position := off; position < end; {
		index := position / BlockSize
		n := min(end-position, (index+1)*BlockSize-position)
		_, allocated := e.disk.blocks[index]
		if last := len(extents) - 1; last >= 0 && extents[last].Hole == !allocated {
			extents[last].Length += n
		} else {
			extents = append(extents, nbd.Extent{Length: n, Hole: !allocated, Zero: !allocated})
		}
		position += n
	}
	return extents, nil
}

// HasMetaContext implements nbd.MetaStatuser.
func (e *export) HasMetaContext(name string) bool {
	_, ok := e.disk.Meta[name]
	return ok
}

// MetaStatus implements nbd.MetaStatuser: the context's extents from off.
func (e *export) MetaStatus(ctx context.Context, name string, off, length uint64) ([]nbd.MetaExtent, error) {
	if err := e.check("meta-status", off, length); err != nil {
		return nil, err
	}
	var out []nbd.MetaExtent
	position := uint64(0)
	for _, extent := range e.disk.Meta[name] {
		end := position + extent.Length
		if end > off {
			out = append(out, nbd.MetaExtent{Length: end - max(position, off), Flags: extent.Flags})
		}
		position = end
	}
	return out, nil
}

func (e *export) Close() error { return nil }

// Serve serves backend with an nbd.Server on 127.0.0.1 (a free port) until
// the test ends, and returns the address.
func Serve(t testing.TB, backend nbd.Backend) string {
	t.Helper()
	return ServeTLS(t, backend, nil)
}

// ServeTLS is Serve with STARTTLS required under config (nil: plaintext).
func ServeTLS(t testing.TB, backend nbd.Backend, config *tls.Config) string {
	t.Helper()
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("nbdtest: listen: %v", err)
	}
	server := &nbd.Server{Backend: backend, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), TLSConfig: config, RequireTLS: config != nil}
	served := make(chan error, 1)
	go func() { served <- server.Serve(context.Background(), listener) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := server.Shutdown(ctx); err != nil {
			t.Errorf("nbdtest: shutdown: %v", err)
		}
		if err := <-served; !errors.Is(err, nbd.ErrServerClosed) {
			t.Errorf("nbdtest: Serve returned %v", err)
		}
	})
	return listener.Addr().String()
}
