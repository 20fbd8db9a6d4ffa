package gateway

// Erasure-coded data objects (docs/ARCHITECTURE.md, "Erasure-coded
// VDIs"; the layout is internal/ec's Layout).
//
// A data object of a VDI with a scheme K+M is an ordinary replicated
// object of M+1 copies (the "overlay object") that holds the blocks
// written since its last fold, an entry per block and two head slots,
// plus K+M chunk objects of one copy each holding its folded bytes.
//
//   - A write puts whole blocks into the overlay (reading a partial
//     block's current content first), then their entries (tag, CRC):
//     two replicated writes, in that order.
//   - A fold reads the object's current content, encodes it, writes a
//     new generation of K+M chunks into the chunk slot the current one
//     does not use (synced), then the head of the new generation into
//     its head slot (synced on every replica): only then does anything
//     read the new chunks, and the old ones are removed after it. The
//     overlay's blocks become stale with the new head (their tag is
//     the old generation's) and are trimmed.
//   - A read takes each block from the overlay when its entry says so
//     and the bytes check against it, otherwise from its data chunk,
//     checked against the head's sums; a chunk that is missing,
//     unreachable or fails its sums is decoded from any K others, and
//     rewritten in place by the writer's gateway.
//
// Only the VDI's writer gateway changes an object (overlay, entries,
// chunks, heads), under the object's ecObject lock, and it keeps the
// object's entries and head in memory while it holds the writer lock.
// Readers elsewhere (ro/, snapshots) read entries and heads each time,
// and a ro/ reader of a live VDI checks after its read that the head it
// used is still current.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/ec"
	"github.com/herd-storage/herd/internal/layout"
	"github.com/herd-storage/herd/internal/object"
	"github.com/herd-storage/herd/internal/waitlock"
)

// ecFoldIdle is how long an object's overlay stays unwritten before the
// background folder folds it; ecFoldTick is how often it looks.
var (
	ecFoldIdle = 5 * time.Second
	ecFoldTick = time.Second
)

// ecConf is what the data path needs of a VDI's scheme.
type ecConf struct {
	scheme ec.Scheme
	layout ec.Layout
	codec  *ec.Codec
	copies int // of the overlay object: M+1
}

// ecView is an object's entries and current head.
type ecView struct {
	head    ec.Head
	hasHead bool
	entries []ec.Entry
}

func (v *ecView) gen() uint32 {
	if !v.hasHead {
		return 0
	}
	return v.head.Generation
}

// overlaid counts the blocks the overlay holds.
func (v *ecView) overlaid() int {
	n := 0
	for _, e := range v.entries {
		if e.Tag == v.gen()+1 {
			n++
		}
	}
	return n
}

// ecObject is the writer gateway's state of one object: its lock and,
// while valid (same writer lock generation), its view.
type ecObject struct {
	lock      waitlock.RWLock
	view      *ecView // guarded by lock
	lockGen   uint64
	lastWrite time.Time
	lastUse   atomic.Int64 // unix nanoseconds of the last request
	state     *vdiState
	conf      *ecConf
	// dead: left ecState.objects (set under lock held exclusively);
	// whoever finds it so looks the object up again.
	dead bool
}

// ecEvictAfter is how long the writer keeps the view of an object with
// nothing to fold that no request used.
var ecEvictAfter = 30 * time.Second

// ecState is the gateway's erasure-coding state.
type ecState struct {
	mu      sync.Mutex
	confs   map[string]*ecConf // by scheme and object size
	objects map[object.OID]*ecObject
	folder  bool // the background folder runs
}

// ecOf returns the erasure-coding configuration of vdi, nil for a VDI of
// copies.
func (g *Gateway) ecOf(vdi cluster.VDI) (*ecConf, error) {
	if vdi.EC == "" {
		return nil, nil
	}
	key := fmt.Sprintf("%s/%d", vdi.EC, vdi.ObjectSize)
	g.ec.mu.Lock()
	defer g.ec.mu.Unlock()
	if c, ok := g.ec.confs[key]; ok {
		return c, nil
	}
	scheme, err := ec.Parse(vdi.EC)
	if err != nil {
		return nil, fmt.Errorf("vdi %q: %w", vdi.Name, err)
	}
	l, err := ec.NewLayout(scheme, int64(vdi.ObjectSize))
	if err != nil {
		return nil, fmt.Errorf("vdi %q: %w", vdi.Name, err)
	}
	codec, err := ec.NewCodec(scheme)
	if err != nil {
		return nil, err
	}
	if vdi.Copies != scheme.M+1 {
		return nil, fmt.Errorf("vdi %q: erasure coding %s with %d copies of its replicated objects, want %d", vdi.Name, scheme, vdi.Copies, scheme.M+1)
	}
	c := &ecConf{scheme: scheme, layout: l, codec: codec, copies: vdi.Copies}
	if g.ec.confs == nil {
		g.ec.confs = map[string]*ecConf{}
	}
	g.ec.confs[key] = c
	return c, nil
}

// writerState returns the state of vdi's writable open through this
// gateway, nil if there is none (a merge job copying objects).
func (g *Gateway) writerState(vdi cluster.VDI) *vdiState {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.open[vdi.Name]
}

// holdsWriter says whether state holds its VDI's writer lock, unfenced,
// for the objects of VDI id (not a snapshot's, after a snapshot moved
// the name): the condition for anything but a request to change them.
// The caller holds state.io (shared), so no handover or snapshot runs
// until it lets go.
func holdsWriter(state *vdiState, id object.VDIID) bool {
	if state == nil {
		return false
	}
	state.mu.Lock()
	defer state.mu.Unlock()
	return state.lockHeld && state.fenced == nil && state.lockGen != 0 && object.VDIID(state.vdi.ID) == id
}

// lockGenOf is the generation of the writer lock state holds (0 for no
// state).
func lockGenOf(state *vdiState) uint64 {
	if state == nil {
		return 0
	}
	state.mu.Lock()
	defer state.mu.Unlock()
	return state.lockGen
}

// ecLoad reads oid's entries and heads (one read of the replicated
// object's tail).
func (g *Gateway) ecLoad(ctx context.Context, conf *ecConf, oid object.OID) (*ecView, error) {
	l := conf.layout
	tail := make([]byte, l.Size()-l.EntriesOffset())
	if err := g.read(ctx, oid, conf.copies, tail, uint32(l.EntriesOffset())); err != nil {
		return nil, err
	}
	v := &ecView{entries: make([]ec.Entry, l.Blocks())}
	for i := range v.entries {
		v.entries[i] = ec.DecodeEntry(tail[int64(i)*ec.EntrySize:])
	}
	h0 := tail[l.HeadOffset(0)-l.EntriesOffset():][:l.HeadSize()]
	h1 := tail[l.HeadOffset(1)-l.EntriesOffset():][:l.HeadSize()]
	head, ok, err := l.Current(h0, h1)
	if err != nil {
		return nil, fmt.Errorf("%w: object %016x: %v", object.ErrCorrupt, oid, err)
	}
	v.head, v.hasHead = head, ok
	return v, nil
}

// ecEntry returns the writer's entry of oid, made if there is none, and
// starts the folder if it does not run.
func (g *Gateway) ecEntry(state *vdiState, conf *ecConf, oid object.OID) *ecObject {
	g.ec.mu.Lock()
	defer g.ec.mu.Unlock()
	if g.ec.objects == nil {
		g.ec.objects = map[object.OID]*ecObject{}
	}
	o, ok := g.ec.objects[oid]
	if !ok {
		o = &ecObject{state: state, conf: conf}
		g.ec.objects[oid] = o
	}
	if !g.ec.folder {
		g.ec.folder = true
		go g.ecFolder()
	}
	return o
}

// ecObjectOf returns the writer's state of oid, its view loaded and
// valid for the writer lock state holds now, with its lock held
// (exclusively when write); the caller calls the returned unlock.
func (g *Gateway) ecObjectOf(ctx context.Context, state *vdiState, conf *ecConf, oid object.OID, write bool) (*ecObject, func(), error) {
	o := g.ecEntry(state, conf, oid)
	gen := lockGenOf(state)
	o.lastUse.Store(time.Now().UnixNano())
	if !write {
		// Most reads find the view loaded.
		o.lock.RLock()
		if !o.dead && o.view != nil && o.lockGen == gen {
			return o, o.lock.RUnlock, nil
		}
		o.lock.RUnlock()
	}
	// The view is loaded under the exclusive lock; a reader that finds
	// it missing takes that first.
	o.lock.Lock()
	if o.dead {
		o.lock.Unlock()
		return g.ecObjectOf(ctx, state, conf, oid, write)
	}
	if o.view == nil || o.lockGen != gen {
		v, err := g.ecLoad(ctx, conf, oid)
		if err != nil {
			o.lock.Unlock()
			return nil, nil, err
		}
		o.view, o.lockGen, o.state, o.conf = v, gen, state, conf
	}
	if write {
		return o, o.lock.Unlock, nil
	}
	o.lock.Unlock()
	o.lock.RLock()
	if o.dead || o.view == nil || o.lockGen != gen {
		o.lock.RUnlock()
		return g.ecObjectOf(ctx, state, conf, oid, write)
	}
	return o, o.lock.RUnlock, nil
}

// ecRead reads p at offset of data object oid of an erasure-coded VDI.
// writer: this gateway holds the VDI's writer lock (state's); live: a
// ro/ read of a VDI written elsewhere, which checks its head again.
func (g *Gateway) ecRead(ctx context.Context, state *vdiState, conf *ecConf, oid object.OID, p []byte, offset uint32, writer, live bool) error {
	if writer {
		o, unlock, err := g.ecObjectOf(ctx, state, conf, oid, false)
		if err != nil {
			return err
		}
		defer unlock()
		return g.ecReadView(ctx, conf, oid, o.view, p, offset, true)
	}
	for attempt := 0; ; attempt++ {
		v, err := g.ecLoad(ctx, conf, oid)
		if err != nil {
			return err
		}
		err = g.ecReadView(ctx, conf, oid, v, p, offset, false)
		if !live {
			if err != nil && attempt < 3 && ctx.Err() == nil {
				// A snapshot's object may have been refolded meanwhile
				// (its chunks rebuilt elsewhere, the old ones removed):
				// its content is the same, read again through its new
				// head.
				if after, lerr := g.ecLoad(ctx, conf, oid); lerr == nil && after.gen() != v.gen() {
					continue
				}
			}
			return err
		}
		// The writer may have folded meanwhile (and trimmed the
		// overlay, or reused the chunks' slot): what was read holds
		// only if the view is still the current one.
		after, lerr := g.ecLoad(ctx, conf, oid)
		if lerr != nil {
			return lerr
		}
		if after.gen() == v.gen() && sameEntries(after, v, offset, len(p)) {
			return err
		}
		if attempt >= 20 {
			return fmt.Errorf("%w: object %016x folded by its writer during 20 reads in a row", object.ErrUnavailable, oid)
		}
	}
}

func sameEntries(a, b *ecView, offset uint32, n int) bool {
	first, last := int64(offset)/ec.BlockSize, (int64(offset)+int64(n)-1)/ec.BlockSize
	for i := first; i <= last; i++ {
		if a.entries[i] != b.entries[i] {
			return false
		}
	}
	return true
}

// ecReadView reads p at offset as view v says; repair: rewrite chunk
// blocks found bad (the writer's gateway only).
func (g *Gateway) ecReadView(ctx context.Context, conf *ecConf, oid object.OID, v *ecView, p []byte, offset uint32, repair bool) error {
	first := int64(offset) / ec.BlockSize
	last := (int64(offset) + int64(len(p)) - 1) / ec.BlockSize
	blocks := make([]byte, (last-first+1)*ec.BlockSize)
	fromChunks := make([]bool, last-first+1)
	gen := v.gen()
	// The overlay's runs first.
	for b := first; b <= last; {
		if v.entries[b].Tag != gen+1 {
			fromChunks[b-first] = true
			b++
			continue
		}
		end := b
		for end+1 <= last && v.entries[end+1].Tag == gen+1 {
			end++
		}
		run := blocks[(b-first)*ec.BlockSize : (end-first+1)*ec.BlockSize]
		if err := g.read(ctx, oid, conf.copies, run, uint32(b*ec.BlockSize)); err != nil {
			return err
		}
		for i := b; i <= end; i++ {
			switch ec.Resolve(v.entries[i], gen, blocks[(i-first)*ec.BlockSize:][:ec.BlockSize]) {
			case ec.FromChunks:
				fromChunks[i-first] = true
			case ec.Corrupt:
				return fmt.Errorf("%w: object %016x block %d: overlay bytes match neither its entry nor its previous content", object.ErrCorrupt, oid, i)
			}
		}
		b = end + 1
	}
	// Then the chunks, a run of blocks of one data chunk at a time.
	for b := first; b <= last; {
		if !fromChunks[b-first] {
			b++
			continue
		}
		chunk := b / conf.layout.ChunkBlocks()
		end := b
		for end+1 <= last && fromChunks[end+1-first] && (end+1)/conf.layout.ChunkBlocks() == chunk {
			end++
		}
		run := blocks[(b-first)*ec.BlockSize : (end-first+1)*ec.BlockSize]
		if !v.hasHead {
			clear(run)
		} else {
			within := (b - chunk*conf.layout.ChunkBlocks()) * ec.BlockSize
			if err := g.ecReadChunk(ctx, conf, oid, v, int(chunk), run, within, repair); err != nil {
				return err
			}
		}
		b = end + 1
	}
	copy(p, blocks[int64(offset)-first*ec.BlockSize:])
	return nil
}

// chunkNode returns the node table's entry of a chunk's home, if the
// node is a member of rv.
func (g *Gateway) chunkNode(rv *layout.Epoch, id string) (cluster.Node, bool) {
	n, ok := rv.Nodes[id]
	return n, ok
}

// ecFetch reads [within, within+len(p)) of chunk c of v's generation
// from its home and checks every block against the head: nil only when
// all of them match.
func (g *Gateway) ecFetch(ctx context.Context, rv *layout.Epoch, conf *ecConf, oid object.OID, v *ecView, c int, p []byte, within int64) error {
	node, ok := g.chunkNode(rv, v.head.Homes[c])
	if !ok {
		return fmt.Errorf("%w: chunk %d's home %s is not in epoch %d", object.ErrUnavailable, c, v.head.Homes[c], rv.Number)
	}
	scope, cancel := layout.Scoped(ctx, g.cluster, rv.Number, readTimeout)
	defer cancel()
	coid := object.ChunkOID(oid, c, int(v.head.Generation%2))
	if _, err := g.replicas.Read(scope, node, rv.Number, coid, p, uint32(within)); err != nil {
		return unanswered(ctx, scope, err)
	}
	for i := int64(0); i < int64(len(p))/ec.BlockSize; i++ {
		block := within/ec.BlockSize + i
		if ec.Checksum(p[i*ec.BlockSize:][:ec.BlockSize]) != v.head.Sums[c][block] {
			return fmt.Errorf("%w: chunk %d of object %016x (generation %d) on %s: block %d does not match its head", object.ErrChecksum, c, oid, v.head.Generation, node.ID, block)
		}
	}
	return nil
}

// ecReadChunk reads p from data chunk c at within: from the chunk, or
// decoded from K others when it cannot be read or fails its sums.
func (g *Gateway) ecReadChunk(ctx context.Context, conf *ecConf, oid object.OID, v *ecView, c int, p []byte, within int64, repair bool) error {
	rv, err := g.layouts.Current()
	if err != nil {
		return err
	}
	first := g.ecFetch(ctx, rv, conf, oid, v, c, p, within)
	if first == nil {
		return nil
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	shards, err := g.ecDecode(ctx, rv, conf, oid, v, within, int64(len(p)), c)
	if err != nil {
		return fmt.Errorf("object %016x: chunk %d: %v; decoding from the others: %w", oid, c, first, err)
	}
	copy(p, shards[c])
	g.logger.Debug("gateway: degraded read of an erasure-coded object", "object", fmt.Sprintf("%016x", oid), "chunk", c, "cause", first)
	if repair {
		g.ecRepair(ctx, rv, oid, v, c, shards[c], within)
	}
	return nil
}

// ecDecode reads [within, within+n) of every chunk but skip, keeps those
// that match the head, and decodes the stripe's range from K of them.
func (g *Gateway) ecDecode(ctx context.Context, rv *layout.Epoch, conf *ecConf, oid object.OID, v *ecView, within, n int64, skip int) ([][]byte, error) {
	total := conf.scheme.Chunks()
	shards := make([][]byte, total)
	errs := make([]error, total)
	var wg sync.WaitGroup
	for c := range total {
		if c == skip {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, n)
			if errs[c] = g.ecFetch(ctx, rv, conf, oid, v, c, buf, within); errs[c] == nil {
				shards[c] = buf
			}
		}()
	}
	wg.Wait()
	good := 0
	for _, s := range shards {
		if s != nil {
			good++
		}
	}
	if good < conf.scheme.K {
		return nil, fmt.Errorf("%w: %d of %d chunks of generation %d readable, %d needed: %v", ec.ErrTooFewChunks, good, total, v.head.Generation, conf.scheme.K, errors.Join(errs...))
	}
	if err := conf.codec.Reconstruct(shards); err != nil {
		return nil, err
	}
	return shards, nil
}

// ecRepair rewrites [within, within+len(p)) of chunk c with bytes decoded
// from the others (that match the head), where its home is a member; a
// chunk whose home left is refolded by the folder instead.
func (g *Gateway) ecRepair(ctx context.Context, rv *layout.Epoch, oid object.OID, v *ecView, c int, p []byte, within int64) {
	node, ok := g.chunkNode(rv, v.head.Homes[c])
	if !ok {
		return
	}
	scope, cancel := layout.Scoped(ctx, g.cluster, rv.Number, readTimeout)
	defer cancel()
	coid := object.ChunkOID(oid, c, int(v.head.Generation%2))
	err := g.replicas.Write(scope, node, rv.Number, coid, p, uint32(within), object.FlagCreate|object.FlagSync)
	if err != nil {
		g.logger.Warn("gateway: rewriting a chunk block decoded from the others", "object", fmt.Sprintf("%016x", oid), "chunk", c, "node", node.ID, "err", err)
		return
	}
	g.logger.Info("gateway: repaired a chunk of an erasure-coded object from the others", "object", fmt.Sprintf("%016x", oid), "chunk", c, "node", node.ID, "offset", within, "bytes", len(p))
}

// ecWrite writes p at offset of data object oid (this gateway is the
// writer). flags may carry FlagCreate|FlagFresh (the object's first
// write in its VDI: whatever a copy held before is gone) and FlagSync.
func (g *Gateway) ecWrite(ctx context.Context, state *vdiState, conf *ecConf, oid object.OID, p []byte, offset uint32, flags object.Flags) error {
	fresh := flags.Has(object.FlagFresh)
	var o *ecObject
	var unlock func()
	var err error
	if fresh {
		// Nothing to load: whatever a copy held is replaced.
		o, unlock = g.ecFreshObject(state, conf, oid)
	} else if o, unlock, err = g.ecObjectOf(ctx, state, conf, oid, true); err != nil {
		return err
	}
	defer unlock()
	v := o.view
	l := conf.layout
	if offset == 0 && int64(len(p)) == l.Geometry.ObjectSize {
		// A whole object: a full stripe, folded as it is.
		if err := g.ecFold(ctx, conf, oid, v, p, fresh); err != nil {
			o.view = nil // the head may have reached some replicas
			return err
		}
		o.view, o.lastWrite = v, time.Now()
		return nil
	}
	first := int64(offset) / ec.BlockSize
	last := (int64(offset) + int64(len(p)) - 1) / ec.BlockSize
	blocks := make([]byte, (last-first+1)*ec.BlockSize)
	// The partial blocks at either end are read first (not for a fresh
	// object: it is zeros).
	for _, b := range []int64{first, last} {
		partial := (b == first && int64(offset)%ec.BlockSize != 0) || (b == last && (int64(offset)+int64(len(p)))%ec.BlockSize != 0)
		if partial && !fresh {
			if err := g.ecReadView(ctx, conf, oid, v, blocks[(b-first)*ec.BlockSize:][:ec.BlockSize], uint32(b*ec.BlockSize), true); err != nil {
				return fmt.Errorf("reading the rest of a partial block: %w", err)
			}
		}
	}
	copy(blocks[int64(offset)-first*ec.BlockSize:], p)
	gen := v.gen()
	// A block the overlay holds is overwritten in place: its entry must
	// name the bytes there now (Prev), read rather than taken from the
	// entry, which a power loss may have left ahead of them.
	prev, overwrite, err := g.ecOverlaid(ctx, conf, oid, v, first, last, fresh)
	if err != nil {
		o.view = nil
		return err
	}
	entries := make([]ec.Entry, last-first+1)
	raw := make([]byte, len(entries)*ec.EntrySize)
	for i := range entries {
		e := ec.Entry{Tag: gen + 1, CRC: ec.Checksum(blocks[int64(i)*ec.BlockSize:][:ec.BlockSize])}
		if prev[i] != nil {
			e.HasPrev, e.Prev = true, *prev[i]
		}
		entries[i] = e
		e.Encode(raw[i*ec.EntrySize:])
	}
	// The entries, then the blocks: until the blocks land, each entry
	// still resolves to the block's old content (ec.Resolve: the bytes
	// match Prev, or no Prev and they match nothing, so the chunks).
	// Never the other order: new bytes under the old entry match
	// neither of its sums. An overwrite's entries are synced first, so
	// that no power loss keeps its bytes without them; a first write
	// needs no sync (with or without its entry, the old content is in
	// the chunks until its bytes match).
	// Only an object's first write creates it (FlagCreate|FlagFresh, on
	// the first of the two): with FlagCreate, a later write would create,
	// on a replica the placement just moved the object to, a copy holding
	// only this piece, stamped with the current epoch, which the other
	// replicas would recover from as the newest.
	entryFlags := flags & (object.FlagCreate | object.FlagFresh | object.FlagSync)
	if overwrite {
		entryFlags |= object.FlagSync
	}
	if err := g.write(ctx, oid, conf.copies, raw, uint32(l.EntriesOffset()+first*ec.EntrySize), entryFlags); err != nil {
		o.view = nil // what the replicas hold is for the repair to say
		return err
	}
	g.ecStep(ctx, oid, ECEntriesWritten)
	if err := g.write(ctx, oid, conf.copies, blocks, uint32(first*ec.BlockSize), flags&^(object.FlagFresh|object.FlagCreate)); err != nil {
		o.view = nil
		return err
	}
	g.ecStep(ctx, oid, ECOverlayWritten)
	copy(v.entries[first:], entries)
	o.view, o.lastWrite = v, time.Now()
	if v.overlaid() == len(v.entries) {
		// The overlay holds the whole object: fold it now, a full
		// stripe, rather than keep M+1 copies of it.
		content := make([]byte, l.Geometry.ObjectSize)
		if err := g.ecReadView(ctx, conf, oid, v, content, 0, true); err != nil {
			return nil // the write is done; the folder tries again
		}
		if err := g.ecFold(ctx, conf, oid, v, content, false); err != nil {
			o.view = nil // the head may have reached some replicas
			g.logger.Debug("gateway: folding a full overlay", "object", fmt.Sprintf("%016x", oid), "err", err)
		}
	}
	return nil
}

// ecOverlaid reads the overlay's bytes of the blocks first..last of v
// that it holds, and returns for each block the CRC32C of what the
// overlay holds as its content (nil: the block reads from the chunks),
// and whether any does.
func (g *Gateway) ecOverlaid(ctx context.Context, conf *ecConf, oid object.OID, v *ecView, first, last int64, fresh bool) (prev []*uint32, any bool, err error) {
	prev = make([]*uint32, last-first+1)
	if fresh {
		return prev, false, nil
	}
	gen := v.gen()
	for b := first; b <= last; {
		if v.entries[b].Tag != gen+1 {
			b++
			continue
		}
		end := b
		for end+1 <= last && v.entries[end+1].Tag == gen+1 {
			end++
		}
		run := make([]byte, (end-b+1)*ec.BlockSize)
		if err := g.read(ctx, oid, conf.copies, run, uint32(b*ec.BlockSize)); err != nil {
			return nil, false, err
		}
		for i := b; i <= end; i++ {
			bytes := run[(i-b)*ec.BlockSize:][:ec.BlockSize]
			switch ec.Resolve(v.entries[i], gen, bytes) {
			case ec.FromOverlay:
				sum := ec.Checksum(bytes)
				prev[i-first], any = &sum, true
			case ec.Corrupt:
				return nil, false, fmt.Errorf("%w: object %016x block %d: overlay bytes match neither its entry nor its previous content", object.ErrCorrupt, oid, i)
			}
		}
		b = end + 1
	}
	return prev, any, nil
}

// ecFreshObject returns the writer's state of an object starting afresh,
// with an empty view, locked exclusively.
func (g *Gateway) ecFreshObject(state *vdiState, conf *ecConf, oid object.OID) (*ecObject, func()) {
	gen := lockGenOf(state)
	o := g.ecEntry(state, conf, oid)
	o.lastUse.Store(time.Now().UnixNano())
	o.lock.Lock()
	if o.dead {
		o.lock.Unlock()
		return g.ecFreshObject(state, conf, oid)
	}
	o.view = &ecView{entries: make([]ec.Entry, conf.layout.Blocks())}
	o.lockGen, o.state, o.conf = gen, state, conf
	return o, o.lock.Unlock
}

// ecFold makes content (the whole object) the next generation of oid's
// chunks, and v its view. fresh: the object starts with it (its
// replicated object is emptied by the head's write).
func (g *Gateway) ecFold(ctx context.Context, conf *ecConf, oid object.OID, v *ecView, content []byte, fresh bool) error {
	return g.ecFoldKeeping(ctx, conf, oid, v, content, fresh, false)
}

// ecFoldKeeping is ecFold; keepOverlay leaves the overlay's bytes as they
// are (a snapshot's object, which readers may be reading through an
// older view: its bytes never change, so every generation's chunks and
// its overlay say the same).
func (g *Gateway) ecFoldKeeping(ctx context.Context, conf *ecConf, oid object.OID, v *ecView, content []byte, fresh, keepOverlay bool) error {
	rv, err := g.layouts.Current()
	if err != nil {
		return err
	}
	homes, err := g.ecHomes(rv, conf, oid)
	if err != nil {
		return fmt.Errorf("folding object %016x: %w", oid, err)
	}
	data, err := conf.layout.Geometry.Split(content)
	if err != nil {
		return err
	}
	parity, err := conf.codec.Encode(data)
	if err != nil {
		return err
	}
	chunks := append(data, parity...)
	next := ec.Head{Generation: v.gen() + 1, Homes: make([]string, len(chunks)), Sums: make([][]uint32, len(chunks))}
	for c, chunk := range chunks {
		next.Homes[c] = homes[c].ID
		sums := make([]uint32, len(chunk)/ec.BlockSize)
		for i := range sums {
			sums[i] = ec.Checksum(chunk[i*ec.BlockSize:][:ec.BlockSize])
		}
		next.Sums[c] = sums
	}
	raw, err := conf.layout.EncodeHead(next)
	if err != nil {
		return err
	}
	// A fold under a writer lock taken away meanwhile writes nothing
	// (its chunk writes would go into a slot the new writer may use).
	if err := g.writer.checkFence(ctx); err != nil {
		return err
	}
	old, hadHead, overlaid := v.head, v.hasHead, v.overlaid()
	// The chunks, synced, then the head that names them, synced on every
	// replica, then the overlay's trim: in this order only (the seeded
	// bugs change it).
	if bugECHeadBeforeChunks {
		if err := g.ecWriteHead(ctx, conf, oid, next, raw, fresh); err != nil {
			return err
		}
		g.ecStep(ctx, oid, ECHeadWritten)
	}
	if err := g.ecWriteChunks(ctx, rv, oid, next, homes, chunks); err != nil {
		return err
	}
	g.ecStep(ctx, oid, ECChunksWritten)
	trim := overlaid > 0 && !fresh && !keepOverlay
	if bugECTrimBeforeHead && trim {
		g.ecTrim(ctx, conf, oid)
		g.ecStep(ctx, oid, ECTrimmed)
		trim = false
	}
	if !bugECHeadBeforeChunks {
		if err := g.ecWriteHead(ctx, conf, oid, next, raw, fresh); err != nil {
			return err
		}
		g.ecStep(ctx, oid, ECHeadWritten)
	}
	v.head, v.hasHead = next, true
	if trim {
		// The overlay's blocks are stale now: free their space.
		g.ecTrim(ctx, conf, oid)
	}
	if !bugECTrimBeforeHead {
		g.ecStep(ctx, oid, ECTrimmed)
	}
	if hadHead {
		g.ecRemoveChunks(ctx, rv, oid, old)
	}
	return nil
}

// ecWriteChunks writes the chunks of generation h of oid to their homes,
// each synced: whole new objects in the slot of h's parity.
func (g *Gateway) ecWriteChunks(ctx context.Context, rv *layout.Epoch, oid object.OID, h ec.Head, homes []cluster.Node, chunks [][]byte) error {
	slot := int(h.Generation % 2)
	errs := make([]error, len(chunks))
	var wg sync.WaitGroup
	for c, chunk := range chunks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			scope, cancel := layout.Scoped(ctx, g.cluster, rv.Number, roundTimeout)
			defer cancel()
			err := g.replicas.Write(scope, homes[c], rv.Number, object.ChunkOID(oid, c, slot), chunk, 0, object.FlagCreate|object.FlagFresh|object.FlagSync)
			if err != nil {
				errs[c] = fmt.Errorf("chunk %d on %s: %w", c, homes[c].ID, unanswered(ctx, scope, err))
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("folding object %016x into generation %d: %w", oid, h.Generation, err)
	}
	return nil
}

// ecWriteHead writes head h (raw, encoded) of oid into its slot, synced
// on every replica. fresh: the object starts with it (its replicated
// object is emptied by the write). Only a fresh object's head creates
// it: see ecWrite.
func (g *Gateway) ecWriteHead(ctx context.Context, conf *ecConf, oid object.OID, h ec.Head, raw []byte, fresh bool) error {
	flags := object.FlagSync
	if fresh {
		flags |= object.FlagCreate | object.FlagFresh
	}
	if err := g.write(ctx, oid, conf.copies, raw, uint32(conf.layout.HeadOffset(int(h.Generation%2))), flags); err != nil {
		return fmt.Errorf("folding object %016x: writing the head of generation %d: %w", oid, h.Generation, err)
	}
	return nil
}

// ecTrim zeroes oid's overlay, whose blocks a new head made stale (best
// effort: stale blocks are never read).
func (g *Gateway) ecTrim(ctx context.Context, conf *ecConf, oid object.OID) {
	err := g.mutateOp(ctx, oid, conf.copies, replicaOp{run: func(ctx context.Context, node cluster.Node, rv *layout.Epoch) error {
		return g.replicas.Zero(ctx, node, rv.Number, oid, 0, uint32(conf.layout.Geometry.ObjectSize), 0)
	}})
	if err != nil {
		g.logger.Debug("gateway: trimming a folded overlay", "object", fmt.Sprintf("%016x", oid), "err", err)
	}
}

// ecHomes places oid's chunks in rv.
func (g *Gateway) ecHomes(rv *layout.Epoch, conf *ecConf, oid object.OID) ([]cluster.Node, error) {
	return rv.ChunkHomes(oid, conf.scheme.K, conf.scheme.M)
}

// ecRemoveChunks removes the chunks of head h from the homes that are
// members of rv; the others keep them until their VDI is freed.
func (g *Gateway) ecRemoveChunks(ctx context.Context, rv *layout.Epoch, oid object.OID, h ec.Head) {
	var wg sync.WaitGroup
	for c, id := range h.Homes {
		node, ok := g.chunkNode(rv, id)
		if !ok {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			scope, cancel := layout.Scoped(ctx, g.cluster, rv.Number, readTimeout)
			defer cancel()
			err := g.replicas.Remove(scope, node, rv.Number, object.ChunkOID(oid, c, int(h.Generation%2)))
			if err != nil && !errors.Is(err, object.ErrNotFound) {
				g.logger.Debug("gateway: removing an old chunk", "object", fmt.Sprintf("%016x", oid), "chunk", c, "node", id, "err", err)
			}
		}()
	}
	wg.Wait()
}

// ecRemove removes data object oid: its replicated object, then its
// chunks (best effort: what is left is freed with its VDI).
func (g *Gateway) ecRemove(ctx context.Context, state *vdiState, conf *ecConf, oid object.OID) error {
	o, unlock, err := g.ecObjectOf(ctx, state, conf, oid, true)
	if err != nil {
		if !errors.Is(err, object.ErrNoObject) && !errors.Is(err, object.ErrNotFound) {
			return err
		}
		return g.remove(ctx, oid, conf.copies)
	}
	defer unlock()
	v := o.view
	if err := g.remove(ctx, oid, conf.copies); err != nil {
		return err
	}
	o.view = nil
	if v.hasHead {
		if rv, err := g.layouts.Current(); err == nil {
			g.ecRemoveChunks(ctx, rv, oid, v.head)
		}
	}
	return nil
}

// ecFolder folds, in the background, the overlays of objects not written
// for ecFoldIdle, and refolds objects whose chunks' homes left the
// epoch, for every EC VDI this gateway writes.
func (g *Gateway) ecFolder() {
	ticker := time.NewTicker(ecFoldTick)
	defer ticker.Stop()
	var scanned object.Epoch
	// A scan that could not finish (a node unreachable, an object not
	// placeable) is tried again after a wait that doubles, to a minute.
	var retrying object.Epoch
	var retryAt time.Time
	backoff := ecFoldTick
	for {
		select {
		case <-g.ctx.Done():
			return
		case <-ticker.C:
		}
		g.ecFoldIdle()
		rv, err := g.layouts.Current()
		if err != nil || rv.Number == scanned {
			continue
		}
		if rv.Number == retrying && time.Now().Before(retryAt) {
			continue
		}
		complete := g.ecScan(rv, nil)
		if g.ecSteward(rv) && complete {
			scanned, backoff = rv.Number, ecFoldTick
			continue
		}
		if rv.Number != retrying {
			backoff = ecFoldTick
		}
		retrying, retryAt = rv.Number, time.Now().Add(backoff)
		backoff = min(2*backoff, time.Minute)
	}
}

// ecScan refolds every object of the EC VDIs this gateway writes whose
// chunks are not where epoch rv places them: a home that left (its
// chunks are rebuilt, from K others, where the epoch places them now), a
// node that joined or was drained. It says whether it went through all
// of them.
func (g *Gateway) ecScan(rv *layout.Epoch, only *vdiState) bool {
	g.mu.Lock()
	var states []*vdiState
	for _, state := range g.open {
		state.mu.Lock()
		if state.vdi.EC != "" && state.lockHeld && state.writers > 0 && (only == nil || state == only) {
			states = append(states, state)
		}
		state.mu.Unlock()
	}
	g.mu.Unlock()
	complete := true
	for _, state := range states {
		vdi, _ := state.current()
		conf, err := g.ecOf(vdi)
		if err != nil || conf == nil {
			continue
		}
		ctx, cancel := context.WithTimeout(g.writer.withFence(g.ctx, state), roundTimeout)
		entries, err := g.Map(ctx, vdi)
		cancel()
		if err != nil {
			g.logger.Warn("gateway: reading the map of an erasure-coded vdi to place its chunks", "vdi", vdi.Name, "err", err)
			complete = false
			continue
		}
		moved := 0
		for index, owner := range entries {
			if owner != vdi.ID {
				continue
			}
			if g.ctx.Err() != nil {
				return false
			}
			if current, err := g.layouts.Current(); err != nil || current.Number != rv.Number {
				return false // the next epoch's scan does it
			}
			done, err := g.ecPlace(rv, state, conf, object.DataOID(object.VDIID(vdi.ID), uint32(index)))
			if errors.Is(err, errNotWriter) {
				break
			}
			if err != nil {
				g.logger.Warn("gateway: placing an erasure-coded object's chunks", "vdi", vdi.Name, "index", index, "err", err)
				complete = false
			}
			if done {
				moved++
			}
		}
		if moved > 0 {
			g.logger.Info("gateway: refolded erasure-coded objects onto the epoch's placement", "vdi", vdi.Name, "epoch", rv.Number, "objects", moved)
		}
	}
	return complete
}

// ecSteward rebuilds the erasure-coded VDIs nobody has open for
// writing, of which this node is the steward (the first replica of the
// VDI's first map object in rv): it opens each for writing, as a client
// would (so a client that opens it meanwhile takes the lock over, as
// from any writer), refolds what rv places elsewhere (ecScan), and
// closes it. It says whether every such VDI was done.
func (g *Gateway) ecSteward(rv *layout.Epoch) bool {
	self := g.cluster.ID()
	complete := true
	for _, v := range g.cluster.Tree() {
		if v.EC == "" || v.Deleted || g.ctx.Err() != nil {
			continue
		}
		if v.Snapshot {
			replicas := rv.ReplicasOf(object.MapOID(object.VDIID(v.ID), 0), v.Copies)
			if len(replicas) > 0 && replicas[0].ID == self && !g.ecPlaceSnapshot(rv, v) {
				complete = false
			}
			continue
		}
		if _, held := g.cluster.Lock(cluster.VDILockKey(v.Name)); held {
			continue // its writer's gateway places its chunks
		}
		replicas := rv.ReplicasOf(object.MapOID(object.VDIID(v.ID), 0), v.Copies)
		if len(replicas) == 0 || replicas[0].ID != self {
			continue
		}
		ctx, cancel := context.WithTimeout(g.ctx, roundTimeout)
		d, err := g.Open(ctx, v.Name)
		cancel()
		if err != nil {
			g.logger.Warn("gateway: opening an erasure-coded vdi to place its chunks", "vdi", v.Name, "err", err)
			complete = false
			continue
		}
		if !g.ecScan(rv, d.state) {
			complete = false
		}
		d.Close()
	}
	return complete
}

// ecPlaceSnapshot refolds the objects of snapshot v whose chunks are not
// where rv places them. A snapshot has no writer and its objects never
// change, so no lock is needed: the refold keeps the overlay (readers
// may hold an older view; ecRead reads again through the new head when
// the old chunks are gone), and two stewards refolding one object at
// once (in two epochs) write the same bytes.
func (g *Gateway) ecPlaceSnapshot(rv *layout.Epoch, v cluster.VDI) bool {
	conf, err := g.ecOf(v)
	if err != nil || conf == nil {
		return err == nil
	}
	ctx, cancel := context.WithTimeout(g.ctx, roundTimeout)
	entries, err := g.Map(ctx, v)
	cancel()
	if err != nil {
		g.logger.Warn("gateway: reading a snapshot's map to place its chunks", "vdi", v.FullName(), "err", err)
		return false
	}
	complete, moved := true, 0
	for index, owner := range entries {
		if owner != v.ID || g.ctx.Err() != nil {
			continue
		}
		if current, err := g.layouts.Current(); err != nil || current.Number != rv.Number {
			return false
		}
		oid := object.DataOID(object.VDIID(v.ID), uint32(index))
		done, err := func() (bool, error) {
			ctx, cancel := context.WithTimeout(g.ctx, roundTimeout)
			defer cancel()
			view, err := g.ecLoad(ctx, conf, oid)
			if err != nil || !view.hasHead {
				return false, err
			}
			homes, err := g.ecHomes(rv, conf, oid)
			if err != nil {
				return false, nil
			}
			same := true
			for c, n := range homes {
				same = same && view.head.Homes[c] == n.ID
			}
			if same {
				return false, nil
			}
			if g.options.Pace != nil {
				if err := g.options.Pace(ctx, uint64(conf.layout.Geometry.ObjectSize)); err != nil {
					return false, err
				}
			}
			content := make([]byte, conf.layout.Geometry.ObjectSize)
			if err := g.ecReadView(ctx, conf, oid, view, content, 0, false); err != nil {
				return false, err
			}
			return true, g.ecFoldKeeping(ctx, conf, oid, view, content, false, true)
		}()
		if err != nil {
			g.logger.Warn("gateway: placing a snapshot's erasure-coded object", "vdi", v.FullName(), "index", index, "err", err)
			complete = false
		}
		if done && err == nil {
			moved++
		}
	}
	if moved > 0 {
		g.logger.Info("gateway: refolded a snapshot's erasure-coded objects onto the epoch's placement", "vdi", v.FullName(), "epoch", rv.Number, "objects", moved)
	}
	return complete
}

// ecPlace refolds oid if its chunks are not where rv places them, and
// says whether it did.
func (g *Gateway) ecPlace(rv *layout.Epoch, state *vdiState, conf *ecConf, oid object.OID) (bool, error) {
	moved, err := g.ecPlaceOnce(rv, state, conf, oid, false)
	if errors.Is(err, errNeedsPacing) {
		// A rebuild reads the object (K chunks' worth): paced like
		// recovery's copies, from the same budget, with no lock held.
		ctx, cancel := context.WithTimeout(g.ctx, 10*roundTimeout)
		err = g.options.Pace(ctx, uint64(conf.layout.Geometry.ObjectSize))
		cancel()
		if err != nil {
			return false, err
		}
		moved, err = g.ecPlaceOnce(rv, state, conf, oid, true)
	}
	return moved, err
}

// errNotWriter: the scan's state no longer holds the writer lock.
var errNotWriter = errors.New("gateway: no longer this vdi's writer")

// errNeedsPacing: ecPlaceOnce found a refold due, and was not paced.
var errNeedsPacing = errors.New("gateway: a refold waits for the recovery rate")

func (g *Gateway) ecPlaceOnce(rv *layout.Epoch, state *vdiState, conf *ecConf, oid object.OID, paced bool) (bool, error) {
	state.io.RLock()
	defer state.io.RUnlock()
	if !holdsWriter(state, object.VDI(oid)) {
		// Handed over (or snapshotted) since the scan began: the
		// writer now places the chunks.
		return false, errNotWriter
	}
	ctx, cancel := context.WithTimeout(g.writer.withFence(g.ctx, state), roundTimeout)
	defer cancel()
	g.ec.mu.Lock()
	_, cached := g.ec.objects[oid]
	g.ec.mu.Unlock()
	o, unlock, err := g.ecObjectOf(ctx, state, conf, oid, true)
	if errors.Is(err, object.ErrNoObject) || errors.Is(err, object.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer unlock()
	if !cached {
		// Loaded for the scan only: not kept (a scan goes through every
		// object of the VDI), unless its overlay is to fold.
		defer func() {
			if o.view == nil || o.view.overlaid() == 0 {
				o.dead = true
				g.ec.mu.Lock()
				if g.ec.objects[oid] == o {
					delete(g.ec.objects, oid)
				}
				g.ec.mu.Unlock()
			}
		}()
	}
	v := o.view
	if !v.hasHead {
		return false, nil // never folded: the folder folds its overlay
	}
	homes, err := g.ecHomes(rv, conf, oid)
	if err != nil {
		return false, nil // not placeable in this epoch: degraded until it is
	}
	same := true
	for c, n := range homes {
		same = same && v.head.Homes[c] == n.ID
	}
	if same {
		return false, nil
	}
	if !paced && g.options.Pace != nil {
		return false, errNeedsPacing
	}
	content := make([]byte, conf.layout.Geometry.ObjectSize)
	if err := g.ecReadView(ctx, conf, oid, v, content, 0, true); err != nil {
		o.view = nil
		return false, err
	}
	if err := g.ecFold(ctx, conf, oid, v, content, false); err != nil {
		o.view = nil
		return false, err
	}
	return true, nil
}

func (g *Gateway) ecFoldIdle() { g.ecFoldWhere(nil) }

// ecFoldClosing folds every overlay of state's objects now: the last
// writer closes the VDI, and nobody would fold them until it is opened
// for writing again.
func (g *Gateway) ecFoldClosing(state *vdiState) { g.ecFoldWhere(state) }

// ecFoldWhere folds what is due (only: every overlay of state's objects).
func (g *Gateway) ecFoldWhere(only *vdiState) {
	rv, err := g.layouts.Current()
	if err != nil {
		return
	}
	g.ec.mu.Lock()
	objects := make(map[object.OID]*ecObject, len(g.ec.objects))
	for oid, o := range g.ec.objects {
		if only == nil || o.state == only {
			objects[oid] = o
		}
	}
	g.ec.mu.Unlock()
	for oid, o := range objects {
		if g.ctx.Err() != nil {
			return
		}
		// As a request does: io shared first (a handover or a snapshot
		// waits for the fold to end, and no fold starts under them),
		// then the object, still of that state.
		o.lock.Lock()
		state := o.state
		o.lock.Unlock()
		if state != nil {
			state.io.RLock()
		}
		o.lock.Lock()
		if o.state != state {
			o.lock.Unlock()
			if state != nil {
				state.io.RUnlock()
			}
			continue
		}
		if g.ecFoldIfDue(rv, oid, o, only != nil) {
			o.dead = true
			g.ec.mu.Lock()
			if g.ec.objects[oid] == o {
				delete(g.ec.objects, oid)
			}
			g.ec.mu.Unlock()
		}
		o.lock.Unlock()
		if state != nil {
			state.io.RUnlock()
		}
	}
}

// ecFoldIfDue folds o (locked) if its overlay is idle, or refolds it if
// a chunk's home left the epoch, while its state still holds the lock
// its view was loaded under. It says whether o may be forgotten.
func (g *Gateway) ecFoldIfDue(rv *layout.Epoch, oid object.OID, o *ecObject, now bool) (evict bool) {
	unused := time.Since(time.Unix(0, o.lastUse.Load())) >= ecEvictAfter
	v := o.view
	if v == nil {
		return unused
	}
	state := o.state
	// Only the VDI's own objects: after a snapshot, the objects written
	// before it are the snapshot's, which nothing changes.
	if !holdsWriter(state, object.VDI(oid)) || lockGenOf(state) != o.lockGen {
		o.view = nil
		return unused
	}
	idle := v.overlaid() > 0 && (now || time.Since(o.lastWrite) >= ecFoldIdle)
	moved := false
	if v.hasHead {
		for _, id := range v.head.Homes {
			if !rv.Member(id) {
				moved = true
			}
		}
	}
	if !idle && !moved {
		return unused && v.overlaid() == 0
	}
	if _, err := g.ecHomes(rv, o.conf, oid); err != nil {
		return false // not placeable in this epoch: degraded until it is
	}
	ctx, cancel := context.WithTimeout(g.writer.withFence(g.ctx, state), roundTimeout)
	defer cancel()
	content := make([]byte, o.conf.layout.Geometry.ObjectSize)
	if err := g.ecReadView(ctx, o.conf, oid, v, content, 0, true); err != nil {
		g.logger.Warn("gateway: reading an erasure-coded object to fold it", "object", fmt.Sprintf("%016x", oid), "err", err)
		o.view = nil
		return false
	}
	if err := g.ecFold(ctx, o.conf, oid, v, content, false); err != nil {
		g.logger.Warn("gateway: folding an erasure-coded object", "object", fmt.Sprintf("%016x", oid), "err", err)
		o.view = nil
		return false
	}
	if moved {
		g.logger.Info("gateway: refolded an erasure-coded object whose chunks' homes left the epoch", "object", fmt.Sprintf("%016x", oid), "generation", v.head.Generation, "epoch", rv.Number)
	}
	return false
}

// CheckChunks checks the chunks of data object oid of erasure-coded vdi
// (`herd vdi check`): every chunk of the current generation is read
// whole from its home and each block checked against the head, and a
// stripe whose every chunk matches is checked once more by recomputing
// its parity. With repair, chunks that are missing or fail (at most M)
// are decoded from the others and written whole to their homes. It
// returns how many chunks it checked, how many were bad and how many it
// rewrote, and a line per problem. The caller makes sure no writer
// changes the object meanwhile (maintenance repairs only a VDI nobody
// has open for writing).
func (g *Gateway) CheckChunks(ctx context.Context, vdi cluster.VDI, oid object.OID, repair bool) (checked, bad, repaired int, problems []string, err error) {
	conf, err := g.ecOf(vdi)
	if err != nil || conf == nil {
		return 0, 0, 0, nil, err
	}
	v, err := g.ecLoad(ctx, conf, oid)
	if err != nil || !v.hasHead {
		return 0, 0, 0, nil, err
	}
	rv, err := g.layouts.Current()
	if err != nil {
		return 0, 0, 0, nil, err
	}
	total := conf.scheme.Chunks()
	shards := make([][]byte, total)
	var failed []int
	for c := range total {
		buf := make([]byte, conf.layout.Geometry.ChunkSize)
		checked++
		if err := g.ecFetch(ctx, rv, conf, oid, v, c, buf, 0); err != nil {
			if ctx.Err() != nil {
				return checked, bad, repaired, problems, ctx.Err()
			}
			failed = append(failed, c)
			problems = append(problems, fmt.Sprintf("object %016x: chunk %d (generation %d) on node %s: %v", oid, c, v.head.Generation, v.head.Homes[c], err))
			continue
		}
		shards[c] = buf
	}
	bad = len(failed)
	if bad == 0 {
		if ok, err := conf.codec.Verify(shards); err != nil || !ok {
			problems = append(problems, fmt.Sprintf("object %016x: generation %d: every chunk matches its head but the parity is not that of the data (%v)", oid, v.head.Generation, err))
			bad++
		}
		return checked, bad, 0, problems, nil
	}
	if bad > conf.scheme.M {
		problems = append(problems, fmt.Sprintf("object %016x: %d of %d chunks of generation %d are missing or bad, at most %d can be rebuilt: its data is lost", oid, bad, total, v.head.Generation, conf.scheme.M))
		return checked, bad, 0, problems, nil
	}
	if !repair {
		return checked, bad, 0, problems, nil
	}
	if err := conf.codec.Reconstruct(shards); err != nil {
		return checked, bad, 0, problems, err
	}
	if again, err := g.ecLoad(ctx, conf, oid); err != nil || again.gen() != v.gen() {
		// Folded meanwhile (a writer opened it): its chunks are new,
		// and the slot written here may be theirs.
		return checked, bad, 0, problems, err
	}
	for _, c := range failed {
		node, ok := g.chunkNode(rv, v.head.Homes[c])
		if !ok {
			problems = append(problems, fmt.Sprintf("object %016x: chunk %d's home %s is not in epoch %d: the vdi's next writer refolds it", oid, c, v.head.Homes[c], rv.Number))
			continue
		}
		coid := object.ChunkOID(oid, c, int(v.head.Generation%2))
		if err := g.replicas.Write(ctx, node, rv.Number, coid, shards[c], 0, object.FlagCreate|object.FlagFresh|object.FlagSync); err != nil {
			problems = append(problems, fmt.Sprintf("object %016x: rewriting chunk %d on node %s: %v", oid, c, node.ID, err))
			continue
		}
		repaired++
	}
	return checked, bad, repaired, problems, nil
}

// ScrubChunks is CheckChunks for a deep scrub pass (scrub.Options.Chunks),
// on any data object: 0, 0, 0 for one of a VDI of copies. It repairs
// what it finds bad when no writer can be folding the object meanwhile
// (a snapshot's, or a VDI nobody has open for writing), and logs each
// problem.
func (g *Gateway) ScrubChunks(ctx context.Context, oid object.OID) (checked, bad, repaired int, err error) {
	var vdi cluster.VDI
	found := false
	for _, v := range g.cluster.Tree() {
		if object.VDIID(v.ID) == object.VDI(oid) {
			vdi, found = v, true
		}
	}
	if !found || vdi.EC == "" {
		return 0, 0, 0, nil
	}
	_, locked := g.cluster.Lock(cluster.VDILockKey(vdi.Name))
	repair := vdi.Snapshot || !locked
	checked, bad, repaired, problems, err := g.CheckChunks(ctx, vdi, oid, repair)
	for _, p := range problems {
		g.logger.Error("scrub: "+p, "vdi", vdi.FullName(), "repaired", repaired)
	}
	return checked, bad, repaired, err
}
