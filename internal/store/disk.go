package store

import (
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/herd-storage/herd/internal/object"
)

// Modes of what the store creates: object data is the VMs' disks, for
// this node's user only. objects/ itself is what keeps everyone else out
// (Open makes it 0700 if it is more open): files and fan-out
// directories that an older herd made 0640 and 0750 beneath it are out
// of reach too, without a walk over millions of files.
const (
	fileMode = 0o600
	dirMode  = 0o700
)

// fanoutCount is the number of fan-out directories under objects/: 256
// (two hex digits), so 10 million objects make about 40,000 entries per
// directory, which ext4 and XFS index without trouble.
const fanoutCount = 256

// diskState is one disk of the store.
type diskState struct {
	root    string // Disk.Path, cleaned
	objects string // root/objects
	weight  uint64 // rendezvous weight
	seed    uint64 // hash of root: the disk's identity in rendezvous hashing

	// objectsDir tracks the entries of objects/ (fan-out directories
	// created), fanout[i] those of objects/<i as 2 hex>/ (object files
	// created or removed), so that Flush and Sync know which directories
	// must be fsynced.
	objectsDir dirState
	fanout     [fanoutCount]dirState

	// failed: taken out of service after an EIO (Store.failDisk).
	failed atomic.Bool

	// journal lists the objects that may hold unsynced writes
	// (journal.go).
	journal *journal
	// checksumErrors counts blocks found failing their checksum;
	// blocksRepaired those rewritten from a good copy.
	checksumErrors atomic.Uint64
	blocksRepaired atomic.Uint64
}

// dirState counts the changes to a directory's entries and how many of
// them an fsync has made durable. A file is not durable until the
// directory entry that names it is (fsync(2): "Calling fsync() does not
// necessarily ensure that the entry in the directory containing the file
// has also reached disk. For that an explicit fsync() on a file descriptor
// for the directory is also needed.").
type dirState struct {
	// changed is incremented after each change to the directory's entries
	// has been made (the syscall returned).
	changed atomic.Uint64
	// synced is the value of changed read before the last successful
	// fsync began: every change counted up to it is durable.
	synced atomic.Uint64
	// mu serialises the fsyncs of this directory, so that concurrent
	// callers share one fsync and synced only grows.
	mu sync.Mutex
}

// needsSync reports whether a change counted up to generation was not yet
// made durable.
func (d *dirState) needsSync(generation uint64) bool {
	return d.synced.Load() < generation
}

// sync makes every change counted so far durable. sync is the hook that
// fsyncs an open directory (Store.dirsync).
func (d *dirState) sync(path string, fsync func(*os.File) error) error {
	generation := d.changed.Load()
	if !d.needsSync(generation) {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.needsSync(generation) {
		return nil // another caller's fsync began after our changes
	}
	// Read again under the lock: the fsync below begins after every change
	// counted now, so it covers them all.
	generation = d.changed.Load()
	dir, err := os.Open(path)
	if err != nil {
		return err
	}
	err = fsync(dir)
	if closeErr := dir.Close(); err == nil {
		err = closeErr
	}
	if err != nil {
		return err
	}
	d.synced.Store(generation)
	return nil
}

// Space is what a disk's file system reports: the bytes an unprivileged
// writer may still use (statfs f_bavail) and its size (f_blocks).
type Space struct {
	FreeBytes  uint64
	TotalBytes uint64
}

// statfsSpace is the default Options.DiskSpace.
func statfsSpace(path string) (Space, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return Space{}, &os.PathError{Op: "statfs", Path: path, Err: err}
	}
	blockSize := uint64(st.Bsize)
	return Space{FreeBytes: st.Bavail * blockSize, TotalBytes: st.Blocks * blockSize}, nil
}

// openDisks checks the configured disks, creates their objects/
// directories and computes their weights.
func openDisks(disks []Disk, space func(string) (Space, error), logger *slog.Logger) ([]*diskState, error) {
	if len(disks) == 0 {
		return nil, fmt.Errorf("%w: no disks", ErrInvalid)
	}
	states := make([]*diskState, 0, len(disks))
	seen := make(map[string]bool, len(disks))
	seeds := make(map[uint64]bool, len(disks))
	for _, disk := range disks {
		if disk.Path == "" {
			return nil, fmt.Errorf("%w: empty disk path", ErrInvalid)
		}
		root, err := filepath.Abs(disk.Path)
		if err != nil {
			return nil, fmt.Errorf("store: disk %s: %w", disk.Path, err)
		}
		if seen[root] {
			return nil, fmt.Errorf("%w: disk %s listed twice", ErrInvalid, root)
		}
		seen[root] = true
		// The disk's root must exist: it is usually a mount point, and
		// creating it would put objects on the parent file system when
		// the disk is not mounted.
		info, err := os.Stat(root)
		if err != nil {
			return nil, fmt.Errorf("store: disk %s: %w", root, err)
		}
		if !info.IsDir() {
			return nil, fmt.Errorf("%w: disk %s is not a directory", ErrInvalid, root)
		}
		if err := checkRootMode(root, info.Mode()); err != nil {
			return nil, err
		}
		state := &diskState{root: root, objects: filepath.Join(root, "objects"), weight: disk.Weight}
		state.seed = diskSeed(root)
		if seeds[state.seed] {
			return nil, fmt.Errorf("%w: disk %s: path hash collision, rename the disk", ErrInvalid, root)
		}
		seeds[state.seed] = true
		if state.weight == 0 {
			s, err := space(root)
			if err != nil {
				return nil, fmt.Errorf("store: disk %s: %w", root, err)
			}
			// The file system size, not the free space: it does not
			// change as objects are written, so the same object maps to
			// the same disk after a restart.
			state.weight = s.TotalBytes
			if state.weight == 0 {
				return nil, fmt.Errorf("%w: disk %s has size 0", ErrInvalid, root)
			}
		}
		if err := ensureDir(state.objects, root); err != nil {
			return nil, fmt.Errorf("store: disk %s: %w", root, err)
		}
		if err := closeObjectsDir(state.objects, logger); err != nil {
			return nil, fmt.Errorf("store: disk %s: %w", root, err)
		}
		states = append(states, state)
	}
	return states, nil
}

// checkRootMode refuses a disk whose directory others can write: they
// could replace objects/ (rename it away, put their own in its place)
// and so the copies this node serves.
func checkRootMode(root string, mode os.FileMode) error {
	if mode.Perm()&0o022 != 0 {
		return fmt.Errorf("%w: disk %s is writable by its group or by others (mode %04o), so another user could replace the objects this node serves; make it writable by its owner only: chmod go-w %s",
			ErrPermissions, root, mode.Perm(), root)
	}
	return nil
}

// closeObjectsDir makes objects/ accessible to its owner only (dirMode),
// saying so when it was not: an older herd made it 0750, and an
// operator may have opened it.
func closeObjectsDir(dir string, logger *slog.Logger) error {
	info, err := os.Stat(dir)
	if err != nil {
		return err
	}
	if info.Mode().Perm()&0o077 == 0 {
		return nil
	}
	if err := os.Chmod(dir, dirMode); err != nil {
		return fmt.Errorf("%w: %s is accessible to its group or others (mode %04o) and making it %04o failed: %v", ErrPermissions, dir, info.Mode().Perm(), dirMode, err)
	}
	logger.Warn("store: objects directory was accessible to its group or others; made it owner-only", "dir", dir, "was", fmt.Sprintf("%04o", info.Mode().Perm()), "now", fmt.Sprintf("%04o", dirMode))
	return nil
}

// ensureDir creates dir if missing and then fsyncs parent, so that the new
// directory survives a crash.
func ensureDir(dir, parent string) error {
	err := os.Mkdir(dir, dirMode)
	if errors.Is(err, os.ErrExist) {
		info, statErr := os.Stat(dir)
		if statErr != nil {
			return statErr
		}
		if !info.IsDir() {
			return fmt.Errorf("%s is not a directory", dir)
		}
		return nil
	}
	if err != nil {
		return err
	}
	f, err := os.Open(parent)
	if err != nil {
		return err
	}
	err = f.Sync()
	if closeErr := f.Close(); err == nil {
		err = closeErr
	}
	return err
}

// diskSeed is a disk's identity in rendezvous hashing: a hash of its path,
// so that adding or removing a disk moves only the objects that rendezvous
// hashing assigns to it.
func diskSeed(root string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(root))
	return mix64(h.Sum64())
}

// mix64 is the splitmix64 finalizer: a bijection of 64-bit integers in
// which every input bit changes every output bit with probability 1/2.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// fanoutIndex is the fan-out directory of an object: the top byte of a hash
// of its id. Not a byte of the id itself, because ids are structured (type |
// VDI | index, DESIGN.md): all inode objects have index 0, for example.
func fanoutIndex(oid object.OID) int {
	return int(mix64(uint64(oid)^0x6865726473746f72) >> 56) // "herdstor"
}

// objectPath is the file of object oid on disk d:
// objects/<fan-out, 2 hex>/<oid, 16 hex>.
func (d *diskState) objectPath(oid object.OID) string {
	var name [2 + 1 + 16]byte
	const digits = "0123456789abcdef"
	fanout := fanoutIndex(oid)
	name[0], name[1], name[2] = digits[fanout>>4], digits[fanout&15], '/'
	for i := 0; i < 16; i++ {
		name[3+i] = digits[(oid>>(60-4*i))&15]
	}
	return d.objects + "/" + string(name[:])
}

// fanoutPath is the directory of fan-out index i on disk d.
func (d *diskState) fanoutPath(i int) string {
	return fmt.Sprintf("%s/%02x", d.objects, i)
}

// parseObjectName returns the object id of a file name in a fan-out
// directory, or false if the name is not one the store writes.
func parseObjectName(name string) (object.OID, bool) {
	if len(name) != 16 {
		return 0, false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return 0, false
		}
	}
	oid, err := strconv.ParseUint(name, 16, 64)
	return object.OID(oid), err == nil
}

// score is disk d's rendezvous score for oid: -ln(u)/weight with u uniform
// in (0, 1) drawn from a hash of (oid, disk). The disk with the lowest
// score holds the object; since -ln(u) is exponentially distributed, the
// minimum falls on each disk with probability weight/Σweight (Ceph calls
// this straw2). Floating point is fine here: the choice is local to one
// node and only needs to be the same after a restart of the same binary.
func (d *diskState) score(oid object.OID) float64 {
	u := (float64(mix64(uint64(oid)^d.seed)>>11) + 0.5) / (1 << 53)
	return -math.Log(u) / float64(d.weight)
}

// probeOrder fills order with the disks in the order an object is looked
// for: the disk rendezvous hashing chooses first (where it is created),
// then the others by increasing score, which is the order they would be
// chosen if the better ones were removed.
func probeOrder(disks []*diskState, oid object.OID, order []*diskState) []*diskState {
	order = append(order[:0], disks...)
	if len(order) == 1 {
		return order
	}
	var scoresArray [8]float64
	scores := scoresArray[:0]
	for _, d := range order {
		scores = append(scores, d.score(oid))
	}
	// Insertion sort: a node has a handful of disks.
	for i := 1; i < len(order); i++ {
		for j := i; j > 0 && scores[j] < scores[j-1]; j-- {
			scores[j], scores[j-1] = scores[j-1], scores[j]
			order[j], order[j-1] = order[j-1], order[j]
		}
	}
	return order
}
