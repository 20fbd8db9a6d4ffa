package backup

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

func testStore(t *testing.T) *Store {
	t.Helper()
	s, err := Open(filepath.Join(t.TempDir(), "store"), 64<<10, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// saveBackup stores chunks and an index for vdi at created.
func saveBackup(t *testing.T, s *Store, vdi string, created time.Time, contents ...byte) *Index {
	t.Helper()
	ix := &Index{ID: newID(vdi, created), VDI: vdi, Snapshot: vdi + "@x", Size: uint64(len(contents)) * uint64(s.chunkSize), ChunkSize: s.chunkSize, Created: created, Kind: "full"}
	for _, c := range contents {
		if c == 0 {
			ix.Chunks = append(ix.Chunks, "")
			continue
		}
		p := bytes.Repeat([]byte{c}, s.chunkSize)
		sum := Hash(p)
		if _, err := s.Put(sum, p); err != nil {
			t.Fatal(err)
		}
		ix.Chunks = append(ix.Chunks, sum)
	}
	if err := s.SaveIndex(ix); err != nil {
		t.Fatal(err)
	}
	return ix
}

// TestStoreIntegrity: an index or a chunk that was changed is refused,
// a put of a stored chunk writes nothing, and a directory that is not a
// store is not taken for one.
func TestStoreIntegrity(t *testing.T) {
	s := testStore(t)
	ix := saveBackup(t, s, "vm", time.Now(), 1, 0, 2)
	if got, err := s.Load(ix.ID); err != nil || !slices.Equal(got.Chunks, ix.Chunks) {
		t.Fatalf("load: %+v %v", got, err)
	}
	p := bytes.Repeat([]byte{1}, s.chunkSize)
	if stored, err := s.Put(Hash(p), p); stored || err != nil {
		t.Fatalf("second put of a chunk: stored %v, %v", stored, err)
	}
	path := filepath.Join(s.dir, "backups", ix.ID+".json")
	raw, _ := os.ReadFile(path)
	os.WriteFile(path, bytes.Replace(raw, []byte(`"vdi":"vm"`), []byte(`"vdi":"vn"`), 1), 0o600)
	if _, err := s.Load(ix.ID); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("an edited index: %v", err)
	}
	os.WriteFile(path, raw, 0o600)
	chunk := s.chunkPath(ix.Chunks[2])
	data, _ := os.ReadFile(chunk)
	data[100] ^= 1
	os.WriteFile(chunk, data, 0o600)
	if _, err := s.Get(ix.Chunks[2], make([]byte, s.chunkSize)); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("a flipped byte: %v", err)
	}
	r, err := Verify(t.Context(), s, nil)
	if err != nil || !slices.Equal(r.Damaged, []string{ix.Chunks[2]}) || !slices.Equal(r.Affected, []string{ix.ID}) {
		t.Fatalf("verify: %+v %v", r, err)
	}
	os.Remove(chunk)
	if r, _ := Verify(t.Context(), s, nil); !slices.Equal(r.Missing, []string{ix.Chunks[2]}) {
		t.Fatalf("verify of a missing chunk: %+v", r)
	}
	other := t.TempDir()
	os.WriteFile(filepath.Join(other, "notes.txt"), []byte("mine"), 0o600)
	if _, err := Open(other, 0, false); !errors.Is(err, ErrNotStore) {
		t.Fatalf("open of a directory with other files: %v", err)
	}
}

// TestPrune: the policy keeps the newest N, one per day and one per ISO
// week, per VDI; the chunks of deleted backups go unless another uses
// them, and interrupted writes in tmp/ go too.
func TestPrune(t *testing.T) {
	s := testStore(t)
	day := func(d int, hour int) time.Time { return time.Date(2026, 11, d, hour, 0, 0, 0, time.UTC) }
	// Mon 16th .. Tue 24th; two backups on the 24th.
	var all []*Index
	for i, when := range []time.Time{day(16, 1), day(18, 1), day(20, 1), day(23, 1), day(24, 1), day(24, 9)} {
		all = append(all, saveBackup(t, s, "vm", when, byte(10+i), 1))
	}
	db := saveBackup(t, s, "db", day(10, 1), 99)
	os.WriteFile(filepath.Join(s.dir, "tmp", ".w-interrupted"), make([]byte, 1000), 0o600)
	s.Close()
	exclusive, err := Open(s.dir, 0, true)
	if err != nil {
		t.Fatal(err)
	}
	defer exclusive.Close()
	if _, err := Open(s.dir, 0, false); err == nil {
		t.Fatal("a shared open while prune holds the store")
	}
	r, err := Prune(exclusive, Policy{Last: 1, Daily: 2, Weekly: 2}, "vm", true)
	// Last 1: 24th 09h; daily 2: 24th 09h, 23rd; weekly 2: week 48 (24th 09h), week 47 (the 20th).
	want := []string{all[2].ID, all[3].ID, all[5].ID}
	slices.Sort(want)
	if err != nil || !slices.Equal(r.Kept, want) || len(r.Deleted) != 3 || !r.DryRun {
		t.Fatalf("dry run: %+v %v, want kept %v", r, err, want)
	}
	if backups, _, _ := exclusive.List(); len(backups) != 7 {
		t.Fatalf("a dry run deleted: %d backups left", len(backups))
	}
	r, err = Prune(exclusive, Policy{Last: 1, Daily: 2, Weekly: 2}, "vm", false)
	if err != nil || !slices.Equal(r.Kept, want) || r.FreedChunks != 3 || r.FreedBytes != 3*64<<10+1000 {
		t.Fatalf("prune: %+v %v", r, err)
	}
	if _, err := exclusive.Load(db.ID); err != nil {
		t.Fatalf("prune --vdi vm touched db's backup: %v", err)
	}
	for _, ix := range []*Index{all[2], all[3], all[5], db} {
		for _, sum := range ix.Chunks {
			if _, err := exclusive.Get(sum, make([]byte, exclusive.chunkSize)); sum != "" && err != nil {
				t.Fatalf("a kept backup lost chunk %s: %v", sum, err)
			}
		}
	}
	if _, err := Prune(exclusive, Policy{}, "", false); err == nil {
		t.Fatal("prune without a policy")
	}
}
