package nbd

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
)

// memoryBlockSize is the allocation unit of memoryDisk: holes are tracked
// per block.
const memoryBlockSize = 4096

// memoryBackend is a Backend of in-memory sparse disks, for tests.
type memoryBackend struct {
	mu    sync.Mutex // guards disks and sessions
	disks map[string]*memoryDisk
	// sessions records the session of every List and Open call, for
	// tests of what the server tells the Backend about its client.
	sessions []Session
	// metaError, if set, is what MetaContexts returns.
	metaError error
}

// recordedSessions returns the sessions of the List and Open calls so far.
func (b *memoryBackend) recordedSessions() []Session {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]Session(nil), b.sessions...)
}

func newMemoryBackend(disks ...*memoryDisk) *memoryBackend {
	backend := &memoryBackend{disks: make(map[string]*memoryDisk)}
	for _, disk := range disks {
		backend.disks[disk.name] = disk
	}
	return backend
}

func (b *memoryBackend) List(ctx context.Context, session Session) ([]ExportSummary, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.sessions = append(b.sessions, session)
	var summaries []ExportSummary
	for _, disk := range b.disks {
		summaries = append(summaries, ExportSummary{Name: disk.name, Description: disk.description})
	}
	sort.Slice(summaries, func(i, j int) bool { return summaries[i].Name < summaries[j].Name })
	return summaries, nil
}

// Open resolves "name" and "name@snapshot"; the latter is a read-only view
// of the same disk (enough for protocol tests).
func (b *memoryBackend) Open(ctx context.Context, name string, session Session) (Export, error) {
	base, _, snapshot := strings.Cut(name, "@")
	b.mu.Lock()
	b.sessions = append(b.sessions, session)
	disk := b.disks[base]
	b.mu.Unlock()
	if disk == nil {
		return nil, fmt.Errorf("%w: %q", ErrUnknownExport, name)
	}
	if disk.openError != nil {
		return nil, disk.openError
	}
	readOnly := disk.info.ReadOnly || snapshot
	if disk.exclusive && !readOnly {
		disk.mu.Lock()
		holder := disk.holder
		if holder == nil {
			disk.holder = &session
		}
		disk.mu.Unlock()
		if holder != nil {
			return nil, fmt.Errorf("%w: %q is held by connection %d from %s", ErrExportBusy, name, holder.ID, holder.RemoteAddress)
		}
	}
	disk.opens.Add(1)
	info := disk.info
	info.Size = disk.size
	info.ReadOnly = readOnly
	info.Description = disk.description
	return &memoryExport{disk: disk, info: info, holder: disk.exclusive && !readOnly}, nil
}

// MetaContexts implements MetaContexter with each disk's meta contexts:
// a LIST query ending in ':' matches every context it prefixes.
func (b *memoryBackend) MetaContexts(ctx context.Context, exportName string, session Session, queries []string, list bool) ([]string, error) {
	base, _, _ := strings.Cut(strings.TrimPrefix(exportName, "ro/"), "@")
	b.mu.Lock()
	disk := b.disks[base]
	b.mu.Unlock()
	if b.metaError != nil {
		return nil, b.metaError
	}
	if disk == nil {
		return nil, nil
	}
	disk.mu.RLock()
	defer disk.mu.RUnlock()
	var names []string
	for name := range disk.meta {
		names = append(names, name)
	}
	sort.Strings(names)
	var out []string
	if !list {
		for _, query := range queries {
			if _, ok := disk.meta[query]; ok {
				out = append(out, query)
			}
		}
		return out, nil
	}
	for _, name := range names {
		matched := len(queries) == 0
		for _, query := range queries {
			matched = matched || query == name || (strings.HasSuffix(query, ":") && strings.HasPrefix(name, query))
		}
		if matched {
			out = append(out, name)
		}
	}
	return out, nil
}

// memoryDisk is one sparse disk.
type memoryDisk struct {
	name        string
	description string
	size        uint64
	info        ExportInfo // features advertised; Size is taken from size
	exclusive   bool       // one writer at a time, like a VDI lock
	openError   error
	// gate, if set, is called at the start of every I/O call; tests use it
	// to block, fail or panic.
	gate func(ctx context.Context, operation string) error

	opens   atomic.Int64
	closes  atomic.Int64
	misuses atomic.Int64

	mu     sync.RWMutex // guards blocks, holder and meta
	blocks map[uint64][]byte
	holder *Session
	// meta are the disk's metadata contexts besides base:allocation and
	// the extents each answers from offset 0 (tests set them).
	meta map[string][]MetaExtent
}

// setMeta gives the disk a metadata context answering extents (nil
// removes it).
func (d *memoryDisk) setMeta(name string, extents []MetaExtent) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.meta == nil {
		d.meta = map[string][]MetaExtent{}
	}
	if extents == nil {
		delete(d.meta, name)
		return
	}
	d.meta[name] = extents
}

func newMemoryDisk(name string, size uint64) *memoryDisk {
	return &memoryDisk{
		name:        name,
		description: "test disk " + name,
		size:        size,
		info: ExportInfo{
			CanFlush: true, CanFUA: true, CanTrim: true, CanWriteZeroes: true,
			CanMultiConn: true, BlockSizeMinimum: 1, BlockSizePreferred: 4096,
			PayloadSizeMaximum: 32 << 20,
		},
		blocks: make(map[uint64][]byte),
	}
}

// allocatedBlocks is for tests that check sparseness.
func (d *memoryDisk) allocatedBlocks() int {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return len(d.blocks)
}

// snapshot returns a copy of the whole disk's contents.
func (d *memoryDisk) contents() []byte {
	data := make([]byte, d.size)
	d.readAt(data, 0)
	return data
}

func (d *memoryDisk) readAt(p []byte, off uint64) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	for done := 0; done < len(p); {
		position := off + uint64(done)
		index, within := position/memoryBlockSize, position%memoryBlockSize
		n := min(len(p)-done, int(memoryBlockSize-within))
		if block, ok := d.blocks[index]; ok {
			copy(p[done:done+n], block[within:])
		} else {
			clear(p[done : done+n])
		}
		done += n
	}
}

// update applies fill to every block piece of [off, off+length). fill gets
// the block (nil if absent) and the piece; it returns the block to store
// (nil to delete).
func (d *memoryDisk) update(off, length uint64, fill func(block []byte, within, n, done uint64) []byte) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for done := uint64(0); done < length; {
		position := off + done
		index, within := position/memoryBlockSize, position%memoryBlockSize
		n := min(length-done, memoryBlockSize-within)
		if block := fill(d.blocks[index], within, n, done); block != nil {
			d.blocks[index] = block
		} else {
			delete(d.blocks, index)
		}
		done += n
	}
}

type memoryExport struct {
	disk   *memoryDisk
	info   ExportInfo
	holder bool
	closed atomic.Bool
}

func (e *memoryExport) Info() ExportInfo { return e.info }

func (e *memoryExport) gate(ctx context.Context, operation string) error {
	if e.closed.Load() {
		e.disk.misuses.Add(1) // the server must not call an export after Close
	}
	if e.disk.gate != nil {
		return e.disk.gate(ctx, operation)
	}
	return nil
}

func (e *memoryExport) ReadAt(ctx context.Context, p []byte, off uint64) error {
	if err := e.gate(ctx, "read"); err != nil {
		return err
	}
	e.disk.readAt(p, off)
	return nil
}

func (e *memoryExport) WriteAt(ctx context.Context, p []byte, off uint64, fua bool) error {
	if err := e.gate(ctx, "write"); err != nil {
		return err
	}
	e.disk.update(off, uint64(len(p)), func(block []byte, within, n, done uint64) []byte {
		if block == nil {
			block = make([]byte, memoryBlockSize)
		}
		copy(block[within:within+n], p[done:done+n])
		return block
	})
	return nil
}

func (e *memoryExport) Flush(ctx context.Context) error {
	return e.gate(ctx, "flush")
}

// Trim punches whole blocks and zeroes the partial ones.
func (e *memoryExport) Trim(ctx context.Context, off, length uint64, fua bool) error {
	if err := e.gate(ctx, "trim"); err != nil {
		return err
	}
	e.punch(off, length)
	return nil
}

func (e *memoryExport) punch(off, length uint64) {
	e.disk.update(off, length, func(block []byte, within, n, done uint64) []byte {
		if block == nil || n == memoryBlockSize {
			return nil
		}
		clear(block[within : within+n])
		return block
	})
}

func (e *memoryExport) WriteZeroes(ctx context.Context, off, length uint64, noHole, fua bool) error {
	if err := e.gate(ctx, "zero"); err != nil {
		return err
	}
	if !noHole {
		e.punch(off, length)
		return nil
	}
	e.disk.update(off, length, func(block []byte, within, n, done uint64) []byte {
		if block == nil {
			return make([]byte, memoryBlockSize)
		}
		clear(block[within : within+n])
		return block
	})
	return nil
}

func (e *memoryExport) BlockStatus(ctx context.Context, off, length uint64) ([]Extent, error) {
	if err := e.gate(ctx, "block-status"); err != nil {
		return nil, err
	}
	e.disk.mu.RLock()
	defer e.disk.mu.RUnlock()
	var extents []Extent
	end := min(off+length, e.disk.size)
	for position := off; position < end; {
		index := position / memoryBlockSize
		n := min(end-position, (index+1)*memoryBlockSize-position)
		_, allocated := e.disk.blocks[index]
		extent := Extent{Length: n, Hole: !allocated, Zero: !allocated}
		if last := len(extents) - 1; last >= 0 && extents[last].Hole == extent.Hole {
			extents[last].Length += n
		} else {
			extents = append(extents, extent)
		}
		position += n
	}
	return extents, nil
}

// HasMetaContext implements MetaStatuser.
func (e *memoryExport) HasMetaContext(name string) bool {
	e.disk.mu.RLock()
	defer e.disk.mu.RUnlock()
	_, ok := e.disk.meta[name]
	return ok
}

// MetaStatus implements MetaStatuser: the context's extents from off,
// the first one cut at off.
func (e *memoryExport) MetaStatus(ctx context.Context, name string, off, length uint64) ([]MetaExtent, error) {
	if err := e.gate(ctx, "meta-status"); err != nil {
		return nil, err
	}
	e.disk.mu.RLock()
	defer e.disk.mu.RUnlock()
	extents, ok := e.disk.meta[name]
	if !ok {
		return nil, fmt.Errorf("%w: no context %q", ErrInvalid, name)
	}
	var out []MetaExtent
	position := uint64(0)
	for _, extent := range extents {
		end := position + extent.Length
		if end > off {
			start := max(position, off)
			out = append(out, MetaExtent{Length: end - start, Flags: extent.Flags})
		}
		position = end
	}
	return out, nil
}

func (e *memoryExport) Close() error {
	if e.closed.Swap(true) {
		e.disk.misuses.Add(1) // Close must be called exactly once
		return nil
	}
	if e.holder {
		e.disk.mu.Lock()
		e.disk.holder = nil
		e.disk.mu.Unlock()
	}
	e.disk.closes.Add(1)
	return nil
}
