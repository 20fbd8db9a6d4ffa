package transfer

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"io"
	"os"
	"time"

	"github.com/herd-storage/herd/internal/size"
)

// The herd diff format (docs/DIFF.md): what changed between two snapshots
// of a VDI, as `herd vdi export NAME@S2 --since S1` writes it and `herd
// vdi import NAME --diff` applies it. Like Ceph's `rbd export-diff`, a
// header naming both ends, then data and zero records in offset order,
// then an end record; unlike it, every record carries a CRC-32C and the
// end record the SHA-256 of the whole file, so that a damaged or cut diff
// is refused before a byte of it is applied.
//
//	file    = magic record*
//	magic   = "HERD-DIFF 1\n"
//	record  = type (1 byte) | length (uint64 LE) | body | CRC-32C of type, length and body (uint32 LE)
//	'H'     header: JSON (DiffHeader); the first record
//	'W'     data: offset (uint64 LE), then the bytes
//	'Z'     zeroes: offset (uint64 LE), length (uint64 LE)
//	'E'     end: SHA-256 of every byte before this record; the last record

const (
	diffMagic = "HERD-DIFF 1\n"
	// maxDiffRecord bounds a record's body: a damaged length must not
	// make the reader allocate gigabytes.
	maxDiffRecord = 64<<20 + 8
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// DiffHeader names the two ends of a diff.
type DiffHeader struct {
	From     string    `json:"from"`      // NAME@TAG the diff applies to
	To       string    `json:"to"`        // NAME@TAG (or NAME) it makes
	FromSize uint64    `json:"from_size"` // bytes
	Size     uint64    `json:"size"`      // bytes, of To
	Created  time.Time `json:"created"`
	// Granularity: the changes are whole objects of this size.
	ObjectSize uint64 `json:"object_size,omitempty"`
}

// DiffExtent is one changed range: data to copy, or zeroes.
type DiffExtent struct {
	Offset uint64 `json:"offset"`
	Length uint64 `json:"length"`
	Zero   bool   `json:"zero,omitempty"`
}

// ErrBadDiff: the diff file is damaged, cut short, or not a herd diff.
var ErrBadDiff = errors.New("not a valid herd diff")

// diffWriter writes the format, hashing as it goes.
type diffWriter struct {
	w   *bufio.Writer
	sum hash.Hash
	n   uint64
}

func newDiffWriter(w io.Writer) *diffWriter {
	d := &diffWriter{w: bufio.NewWriterSize(w, 1<<20), sum: sha256.New()}
	d.write([]byte(diffMagic))
	return d
}

func (d *diffWriter) write(p []byte) error {
	d.sum.Write(p)
	d.n += uint64(len(p))
	_, err := d.w.Write(p)
	return err
}

func (d *diffWriter) record(kind byte, parts ...[]byte) error {
	var length uint64
	for _, p := range parts {
		length += uint64(len(p))
	}
	var head [9]byte
	head[0] = kind
	binary.LittleEndian.PutUint64(head[1:], length)
	crc := crc32.Update(0, castagnoli, head[:])
	if err := d.write(head[:]); err != nil {
		return err
	}
	for _, p := range parts {
		crc = crc32.Update(crc, castagnoli, p)
		if err := d.write(p); err != nil {
			return err
		}
	}
	return d.write(binary.LittleEndian.AppendUint32(nil, crc))
}

func (d *diffWriter) header(h DiffHeader) error {
	body, err := json.Marshal(h)
	if err != nil {
		return err
	}
	return d.record('H', body)
}

func (d *diffWriter) data(offset uint64, p []byte) error {
	return d.record('W', binary.LittleEndian.AppendUint64(nil, offset), p)
}

func (d *diffWriter) zero(offset, length uint64) error {
	return d.record('Z', binary.LittleEndian.AppendUint64(binary.LittleEndian.AppendUint64(nil, offset), length))
}

func (d *diffWriter) end() error {
	if err := d.record('E', d.sum.Sum(nil)); err != nil {
		return err
	}
	return d.w.Flush()
}

// diffRecord is one record read back.
type diffRecord struct {
	kind   byte
	offset uint64
	length uint64
	data   []byte // 'W': the bytes (valid until the next record)
}

// diffReader reads and checks the format.
type diffReader struct {
	r      *bufio.Reader
	sum    hash.Hash
	body   []byte
	header DiffHeader
	at     uint64 // file offset, for messages
	next   uint64 // the lowest offset the next change may start at
	ended  bool
}

func newDiffReader(r io.Reader) (*diffReader, error) {
	d := &diffReader{r: bufio.NewReaderSize(r, 1<<20), sum: sha256.New()}
	magic := make([]byte, len(diffMagic))
	if _, err := io.ReadFull(d.r, magic); err != nil || string(magic) != diffMagic {
		return nil, fmt.Errorf("%w: it does not start with %q", ErrBadDiff, diffMagic[:len(diffMagic)-1])
	}
	d.sum.Write(magic)
	d.at = uint64(len(magic))
	rec, err := d.read()
	if err != nil {
		return nil, err
	}
	if rec.kind != 'H' {
		return nil, fmt.Errorf("%w: the first record is %q, not the header", ErrBadDiff, rec.kind)
	}
	if err := json.Unmarshal(rec.data, &d.header); err != nil {
		return nil, fmt.Errorf("%w: its header: %v", ErrBadDiff, err)
	}
	if d.header.From == "" || d.header.Size == 0 {
		return nil, fmt.Errorf("%w: its header names no snapshot or no size", ErrBadDiff)
	}
	return d, nil
}

// read returns the next record, checked: its CRC, its fields, its place
// (in offset order, within the size), and for the end record the hash of
// the file. After the end record it checks that nothing follows and
// returns io.EOF.
func (d *diffReader) read() (diffRecord, error) {
	if d.ended {
		if _, err := d.r.ReadByte(); err != io.EOF {
			return diffRecord{}, fmt.Errorf("%w: bytes follow its end record", ErrBadDiff)
		}
		return diffRecord{}, io.EOF
	}
	at := d.at
	var head [9]byte
	if _, err := io.ReadFull(d.r, head[:]); err != nil {
		return diffRecord{}, fmt.Errorf("%w: cut short at byte %d (no end record)", ErrBadDiff, at)
	}
	length := binary.LittleEndian.Uint64(head[1:])
	if length > maxDiffRecord {
		return diffRecord{}, fmt.Errorf("%w: a record of %d bytes at byte %d", ErrBadDiff, length, at)
	}
	if uint64(cap(d.body)) < length+4 {
		d.body = make([]byte, length+4)
	}
	body := d.body[:length+4]
	if _, err := io.ReadFull(d.r, body); err != nil {
		return diffRecord{}, fmt.Errorf("%w: cut short at byte %d (in a record)", ErrBadDiff, at)
	}
	crc := crc32.Update(crc32.Update(0, castagnoli, head[:]), castagnoli, body[:length])
	if crc != binary.LittleEndian.Uint32(body[length:]) {
		return diffRecord{}, fmt.Errorf("%w: the record at byte %d fails its checksum", ErrBadDiff, at)
	}
	d.at += 9 + length + 4
	rec := diffRecord{kind: head[0]}
	body = body[:length]
	switch rec.kind {
	case 'H':
		if at != uint64(len(diffMagic)) {
			return rec, fmt.Errorf("%w: a second header at byte %d", ErrBadDiff, at)
		}
		rec.data = body
	case 'W', 'Z':
		if len(body) < 8 || (rec.kind == 'Z' && len(body) != 16) || (rec.kind == 'W' && len(body) == 8) {
			return rec, fmt.Errorf("%w: a malformed %q record at byte %d", ErrBadDiff, rec.kind, at)
		}
		rec.offset = binary.LittleEndian.Uint64(body)
		if rec.kind == 'W' {
			rec.data, rec.length = body[8:], uint64(len(body)-8)
		} else {
			rec.length = binary.LittleEndian.Uint64(body[8:])
		}
		if rec.offset < d.next || rec.length == 0 || rec.offset+rec.length < rec.offset || rec.offset+rec.length > d.header.Size {
			return rec, fmt.Errorf("%w: the %q record at byte %d covers [%d, %d): out of order or beyond the size %d", ErrBadDiff, rec.kind, at, rec.offset, rec.offset+rec.length, d.header.Size)
		}
		d.next = rec.offset + rec.length
	case 'E':
		if !bytes.Equal(body, d.sum.Sum(nil)) {
			return rec, fmt.Errorf("%w: its SHA-256 does not match (damaged)", ErrBadDiff)
		}
		d.ended = true
	default:
		return rec, fmt.Errorf("%w: an unknown record %q at byte %d", ErrBadDiff, rec.kind, at)
	}
	d.sum.Write(head[:])
	d.sum.Write(body)
	d.sum.Write(d.body[length : length+4])
	return rec, nil
}

// DiffSummary is the result of a diff export or import.
type DiffSummary struct {
	Operation      string  `json:"operation"` // "export-diff" or "import-diff"
	VDI            string  `json:"vdi"`
	From           string  `json:"from"`
	To             string  `json:"to"`
	File           string  `json:"file"`
	DataBytes      uint64  `json:"data_bytes"` // data records
	ZeroBytes      uint64  `json:"zero_bytes"` // zero records
	FileBytes      uint64  `json:"file_bytes"`
	Seconds        float64 `json:"seconds"`
	BytesPerSecond float64 `json:"bytes_per_second"`
	Snapshot       string  `json:"snapshot,omitempty"` // import: the snapshot taken after
}

// Line is the summary for people.
func (s DiffSummary) Line() string {
	verb := "exported the changes of %s since %s to %s: %s of data, %s zeroed, in %.1fs"
	args := []any{s.To, s.From, s.File}
	if s.Operation == "import-diff" {
		verb = "applied the changes of %s since %s to %s: %s of data, %s zeroed, in %.1fs"
		args = []any{s.To, s.From, s.VDI}
	}
	line := fmt.Sprintf(verb, append(args, size.Format(s.DataBytes), size.Format(s.ZeroBytes), s.Seconds)...)
	if s.Snapshot != "" {
		line += "; took snapshot " + s.Snapshot
	}
	return line
}

// ExportDiff writes the changes of vdi (NAME@TAG or NAME) since its
// ancestor snapshot, as header and extents describe them (the admin API's
// diff), to file ("-": Options.Stdout). Changed data that reads as zeroes
// is written as zero records: the file is sparse-aware.
func ExportDiff(ctx context.Context, options Options, vdi string, header DiffHeader, extents []DiffExtent, file string) (DiffSummary, error) {
	started := time.Now()
	s, err := OpenSession(ctx, options, vdi, false)
	if err != nil {
		return DiffSummary{}, err
	}
	defer s.Close()
	if s.Size() != header.Size {
		return DiffSummary{}, fmt.Errorf("vdi %s is %d bytes through NBD, the diff says %d: it was resized meanwhile; try again", vdi, s.Size(), header.Size)
	}
	var out io.Writer = s.t.Stdout
	var f *os.File
	if file != "-" {
		if _, err := os.Stat(file); err == nil && !options.Force {
			return DiffSummary{}, fmt.Errorf("%s exists: add --force to overwrite it", file)
		}
		// Written under a temporary name and renamed when complete, so
		// that an interrupted export leaves no file that looks whole.
		f, err = os.CreateTemp(dirOf(file), ".herd-diff-*")
		if err != nil {
			return DiffSummary{}, fmt.Errorf("cannot create the diff file: %w", err)
		}
		defer func() {
			if f != nil {
				f.Close()
				os.Remove(f.Name())
			}
		}()
		out = f
	}
	w := newDiffWriter(out)
	if err := w.header(header); err != nil {
		return DiffSummary{}, err
	}
	summary := DiffSummary{Operation: "export-diff", VDI: vdi, From: header.From, To: header.To, File: file}
	var total uint64
	var ranges []Range
	for _, e := range extents {
		total += e.Length
		if !e.Zero {
			ranges = append(ranges, Range{e.Offset, e.Length})
		}
	}
	progress := s.Progress("exporting the changes of "+vdi, total)
	defer progress.Finish()
	// Zero extents are written where they fall between the data.
	pending := extents
	flushZeros := func(upTo uint64) error {
		for len(pending) > 0 && pending[0].Offset < upTo {
			if pending[0].Zero {
				if err := w.zero(pending[0].Offset, pending[0].Length); err != nil {
					return err
				}
				summary.ZeroBytes += pending[0].Length
				progress.Add(pending[0].Length)
			}
			pending = pending[1:]
		}
		return nil
	}
	const block = 64 << 10
	err = s.ReadRanges(ctx, ranges, func(offset uint64, data []byte) error {
		if err := flushZeros(offset); err != nil {
			return err
		}
		// Runs of zero 64 KiB blocks inside changed data become zero
		// records.
		for start := 0; start < len(data); {
			end := min(len(data), start+block)
			zero := allZero(data[start:end])
			for end < len(data) && allZero(data[end:min(len(data), end+block)]) == zero {
				end = min(len(data), end+block)
			}
			var err error
			if zero {
				err = w.zero(offset+uint64(start), uint64(end-start))
				summary.ZeroBytes += uint64(end - start)
			} else {
				err = w.data(offset+uint64(start), data[start:end])
				summary.DataBytes += uint64(end - start)
			}
			if err != nil {
				return fmt.Errorf("writing the diff: %w", err)
			}
			start = end
		}
		progress.Add(uint64(len(data)))
		return nil
	})
	if err == nil {
		err = flushZeros(^uint64(0))
	}
	if err == nil {
		err = w.end()
	}
	if err != nil {
		return DiffSummary{}, err
	}
	summary.FileBytes = w.n
	if f != nil {
		if err := f.Sync(); err != nil {
			return DiffSummary{}, fmt.Errorf("%s: %w", file, err)
		}
		if err := f.Close(); err != nil {
			return DiffSummary{}, fmt.Errorf("%s: %w", file, err)
		}
		if err := os.Rename(f.Name(), file); err != nil {
			os.Remove(f.Name())
			f = nil
			return DiffSummary{}, fmt.Errorf("%s: %w", file, err)
		}
		f = nil
	}
	progress.Finish()
	summary.finish(started)
	return summary, nil
}

func (s *DiffSummary) finish(started time.Time) {
	s.Seconds = time.Since(started).Seconds()
	if s.Seconds > 0 {
		s.BytesPerSecond = float64(s.DataBytes+s.ZeroBytes) / s.Seconds
	}
}

// ReadDiffHeader checks the whole diff file (every record's checksum, the
// order, the final SHA-256) and returns its header.
func ReadDiffHeader(file string) (DiffHeader, error) {
	f, err := os.Open(file)
	if err != nil {
		return DiffHeader{}, err
	}
	defer f.Close()
	d, err := newDiffReader(f)
	if err != nil {
		return DiffHeader{}, fmt.Errorf("%s: %w", file, err)
	}
	for {
		if _, err := d.read(); err == io.EOF {
			return d.header, nil
		} else if err != nil {
			return DiffHeader{}, fmt.Errorf("%s: %w", file, err)
		}
	}
}

// ImportDiff applies the diff file to vdi, whose content the caller has
// checked is the diff's From (the CLI: a snapshot of that tag with no
// change since). The file is checked whole first (ReadDiffHeader), so a
// damaged file changes nothing; then applied and flushed.
func ImportDiff(ctx context.Context, options Options, vdi, file string) (DiffSummary, error) {
	started := time.Now()
	header, err := ReadDiffHeader(file)
	if err != nil {
		return DiffSummary{}, err
	}
	s, err := OpenSession(ctx, options, vdi, true)
	if err != nil {
		return DiffSummary{}, err
	}
	defer s.Close()
	if s.Size() < header.Size {
		return DiffSummary{}, fmt.Errorf("vdi %s is %d bytes, the diff needs %d: resize it first (herd vdi resize %s %d)", vdi, s.Size(), header.Size, vdi, header.Size)
	}
	f, err := os.Open(file)
	if err != nil {
		return DiffSummary{}, err
	}
	defer f.Close()
	d, err := newDiffReader(f)
	if err != nil {
		return DiffSummary{}, fmt.Errorf("%s: %w", file, err)
	}
	info, _ := f.Stat()
	summary := DiffSummary{Operation: "import-diff", VDI: vdi, From: header.From, To: header.To, File: file}
	if info != nil {
		summary.FileBytes = uint64(info.Size())
	}
	progress := s.Progress("applying "+file+" to "+vdi, summary.FileBytes)
	defer progress.Finish()
	w := s.Writer(ctx)
	chunk := s.ChunkLength()
	for {
		rec, err := d.read()
		if err == io.EOF {
			break
		}
		if err != nil {
			w.Close(ctx)
			return DiffSummary{}, fmt.Errorf("%s changed while it was applied: %w", file, err)
		}
		switch rec.kind {
		case 'W':
			for done := 0; done < len(rec.data); {
				n := min(chunk, len(rec.data)-done)
				buffer := w.Buffer(n)
				copy(buffer, rec.data[done:done+n])
				if err := w.Write(rec.offset+uint64(done), buffer); err != nil {
					w.Close(ctx)
					return DiffSummary{}, err
				}
				done += n
			}
			summary.DataBytes += rec.length
			progress.Add(rec.length + 21)
		case 'Z':
			if err := w.Zero(rec.offset, rec.length); err != nil {
				w.Close(ctx)
				return DiffSummary{}, err
			}
			summary.ZeroBytes += rec.length
			progress.Add(29)
		}
	}
	if err := w.Close(ctx); err != nil {
		return DiffSummary{}, err
	}
	progress.Finish()
	summary.finish(started)
	return summary, nil
}

func dirOf(file string) string {
	for i := len(file) - 1; i >= 0; i-- {
		if file[i] == '/' {
			return file[:i+1]
		}
	}
	return "."
}
