package gateway

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/nbd"
)

// export is one NBD connection's handle on an open VDI. Its methods are
// called concurrently (many requests in flight per connection).
type export struct {
	gateway  *Gateway
	state    *vdiState
	readOnly bool
	size     uint64
	closed   sync.Once
}

// Info implements nbd.Export.
func (e *export) Info() nbd.ExportInfo {
	vdi, _ := e.state.current()
	return nbd.ExportInfo{
		Size:               e.size,
		Name:               vdi.FullName(),
		Description:        fmt.Sprintf("herd vdi %s (id %d, %d copies)", vdi.FullName(), vdi.ID, vdi.Copies),
		ReadOnly:           e.readOnly,
		CanFlush:           true,
		CanFUA:             true,
		CanTrim:            !e.readOnly,
		CanWriteZeroes:     !e.readOnly,
		CanMultiConn:       true,
		BlockSizeMinimum:   1,
		BlockSizePreferred: 4096,
		PayloadSizeMaximum: 32 << 20,
	}
}

// piece is the part of a request that falls in one object.
type piece struct {
	index  uint32 // object index in the VDI
	within uint32 // offset inside the object
	start  uint64 // offset inside the request
	length uint64
}

func (e *export) pieces(offset, length uint64) ([]piece, error) {
	vdi, _ := e.state.current()
	if offset+length > e.size || offset+length < offset {
		return nil, fmt.Errorf("%w: request [%d, +%d) beyond the end of vdi %q (%d bytes)", nbd.ErrInvalid, offset, length, vdi.Name, e.size)
	}
	objectSize := vdi.ObjectSize
	var out []piece
	for done := uint64(0); done < length; {
		at := offset + done
		within := at % objectSize
		n := min(length-done, objectSize-within)
		out = append(out, piece{index: uint32(at / objectSize), within: uint32(within), start: done, length: n})
		done += n
	}
	return out, nil
}

// each runs fn for every piece, in parallel when there are several.
func each(pieces []piece, fn func(piece) error) error {
	if len(pieces) == 1 {
		return fn(pieces[0])
	}
	errs := make([]error, len(pieces))
	var wg sync.WaitGroup
	for i, p := range pieces {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = fn(p)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// ReadAt implements nbd.Export.
func (e *export) ReadAt(ctx context.Context, p []byte, offset uint64) error {
	pieces, err := e.pieces(offset, uint64(len(p)))
	if err != nil {
		return err
	}
	g, state := e.gateway, e.state
	state.io.RLock()
	defer state.io.RUnlock()
	vdi, chain := state.current()
	return toNBD(each(pieces, func(pc piece) error {
		buffer := p[pc.start : pc.start+pc.length]
		// A read-only open of a VDI written elsewhere re-reads the map
		// page where it saw nothing: the writer may have written since.
		owner, err := g.resolve(ctx, state, vdi, chain, pc.index, false)
		if err == nil && owner == 0 && e.readOnly && !vdi.Snapshot {
			owner, err = g.resolve(ctx, state, vdi, chain, pc.index, true)
		}
		if err != nil {
			return err
		}
		if owner == 0 {
			clear(buffer)
			return nil
		}
		return g.read(ctx, DataOID(owner, pc.index), vdi.Copies, buffer, pc.within)
	}))
}

// WriteAt implements nbd.Export.
func (e *export) WriteAt(ctx context.Context, p []byte, offset uint64, fua bool) error {
	if e.readOnly {
		return nbd.ErrReadOnly
	}
	pieces, err := e.pieces(offset, uint64(len(p)))
	if err != nil {
		return err
	}
	e.state.io.RLock()
	defer e.state.io.RUnlock()
	vdi, chain := e.state.current()
	return toNBD(each(pieces, func(pc piece) error {
		return e.writePiece(ctx, vdi, chain, pc.index, p[pc.start:pc.start+pc.length], pc.within, fua)
	}))
}

// owned returns object index's owner, and when this VDI does not own it
// yet, takes the object's allocation lock (the caller must unlock) and
// returns the owner seen under it.
func (e *export) owned(ctx context.Context, vdi cluster.VDI, chain []uint32, index uint32) (owner uint32, unlock func(), err error) {
	g, state := e.gateway, e.state
	if owner, err = g.resolve(ctx, state, vdi, chain, index, false); err != nil || owner == vdi.ID {
		return owner, func() {}, err
	}
	lock := &state.allocation[index%uint32(len(state.allocation))]
	lock.Lock()
	if owner, err = g.resolve(ctx, state, vdi, chain, index, false); err != nil || owner == vdi.ID {
		lock.Unlock()
		return owner, func() {}, err
	}
	return owner, lock.Unlock, nil
}

func (e *export) writePiece(ctx context.Context, vdi cluster.VDI, chain []uint32, index uint32, p []byte, within uint32, fua bool) error {
	g, state := e.gateway, e.state
	owner, unlock, err := e.owned(ctx, vdi, chain, index)
	defer unlock()
	if err != nil {
		return err
	}
	oid := DataOID(vdi.ID, index)
	if owner == vdi.ID {
		return g.write(ctx, oid, vdi.Copies, p, within, WriteFlags{Sync: fua})
	}
	// First write to this object in this VDI: the data goes to every
	// replica, then the map entry, then the answer. A crash in between
	// leaves an unreferenced object, never an entry without data. When an
	// ancestor (a snapshot) owns the object, copy it first.
	data := p
	if owner != 0 && (within != 0 || uint64(len(p)) != vdi.ObjectSize) {
		data = make([]byte, vdi.ObjectSize)
		if err := g.read(ctx, DataOID(owner, index), vdi.Copies, data, 0); err != nil {
			return fmt.Errorf("copy-on-write of object %d from vdi %d: %w", index, owner, err)
		}
		copy(data[within:], p)
		within = 0
	}
	if err := g.write(ctx, oid, vdi.Copies, data, within, WriteFlags{Create: true, Sync: fua}); err != nil {
		return err
	}
	return g.setEntry(ctx, state, vdi, vdi.ID, index, vdi.ID, fua)
}

// Flush implements nbd.Export.
func (e *export) Flush(ctx context.Context) error {
	return toNBD(e.gateway.flush(ctx))
}

// Trim implements nbd.Export.
func (e *export) Trim(ctx context.Context, offset, length uint64, fua bool) error {
	return e.zero(ctx, offset, length, false, fua)
}

// WriteZeroes implements nbd.Export.
func (e *export) WriteZeroes(ctx context.Context, offset, length uint64, noHole, fua bool) error {
	return e.zero(ctx, offset, length, noHole, fua)
}

// zero makes a range read as zeros. A piece covering a whole object frees
// it (unless noHole): the map entry becomes "zeros" first, then the
// object goes from every replica. A partial piece punches a hole (or
// writes zeros) in this VDI's copy, copying an ancestor's first.
func (e *export) zero(ctx context.Context, offset, length uint64, noHole, fua bool) error {
	if e.readOnly {
		return nbd.ErrReadOnly
	}
	pieces, err := e.pieces(offset, length)
	if err != nil {
		return err
	}
	g, state := e.gateway, e.state
	state.io.RLock()
	defer state.io.RUnlock()
	vdi, chain := state.current()
	return toNBD(each(pieces, func(pc piece) error {
		owner, unlock, err := e.owned(ctx, vdi, chain, pc.index)
		defer unlock()
		if err != nil || owner == 0 {
			return err // already zeros
		}
		whole := pc.within == 0 && pc.length == vdi.ObjectSize
		oid := DataOID(vdi.ID, pc.index)
		if whole && !noHole {
			value := uint32(0)
			if len(chain) > 1 {
				value = tombstone // do not inherit an ancestor's data
			}
			if err := g.setEntry(ctx, state, vdi, vdi.ID, pc.index, value, fua); err != nil {
				return err
			}
			if owner == vdi.ID {
				return g.remove(ctx, oid, vdi.Copies)
			}
			return nil
		}
		if owner != vdi.ID {
			// Copy the ancestor's object, zeroing the range on the way.
			data := make([]byte, vdi.ObjectSize)
			if !whole {
				if err := g.read(ctx, DataOID(owner, pc.index), vdi.Copies, data, 0); err != nil {
					return err
				}
				clear(data[pc.within : uint64(pc.within)+pc.length])
			}
			if err := g.write(ctx, oid, vdi.Copies, data, 0, WriteFlags{Create: true, Sync: fua}); err != nil {
				return err
			}
			return g.setEntry(ctx, state, vdi, vdi.ID, pc.index, vdi.ID, fua)
		}
		flags := WriteFlags{Sync: fua, NoHole: noHole}
		return g.mutate(ctx, oid, vdi.Copies, func(ctx context.Context, node cluster.Node, rv *ringView) error {
			return g.replicas.Zero(ctx, node, rv.epoch, oid, pc.within, uint32(pc.length), flags)
		})
	}))
}

// BlockStatus implements nbd.Export (base:allocation): objects this VDI
// reads zeros from are holes.
func (e *export) BlockStatus(ctx context.Context, offset, length uint64) ([]nbd.Extent, error) {
	pieces, err := e.pieces(offset, length)
	if err != nil {
		return nil, err
	}
	vdi, chain := e.state.current()
	refresh := e.readOnly && !vdi.Snapshot
	extents := make([]nbd.Extent, 0, len(pieces))
	for _, pc := range pieces {
		owner, err := e.gateway.resolve(ctx, e.state, vdi, chain, pc.index, refresh)
		if err != nil {
			return nil, toNBD(err)
		}
		hole := owner == 0
		if n := len(extents); n > 0 && extents[n-1].Hole == hole {
			extents[n-1].Length += pc.length
			continue
		}
		extents = append(extents, nbd.Extent{Length: pc.length, Hole: hole, Zero: hole})
	}
	return extents, nil
}

// Close implements nbd.Export.
func (e *export) Close() error {
	kind := openWriter
	if e.readOnly {
		kind = openReader
	}
	e.closed.Do(func() { e.gateway.release(e.state, kind) })
	return nil
}

// toNBD translates gateway errors to the NBD errors clients see; the
// message keeps the detail for the server log.
func toNBD(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, nbd.ErrInvalid), errors.Is(err, nbd.ErrReadOnly), errors.Is(err, nbd.ErrNoSpace), errors.Is(err, nbd.ErrIO):
		return err
	case errors.Is(err, context.Canceled):
		return fmt.Errorf("%w: %v", nbd.ErrShutdown, err)
	case isNoSpace(err):
		return fmt.Errorf("%w: %v", nbd.ErrNoSpace, err)
	}
	return fmt.Errorf("%w: %v", nbd.ErrIO, err)
}
