package store

import (
	"bytes"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/herd-storage/herd/internal/object"
)

// withUmask runs the test under umask 0, so that the modes checked are
// the ones the store asks for, not what the umask left of them.
func withUmask(t *testing.T) {
	old := syscall.Umask(0)
	t.Cleanup(func() { syscall.Umask(old) })
}

// Object files are 0600 and directories 0700, whether made by Write or
// by Replace.
func TestObjectFilesAndDirectoriesAreOwnerOnly(t *testing.T) {
	withUmask(t)
	root := tempDisk(t)
	s := openTest(t, Options{Disks: []Disk{{Path: root}}})
	for oid := uint64(1); oid <= 20; oid++ {
		mustWrite(t, s, 1, object.OID(oid), []byte("data"), 0, object.FlagCreate)
	}
	if err := s.Replace(1, 99, pattern(1, 4096)); err != nil {
		t.Fatal(err)
	}
	files, directories := 0, 0
	err := filepath.WalkDir(filepath.Join(root, "objects"), func(path string, entry fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := entry.Info()
		if err != nil {
			return err
		}
		want := fs.FileMode(0o600)
		if entry.IsDir() {
			want = 0o700
			directories++
		} else {
			files++
		}
		if info.Mode().Perm() != want {
			t.Errorf("%s has mode %04o, want %04o", path, info.Mode().Perm(), want)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files != 22 || directories < 2 {
		t.Fatalf("walked %d files and %d directories, want 21 objects and the journal in objects/ and its fan-out directories", files, directories)
	}
}

// Open refuses a disk others can write, saying how to fix it, and takes
// one that only its owner can.
func TestOpenRefusesADiskOthersCanWrite(t *testing.T) {
	withUmask(t)
	for _, mode := range []fs.FileMode{0o770, 0o757, 0o777, 0o1777} {
		root := t.TempDir()
		if err := os.Chmod(root, mode); err != nil {
			t.Fatal(err)
		}
		_, err := Open(Options{Disks: []Disk{{Path: root}}})
		if !errors.Is(err, ErrPermissions) || !strings.Contains(err.Error(), "chmod go-w "+root) {
			t.Fatalf("Open of a disk of mode %04o: %v, want a refusal with a chmod hint", mode, err)
		}
		if _, statErr := os.Stat(filepath.Join(root, "objects")); !errors.Is(statErr, fs.ErrNotExist) {
			t.Fatalf("a refused disk of mode %04o got an objects directory (%v)", mode, statErr)
		}
	}
	root := t.TempDir()
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	openTest(t, Options{Disks: []Disk{{Path: root}}})
}

// An objects directory open to others (an older herd made it 0750) is
// made 0700 on Open, with a warning.
func TestOpenClosesTheObjectsDirectory(t *testing.T) {
	withUmask(t)
	root := tempDisk(t)
	objects := filepath.Join(root, "objects")
	if err := os.Mkdir(objects, 0o755); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	options := Options{Disks: []Disk{{Path: root}}, Logger: logger}
	s := openTest(t, options)
	info, err := os.Stat(objects)
	if err != nil {
		t.Fatal(err)
	}
	if info.Mode().Perm() != 0o700 {
		t.Fatalf("objects/ is %04o after Open, want 0700", info.Mode().Perm())
	}
	if !strings.Contains(logs.String(), "made it owner-only") || !strings.Contains(logs.String(), "was=0755") {
		t.Fatalf("no warning that objects/ was changed:\n%s", logs.String())
	}
	// Already closed: nothing to say the next time.
	logs.Reset()
	reopen(t, s, options)
	if strings.Contains(logs.String(), "owner-only") {
		t.Fatalf("warned again about a closed objects/:\n%s", logs.String())
	}
}
