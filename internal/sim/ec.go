package sim

// Erasure-coded VDIs in the simulator (Config.ClientEC): crash points
// inside every step of a write and a fold (gateway.ECStep), and the
// invariants' reading of an erasure-coded object straight from the
// stores on disk.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strings"
	"sync"
	"time"

	"github.com/herd-storage/herd/internal/ec"
	"github.com/herd-storage/herd/internal/gateway"
	"github.com/herd-storage/herd/internal/object"
	"github.com/herd-storage/herd/internal/store"
)

// crashRestart is how long a node killed at a crash point stays down at
// least: it starts again at the first step after (its supervisor
// restarting it).
const crashRestart = 500 * time.Millisecond

// gateways maps every running gateway to its process, for the crash
// points' hook: one hook serves every world of the test binary (seeds
// run in parallel), each gateway finding its own.
var gateways sync.Map // *gateway.Gateway -> *process

func init() { gateway.SetECStepHook(crashPoint) }

// crashPoint is the gateways' ECStep hook.
func crashPoint(_ context.Context, g *gateway.Gateway, oid object.OID, step gateway.ECStep) {
	if v, ok := gateways.Load(g); ok {
		p := v.(*process)
		p.w.crashPoint(p, oid, step)
	}
}

// crashPoint kills p's node right there, with the chance the seed gives
// a crash at step (Config.ECWriteCrashPerMille, ECFoldCrashPerMille),
// drawn from a hash of the seed, the node, the object, the step, how
// many times the object passed it and the fake time (not from a stream
// consumed in the order goroutines happen to run). It returns once the process is dead, so
// nothing more of the step runs: every request of a dead process is
// refused.
func (w *World) crashPoint(p *process, oid object.OID, step gateway.ECStep) {
	rate := w.cfg.ECWriteCrashPerMille
	if step.Fold() {
		rate = w.cfg.ECFoldCrashPerMille
	}
	n := p.node
	w.mu.Lock()
	w.passed[step]++
	key := crashKey{oid: oid, step: step}
	w.passes[key]++
	if rate == 0 || !w.crashing || p.dead || n.stopping || w.crashTotalLocked() >= w.cfg.ECCrashes {
		w.mu.Unlock()
		return
	}
	h := fnv.New64a()
	fmt.Fprintf(h, "crash %s %x %d %d %d", n.id, oid, step, w.passes[key], time.Since(w.started))
	if newSplitMix(h.Sum64()^w.seed).next()%1000 >= uint64(rate) {
		w.mu.Unlock()
		return
	}
	w.crashed[step]++
	n.crashed, n.crashedAt = true, time.Now()
	w.killLocked(p)
	w.mu.Unlock()
	what := "write"
	if step.Fold() {
		what = "fold"
	}
	w.note("kill %s inside a %s of object %016x: %s (a crash point)", p.incarnation, what, oid, step)
	p.end()
	<-p.ctx.Done()
}

func (w *World) crashTotalLocked() int {
	total := 0
	for _, n := range w.crashed {
		total += n
	}
	return total
}

// restartCrashed starts again the nodes killed at a crash point at least
// crashRestart ago (not killed by the schedule since).
func (w *World) restartCrashed() error {
	w.mu.Lock()
	var due []*node
	for _, n := range w.nodes {
		if n.crashed && n.killed && time.Since(n.crashedAt) >= crashRestart {
			due = append(due, n)
		}
	}
	w.mu.Unlock()
	for _, n := range due {
		w.note("restart %s after its crash", n.id)
		if err := w.startProcess(n); err != nil {
			return err
		}
	}
	return nil
}

// crashCounts returns the steps passed and the crashes, by step.
func (w *World) crashCounts() (passed, crashed map[string]int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	passed, crashed = map[string]int{}, map[string]int{}
	for step, n := range w.passed {
		passed[step.String()] = n
	}
	for step, n := range w.crashed {
		crashed[step.String()] = n
	}
	return passed, crashed
}

// ecInfo is what reading an erasure-coded object needs of its VDI.
type ecInfo struct {
	scheme ec.Scheme
	layout ec.Layout
	codec  *ec.Codec
}

// ecOf returns the erasure-coding configuration of VDI id, nil for a VDI
// of copies (or one the log does not have).
func (w *World) ecOf(id uint32) (*ecInfo, error) {
	if info, ok := w.ecInfos[id]; ok {
		return info, nil
	}
	scheme, ok := w.log.VDIScheme(id)
	var info *ecInfo
	if ok {
		l, err := ec.NewLayout(scheme, int64(w.cfg.ObjectSize))
		if err != nil {
			return nil, fmt.Errorf("vdi %d: %w", id, err)
		}
		codec, err := ec.NewCodec(scheme)
		if err != nil {
			return nil, fmt.Errorf("vdi %d: %w", id, err)
		}
		info = &ecInfo{scheme: scheme, layout: l, codec: codec}
	}
	w.ecInfos[id] = info
	return info, nil
}

// ecCopy is one node's copy of an object's replicated part, past the
// overlay: its entries and current head.
type ecCopy struct {
	entries []ec.Entry
	head    ec.Head
	hasHead bool
}

func (c *ecCopy) gen() uint32 {
	if !c.hasHead {
		return 0
	}
	return c.head.Generation
}

// ecCopies are the copies one check read (nothing changes during a
// check), by node and object.
type ecCopies map[ecCopyKey]*ecCopy

type ecCopyKey struct {
	node int
	oid  object.OID
}

// ecCopyOf reads n's copy of oid past the overlay (store.ErrNotFound: it
// has none).
func (w *World) ecCopyOf(n *node, info *ecInfo, oid object.OID) (*ecCopy, error) {
	l := info.layout
	tail := make([]byte, l.Size()-l.EntriesOffset())
	if _, err := n.proc.store.Read(oid, tail, uint32(l.EntriesOffset())); err != nil {
		return nil, err
	}
	return parseTail(info, tail)
}

// parseTail reads the entries and heads of a replicated part's tail
// (from the entries to the end).
func parseTail(info *ecInfo, tail []byte) (*ecCopy, error) {
	l := info.layout
	c := &ecCopy{entries: make([]ec.Entry, l.Blocks())}
	for i := range c.entries {
		c.entries[i] = ec.DecodeEntry(tail[int64(i)*ec.EntrySize:])
	}
	h0 := tail[l.HeadOffset(0)-l.EntriesOffset():][:l.HeadSize()]
	h1 := tail[l.HeadOffset(1)-l.EntriesOffset():][:l.HeadSize()]
	head, ok, err := l.Current(h0, h1)
	if err != nil {
		return nil, fmt.Errorf("its heads: %v", err)
	}
	c.head, c.hasHead = head, ok
	return c, nil
}

// ecBlock reads block b of erasure-coded object oid into p as node n's
// copy of its replicated part presents it: from that copy's overlay when
// its entry says so (ec.Resolve), else from the data chunk the copy's
// head names, on the store of the chunk's home, checked against the
// head's CRC, or, when that chunk is missing or fails it, decoded from
// any K chunks that pass theirs. It says where the bytes came from.
// store.ErrNotFound: n has no copy. copies keeps the copies read.
func (w *World) ecBlock(n *node, info *ecInfo, oid object.OID, b int64, p []byte, copies ecCopies) (string, error) {
	key := ecCopyKey{node: n.index, oid: oid}
	c, ok := copies[key]
	if !ok {
		var err error
		if c, err = w.ecCopyOf(n, info, oid); err != nil {
			return "", err
		}
		copies[key] = c
	}
	if _, err := n.proc.store.Read(oid, p, uint32(b*ec.BlockSize)); err != nil {
		return "", fmt.Errorf("its overlay: %v", err)
	}
	e := c.entries[b]
	switch ec.Resolve(e, c.gen(), p) {
	case ec.FromOverlay:
		return "from its overlay", nil
	case ec.Corrupt:
		return "", fmt.Errorf("its overlay's block (crc %08x) matches neither its entry %+v nor its previous content (head generation %d)", ec.Checksum(p), e, c.gen())
	}
	why := ""
	if e.Tag == c.gen()+1 {
		why = fmt.Sprintf(", its overlay's block (crc %08x) not matching its entry %+v", ec.Checksum(p), e)
	}
	if !c.hasHead {
		clear(p)
		return "zeros: never folded" + why, nil
	}
	if err := w.ecChunkBlock(info, oid, &c.head, b, p); err != nil {
		return "", err
	}
	return fmt.Sprintf("from the chunks of generation %d%s", c.gen(), why), nil
}

// ecChunkBlock reads block b of oid from the chunks of head h.
func (w *World) ecChunkBlock(info *ecInfo, oid object.OID, h *ec.Head, b int64, p []byte) error {
	l := info.layout
	chunk, within := int(b/l.ChunkBlocks()), b%l.ChunkBlocks()
	first := w.ecChunkRead(oid, h, chunk, within, p)
	if first == nil {
		return nil
	}
	shards := make([][]byte, info.scheme.Chunks())
	good := 0
	why := []string{fmt.Sprintf("chunk %d: %v", chunk, first)}
	for c := range shards {
		if c == chunk {
			continue
		}
		buf := make([]byte, ec.BlockSize)
		if err := w.ecChunkRead(oid, h, c, within, buf); err != nil {
			why = append(why, fmt.Sprintf("chunk %d: %v", c, err))
			continue
		}
		shards[c] = buf
		good++
	}
	if good < info.scheme.K {
		return fmt.Errorf("generation %d: %d chunks hold block %d's column, %d needed (%s)", h.Generation, good, within, info.scheme.K, strings.Join(why, "; "))
	}
	if err := info.codec.Reconstruct(shards); err != nil {
		return fmt.Errorf("generation %d: decoding block %d: %v", h.Generation, within, err)
	}
	copy(p, shards[chunk])
	return nil
}

// ecChunkRead reads block within of chunk c of head h from its home's
// store and checks it against the head.
func (w *World) ecChunkRead(oid object.OID, h *ec.Head, c int, within int64, p []byte) error {
	home := w.index(h.Homes[c])
	if home < 0 {
		return fmt.Errorf("its home %q is no node", h.Homes[c])
	}
	coid := object.ChunkOID(oid, c, int(h.Generation%2))
	if _, err := w.nodes[home].proc.store.Read(coid, p, uint32(within*ec.BlockSize)); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return fmt.Errorf("missing on %s", h.Homes[c])
		}
		return fmt.Errorf("on %s: %v", h.Homes[c], err)
	}
	if ec.Checksum(p) != h.Sums[c][within] {
		return fmt.Errorf("on %s: block %d does not match its head", h.Homes[c], within)
	}
	return nil
}

// ecChunksProblems checks, once faults stopped, that the current head of
// erasure-coded object oid (tail: its replicated copies' part from the
// entries, identical on every copy) names chunks that exist on their
// homes and match every block CRC, and whose parity is that of their
// data. (The final read-back through a new export checks the content.)
func (w *World) ecChunksProblems(info *ecInfo, oid object.OID, tail []byte) []string {
	c, err := parseTail(info, tail)
	if err != nil {
		return []string{fmt.Sprintf("object %016x: %v", oid, err)}
	}
	if !c.hasHead {
		return nil
	}
	l := info.layout
	shards := make([][]byte, info.scheme.Chunks())
	var problems []string
	for i := range shards {
		buf := make([]byte, l.Geometry.ChunkSize)
		bad := false
		for b := int64(0); b < l.ChunkBlocks(); b++ {
			if err := w.ecChunkRead(oid, &c.head, i, b, buf[b*ec.BlockSize:][:ec.BlockSize]); err != nil {
				problems = append(problems, fmt.Sprintf("object %016x: chunk %d of generation %d, the current one: %v", oid, i, c.head.Generation, err))
				bad = true
				break
			}
		}
		if !bad {
			shards[i] = buf
		}
	}
	if len(problems) > 0 {
		return problems
	}
	if ok, err := info.codec.Verify(shards); err != nil || !ok {
		problems = append(problems, fmt.Sprintf("object %016x: generation %d: every chunk matches its head, but the parity is not that of the data (%v)", oid, c.head.Generation, err))
	}
	return problems
}

// describeTails names where two copies of an erasure-coded object's
// replicated part differ past the overlay: the entries that differ and
// each copy's heads.
func describeTails(info *ecInfo, a, b []byte) string {
	l := info.layout
	var out []string
	for i := int64(0); i < l.Blocks(); i++ {
		at := l.EntriesOffset() + i*ec.EntrySize
		x, y := ec.DecodeEntry(a[at:]), ec.DecodeEntry(b[at:])
		if x != y {
			out = append(out, fmt.Sprintf("block %d's entry %+v vs %+v", i, x, y))
		}
	}
	for slot := 0; slot < 2; slot++ {
		at := l.HeadOffset(slot)
		x, y := a[at:at+l.HeadSize()], b[at:at+l.HeadSize()]
		if !bytes.Equal(x, y) {
			out = append(out, fmt.Sprintf("head slot %d: %s vs %s", slot, describeHead(l, x), describeHead(l, y)))
		}
	}
	return strings.Join(out, "; ")
}

func describeHead(l ec.Layout, raw []byte) string {
	h, err := l.DecodeHead(raw)
	if err != nil {
		return err.Error()
	}
	return fmt.Sprintf("generation %d on %v", h.Generation, h.Homes)
}
