// Package store is the local object store of one node: the copies of
// objects that placement puts on this node, kept as files on its disks
// (DESIGN.md, "Local store"). The gateway of any node reads and writes
// object pieces here through the peer protocol; recovery lists, restamps
// and removes copies. The store does not judge epochs: it records the
// epoch it is given, and the peer layer rejects requests from another
// epoch before they get here.
//
// # Layout
//
// An object is identified by a 64-bit id (oid) and holds at most
// MaxObjectSize bytes. Each object lives on exactly one disk, chosen by
// weighted rendezvous hashing of its id over the disks (a disk's weight is
// its file system size unless configured), so the same disk is chosen after
// a restart and adding a disk moves only the objects it wins. When the
// object is not on that disk, the others are searched in rendezvous order,
// so copies survive a change of the disk set where they are. Under each
// disk:
//
//	objects/<fan-out>/<oid as 16 hex digits>
//
// where the fan-out directory is two hex digits of a hash of the oid, so
// that no directory holds millions of files. Each file starts with a 4 KiB
// header (magic "HERDOBJ1", format version, oid, epoch stamp, flags,
// CRC32C; see header.go), then the 256 KiB checksum table, then the
// object's data at file offset 266240, which keeps the data 4 KiB
// aligned (copies written before checksums, format version 1, have their
// data at 4096 and no table). Files are sparse: only written
// ranges take space, and holes and bytes beyond the end read as zeros;
// Trim and WriteZeroes punch holes (fallocate PUNCH_HOLE).
//
// # Epoch stamps
//
// Each copy records the epoch at which it was last written (or restamped by
// SetEpoch after recovery), so that a stale copy is never served
// (DESIGN.md, "Consistency and durability promises"; the Sheepdog paper's
// Fig. 4 case). Write, WriteZeroes and Trim stamp the header when their
// epoch differs from the copy's; the stamp is cached in memory, so writes
// within one epoch do not rewrite the header. A header with a bad magic,
// version, oid or checksum makes every access fail with ErrCorrupt; the
// copy is never used until Remove deletes it.
//
// # Durability contract
//
//   - Write, WriteZeroes, Trim, SetEpoch return when the kernel has the
//     change (pwrite, fallocate done): a Read after them sees it, but a
//     machine crash may lose it.
//   - Flush makes every change acknowledged before it was called durable,
//     on every disk: it fdatasyncs each object file changed since the last
//     Flush and fsyncs each directory whose entries changed (object files
//     created or removed, fan-out directories created). Both are needed
//     for a new object: fdatasync makes the file's data and size durable
//     but not the name that leads to it, which lives in the directory
//     (fsync(2)). Remove is durable after the next Flush.
//   - The Sync flag (FUA) makes one operation durable before it returns:
//     fdatasync of the file, plus the fsync of its directories if the file
//     (or its fan-out directory) was created since they were last synced.
//     The Sync method does the same for everything written to one object.
//   - Open syncs each disk's file system (syncfs), so that what an earlier
//     process left in the page cache is durable before this one builds on it.
//
// A failed fdatasync is not retried: after reporting it, Linux may have
// dropped the written pages, and another fdatasync would falsely succeed.
// The copy is marked damaged (in memory and, if the disk still takes
// writes, in its header), reads of it fail with ErrCorrupt, and every
// Flush reports it until it is removed and recovered from a replica.
//
// # Concurrency
//
// All methods are safe for concurrent use, for the same object too. Open
// files are kept in an fd cache (LRU, Options.OpenFiles, sharded by object
// id), reference counted so that eviction never closes a file in use;
// I/O is positional (pread/pwrite), with no shared file offset. The only
// locks held across I/O are narrow: per object for a header restamp, an
// fdatasync, and Remove (which waits for the object's running requests);
// per directory for its fsync; and Flush rounds run one at a time (a Flush
// waits for a round that starts after it was called; concurrent calls share
// it). Reads and writes without the Sync flag never wait for a Flush.
//
// The fd cache may exceed Options.OpenFiles while requests hold files and
// while written files wait for their fdatasync: a dirty file is never
// closed before it is synced (an fdatasync through a reopened fd could
// miss a writeback error), so when more than half the cache is dirty a
// background flush round writes it back.
//
// # Data checksums
//
// Every 4 KiB block of data has a CRC32C in the file's checksum table,
// written with every write and checked on every read; a block that fails
// is never returned (ErrChecksum), and Repair rewrites it from a good
// replica's bytes. The journal (journal.go) keeps data and checksums
// consistent across a crash: see checksum.go and journal.go.
//
// Errors are *ObjectError values wrapping a sentinel of errors.go (ENOSPC
// and EDQUOT become ErrNoSpace, EIO becomes ErrIO) and the cause.
//
// The package uses Linux system calls (fdatasync, fallocate, syncfs).
package store
