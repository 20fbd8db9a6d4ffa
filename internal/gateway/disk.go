package gateway

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/ec"
	"github.com/herd-storage/herd/internal/layout"
	"github.com/herd-storage/herd/internal/object"
	"github.com/herd-storage/herd/internal/objmap"
)

// Disk is one open of a VDI through this node (an NBD connection's, say).
// Its methods may be called concurrently (many requests in flight); every
// open of the same VDI through this node shares one state, so they see
// each other's writes.
type Disk struct {
	gateway  *Gateway
	state    *vdiState
	readOnly bool
	size     uint64
	closed   sync.Once
	client   string    // the client's address, when the opener said
	since    time.Time // opened
	// takeoverCheck, if set, is asked before this open takes the VDI's
	// writer lock (SetTakeoverCheck).
	takeoverCheck func() error
}

// SetTakeoverCheck makes every take of the VDI's writer lock by this open
// (a standby's first request taking it over from another node, or taking
// it again after losing it; handover.go) ask check first, and again once
// the lock is this node's: an error fails the request, which then
// changes nothing. The NBD layer asks whether the client may still write
// (not revoked), so a lock is never taken over for a client revoked while
// its open was on standby. Call it before the disk's first request.
func (d *Disk) SetTakeoverCheck(check func() error) { d.takeoverCheck = check }

// VDI is the VDI this disk reads and writes (after a snapshot taken
// while it is open: the writable child).
func (d *Disk) VDI() cluster.VDI {
	vdi, _ := d.state.current()
	return vdi
}

// ReadOnly says whether the disk was opened read-only.
func (d *Disk) ReadOnly() bool { return d.readOnly }

// Size is the disk's size in bytes, as it was opened.
func (d *Disk) Size() uint64 { return d.size }

// piece is the part of a request that falls in one object.
type piece struct {
	index  uint32 // object index in the VDI
	within uint32 // offset inside the object
	start  uint64 // offset inside the request
	length uint64
}

// pieces checks a request's range and returns its pieces (see span).
func (d *Disk) pieces(offset, length uint64) (span, error) {
	vdi, _ := d.state.current()
	if offset+length > d.size || offset+length < offset {
		return span{}, fmt.Errorf("%w: request [%d, +%d), vdi %q is %d bytes", ErrOutOfRange, offset, length, vdi.Name, d.size)
	}
	return span{offset: offset, length: length, objectSize: vdi.ObjectSize}, nil
}

// each runs fn for every piece of s, Options.PiecesPerRequest at a time.
func (d *Disk) each(ctx context.Context, s span, fn func(piece) error) error {
	return each(ctx, s, d.gateway.options.PiecesPerRequest, fn)
}

// followName gives a read-only open of NAME (ro/NAME) the VDI that has
// the name now, as this node's log has it: a snapshot or a rollback
// gives the name a new VDI, and the old one, now the snapshot, no
// longer takes the writer's writes. Returns the state's VDI and chain.
func (g *Gateway) followName(state *vdiState) (cluster.VDI, []uint32) {
	vdi, chain := state.current()
	now, err := g.cluster.VDI(vdi.Name)
	if err != nil || now.ID == vdi.ID {
		return vdi, chain
	}
	nowChain := g.cluster.Chain(now.ID)
	state.mu.Lock()
	defer state.mu.Unlock()
	if state.vdi.ID == vdi.ID {
		state.vdi, state.chain = now, nowChain
		state.dropPagesLocked()
	}
	return state.vdi, state.chain
}

// ReadAt reads len(p) bytes at offset.
func (d *Disk) ReadAt(ctx context.Context, p []byte, offset uint64) error {
	pieces, err := d.pieces(offset, uint64(len(p)))
	if err != nil {
		return err
	}
	g, state := d.gateway, d.state
	// QoS first, never under io (qos.go rule 2).
	if err := state.limiter.wait(ctx, false, uint64(len(p))); err != nil {
		return err
	}
	state.io.RLock()
	defer state.io.RUnlock()
	if !d.readOnly {
		// A writable open reads as the writer: on standby, its first
		// request of any kind takes the lock over (handover.go).
		if err := g.writer.ensureWriter(ctx, state, d.takeoverCheck); err != nil {
			return err
		}
	}
	release, err := d.slot(ctx)
	if err != nil {
		return err
	}
	defer release()
	vdi, chain := state.current()
	if d.readOnly && !vdi.Snapshot {
		// What the writer committed before this read began (a snapshot
		// moving the name to a new VDI) is applied here first (agree.go).
		if err := g.syncForRead(ctx); err != nil {
			return err
		}
		vdi, chain = g.followName(state)
		if !vdi.Snapshot {
			// Written through another node: a read returns only what
			// every replica holds (agree.go).
			ctx = withAgreement(ctx, vdi.ID)
		}
	}
	return d.each(ctx, pieces, func(pc piece) error {
		buffer := p[pc.start : pc.start+pc.length]
		// A read-only open of a VDI written elsewhere re-reads the map
		// page where it saw nothing of the VDI's own (a hole, or an
		// ancestor's object): the writer may have written since, or
		// copied the ancestor's object into its own on a first write.
		owner, err := g.resolve(ctx, state, vdi, chain, pc.index, false)
		if err == nil && owner != vdi.ID && d.readOnly && !vdi.Snapshot {
			owner, err = g.resolve(ctx, state, vdi, chain, pc.index, true)
		}
		if err != nil {
			return err
		}
		if owner == 0 {
			clear(buffer)
			return nil
		}
		err = d.readData(ctx, vdi, owner, pc.index, buffer, pc.within)
		if err != nil && owner != vdi.ID && isGone(err) {
			// An ancestor's object freed after a merge or flatten took
			// its layer out of the chain (merge.go): read through the
			// chain the log has now, every map page again.
			g.layers.refreshChain(state)
			state.mu.Lock()
			state.dropPagesLocked()
			state.mu.Unlock()
			v, c := state.current()
			if owner, err = g.resolve(ctx, state, v, c, pc.index, false); err != nil {
				return err
			}
			if owner == 0 {
				clear(buffer)
				return nil
			}
			err = d.readData(ctx, vdi, owner, pc.index, buffer, pc.within)
		}
		return err
	})
}

// readData reads p at within of object index, which VDI owner (vdi or
// one of its ancestors) owns.
func (d *Disk) readData(ctx context.Context, vdi cluster.VDI, owner, index uint32, p []byte, within uint32) error {
	g := d.gateway
	oid := object.DataOID(object.VDIID(owner), index)
	conf, err := g.ecOf(vdi)
	if err != nil {
		return err
	}
	if conf != nil {
		writer := !d.readOnly && owner == vdi.ID
		live := d.readOnly && !vdi.Snapshot && owner == vdi.ID
		return g.ecRead(ctx, d.state, conf, oid, p, within, writer, live)
	}
	return g.read(ctx, oid, vdi.Copies, p, within)
}

// WriteAt writes p at offset; with fua, durable on every replica before it returns.
func (d *Disk) WriteAt(ctx context.Context, p []byte, offset uint64, fua bool) error {
	if d.readOnly {
		return ErrReadOnly
	}
	pieces, err := d.pieces(offset, uint64(len(p)))
	if err != nil {
		return err
	}
	// QoS first, never under io (qos.go rule 2).
	if err := d.state.limiter.wait(ctx, true, uint64(len(p))); err != nil {
		return err
	}
	d.state.io.RLock()
	defer d.state.io.RUnlock()
	if err := d.gateway.writer.ensureWriter(ctx, d.state, d.takeoverCheck); err != nil {
		return err
	}
	release, err := d.slot(ctx)
	if err != nil {
		return err
	}
	defer release()
	ctx = d.gateway.writer.withFence(ctx, d.state)
	vdi, chain := d.state.current()
	return d.each(ctx, pieces, func(pc piece) error {
		return d.writePiece(ctx, vdi, chain, pc.index, p[pc.start:pc.start+pc.length], pc.within, fua)
	})
}

// owned returns object index's owner, and when this VDI does not own it
// yet, takes the object's allocation lock (the caller must unlock) and
// returns the owner seen under it.
func (d *Disk) owned(ctx context.Context, vdi cluster.VDI, chain []uint32, index uint32) (owner uint32, unlock func(), err error) {
	g, state := d.gateway, d.state
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

func (d *Disk) writePiece(ctx context.Context, vdi cluster.VDI, chain []uint32, index uint32, p []byte, within uint32, fua bool) error {
	g, state := d.gateway, d.state
	owner, unlock, err := d.owned(ctx, vdi, chain, index)
	defer unlock()
	if err != nil {
		return err
	}
	oid := object.DataOID(object.VDIID(vdi.ID), index)
	// Zone mode (lag.go): without FUA, acknowledged once this zone's
	// replicas have it.
	near := !fua && state.limiter.ackZone.Load()
	conf, err := g.ecOf(vdi)
	if err != nil {
		return err
	}
	if conf != nil {
		// Erasure-coded (ec.go): --ack zone is refused for such a VDI.
		if owner == vdi.ID {
			return g.ecWrite(ctx, state, conf, oid, p, within, object.Flags(0).With(object.FlagSync, fua))
		}
		if owner != 0 && (within != 0 || uint64(len(p)) != vdi.ObjectSize) {
			err = g.copyObject(ctx, vdi, owner, index, fua, func(data []byte) { copy(data[within:], p) })
		} else {
			err = g.ecWrite(ctx, state, conf, oid, p, within, (object.FlagCreate|object.FlagFresh).With(object.FlagSync, fua))
		}
		if err != nil {
			return err
		}
		return g.setEntry(ctx, state, vdi, vdi.ID, index, vdi.ID, fua)
	}
	if owner == vdi.ID {
		if near {
			_, err := g.lag.writeNear(ctx, oid, vdi.Copies, p, within, 0, vdi.ObjectSize, nil)
			return err
		}
		return g.write(ctx, oid, vdi.Copies, p, within, object.Flags(0).With(object.FlagSync, fua))
	}
	// First write to this object in this VDI: the data goes to every
	// replica, then the map entry, then the answer. A crash in between
	// leaves an unreferenced object, never an entry without data. When an
	// ancestor (a snapshot) owns the object, copy it first, unless this
	// piece replaces all of it.
	var data *lagOp // the far part of a fresh object's data, in zone mode
	if owner != 0 && (within != 0 || uint64(len(p)) != vdi.ObjectSize) {
		err = g.copyObject(ctx, vdi, owner, index, fua, func(data []byte) { copy(data[within:], p) })
	} else if near {
		data, err = g.lag.writeNear(ctx, oid, vdi.Copies, p, within, object.FlagCreate|object.FlagFresh, vdi.ObjectSize, nil)
	} else {
		// Fresh: a copy of this object may exist already, unreferenced,
		// left by a first write or a remove that failed on some replicas
		// (its gateway died before repairing it). Its bytes must not show
		// beside this piece, nor differ between replicas.
		err = g.write(ctx, oid, vdi.Copies, p, within, (object.FlagCreate|object.FlagFresh).With(object.FlagSync, fua))
	}
	if err != nil {
		return err
	}
	if near {
		// The entry reaches each zone after the data did (lag.go, rule 2).
		return g.setEntryNear(ctx, state, vdi, vdi.ID, index, vdi.ID, data)
	}
	return g.setEntry(ctx, state, vdi, vdi.ID, index, vdi.ID, fua)
}

// copyObject creates this VDI's own copy of object index from owner's
// (an ancestor's) on every replica, with change applied to the data on
// the way. The caller holds the object's allocation lock and writes the
// map entry afterwards.
//
// The copy holds a whole object in memory, however small the write that
// caused it: its buffer is counted against Options.CopyBytes, so that
// many small writes to objects a snapshot shares queue rather than
// allocate without bound. Copying in parts would bound the buffer
// further, but would turn the copy into several writes per replica,
// between which an epoch change can find the new object half made and
// recover it as it is. That is probably harmless (no map entry points to
// the object yet) but nothing here proves it, so the copy stays one
// whole write per replica, and is bounded instead.
func (g *Gateway) copyObject(ctx context.Context, vdi cluster.VDI, owner, index uint32, fua bool, change func(data []byte)) error {
	size := int64(vdi.ObjectSize)
	if err := acquire(ctx, g.logger, g.admit.copyBytes, size, fmt.Sprintf("copy-on-write of object %d of vdi %q", index, vdi.Name)); err != nil {
		return err
	}
	defer g.admit.copyBytes.release(size)
	buffer := getObjectBuffer(vdi.ObjectSize)
	defer buffer.release()
	data := buffer.Bytes
	// A pooled buffer holds another copy's data: clear it, so that a
	// read that filled less than all of it can never leak that data.
	clear(data)
	conf, err := g.ecOf(vdi)
	if err != nil {
		return err
	}
	from, to := object.DataOID(object.VDIID(owner), index), object.DataOID(object.VDIID(vdi.ID), index)
	if conf != nil {
		// The ancestor's object is read as a reader would; this VDI's
		// starts afresh with it, a full stripe.
		if err := g.ecRead(ctx, nil, conf, from, data, 0, false, false); err != nil {
			return fmt.Errorf("copy-on-write of object %d from vdi %d: %w", index, owner, err)
		}
		change(data)
		return g.ecWrite(ctx, g.writerState(vdi), conf, to, data, 0, (object.FlagCreate|object.FlagFresh).With(object.FlagSync, fua))
	}
	if err := g.read(ctx, from, vdi.Copies, data, 0); err != nil {
		return fmt.Errorf("copy-on-write of object %d from vdi %d: %w", index, owner, err)
	}
	change(data)
	return g.write(ctx, to, vdi.Copies, data, 0, object.FlagCreate.With(object.FlagSync, fua))
}

// Flush makes every write acknowledged before it durable on every replica.
func (d *Disk) Flush(ctx context.Context) error {
	return (d.gateway.flush(ctx))
}

// Trim discards a range: it reads as zeros afterwards.
func (d *Disk) Trim(ctx context.Context, offset, length uint64, fua bool) error {
	return d.zero(ctx, offset, length, false, fua)
}

// WriteZeroes makes a range read as zeros (noHole: keep it allocated).
func (d *Disk) WriteZeroes(ctx context.Context, offset, length uint64, noHole, fua bool) error {
	return d.zero(ctx, offset, length, noHole, fua)
}

// zero makes a range read as zeros. A piece covering a whole object frees
// it (unless noHole): the map entry becomes "zeros" first, then the
// object goes from every replica. A partial piece punches a hole (or
// writes zeros) in this VDI's copy, copying an ancestor's first.
func (d *Disk) zero(ctx context.Context, offset, length uint64, noHole, fua bool) error {
	if d.readOnly {
		return ErrReadOnly
	}
	pieces, err := d.pieces(offset, length)
	if err != nil {
		return err
	}
	g, state := d.gateway, d.state
	// QoS first, never under io (qos.go rule 2): a request, no bytes.
	if err := state.limiter.wait(ctx, true, 0); err != nil {
		return err
	}
	state.io.RLock()
	defer state.io.RUnlock()
	if err := g.writer.ensureWriter(ctx, state, d.takeoverCheck); err != nil {
		return err
	}
	release, err := d.slot(ctx)
	if err != nil {
		return err
	}
	defer release()
	ctx = g.writer.withFence(ctx, state)
	vdi, chain := state.current()
	what := "TRIM"
	if noHole {
		what = "WRITE_ZEROES"
	}
	what = fmt.Sprintf("%s of vdi %q [%d, +%d)", what, vdi.Name, offset, length)
	return d.each(ctx, pieces, func(pc piece) error {
		// A piece carries no payload, so the NBD server's byte budget
		// does not count it: the node-wide slot does (bounds.go).
		if err := acquire(ctx, g.logger, g.admit.zeroPieces, 1, what); err != nil {
			return err
		}
		defer g.admit.zeroPieces.release(1)
		return d.zeroPiece(ctx, vdi, chain, pc, noHole, fua)
	})
}

// zeroPiece makes one piece read as zeros (see zero).
func (d *Disk) zeroPiece(ctx context.Context, vdi cluster.VDI, chain []uint32, pc piece, noHole, fua bool) error {
	g, state := d.gateway, d.state
	owner, unlock, err := d.owned(ctx, vdi, chain, pc.index)
	defer unlock()
	if err != nil || owner == 0 {
		return err // already zeros
	}
	whole := pc.within == 0 && pc.length == vdi.ObjectSize
	oid := object.DataOID(object.VDIID(vdi.ID), pc.index)
	conf, err := g.ecOf(vdi)
	if err != nil {
		return err
	}
	if conf != nil {
		return d.ecZeroPiece(ctx, vdi, chain, conf, owner, pc, noHole, fua)
	}
	if whole && !noHole {
		return d.freeObject(ctx, vdi, chain, owner, pc.index, fua, func() error { return g.remove(ctx, oid, vdi.Copies) })
	}
	if owner != vdi.ID {
		// An ancestor's object: this VDI's own copy, zeroed over the
		// range. A whole object of zeros needs no copy: the shared zero
		// buffer is written.
		if whole {
			err = g.write(ctx, oid, vdi.Copies, zeros(vdi.ObjectSize), 0, object.FlagCreate.With(object.FlagSync, fua))
		} else {
			err = g.copyObject(ctx, vdi, owner, pc.index, fua, func(data []byte) {
				clear(data[pc.within : uint64(pc.within)+pc.length])
			})
		}
		if err != nil {
			return err
		}
		return g.setEntry(ctx, state, vdi, vdi.ID, pc.index, vdi.ID, fua)
	}
	flags := object.Flags(0).With(object.FlagSync, fua).With(object.FlagNoHole, noHole)
	return g.mutateOp(ctx, oid, vdi.Copies, replicaOp{run: func(ctx context.Context, node cluster.Node, rv *layout.Epoch) error {
		return g.heal.changeHealing(ctx, node, rv, oid, vdi.Copies, pc.within, int(pc.length), func() error {
			return g.replicas.Zero(ctx, node, rv.Number, oid, pc.within, uint32(pc.length), flags)
		})
	}, change: &failedChange{offset: pc.within, length: uint32(pc.length)}})
}

// Extent is a run of the disk that is all data or all hole.
type Extent struct {
	Length uint64
	Hole   bool // reads as zeros: no object backs it
}

// Extents describes [offset, offset+length): objects this VDI reads
// zeros from are holes.
func (d *Disk) Extents(ctx context.Context, offset, length uint64) ([]Extent, error) {
	layers, err := d.Layers(ctx, offset, length)
	if err != nil {
		return nil, err
	}
	extents := make([]Extent, 0, len(layers))
	for _, l := range layers {
		hole := l.Depth == 0 || l.Zero // never written, or zeroed with a tombstone
		if n := len(extents); n > 0 && extents[n-1].Hole == hole {
			extents[n-1].Length += l.Length
			continue
		}
		extents = append(extents, Extent{Length: l.Length, Hole: hole})
	}
	return extents, nil
}

// Close ends this open; the last writer releases the VDI's lock.
func (d *Disk) Close() error {
	kind := openWriter
	if d.readOnly {
		kind = openReader
	}
	d.closed.Do(func() {
		d.state.mu.Lock()
		delete(d.state.disks, d)
		d.state.mu.Unlock()
		d.gateway.release(d.state, kind)
	})
	return nil
}

// ecZeroPiece is zeroPiece for an erasure-coded VDI (ec.go): a whole
// object is freed (unless noHole), a part written with zeros.
func (d *Disk) ecZeroPiece(ctx context.Context, vdi cluster.VDI, chain []uint32, conf *ecConf, owner uint32, pc piece, noHole, fua bool) error {
	g, state := d.gateway, d.state
	whole := pc.within == 0 && pc.length == vdi.ObjectSize
	oid := object.DataOID(object.VDIID(vdi.ID), pc.index)
	if whole && !noHole {
		return d.freeObject(ctx, vdi, chain, owner, pc.index, fua, func() error { return g.ecRemove(ctx, state, conf, oid) })
	}
	if owner != vdi.ID {
		if whole {
			// An object of zeros: an empty one, with no head.
			err := g.ecWrite(ctx, state, conf, oid, zeros(ec.BlockSize), 0, (object.FlagCreate|object.FlagFresh).With(object.FlagSync, fua))
			if err != nil {
				return err
			}
		} else if err := g.copyObject(ctx, vdi, owner, pc.index, fua, func(data []byte) {
			clear(data[pc.within : uint64(pc.within)+pc.length])
		}); err != nil {
			return err
		}
		return g.setEntry(ctx, state, vdi, vdi.ID, pc.index, vdi.ID, fua)
	}
	flags := object.Flags(0).With(object.FlagSync, fua)
	for done := uint64(0); done < pc.length; {
		n := min(pc.length-done, 1<<20)
		if err := g.ecWrite(ctx, state, conf, oid, zeros(n), pc.within+uint32(done), flags); err != nil {
			return err
		}
		done += n
	}
	return nil
}

// freeObject makes object index of vdi read as zeros by its map entry
// ("zeros", or a tombstone over an ancestor's data), then, if vdi owns
// it, removes it (remove).
func (d *Disk) freeObject(ctx context.Context, vdi cluster.VDI, chain []uint32, owner, index uint32, fua bool, remove func() error) error {
	value := uint32(0)
	if len(chain) > 1 {
		value = objmap.Tombstone // do not inherit an ancestor's data
	}
	if err := d.gateway.setEntry(ctx, d.state, vdi, vdi.ID, index, value, fua); err != nil {
		return err
	}
	if owner == vdi.ID {
		return remove()
	}
	return nil
}
