// Package scrub is each node's background scrub: it reads every copy the
// node holds, on a schedule and at a rate limit, so that rot in data no
// client reads is found and repaired while the other replicas are still
// there to repair it from, not when a failure needs that copy.
//
// A pass lists the node's copies and reads each through the store, which
// checks every 4 KiB block against its checksum (internal/store). A chunk
// that fails is repaired from another replica: the same chunk is read
// from a replica of the current epoch (whose read verifies it) and
// written here with the REPAIR flag, which rewrites only the blocks that
// fail, so a repair never undoes a newer write.
//
// Invariants:
//   - A copy is repaired only while it is current in the epoch (stamped
//     with it) and only from a replica current in the same epoch: equal
//     stamps mean equal content, so no block of another history is mixed
//     in. A copy not yet current is left to recovery and the next pass.
//   - A block bad on every replica is never rewritten: it is counted as
//     unrepairable and logged with its object and offset (its reads fail
//     with an I/O error; `herd vdi check` reports it).
//   - Copies written before checksums (format version 1) are rewritten
//     with checksums (store.Upgrade) under the replica's exclusive object
//     lock, so no write interleaves: the first pass gives every copy of a
//     cluster formatted before checksums its checksums.
//   - The rate limit bounds the bytes read per second; it and pause,
//     resume and start take effect at once (`herd scrub`).
//
// Every DeepEvery-th pass is deep: for each object of which this node is
// the first replica in the current placement, the other replicas' copies
// are read too (within the same rate limit) and compared with this one.
// Copies with the same stamp must be identical; copies that verify but
// differ are reported (logged, counted: `herd vdi check --repair` makes
// them identical), since no checksum can tell which is right.
//
// Chunks of erasure-coded objects (object.IsChunk) are read and verified
// like any copy, but have no replica: one copy each, on the node their
// object's head names. A bad block in one is never "repaired" from
// another node (which holds no copy of that id, or an unrelated one the
// epoch's placement of the id happens to name): it is counted as
// unrepairable and logged, and left to the VDI's gateway, which checks
// chunks against their object's head. Deep passes do not compare them.
package scrub

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/layout"
	"github.com/herd-storage/herd/internal/object"
	"github.com/herd-storage/herd/internal/store"
)

// chunkSize is how much of a copy one read checks (and one repair covers).
const chunkSize = 1 << 20

// deepEveryDefault: one pass in four is deep (every four weeks by default).
const deepEveryDefault = 4

// Store is the node's object store as the scrub uses it.
type Store interface {
	List(fn func(oid object.OID, info store.Info) error) error
	Read(oid object.OID, p []byte, offset uint32) (store.Info, error)
	Repair(oid object.OID, p []byte, offset uint32) (int, error)
	Stat(oid object.OID) (store.Info, error)
	Upgrade(oid object.OID) (bool, error)
}

// Replicas reads other nodes' copies (replica.Client).
type Replicas interface {
	Read(ctx context.Context, node cluster.Node, epoch object.Epoch, oid object.OID, p []byte, offset uint32) (object.Epoch, error)
	Fetch(ctx context.Context, node cluster.Node, epoch object.Epoch, oid object.OID, p []byte) (object.Epoch, error)
}

// Options configure New.
type Options struct {
	// Interval between the starts of two passes (default a week).
	Interval time.Duration
	// MaxRate bounds the bytes read per second (default 50 MiB/s).
	MaxRate uint64
	// StatePath keeps the time of the last complete pass across
	// restarts (DATA/scrub.json).
	StatePath string
	// Exclusive runs fn with the replica's exclusive lock on oid
	// (replica.Replica.Exclusive).
	Exclusive func(oid object.OID, fn func() error) error
	// DeepEvery makes every DeepEvery-th pass deep (default 4).
	DeepEvery int
	// ObjectSize is the size of oid's VDI's objects (deep passes compare
	// whole objects); nil disables deep passes.
	ObjectSize func(oid object.OID) (uint64, error)
	// Copies is the number of copies of oid's VDI, false when the VDI is
	// unknown (cluster.State.CopiesOf); an object's replicas are its
	// VDI's copies of it. nil: every VDI has the format's copies.
	Copies func(oid object.OID) (int, bool)
	// Chunks, if set, checks the chunks of a data object of an
	// erasure-coded VDI against its head, the parity against the data,
	// and rewrites what is bad where that is safe
	// (gateway.Gateway.ScrubChunks); a deep pass runs it on the node of
	// the object's first replica, after comparing the replicas. It
	// returns 0, 0, 0 for an object of a VDI of copies.
	Chunks func(ctx context.Context, oid object.OID) (checked, bad, repaired int, err error)
	Logger *slog.Logger
	// Now is the clock (tests); nil is time.Now.
	Now func() time.Time
}

// Status is what `herd scrub status` shows for one node.
type Status struct {
	// State: idle (waiting for the next pass), running or paused.
	State string `json:"state"`
	// The pass running now (or the last one).
	PassStarted   time.Time `json:"pass_started,omitzero"`
	Objects       int       `json:"objects"`
	Done          int       `json:"done"`
	BytesVerified uint64    `json:"bytes_verified"`
	// Counts over the node's life (since it started): chunks that
	// failed their checksums, blocks repaired from another replica,
	// chunks with blocks no replica had good (and those of an
	// erasure-coded object's chunk, which has no replica: left to its
	// gateway), copies given checksums.
	ChecksumErrors uint64 `json:"checksum_errors"`
	Repaired       uint64 `json:"blocks_repaired"`
	Unrepairable   uint64 `json:"unrepairable"`
	Upgraded       uint64 `json:"upgraded"`
	// Deep says the pass running (or the last) compares replicas;
	// Compared counts the objects it compared, Mismatched those whose
	// replicas differ under one stamp.
	Deep       bool   `json:"deep"`
	Compared   uint64 `json:"compared"`
	Mismatched uint64 `json:"mismatched"`
	// ChunksChecked counts the chunks of erasure-coded objects a deep
	// pass checked against their heads (Options.Chunks), ChunksBad those
	// missing or failing, ChunksRepaired those it rewrote.
	ChunksChecked  uint64 `json:"chunks_checked,omitempty"`
	ChunksBad      uint64 `json:"chunks_bad,omitempty"`
	ChunksRepaired uint64 `json:"chunks_repaired,omitempty"`
	Passes         uint64 `json:"passes"`
	// LastComplete is the end of the last pass that read every copy.
	LastComplete time.Time `json:"last_complete,omitzero"`
	NextPass     time.Time `json:"next_pass,omitzero"`
	// Limits in force.
	MaxRate         uint64  `json:"max_rate_bytes_per_second"`
	IntervalSeconds float64 `json:"interval_seconds"`
	LastError       string  `json:"last_error,omitempty"`
}

// Scrubber runs one node's scrub.
type Scrubber struct {
	store    Store
	replicas Replicas
	layouts  *layout.History
	self     string
	options  Options
	limiter  *rate.Limiter
	wake     chan struct{}

	mu       sync.Mutex
	cond     sync.Cond // signalled on resume
	paused   bool
	startNow bool
	status   Status
}

// New returns the scrub of node self. Run starts it.
func New(s Store, replicas Replicas, layouts *layout.History, self string, options Options) *Scrubber {
	if options.Interval <= 0 {
		options.Interval = 7 * 24 * time.Hour
	}
	if options.MaxRate == 0 {
		options.MaxRate = 50 << 20
	}
	if options.Logger == nil {
		options.Logger = slog.New(slog.DiscardHandler)
	}
	if options.Now == nil {
		options.Now = time.Now
	}
	if options.DeepEvery <= 0 {
		options.DeepEvery = deepEveryDefault
	}
	sc := &Scrubber{
		store: s, replicas: replicas, layouts: layouts, self: self, options: options,
		limiter: rate.NewLimiter(rate.Limit(options.MaxRate), chunkSize),
		wake:    make(chan struct{}, 1),
	}
	sc.cond.L = &sc.mu
	sc.status.State = "idle"
	sc.status.MaxRate = options.MaxRate
	sc.status.IntervalSeconds = options.Interval.Seconds()
	sc.status.LastComplete = sc.loadLastComplete()
	return sc
}

// Status returns the scrub's progress and counts.
func (sc *Scrubber) Status() Status {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	st := sc.status
	if st.State == "idle" {
		st.NextPass = sc.nextPassLocked()
	}
	return st
}

// Start starts a pass now (or after the one running).
func (sc *Scrubber) Start() {
	sc.mu.Lock()
	sc.startNow = true
	sc.paused = false
	sc.cond.Broadcast()
	sc.mu.Unlock()
	sc.kick()
}

// Pause holds the running pass (and keeps new ones from starting) until
// Resume or Start.
func (sc *Scrubber) Pause() {
	sc.mu.Lock()
	sc.paused = true
	if sc.status.State == "running" {
		sc.status.State = "paused"
	}
	sc.mu.Unlock()
}

// Resume lets a paused pass go on.
func (sc *Scrubber) Resume() {
	sc.mu.Lock()
	sc.paused = false
	if sc.status.State == "paused" {
		sc.status.State = "running"
	}
	sc.cond.Broadcast()
	sc.mu.Unlock()
	sc.kick()
}

// SetMaxRate changes the rate limit at once.
func (sc *Scrubber) SetMaxRate(bytesPerSecond uint64) error {
	if bytesPerSecond < 4096 {
		return fmt.Errorf("%w: scrub rate %d bytes/s: at least 4KiB/s", object.ErrInvalid, bytesPerSecond)
	}
	sc.limiter.SetLimit(rate.Limit(bytesPerSecond))
	sc.mu.Lock()
	sc.status.MaxRate = bytesPerSecond
	sc.mu.Unlock()
	return nil
}

func (sc *Scrubber) kick() {
	select {
	case sc.wake <- struct{}{}:
	default:
	}
}

func (sc *Scrubber) nextPassLocked() time.Time {
	if sc.paused {
		return time.Time{}
	}
	return sc.status.LastComplete.Add(sc.options.Interval)
}

// Run scrubs until ctx ends: a pass whenever the interval since the last
// complete one has passed, or when Start asks.
func (sc *Scrubber) Run(ctx context.Context) {
	for {
		sc.mu.Lock()
		due := sc.startNow || (!sc.paused && !sc.options.Now().Before(sc.nextPassLocked()))
		wait := sc.nextPassLocked().Sub(sc.options.Now())
		sc.mu.Unlock()
		if !due {
			timer := time.NewTimer(min(max(wait, time.Second), time.Hour))
			select {
			case <-ctx.Done():
				timer.Stop()
				return
			case <-sc.wake:
			case <-timer.C:
			}
			timer.Stop()
			continue
		}
		err := sc.pass(ctx)
		if ctx.Err() != nil {
			return
		}
		sc.mu.Lock()
		sc.startNow = false
		if err != nil {
			sc.status.LastError = err.Error()
			sc.mu.Unlock()
			sc.options.Logger.Warn("scrub: pass failed; trying again in a minute", "err", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Minute):
			}
			continue
		}
		sc.status.LastError = ""
		sc.status.Passes++
		sc.status.LastComplete = sc.options.Now()
		sc.saveLastCompleteLocked()
		st := sc.status
		sc.mu.Unlock()
		sc.options.Logger.Info("scrub: pass complete", "objects", st.Done, "bytes", st.BytesVerified,
			"checksum_errors", st.ChecksumErrors, "blocks_repaired", st.Repaired, "unrepairable", st.Unrepairable)
	}
}

// pass reads every copy once.
func (sc *Scrubber) pass(ctx context.Context) error {
	var oids []object.OID
	if err := sc.store.List(func(oid object.OID, info store.Info) error {
		if !info.Damaged {
			oids = append(oids, oid)
		}
		return nil
	}); err != nil {
		return err
	}
	sc.mu.Lock()
	sc.status.State = "running"
	if sc.paused {
		sc.status.State = "paused"
	}
	sc.status.PassStarted = sc.options.Now()
	sc.status.Deep = sc.options.ObjectSize != nil && sc.status.Passes%uint64(sc.options.DeepEvery) == uint64(sc.options.DeepEvery)-1
	sc.status.Objects, sc.status.Done, sc.status.BytesVerified = len(oids), 0, 0
	sc.mu.Unlock()
	defer func() {
		sc.mu.Lock()
		sc.status.State = "idle"
		sc.mu.Unlock()
	}()
	buffer := make([]byte, chunkSize)
	for _, oid := range oids {
		if err := sc.waitResumed(ctx); err != nil {
			return err
		}
		if err := sc.object(ctx, oid, buffer); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			sc.options.Logger.Warn("scrub: object", "object", fmt.Sprintf("%016x", oid), "err", err)
		}
		sc.mu.Lock()
		sc.status.Done++
		sc.mu.Unlock()
	}
	return nil
}

func (sc *Scrubber) waitResumed(ctx context.Context) error {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	for sc.paused && ctx.Err() == nil {
		stop := context.AfterFunc(ctx, func() {
			sc.mu.Lock()
			sc.cond.Broadcast()
			sc.mu.Unlock()
		})
		sc.cond.Wait()
		stop()
	}
	return ctx.Err()
}

// object scrubs one copy.
func (sc *Scrubber) object(ctx context.Context, oid object.OID, buffer []byte) error {
	upgraded, err := sc.upgrade(oid)
	if err != nil {
		return err
	}
	if upgraded {
		sc.mu.Lock()
		sc.status.Upgraded++
		sc.mu.Unlock()
	}
	info, err := sc.store.Stat(oid)
	if errors.Is(err, object.ErrNotFound) {
		return nil // removed since the listing
	}
	if err != nil {
		return err
	}
	for offset := uint64(0); offset < info.LengthBytes; offset += chunkSize {
		n := min(chunkSize, info.LengthBytes-offset)
		chunk := buffer[:(n+4095)&^4095]
		if err := sc.limiter.WaitN(ctx, len(chunk)); err != nil {
			return err
		}
		if err := sc.waitResumed(ctx); err != nil {
			return err
		}
		_, err := sc.store.Read(oid, chunk, uint32(offset))
		sc.mu.Lock()
		sc.status.BytesVerified += uint64(len(chunk))
		sc.mu.Unlock()
		if errors.Is(err, object.ErrNotFound) {
			return nil
		}
		if errors.Is(err, object.ErrChecksum) {
			sc.mu.Lock()
			sc.status.ChecksumErrors++
			sc.mu.Unlock()
			err = sc.repair(ctx, info.Epoch, oid, chunk, uint32(offset))
		}
		if err != nil {
			return err
		}
	}
	sc.mu.Lock()
	deep := sc.status.Deep
	sc.mu.Unlock()
	if deep {
		return sc.compare(ctx, info.Epoch, oid)
	}
	return nil
}

// compare reads every replica of oid, when this node is its first in
// the current placement, and reports copies that differ under one stamp.
func (sc *Scrubber) compare(ctx context.Context, stamp object.Epoch, oid object.OID) error {
	if object.IsChunk(oid) {
		return nil // one copy, placed by its object's head: no replica to compare
	}
	rv, err := sc.layouts.Current()
	if err != nil || rv.Format.Copies == 0 || stamp != rv.Number {
		return err // not current: recovery's business first
	}
	copies, known := sc.copies(rv, oid)
	if !known {
		return nil // its VDI is not known here (yet, or any more)
	}
	replicas := rv.ReplicasOf(oid, copies)
	if len(replicas) < 2 || replicas[0].ID != sc.self {
		return nil
	}
	size, err := sc.options.ObjectSize(oid)
	if err != nil {
		return nil // its VDI was deleted meanwhile
	}
	var reference []byte
	var from string
	for _, node := range replicas {
		for done := uint64(0); done < size; done += chunkSize {
			if err := sc.limiter.WaitN(ctx, int(min(chunkSize, size-done))); err != nil {
				return err
			}
		}
		data := make([]byte, size)
		got, err := sc.replicas.Fetch(ctx, node, rv.Number, oid, data)
		if err != nil {
			if errors.Is(err, object.ErrChecksum) {
				continue // bad blocks there: repaired by that node's own scrub or the next read
			}
			return fmt.Errorf("comparing replicas: node %s: %w", node.ID, err)
		}
		if got != stamp {
			continue // a copy not yet current there: recovery's business
		}
		if reference == nil {
			reference, from = data, node.ID
			continue
		}
		if !bytes.Equal(reference, data) {
			sc.mu.Lock()
			sc.status.Mismatched++
			sc.mu.Unlock()
			sc.options.Logger.Error("scrub: replicas that verify differ under one stamp; herd vdi check --repair makes them identical",
				"vdi_id", object.VDI(oid), "object", fmt.Sprintf("%016x", oid), "stamp", stamp, "node", node.ID, "differs_from", from)
			return nil
		}
	}
	sc.mu.Lock()
	sc.status.Compared++
	sc.mu.Unlock()
	if sc.options.Chunks != nil && object.Type(oid) == object.TypeData {
		// Its chunks: about as many bytes again, paced alike.
		for done := uint64(0); done < size; done += chunkSize {
			if err := sc.limiter.WaitN(ctx, int(min(chunkSize, size-done))); err != nil {
				return err
			}
		}
		checked, bad, repaired, err := sc.options.Chunks(ctx, oid)
		sc.mu.Lock()
		sc.status.ChunksChecked += uint64(checked)
		sc.status.ChunksBad += uint64(bad)
		sc.status.ChunksRepaired += uint64(repaired)
		sc.mu.Unlock()
		if err != nil {
			return fmt.Errorf("checking the chunks of object %016x: %w", oid, err)
		}
	}
	return nil
}

// copies is the number of copies of oid's VDI, and whether the VDI is
// known (Options.Copies); the format's when it is not.
func (sc *Scrubber) copies(rv *layout.Epoch, oid object.OID) (int, bool) {
	if sc.options.Copies == nil {
		return rv.Format.Copies, true
	}
	if n, ok := sc.options.Copies(oid); ok {
		return n, true
	}
	return rv.Format.Copies, false
}

// upgrade gives a copy written before checksums its checksums.
func (sc *Scrubber) upgrade(oid object.OID) (bool, error) {
	if sc.options.Exclusive == nil {
		return sc.store.Upgrade(oid)
	}
	var upgraded bool
	err := sc.options.Exclusive(oid, func() error {
		var err error
		upgraded, err = sc.store.Upgrade(oid)
		return err
	})
	return upgraded, err
}

// repair rewrites the bad blocks of a chunk from another current replica.
// A chunk of an erasure-coded object has none: its bad blocks are
// reported and left to its gateway.
func (sc *Scrubber) repair(ctx context.Context, stamp object.Epoch, oid object.OID, chunk []byte, offset uint32) error {
	if data, c, slot, ok := object.ChunkOf(oid); ok {
		sc.mu.Lock()
		sc.status.Unrepairable++
		sc.mu.Unlock()
		sc.options.Logger.Error("scrub: blocks of a chunk of an erasure-coded object fail their checksum; a chunk has no replica to repair it from: left to the vdi's gateway, whose reads check chunks against their object's head",
			"vdi_id", object.VDI(oid), "object", fmt.Sprintf("%016x", oid), "data_object", fmt.Sprintf("%016x", data), "chunk", c, "slot", slot,
			"object_offset", offset, "bytes", len(chunk))
		return nil
	}
	rv, err := sc.layouts.Current()
	if err != nil {
		return err
	}
	if rv.Format.Copies == 0 {
		return errors.New("the cluster is not formatted")
	}
	if stamp != rv.Number {
		return fmt.Errorf("blocks at offset %d fail their checksum; the copy is not current in epoch %d (stamped %d): left to recovery and the next pass", offset, rv.Number, stamp)
	}
	var last error = errors.New("no other replica")
	// A VDI unknown here: the format's copies (any replica current in
	// this epoch has the same content; one that holds no copy answers
	// so and the next is tried).
	copies, _ := sc.copies(rv, oid)
	for _, node := range rv.ReplicasOf(oid, copies) {
		if node.ID == sc.self {
			continue
		}
		readCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
		_, err := sc.replicas.Read(readCtx, node, rv.Number, oid, chunk, offset)
		cancel()
		if err != nil {
			last = fmt.Errorf("node %s: %w", node.ID, err)
			continue
		}
		n, err := sc.store.Repair(oid, chunk, offset)
		if err != nil {
			return err
		}
		sc.mu.Lock()
		sc.status.Repaired += uint64(n)
		sc.mu.Unlock()
		sc.options.Logger.Warn("scrub: repaired blocks that failed their checksum", "object", fmt.Sprintf("%016x", oid), "offset", offset, "blocks", n, "from", node.ID)
		return nil
	}
	sc.mu.Lock()
	sc.status.Unrepairable++
	sc.mu.Unlock()
	sc.options.Logger.Error("scrub: blocks fail their checksum and no other replica has them good: their data is lost; reads of them fail",
		"vdi_id", object.VDI(oid), "object", fmt.Sprintf("%016x", oid), "object_offset", offset, "bytes", len(chunk), "err", last)
	return nil
}

type savedState struct {
	LastComplete time.Time `json:"last_complete"`
}

// loadLastComplete reads the time of the last complete pass. A node with
// none counts from its first start, so the first pass comes an interval
// after that, not at once.
func (sc *Scrubber) loadLastComplete() time.Time {
	if sc.options.StatePath == "" {
		return sc.options.Now()
	}
	b, err := os.ReadFile(sc.options.StatePath)
	var saved savedState
	if err == nil && json.Unmarshal(b, &saved) == nil && !saved.LastComplete.IsZero() {
		return saved.LastComplete
	}
	sc.status.LastComplete = sc.options.Now()
	sc.saveLastCompleteLocked()
	return sc.status.LastComplete
}

func (sc *Scrubber) saveLastCompleteLocked() {
	if sc.options.StatePath == "" {
		return
	}
	b, _ := json.Marshal(savedState{LastComplete: sc.status.LastComplete})
	temp := sc.options.StatePath + ".tmp"
	if err := os.WriteFile(temp, b, 0o600); err == nil {
		err = os.Rename(temp, sc.options.StatePath)
		if err != nil {
			sc.options.Logger.Warn("scrub: saving its state", "path", filepath.Base(sc.options.StatePath), "err", err)
		}
	}
}
