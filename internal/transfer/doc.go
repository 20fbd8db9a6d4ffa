// Package transfer copies disk images into and out of VDIs over NBD: the
// engine behind `herd vdi import` and `herd vdi export`. The data goes
// straight to a node's NBD port (internal/nbdclient), never through the
// admin API.
//
// What it guarantees:
//
//   - Parallel: Options.Connections connections to the export, each with
//     Options.Requests requests in flight, moving the image in chunks of
//     Options.ChunkLength bytes (4 MiB by default: one herd object, so
//     that a zero chunk is a whole hole).
//   - Sparse-aware on both sides. Import does not read the holes of a
//     regular file (SEEK_DATA, SEEK_HOLE), does not send chunks of zeroes as
//     data (WRITE_ZEROES instead) and sends nothing where the VDI already
//     reads as zeroes (its BLOCK_STATUS zero map). Export does not read what
//     the VDI's zero map says reads as zeroes, and leaves every 4 KiB block
//     of zeroes as a hole in a regular output file.
//   - An import leaves the VDI reading back as the image followed by
//     zeroes, like a VDI created for it, and ends with a FLUSH (one, when
//     the server offers NBD_FLAG_CAN_MULTI_CONN, else one per connection):
//     when Import returns nil, the data is on the replicas' disks. Formats
//     other than raw (qcow2, vmdk, vhdx, vdi, vpc, qed, recognised by their
//     magic) are converted by qemu-img writing to the same NBD export.
//   - An export opens a VDI read-only ("ro/NAME", so a VM may keep running
//     on it; the copy is then not crash-consistent) and a snapshot as it
//     is; a regular output file or block device is fsynced before Export
//     returns nil.
//
// What is verified: before any data moves, that the export exists and is
// writable (import), that every connection sees the same size, that the
// VDI is at least as large as the image and that the image's size is a
// multiple of the export's minimum block size; an export file that exists
// is not overwritten without Options.Force. Every request must be
// acknowledged by the server (nbdclient checks each reply against its
// request). The data itself is not read back or checksummed after the copy.
//
// How errors surface: the first failure (a refused or failed request, a
// read or write of the local file, a broken pipe on stdout) cancels every
// other request and is returned as one line for people, naming the VDI or
// file and, where it helps, the herd command that fixes it. A cancelled
// context ends the copy with the context's error. A failed import leaves
// the VDI partly written; a failed export removes the partial output when
// it is a regular file it created or truncated.
package transfer
