package backup

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/gateway"
	"github.com/herd-storage/herd/internal/transfer"
)

// Cluster is what backups need of a herd cluster (api.Client has it).
type Cluster interface {
	VDI(ctx context.Context, name string) (cluster.VDI, error)
	CreateVDI(ctx context.Context, name string, size uint64) (cluster.VDI, error)
	DeleteVDI(ctx context.Context, name string) error
	Snapshot(ctx context.Context, name, tag string) (cluster.SnapshotResult, error)
	Diff(ctx context.Context, name, since string) (gateway.Diff, error)
}

// SnapshotPrefix starts the tags of the snapshots backups take.
const SnapshotPrefix = "backup-"

// CreateOptions shape a backup.
type CreateOptions struct {
	Transfer transfer.Options // where the node's NBD port is, TLS, progress
	Full     bool             // read everything even if an earlier backup exists
	// Notes receives remarks for people (a fallback to a full backup).
	Notes func(string)
}

// Create backs up the VDI name (a snapshot is taken first, tagged
// backup-TIME; or name is a snapshot NAME@TAG, backed up as it is). If the
// store has an earlier backup of the VDI whose snapshot is still an
// ancestor, only what changed since is read; otherwise everything
// allocated. The snapshot of the previous backup is deleted once this one
// is complete: each VDI keeps one backup snapshot per store.
func Create(ctx context.Context, s *Store, c Cluster, name string, options CreateOptions) (*Index, error) {
	started := time.Now()
	note := options.Notes
	if note == nil {
		note = func(string) {}
	}
	phases := map[string]float64{}
	lap := started
	phase := func(name string) {
		now := time.Now()
		phases[name] += now.Sub(lap).Seconds()
		lap = now
	}
	vdiName, snapshot := name, name
	if base, tag := cluster.SplitName(name); tag != "" {
		vdiName = base
	} else {
		tag := SnapshotPrefix + started.UTC().Format("20060102T150405.000Z")
		tag = strings.ReplaceAll(tag, ".", "")
		result, err := c.Snapshot(ctx, name, tag)
		if err != nil {
			return nil, fmt.Errorf("taking the snapshot to back up: %w", err)
		}
		snapshot = result.Snapshot.FullName()
	}
	phase("snapshot")
	taken := snapshot != name
	fail := func(err error) (*Index, error) {
		if taken {
			// The snapshot of a failed backup would only hold space.
			cleanup, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			c.DeleteVDI(cleanup, snapshot)
		}
		return nil, err
	}
	var previous *Index
	var diff gateway.Diff
	if !options.Full {
		latest, err := s.Latest(vdiName)
		if err != nil {
			return fail(err)
		}
		if latest != nil {
			diff, err = c.Diff(ctx, snapshot, latest.Snapshot)
			switch {
			case err == nil:
				previous = latest
			case errors.Is(err, cluster.ErrNotFound) || strings.Contains(err.Error(), "not found"):
				note(fmt.Sprintf("the snapshot of the previous backup (%s) is gone from the cluster: a full backup", latest.Snapshot))
			default:
				return fail(err)
			}
		}
	}
	phase("plan")
	session, err := transfer.OpenSession(ctx, options.Transfer, snapshot, false)
	if err != nil {
		return fail(err)
	}
	defer session.Close()
	phase("connect")
	size := session.Size()
	chunkSize := uint64(s.chunkSize)
	count := (size + chunkSize - 1) / chunkSize
	ix := &Index{ID: newID(vdiName, started), VDI: vdiName, Snapshot: snapshot, Size: size, ChunkSize: s.chunkSize,
		Created: started.UTC(), Kind: "full", Chunks: make([]string, count)}
	need := make([]bool, count)
	mark := func(offset, length uint64, value bool) {
		for i := offset / chunkSize; i < count && i*chunkSize < offset+length; i++ {
			need[i] = value
		}
	}
	if previous != nil {
		ix.Kind, ix.Parent = "incremental", previous.ID
		copy(ix.Chunks, previous.Chunks) // unchanged pieces keep their hash
		for _, e := range diff.Extents {
			mark(e.Offset, e.Length, true)
			if e.Zero {
				// Whole chunks inside zeroed ranges are zeroes now.
				for i := (e.Offset + chunkSize - 1) / chunkSize; (i+1)*chunkSize <= e.Offset+e.Length && i < count; i++ {
					need[i], ix.Chunks[i] = false, ""
				}
			}
		}
		for i := range need {
			if need[i] {
				ix.Chunks[i] = ""
			}
		}
	} else {
		allocated, err := session.Allocated(ctx)
		if err != nil {
			return fail(err)
		}
		for _, r := range allocated {
			mark(r.Offset, r.Length, true)
		}
	}
	phase("plan")
	var ranges []transfer.Range
	var total uint64
	for i := uint64(0); i < count; i++ {
		if !need[i] {
			continue
		}
		length := min(chunkSize, size-i*chunkSize)
		total += length
		if n := len(ranges); n > 0 && ranges[n-1].Offset+ranges[n-1].Length == i*chunkSize {
			ranges[n-1].Length += length
		} else {
			ranges = append(ranges, transfer.Range{Offset: i * chunkSize, Length: length})
		}
	}
	progress := session.Progress(fmt.Sprintf("backing up %s (%s)", snapshot, ix.Kind), total)
	defer progress.Finish()

	// The reader hands pieces over in order; workers hash and store them.
	type piece struct {
		index uint64
		data  []byte
	}
	work := make(chan piece, 64)
	var mu sync.Mutex
	var firstErr error
	var group sync.WaitGroup
	for range 8 { // a chunk write waits for its fsync: more of them in flight
		group.Go(func() {
			for p := range work {
				mu.Lock()
				failed := firstErr != nil
				mu.Unlock()
				if failed {
					continue
				}
				sum, stored, zero := "", false, allZero(p.data)
				var err error
				if !zero {
					sum = Hash(p.data)
					stored, err = s.Put(sum, p.data)
				}
				mu.Lock()
				switch {
				case err != nil:
					if firstErr == nil {
						firstErr = err
					}
				case zero:
					ix.Stats.ZeroChunks++
				case stored:
					ix.Stats.NewChunks++
					ix.Stats.NewBytes += uint64(len(p.data))
				default:
					ix.Stats.ReusedChunks++
				}
				ix.Chunks[p.index] = sum
				mu.Unlock()
				progress.Add(uint64(len(p.data)))
			}
		})
	}
	var pending []byte
	var pendingIndex uint64
	readErr := session.ReadRanges(ctx, ranges, func(offset uint64, data []byte) error {
		mu.Lock()
		err := firstErr
		mu.Unlock()
		if err != nil {
			return err
		}
		ix.Stats.ReadBytes += uint64(len(data))
		for len(data) > 0 {
			index := offset / chunkSize
			if pending == nil {
				pending, pendingIndex = make([]byte, 0, min(chunkSize, size-index*chunkSize)), index
			}
			n := min(uint64(len(data)), uint64(cap(pending)-len(pending)))
			pending = append(pending, data[:n]...)
			data, offset = data[n:], offset+n
			if len(pending) == cap(pending) {
				work <- piece{pendingIndex, pending}
				pending = nil
			}
		}
		return nil
	})
	close(work)
	group.Wait()
	if readErr == nil {
		readErr = firstErr
	}
	if readErr == nil && pending != nil {
		readErr = fmt.Errorf("backup of %s: a chunk was read only in part", snapshot)
	}
	if readErr != nil {
		return fail(readErr)
	}
	for i, sum := range ix.Chunks {
		if sum != "" {
			ix.Stats.DataBytes += min(chunkSize, size-uint64(i)*chunkSize)
		}
		switch {
		case need[i]:
		case previous == nil || sum == "":
			ix.Stats.ZeroChunks++
		default:
			ix.Stats.UnchangedChunks++
		}
	}
	phase("read")
	ix.Stats.Seconds = time.Since(started).Seconds()
	ix.Stats.Phases = phases
	if err := s.SaveIndex(ix); err != nil {
		return fail(err)
	}
	phase("index")
	ix.Stats.Seconds = time.Since(started).Seconds()
	progress.Finish()
	if previous != nil && previous.Snapshot != snapshot {
		if _, tag := cluster.SplitName(previous.Snapshot); strings.HasPrefix(tag, SnapshotPrefix) {
			if err := c.DeleteVDI(ctx, previous.Snapshot); err != nil && !strings.Contains(err.Error(), "not found") {
				note(fmt.Sprintf("deleting the previous backup snapshot %s: %v", previous.Snapshot, err))
			}
		}
	}
	return ix, nil
}

func allZero(p []byte) bool {
	for _, b := range p {
		if b != 0 {
			return false
		}
	}
	return true
}

// RestoreSummary is a restore's result.
type RestoreSummary struct {
	Backup         string  `json:"backup"`
	VDI            string  `json:"vdi"`
	Size           uint64  `json:"size"`
	DataBytes      uint64  `json:"data_bytes"`
	Seconds        float64 `json:"seconds"`
	BytesPerSecond float64 `json:"bytes_per_second"`
}

// Restore writes backup id into a new VDI named name (created here, of the
// backup's size). Every chunk is checked against its hash as it is read:
// a damaged store fails the restore (and the new VDI is deleted), it never
// writes a byte it cannot vouch for.
func Restore(ctx context.Context, s *Store, c Cluster, id, name string, options transfer.Options) (RestoreSummary, error) {
	started := time.Now()
	ix, err := s.Load(id)
	if err != nil {
		return RestoreSummary{}, err
	}
	if _, err := c.VDI(ctx, name); err == nil {
		return RestoreSummary{}, fmt.Errorf("vdi %s exists: restore into a new name (a restore never overwrites a VDI)", name)
	}
	if _, err := c.CreateVDI(ctx, name, ix.Size); err != nil {
		return RestoreSummary{}, fmt.Errorf("creating vdi %s: %w", name, err)
	}
	summary := RestoreSummary{Backup: id, VDI: name, Size: ix.Size}
	var session *transfer.Session
	fail := func(err error) (RestoreSummary, error) {
		if session != nil {
			session.Close()
			session = nil
		}
		cleanup, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		// The writer lock of the closed connections is released in the
		// background: a delete may find it held for a moment.
		var deleteErr error
		for attempt := 1; attempt <= 20; attempt++ {
			if deleteErr = c.DeleteVDI(cleanup, name); deleteErr == nil || !strings.Contains(deleteErr.Error(), "open for writing") {
				break
			}
			time.Sleep(time.Duration(attempt) * 50 * time.Millisecond)
		}
		if deleteErr != nil {
			return summary, fmt.Errorf("%w (and deleting the partly restored vdi %s failed: %v)", err, name, deleteErr)
		}
		return summary, fmt.Errorf("%w (the partly restored vdi %s was deleted)", err, name)
	}
	session, err = transfer.OpenSession(ctx, options, name, true)
	if err != nil {
		return fail(err)
	}
	defer func() {
		if session != nil {
			session.Close()
		}
	}()
	var total uint64
	for i, sum := range ix.Chunks {
		if sum != "" {
			total += min(uint64(ix.ChunkSize), ix.Size-uint64(i)*uint64(ix.ChunkSize))
		}
	}
	progress := session.Progress("restoring "+id+" into "+name, total)
	defer progress.Finish()
	w := session.Writer(ctx)
	chunk := session.ChunkLength()
	for i, sum := range ix.Chunks {
		if sum == "" {
			continue // a new VDI reads as zeroes
		}
		offset := uint64(i) * uint64(ix.ChunkSize)
		length := int(min(uint64(ix.ChunkSize), ix.Size-offset))
		data := make([]byte, length)
		data, err := s.Get(sum, data)
		if err == nil && len(data) != length {
			err = fmt.Errorf("%w: chunk %s holds %d bytes, piece %d of backup %s needs %d", ErrCorrupt, sum, len(data), i, id, length)
		}
		if err != nil {
			w.Close(ctx)
			return fail(fmt.Errorf("backup %s: %w", id, err))
		}
		for done := 0; done < length; done += chunk {
			n := min(chunk, length-done)
			buffer := w.Buffer(n)
			copy(buffer, data[done:done+n])
			if err := w.Write(offset+uint64(done), buffer); err != nil {
				w.Close(ctx)
				return fail(err)
			}
		}
		summary.DataBytes += uint64(length)
		progress.Add(uint64(length))
	}
	if err := w.Close(ctx); err != nil {
		return fail(err)
	}
	progress.Finish()
	summary.Seconds = time.Since(started).Seconds()
	if summary.Seconds > 0 {
		summary.BytesPerSecond = float64(summary.DataBytes) / summary.Seconds
	}
	return summary, nil
}

// VerifyReport is what verify found.
type VerifyReport struct {
	Backups int      `json:"backups"`
	Chunks  int      `json:"chunks"` // stored chunks re-hashed
	Bytes   uint64   `json:"bytes"`
	Damaged []string `json:"damaged,omitempty"` // chunks failing their hash
	Missing []string `json:"missing,omitempty"` // chunks a backup names that are not stored
	// Affected are the backups that name a damaged or missing chunk, or
	// whose index is damaged.
	Affected []string `json:"affected,omitempty"`
	Problems []string `json:"problems,omitempty"`
}

// Verify re-hashes every stored chunk and checks that every chunk a
// backup names is stored and sound.
func Verify(ctx context.Context, s *Store, progress func(n uint64)) (VerifyReport, error) {
	var r VerifyReport
	backups, bad, err := s.List()
	if err != nil {
		return r, err
	}
	for _, e := range bad {
		r.Problems = append(r.Problems, e.Error())
	}
	r.Backups = len(backups)
	all, err := s.Chunks()
	if err != nil {
		return r, err
	}
	stored := map[string]bool{}
	damaged := map[string]bool{}
	jobs := make(chan ChunkInfo)
	var mu sync.Mutex
	var group sync.WaitGroup
	for range 4 {
		group.Go(func() {
			buffer := make([]byte, s.chunkSize)
			for c := range jobs {
				_, err := s.Get(c.Sum, buffer)
				mu.Lock()
				r.Chunks++
				r.Bytes += uint64(c.Size)
				if err != nil {
					damaged[c.Sum] = true
					r.Damaged = append(r.Damaged, c.Sum)
					r.Problems = append(r.Problems, err.Error())
				}
				mu.Unlock()
				if progress != nil {
					progress(uint64(c.Size))
				}
			}
		})
	}
	for _, c := range all {
		stored[c.Sum] = true
		if ctx.Err() != nil {
			break
		}
		jobs <- c
	}
	close(jobs)
	group.Wait()
	if ctx.Err() != nil {
		return r, ctx.Err()
	}
	missing := map[string]bool{}
	for _, ix := range backups {
		hit := false
		for _, sum := range ix.Chunks {
			switch {
			case sum == "":
			case !stored[sum]:
				if !missing[sum] {
					missing[sum] = true
					r.Missing = append(r.Missing, sum)
				}
				hit = true
			case damaged[sum]:
				hit = true
			}
		}
		if hit {
			r.Affected = append(r.Affected, ix.ID)
		}
	}
	for _, sum := range r.Missing {
		r.Problems = append(r.Problems, fmt.Sprintf("chunk %s is missing", sum))
	}
	sort.Strings(r.Damaged)
	return r, nil
}

// Policy says which backups prune keeps, per VDI: the newest Last, the
// newest of each of the last Daily days that have one, the newest of each
// of the last Weekly ISO weeks that have one.
type Policy struct {
	Last, Daily, Weekly int
}

// PruneReport is what prune did (or, dry, would do).
type PruneReport struct {
	Kept        []string       `json:"kept"`
	Deleted     []string       `json:"deleted"`
	FreedChunks int            `json:"freed_chunks"`
	FreedBytes  uint64         `json:"freed_bytes"`
	DryRun      bool           `json:"dry_run,omitempty"`
	StoreBytes  uint64         `json:"store_bytes"` // after
	KeptPerVDI  map[string]int `json:"kept_per_vdi"`
}

// Prune deletes the backups the policy does not keep (of vdi only, if
// given) and then every chunk no remaining backup uses. The store must be
// open exclusively.
func Prune(s *Store, policy Policy, vdi string, dryRun bool) (PruneReport, error) {
	r := PruneReport{DryRun: dryRun, Kept: []string{}, Deleted: []string{}, KeptPerVDI: map[string]int{}}
	if policy.Last <= 0 && policy.Daily <= 0 && policy.Weekly <= 0 {
		return r, errors.New("give what to keep: --keep-last N, --keep-daily N and/or --keep-weekly N")
	}
	backups, bad, err := s.List()
	if err != nil {
		return r, err
	}
	if len(bad) > 0 {
		return r, fmt.Errorf("not pruning while an index is damaged (run herd backup verify): %v", bad[0])
	}
	byVDI := map[string][]*Index{}
	for _, ix := range backups {
		if vdi == "" || ix.VDI == vdi {
			byVDI[ix.VDI] = append(byVDI[ix.VDI], ix)
		}
	}
	for name, list := range byVDI {
		keep := map[string]bool{}
		// Newest first.
		sort.Slice(list, func(i, j int) bool { return list[i].Created.After(list[j].Created) })
		for i := 0; i < policy.Last && i < len(list); i++ {
			keep[list[i].ID] = true
		}
		period := func(n int, key func(time.Time) string) {
			seen := map[string]bool{}
			for _, ix := range list {
				k := key(ix.Created)
				if seen[k] {
					continue
				}
				if len(seen) == n {
					break
				}
				seen[k] = true
				keep[ix.ID] = true
			}
		}
		period(policy.Daily, func(t time.Time) string { return t.UTC().Format("2006-01-02") })
		period(policy.Weekly, func(t time.Time) string { y, w := t.UTC().ISOWeek(); return fmt.Sprintf("%d-%02d", y, w) })
		for _, ix := range list {
			if keep[ix.ID] {
				r.Kept = append(r.Kept, ix.ID)
				r.KeptPerVDI[name]++
				continue
			}
			r.Deleted = append(r.Deleted, ix.ID)
			if !dryRun {
				if err := s.Delete(ix.ID); err != nil {
					return r, err
				}
			}
		}
	}
	sort.Strings(r.Kept)
	sort.Strings(r.Deleted)
	if !dryRun {
		if r.FreedChunks, r.FreedBytes, err = s.Collect(); err != nil {
			return r, err
		}
	}
	r.StoreBytes, err = s.Used()
	return r, err
}
