// Package backup is herd's backup store: a directory (a local disk or an
// NFS mount) of chunks addressed by their SHA-256, shared by every VDI and
// every backup in it, and one index per backup listing its chunks.
//
//	DIR/herd-backup.json         the store's format and chunk size
//	DIR/chunks/ab/ab12...ef      a chunk: raw bytes whose SHA-256 is the name
//	DIR/backups/ID.json          a backup's index (Index), checksummed
//	DIR/tmp/                     files being written; never read
//	DIR/lock                     flock: shared by backups, exclusive by prune
//
// Chunks are fixed-size pieces of the disk (1 MiB by default) at fixed
// offsets, so an unchanged piece has the same hash in every backup and is
// stored once; a piece of zeroes is not stored at all. Every backup's index
// lists all its chunks, so any backup restores on its own and deleting one
// never breaks another: an incremental backup is only cheaper to make (it
// reads what changed since the previous one's snapshot and takes the other
// chunks' hashes from its index).
//
// Crash safety: a chunk or an index is written under tmp/, synced, and
// renamed into place, and its directory synced; an index is written last,
// after every chunk it names is durable. So an interrupted backup leaves
// at most unreferenced chunks and temporary files (prune removes them),
// never an index that passes for a complete backup.
package backup

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"
)

const (
	formatVersion = 1
	// DefaultChunkSize is the default piece size: small enough that a
	// few scattered 4 KiB writes store little, large enough that a 1 TiB
	// disk has a million chunks at most.
	DefaultChunkSize = 1 << 20
	configName       = "herd-backup.json"
)

// ErrCorrupt: a chunk or an index does not match its checksum.
var ErrCorrupt = errors.New("backup store: damaged")

// ErrNotStore: the directory is not a herd backup store.
var ErrNotStore = errors.New("not a herd backup store")

// config is herd-backup.json.
type config struct {
	Format    int       `json:"format"`
	ChunkSize int       `json:"chunk_size"`
	Hash      string    `json:"hash"`
	Created   time.Time `json:"created"`
}

// Store is an open backup store.
type Store struct {
	dir       string
	chunkSize int
	lock      *os.File

	dirsMu sync.Mutex
	dirty  map[string]bool // directories with renames not yet synced
}

// Open opens the store in dir, creating it (with chunkSize, or the
// default) if dir is empty or missing. exclusive takes the store's lock
// for prune; otherwise it is shared (backups, restores and verifies run
// side by side).
func Open(dir string, chunkSize int, exclusive bool) (*Store, error) {
	if chunkSize == 0 {
		chunkSize = DefaultChunkSize
	}
	if chunkSize < 64<<10 || chunkSize > 64<<20 || chunkSize&(chunkSize-1) != 0 {
		return nil, fmt.Errorf("chunk size %d: give a power of two from 64 KiB to 64 MiB", chunkSize)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("backup store %s: %w", dir, err)
	}
	s := &Store{dir: dir, dirty: map[string]bool{}}
	raw, err := os.ReadFile(filepath.Join(dir, configName))
	switch {
	case errors.Is(err, fs.ErrNotExist):
		entries, err := os.ReadDir(dir)
		if err != nil {
			return nil, err
		}
		if len(entries) > 0 {
			return nil, fmt.Errorf("%s: %w (it has files but no %s); give an empty or new directory", dir, ErrNotStore, configName)
		}
		c := config{Format: formatVersion, ChunkSize: chunkSize, Hash: "sha256", Created: time.Now().UTC()}
		for _, sub := range []string{"chunks", "backups", "tmp"} {
			if err := os.MkdirAll(filepath.Join(dir, sub), 0o700); err != nil {
				return nil, err
			}
		}
		body, _ := json.MarshalIndent(c, "", "  ")
		if err := s.writeFile(filepath.Join(dir, configName), body); err != nil {
			return nil, err
		}
		if err := s.syncDirs(); err != nil {
			return nil, err
		}
		s.chunkSize = chunkSize
	case err != nil:
		return nil, fmt.Errorf("backup store %s: %w", dir, err)
	default:
		var c config
		if err := json.Unmarshal(raw, &c); err != nil || c.Hash != "sha256" || c.ChunkSize == 0 {
			return nil, fmt.Errorf("%s: %w (%s is unreadable)", dir, ErrNotStore, configName)
		}
		if c.Format != formatVersion {
			return nil, fmt.Errorf("%s: store format %d, this herd reads format %d", dir, c.Format, formatVersion)
		}
		s.chunkSize = c.ChunkSize
	}
	lock, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	how := syscall.LOCK_SH
	if exclusive {
		how = syscall.LOCK_EX
	}
	if err := syscall.Flock(int(lock.Fd()), how|syscall.LOCK_NB); err != nil {
		lock.Close()
		if exclusive {
			return nil, fmt.Errorf("backup store %s is in use (a backup, restore or verify runs): prune needs it alone; try again later", dir)
		}
		return nil, fmt.Errorf("backup store %s is being pruned; try again later", dir)
	}
	s.lock = lock
	return s, nil
}

// Close releases the store's lock.
func (s *Store) Close() error { return s.lock.Close() }

// ChunkSize is the store's piece size.
func (s *Store) ChunkSize() int { return s.chunkSize }

// Dir is the store's directory.
func (s *Store) Dir() string { return s.dir }

func (s *Store) chunkPath(sum string) string {
	return filepath.Join(s.dir, "chunks", sum[:2], sum)
}

// writeFile writes body to path through a synced temporary file and a
// rename; the directory is synced by syncDirs.
func (s *Store) writeFile(path string, body []byte) error {
	f, err := os.CreateTemp(filepath.Join(s.dir, "tmp"), ".w-*")
	if errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(filepath.Join(s.dir, "tmp"), 0o700); err != nil {
			return err
		}
		f, err = os.CreateTemp(filepath.Join(s.dir, "tmp"), ".w-*")
	}
	if err != nil {
		return fmt.Errorf("backup store: %w", err)
	}
	_, err = f.Write(body)
	if err == nil {
		err = f.Sync()
	}
	if closeErr := f.Close(); err == nil {
		err = closeErr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
		return fmt.Errorf("backup store: writing %s: %w", path, err)
	}
	s.dirsMu.Lock()
	s.dirty[filepath.Dir(path)] = true
	s.dirsMu.Unlock()
	return nil
}

// syncDirs makes the renames so far durable.
func (s *Store) syncDirs() error {
	s.dirsMu.Lock()
	dirs := s.dirty
	s.dirty = map[string]bool{}
	s.dirsMu.Unlock()
	for dir := range dirs {
		d, err := os.Open(dir)
		if err != nil {
			return err
		}
		err = d.Sync()
		d.Close()
		if err != nil {
			return fmt.Errorf("backup store: syncing %s: %w", dir, err)
		}
	}
	return nil
}

// Hash is a chunk's name.
func Hash(p []byte) string {
	sum := sha256.Sum256(p)
	return hex.EncodeToString(sum[:])
}

// Put stores a chunk unless the store has it; it reports whether it wrote
// one (the bytes the store grew by).
func (s *Store) Put(sum string, p []byte) (bool, error) {
	path := s.chunkPath(sum)
	if _, err := os.Stat(path); err == nil {
		return false, nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return false, err
	}
	s.dirsMu.Lock()
	s.dirty[filepath.Join(s.dir, "chunks")] = true
	s.dirsMu.Unlock()
	return true, s.writeFile(path, p)
}

// Get reads a chunk and checks its hash: a damaged chunk is never
// returned as data.
func (s *Store) Get(sum string, p []byte) ([]byte, error) {
	f, err := os.Open(s.chunkPath(sum))
	if err != nil {
		return nil, fmt.Errorf("chunk %s: %w", sum, err)
	}
	defer f.Close()
	n, err := io.ReadFull(f, p)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
		return nil, fmt.Errorf("chunk %s: %w", sum, err)
	}
	if extra, _ := f.Read(make([]byte, 1)); extra > 0 {
		return nil, fmt.Errorf("%w: chunk %s is longer than a chunk", ErrCorrupt, sum)
	}
	if Hash(p[:n]) != sum {
		return nil, fmt.Errorf("%w: chunk %s does not match its hash", ErrCorrupt, sum)
	}
	return p[:n], nil
}

// Index is one backup.
type Index struct {
	Format    int       `json:"format"`
	ID        string    `json:"id"`
	VDI       string    `json:"vdi"`
	Snapshot  string    `json:"snapshot"` // NAME@TAG it was read from
	Size      uint64    `json:"size"`
	ChunkSize int       `json:"chunk_size"`
	Created   time.Time `json:"created"`
	// Parent is the backup an incremental one took its unchanged chunks
	// from ("" for a full backup).
	Parent string `json:"parent,omitempty"`
	Kind   string `json:"kind"` // "full" or "incremental"
	Stats  Stats  `json:"stats"`
	// Chunks has one entry per piece of the disk: its hash, or "" for a
	// piece of zeroes (not stored).
	Chunks []string `json:"chunks"`
	// Checksum is the SHA-256 of the index written with this field empty.
	Checksum string `json:"checksum"`
}

// Stats are what a backup cost.
type Stats struct {
	ReadBytes    uint64 `json:"read_bytes"`    // read from the cluster
	NewBytes     uint64 `json:"new_bytes"`     // added to the store
	NewChunks    int    `json:"new_chunks"`    // of them
	ReusedChunks int    `json:"reused_chunks"` // already in the store (or the parent)
	ZeroChunks   int    `json:"zero_chunks"`
	// UnchangedChunks an incremental backup took from its parent's index
	// without reading them.
	UnchangedChunks int `json:"unchanged_chunks,omitempty"`
	// Phases: seconds spent taking the snapshot, planning (the diff or
	// the allocation map), connecting, reading and storing, and writing
	// the index (this one only in the result, not in the stored index).
	Phases    map[string]float64 `json:"phases,omitempty"`
	DataBytes uint64             `json:"data_bytes"` // the backup's non-zero chunks
	Seconds   float64            `json:"seconds"`
}

func (ix *Index) checksum() string {
	copy := *ix
	copy.Checksum = ""
	body, _ := json.Marshal(copy)
	return Hash(body)
}

// newID names a backup: the VDI, the time and a random suffix.
func newID(vdi string, at time.Time) string {
	var r [3]byte
	rand.Read(r[:])
	return fmt.Sprintf("%s-%s-%s", vdi, at.UTC().Format("20060102T150405Z"), hex.EncodeToString(r[:]))
}

// SaveIndex writes a backup's index, after making every chunk durable: the
// backup exists from this moment.
func (s *Store) SaveIndex(ix *Index) error {
	if err := s.syncDirs(); err != nil {
		return err
	}
	ix.Format = formatVersion
	ix.Checksum = ix.checksum()
	body, err := json.Marshal(ix)
	if err != nil {
		return err
	}
	if err := s.writeFile(filepath.Join(s.dir, "backups", ix.ID+".json"), body); err != nil {
		return err
	}
	return s.syncDirs()
}

// Load reads one backup's index and checks it.
func (s *Store) Load(id string) (*Index, error) {
	if strings.ContainsAny(id, "/\\") || id == "" || strings.HasPrefix(id, ".") {
		return nil, fmt.Errorf("backup %q: not a backup id (see herd backup list)", id)
	}
	raw, err := os.ReadFile(filepath.Join(s.dir, "backups", id+".json"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("backup %q not found in %s (see herd backup list)", id, s.dir)
	}
	if err != nil {
		return nil, err
	}
	var ix Index
	if err := json.Unmarshal(raw, &ix); err != nil {
		return nil, fmt.Errorf("%w: the index of backup %s is unreadable: %v", ErrCorrupt, id, err)
	}
	if ix.Checksum != ix.checksum() || ix.ID != id {
		return nil, fmt.Errorf("%w: the index of backup %s does not match its checksum", ErrCorrupt, id)
	}
	if ix.ChunkSize != s.chunkSize || uint64(len(ix.Chunks)) != (ix.Size+uint64(ix.ChunkSize)-1)/uint64(ix.ChunkSize) {
		return nil, fmt.Errorf("%w: the index of backup %s has %d chunks of %d bytes for %d bytes", ErrCorrupt, id, len(ix.Chunks), ix.ChunkSize, ix.Size)
	}
	return &ix, nil
}

// List returns every backup, oldest first (damaged indexes are reported
// in bad, not hidden).
func (s *Store) List() (backups []*Index, bad []error, err error) {
	entries, err := os.ReadDir(filepath.Join(s.dir, "backups"))
	if err != nil {
		return nil, nil, err
	}
	for _, e := range entries {
		name := e.Name()
		if !strings.HasSuffix(name, ".json") || strings.HasPrefix(name, ".") {
			continue
		}
		ix, err := s.Load(strings.TrimSuffix(name, ".json"))
		if err != nil {
			bad = append(bad, err)
			continue
		}
		backups = append(backups, ix)
	}
	sort.Slice(backups, func(i, j int) bool {
		if !backups[i].Created.Equal(backups[j].Created) {
			return backups[i].Created.Before(backups[j].Created)
		}
		return backups[i].ID < backups[j].ID
	})
	return backups, bad, nil
}

// Latest is the newest backup of vdi, or nil.
func (s *Store) Latest(vdi string) (*Index, error) {
	backups, _, err := s.List()
	if err != nil {
		return nil, err
	}
	for i := len(backups) - 1; i >= 0; i-- {
		if backups[i].VDI == vdi {
			return backups[i], nil
		}
	}
	return nil, nil
}

// Delete removes a backup's index (its chunks go at the next Collect).
func (s *Store) Delete(id string) error {
	if _, err := s.Load(id); err != nil && !errors.Is(err, ErrCorrupt) {
		return err
	}
	if err := os.Remove(filepath.Join(s.dir, "backups", id+".json")); err != nil {
		return err
	}
	s.dirsMu.Lock()
	s.dirty[filepath.Join(s.dir, "backups")] = true
	s.dirsMu.Unlock()
	return s.syncDirs()
}

// ChunkInfo is one stored chunk.
type ChunkInfo struct {
	Sum  string
	Size int64
}

// Chunks lists every stored chunk.
func (s *Store) Chunks() ([]ChunkInfo, error) {
	var out []ChunkInfo
	root := filepath.Join(s.dir, "chunks")
	fans, err := os.ReadDir(root)
	if err != nil {
		return nil, err
	}
	for _, fan := range fans {
		if !fan.IsDir() {
			continue
		}
		entries, err := os.ReadDir(filepath.Join(root, fan.Name()))
		if err != nil {
			return nil, err
		}
		for _, e := range entries {
			info, err := e.Info()
			if err != nil {
				continue
			}
			out = append(out, ChunkInfo{Sum: e.Name(), Size: info.Size()})
		}
	}
	return out, nil
}

// Collect deletes the chunks no backup uses and the temporary files
// interrupted writes left (the caller holds the store exclusively). It
// returns what it freed.
func (s *Store) Collect() (chunks int, bytes uint64, err error) {
	backups, bad, err := s.List()
	if err != nil {
		return 0, 0, err
	}
	if len(bad) > 0 {
		// A damaged index may still name chunks another copy of it
		// needs: collecting would be guessing.
		return 0, 0, fmt.Errorf("not collecting chunks while an index is damaged: %v", bad[0])
	}
	used := map[string]bool{}
	for _, ix := range backups {
		for _, sum := range ix.Chunks {
			if sum != "" {
				used[sum] = true
			}
		}
	}
	all, err := s.Chunks()
	if err != nil {
		return 0, 0, err
	}
	for _, c := range all {
		if used[c.Sum] {
			continue
		}
		if err := os.Remove(s.chunkPath(c.Sum)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return chunks, bytes, err
		}
		chunks++
		bytes += uint64(c.Size)
	}
	temps, _ := os.ReadDir(filepath.Join(s.dir, "tmp"))
	for _, e := range temps {
		if info, err := e.Info(); err == nil {
			bytes += uint64(info.Size())
		}
		os.Remove(filepath.Join(s.dir, "tmp", e.Name()))
	}
	return chunks, bytes, nil
}

// Used is the bytes the store's chunks take.
func (s *Store) Used() (uint64, error) {
	all, err := s.Chunks()
	var total uint64
	for _, c := range all {
		total += uint64(c.Size)
	}
	return total, err
}
