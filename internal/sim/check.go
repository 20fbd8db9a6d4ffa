package sim

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/herd-storage/herd/internal/object"
	"github.com/herd-storage/herd/internal/store"
)

// The invariants read every node's store directly, as files on its disk,
// whether its process runs, is paused or was killed. The step loop calls
// them only once synctest.Wait returned: every goroutine of the world is
// then blocked, so nothing changes while they read.

// checkStores checks invariants (b) and (c) and returns what is broken.
func (w *World) checkStores() []string {
	var problems []string
	problems = append(problems, w.checkAcknowledged()...)
	problems = append(problems, w.checkStamps()...)
	return problems
}

// checkAcknowledged is invariant (b): every acknowledged write is held by
// some copy of its object on some node's disk, with the map entry that
// leads to it, unless a later write of unknown outcome (or in flight)
// replaced it. So no acknowledged write is lost and no copy is deleted
// before its replacement exists.
func (w *World) checkAcknowledged() []string {
	var problems []string
	block := make([]byte, blockSize)
	entry := make([]byte, 4)
	perMap := w.cfg.ObjectSize / 4
	copies := ecCopies{}
	for _, c := range w.clients {
		if !c.running() {
			continue
		}
		c.mu.Lock()
		acked := slices.Clone(c.acked)
		allowed := map[int][]uint64{}
		for b, seqs := range c.uncertain {
			allowed[b] = slices.Clone(seqs)
		}
		for b, seq := range c.pending {
			allowed[b] = append(allowed[b], seq)
		}
		c.mu.Unlock()
		mapped := map[uint32]bool{}
		// With snapshots (Config.Layers) a block's write is in the object
		// of the chain member a read finds it in: the VDI's own, or an
		// ancestor's (until a merge or flatten copies it into the VDI).
		chain := w.chainOf(c)
		owners := map[uint32]uint32{}
		for b, seq := range acked {
			if seq == 0 {
				continue
			}
			offset := uint64(b) * blockSize
			index := uint32(offset / w.cfg.ObjectSize)
			owner := c.vdiID
			if len(chain) > 1 {
				var known bool
				if owner, known = owners[index]; !known {
					owner = w.ownerOf(chain, index)
					owners[index] = owner
				}
				if owner == 0 {
					if !mapped[index] {
						problems = append(problems, fmt.Sprintf("client %d: object %d holds acknowledged write #%d to block %d, but no map of the vdi's chain %v has an entry for it", c.id, index, seq, b, chain))
						mapped[index] = true
					}
					continue
				}
				mapped[index] = true // ownerOf read the owner's entry
			}
			oid := object.DataOID(object.VDIID(owner), index)
			// An erasure-coded object's block is where its replicated
			// part on that node says: its overlay or its chunks (ec.go).
			info, err := w.ecOf(owner)
			if err != nil {
				problems = append(problems, err.Error())
				continue
			}
			var seen []string
			found := false
			for _, n := range w.nodes {
				var err error
				where := ""
				if info != nil {
					where, err = w.ecBlock(n, info, oid, int64(offset%w.cfg.ObjectSize)/blockSize, block, copies)
					where = " " + where
				} else {
					_, err = n.proc.store.Read(oid, block, uint32(offset%w.cfg.ObjectSize))
				}
				if errors.Is(err, store.ErrNotFound) {
					continue
				}
				if err != nil {
					seen = append(seen, fmt.Sprintf("%s: %v", n.id, err))
					continue
				}
				got, err := decode(c.id, b, block)
				if err == nil && (got == seq || slices.Contains(allowed[b], got)) {
					found = true
					break
				}
				if err != nil {
					seen = append(seen, fmt.Sprintf("%s holds no write%s (%v)", n.id, where, err))
					continue
				}
				seen = append(seen, fmt.Sprintf("%s holds #%d%s", n.id, got, where))
			}
			if !found {
				problems = append(problems, fmt.Sprintf("client %d: acknowledged write #%d to block %d (object %016x) is on no node's disk (%s)", c.id, seq, b, oid, strings.Join(seen, "; ")))
			}
			if mapped[index] {
				continue
			}
			mapOID := object.MapOID(object.VDIID(c.vdiID), uint32(uint64(index)/perMap))
			for _, n := range w.nodes {
				if _, err := n.proc.store.Read(mapOID, entry, uint32(uint64(index)%perMap*4)); err == nil && binary.BigEndian.Uint32(entry) == c.vdiID {
					mapped[index] = true
					break
				}
			}
			if !mapped[index] {
				problems = append(problems, fmt.Sprintf("client %d: object %d holds acknowledged write #%d to block %d, but no node's copy of the map object %016x says the vdi owns it", c.id, index, seq, b, mapOID))
				mapped[index] = true // once per object
			}
		}
	}
	return problems
}

// checkStamps is invariant (c): the epoch stamp of a node's copy of an
// object never decreases while the copy exists. It looks at every object
// the clients' VDIs can have (their data and map objects: nothing else
// is written), which costs far less than listing every store.
func (w *World) checkStamps() []string {
	var problems []string
	for _, n := range w.nodes {
		for _, oid := range w.objects() {
			key := stampKey{node: n.index, oid: oid}
			stamp, err := n.proc.store.Epoch(oid)
			if errors.Is(err, store.ErrNotFound) {
				delete(w.stamps, key) // removed: a new copy starts afresh
				continue
			}
			if err != nil {
				problems = append(problems, fmt.Sprintf("%s: the stamp of object %016x: %v", n.id, oid, err))
				continue
			}
			if before, ok := w.stamps[key]; ok && stamp < before {
				problems = append(problems, fmt.Sprintf("%s: the stamp of object %016x went back from epoch %d to %d", n.id, oid, before, stamp))
			}
			w.stamps[key] = stamp
		}
	}
	return problems
}

// objects returns every object the clients' VDIs can have (those that
// exist: a VDI created after the upgrade once it is).
func (w *World) objects() []object.OID {
	if w.oids == nil {
		count := w.cfg.VDISize / w.cfg.ObjectSize
		perMap := w.cfg.ObjectSize / 4
		for _, c := range w.clients {
			if !c.running() {
				continue
			}
			for _, id := range w.chainOf(c) {
				for i := uint64(0); i < count; i++ {
					w.oids = append(w.oids, object.DataOID(object.VDIID(id), uint32(i)))
				}
				for k := uint64(0); k*perMap < count; k++ {
					w.oids = append(w.oids, object.MapOID(object.VDIID(id), uint32(k)))
				}
			}
		}
	}
	oids := w.oids
	if w.cfg.Layers {
		w.oids = nil // the chains change: listed again at every check
	}
	return oids
}

// converged is invariant (d) on the stores, once faults stopped: every
// object has exactly its VDI's copies (the format's or the VDI's own), on
// the nodes the final epoch places it on, all stamped with that epoch and
// identical (chunks of erasure-coded objects aside: the current head of
// each names chunks that exist on their homes and match it). It returns what still
// differs. Copies that differ only where they hold different writes the
// model allows (an acknowledged write and a later one of unknown outcome)
// differ too: each read would be allowed, but two reads of the same block
// could return the new write and then the old one, and nothing would ever
// make the copies equal (the gateway's suspect objects prevent it).
func (w *World) converged() (problems []string) {
	p := w.nodes[0].proc
	type holder struct {
		node  int
		stamp object.Epoch
	}
	holders := map[object.OID][]holder{}
	for _, n := range w.nodes {
		err := n.proc.store.List(func(oid object.OID, info store.Info) error {
			if object.IsChunk(oid) {
				// One copy, on the node its object's head names, stamped
				// when written: neither placed by the epoch nor
				// restamped, so none of this applies.
				return nil
			}
			holders[oid] = append(holders[oid], holder{node: n.index, stamp: info.Epoch})
			return nil
		})
		if err != nil {
			return []string{fmt.Sprintf("%s: listing its store: %v", n.id, err)}
		}
	}
	oids := make([]object.OID, 0, len(holders))
	for oid := range holders {
		oids = append(oids, oid)
	}
	sort.Slice(oids, func(i, j int) bool { return oids[i] < oids[j] })
	for _, oid := range oids {
		copies, ok := w.log.VDICopies(uint32(object.VDI(oid)))
		if !ok {
			problems = append(problems, fmt.Sprintf("object %016x: its vdi %d is not in the log", oid, object.VDI(oid)))
			continue
		}
		epoch, placed, err := p.gateway.ReplicasOf(oid, copies)
		if err != nil {
			return []string{err.Error()}
		}
		var want, have []string
		for _, n := range placed {
			want = append(want, n.ID)
		}
		stale := ""
		for _, h := range holders[oid] {
			have = append(have, w.nodes[h.node].id)
			if h.stamp != epoch {
				stale += fmt.Sprintf(" %s's is stamped %d, not %d;", w.nodes[h.node].id, h.stamp, epoch)
			}
		}
		slices.Sort(want)
		slices.Sort(have)
		if !slices.Equal(want, have) {
			problems = append(problems, fmt.Sprintf("object %016x: copies on %v, placed on %v", oid, have, want))
			continue
		}
		if stale != "" {
			problems = append(problems, fmt.Sprintf("object %016x:%s", oid, stale))
			continue
		}
		// An erasure-coded data object's replicated part is its overlay,
		// entries and heads, all compared.
		size := int64(w.cfg.ObjectSize)
		info := (*ecInfo)(nil)
		if object.Type(oid) == object.TypeData {
			if info, err = w.ecOf(uint32(object.VDI(oid))); err != nil {
				problems = append(problems, err.Error())
				continue
			}
		}
		if info != nil {
			size = info.layout.Size()
		}
		var first []byte
		same := true
		for i, h := range holders[oid] {
			data := make([]byte, size)
			if _, err := w.nodes[h.node].proc.store.Read(oid, data, 0); err != nil {
				problems = append(problems, fmt.Sprintf("object %016x: reading %s's copy: %v", oid, w.nodes[h.node].id, err))
				same = false
				break
			}
			if i == 0 {
				first = data
			} else if !bytes.Equal(first, data) {
				same = false
				if info != nil && bytes.Equal(first[:w.cfg.ObjectSize], data[:w.cfg.ObjectSize]) {
					problems = append(problems, fmt.Sprintf("object %016x: %s's copy differs from %s's in %s", oid, w.nodes[h.node].id, w.nodes[holders[oid][0].node].id, describeTails(info, data, first)))
					break
				}
				detail, allowed := w.describeDifference(oid, data[:w.cfg.ObjectSize], first[:w.cfg.ObjectSize])
				kind := ""
				if allowed {
					kind = " (only in blocks holding writes of unknown outcome: a failed write reached some replicas only, and was not repaired)"
				}
				problems = append(problems, fmt.Sprintf("object %016x: %s's copy differs from %s's%s%s", oid, w.nodes[h.node].id, w.nodes[holders[oid][0].node].id, detail, kind))
				break
			}
		}
		if info != nil && same {
			problems = append(problems, w.ecChunksProblems(info, oid, first[info.layout.EntriesOffset():])...)
		}
	}
	return problems
}

// describeDifference names the blocks in which two copies of a data
// object differ and the writes each holds there, with what the client's
// model says of them; allowed says whether each copy holds, in every such
// block, a write a read may return.
func (w *World) describeDifference(oid object.OID, a, b []byte) (detail string, allowed bool) {
	if object.Type(oid) != object.TypeData {
		return "", false
	}
	var c *client
	for _, x := range w.clients {
		if slices.Contains(w.chainOf(x), uint32(object.VDI(oid))) {
			c = x
		}
	}
	if c == nil {
		return "", false
	}
	var out []string
	allowed = true
	base := int(uint64(oid&0xffffffff) * w.cfg.ObjectSize / blockSize)
	for i := 0; i+blockSize <= len(a); i += blockSize {
		if bytes.Equal(a[i:i+blockSize], b[i:i+blockSize]) {
			continue
		}
		block := base + i/blockSize
		x, errX := decode(c.id, block, a[i:i+blockSize])
		y, errY := decode(c.id, block, b[i:i+blockSize])
		acked, uncertain := c.possible(block)
		ok := func(seq uint64) bool { return seq == acked || slices.Contains(uncertain, seq) }
		allowed = allowed && errX == nil && errY == nil && ok(x) && ok(y)
		out = append(out, fmt.Sprintf("block %d: #%d vs #%d (acknowledged #%d, unknown outcome %v)", block, x, y, acked, uncertain))
	}
	return ": " + strings.Join(out, "; "), allowed
}
