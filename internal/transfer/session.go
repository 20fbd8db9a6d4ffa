package transfer

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/herd-storage/herd/internal/exportname"
	"github.com/herd-storage/herd/internal/nbdclient"
)

// Session: parallel NBD connections to one export, for copies that are
// not a whole image: diffs (diff.go) and backups (internal/backup).

// Range is a byte range of an export.
type Range struct {
	Offset uint64
	Length uint64
}

// Session is Options.Connections connections to one export.
type Session struct {
	t     *copier
	vdi   string
	conns []*nbdclient.Conn
	chunk int
}

// OpenSession connects to the VDI or snapshot vdi: read-only (a writable
// VDI through "ro/NAME", so that neither its writer lock is taken nor a
// running VM disturbed) unless writing.
func OpenSession(ctx context.Context, options Options, vdi string, writing bool) (*Session, error) {
	t := newCopier(options)
	exportName := vdi
	if parsed := exportname.Parse(vdi); !writing && parsed.Writable() {
		exportName = parsed.AsReadOnly().String()
	}
	conns, err := t.dial(ctx, exportName, vdi, writing)
	if err != nil {
		return nil, err
	}
	return &Session{t: t, vdi: vdi, conns: conns, chunk: t.chunkLengthFor(conns[0])}, nil
}

// Size is the export's size in bytes.
func (s *Session) Size() uint64 { return s.conns[0].Size() }

// ChunkLength is the largest piece one request moves.
func (s *Session) ChunkLength() int { return s.chunk }

// Close ends every connection.
func (s *Session) Close() { closeConns(s.conns) }

// Allocated returns the ranges of the export that may hold data: all but
// what base:allocation says reads as zeroes (everything if the server
// offers no block status).
func (s *Session) Allocated(ctx context.Context) ([]Range, error) {
	size := s.Size()
	if !s.conns[0].CanBlockStatus() || size == 0 {
		return []Range{{0, size}}, nil
	}
	var out []Range
	for offset := uint64(0); offset < size; {
		extents, err := s.conns[0].BlockStatus(ctx, offset, size-offset)
		if err != nil {
			return nil, fmt.Errorf("reading the allocation map of %s: %w", s.vdi, err)
		}
		if len(extents) == 0 {
			return nil, fmt.Errorf("reading the allocation map of %s: an empty answer at offset %d", s.vdi, offset)
		}
		for _, e := range extents {
			length := min(e.Length, size-offset)
			if !e.Zero && length > 0 {
				if n := len(out); n > 0 && out[n-1].Offset+out[n-1].Length == offset {
					out[n-1].Length += length
				} else {
					out = append(out, Range{offset, length})
				}
			}
			offset += length
			if offset >= size {
				break
			}
		}
	}
	return out, nil
}

// readJob is one chunk of ReadRanges.
type readJob struct {
	offset uint64
	data   []byte
	err    error
	done   chan struct{}
}

// ReadRanges reads ranges in pieces of at most ChunkLength bytes (a piece
// never crosses a multiple of ChunkLength, so pieces line up with objects
// and backup chunks), many in flight at once, and hands them to fn in
// order. fn must not keep data after it returns. It stops at the first
// error, fn's included.
func (s *Session) ReadRanges(ctx context.Context, ranges []Range, fn func(offset uint64, data []byte) error) error {
	chunk := uint64(s.chunk)
	window := 2 * len(s.conns) * s.t.Requests
	pool := newBufferPool(s.chunk, window+1)
	workContext, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	jobs, wait := runWorkers(workContext, cancel, s.conns, s.t.Requests, func(ctx context.Context, conn *nbdclient.Conn, job *readJob) error {
		defer close(job.done)
		if err := conn.ReadAt(ctx, job.data, job.offset); err != nil {
			job.err = fmt.Errorf("reading %s at offset %d: %w", s.vdi, job.offset, err)
			return job.err
		}
		return nil
	})
	ordered := make(chan *readJob, window)
	consumed := make(chan error, 1)
	go func() {
		var failed error
		for job := range ordered {
			select {
			case <-job.done:
			case <-workContext.Done():
			}
			if failed == nil {
				switch {
				case job.err != nil:
					failed = job.err
				case workContext.Err() != nil:
					failed = context.Cause(workContext)
				default:
					failed = fn(job.offset, job.data)
				}
				if failed != nil {
					cancel(failed)
				}
			}
			pool.put(job.data)
		}
		consumed <- failed
	}()
produce:
	for _, r := range ranges {
		for offset := r.Offset; offset < r.Offset+r.Length; {
			end := min(r.Offset+r.Length, (offset/chunk+1)*chunk)
			job := &readJob{offset: offset, data: pool.get()[:end-offset], done: make(chan struct{})}
			select {
			case ordered <- job:
			case <-workContext.Done():
				break produce
			}
			if !send(workContext, jobs, job) {
				close(job.done)
				break produce
			}
			offset = end
		}
	}
	close(ordered)
	workErr := wait()
	if err := <-consumed; err != nil {
		return err
	}
	return workErr
}

// Writer applies writes and zeroes with many requests in flight; Close
// waits for them and flushes.
type Writer struct {
	s       *Session
	jobs    chan<- writeJob
	wait    func() error
	ctx     context.Context
	pool    *bufferPool
	written atomic.Uint64
}

type writeJob struct {
	offset uint64
	data   []byte // nil: zero length bytes
	length uint64
}

// Writer starts a parallel writer (the session must be writable).
func (s *Session) Writer(ctx context.Context) *Writer {
	workContext, cancel := context.WithCancelCause(ctx)
	w := &Writer{s: s, ctx: workContext, pool: newBufferPool(s.chunk, 2*len(s.conns)*s.t.Requests+2)}
	w.jobs, w.wait = runWorkers(workContext, cancel, s.conns, s.t.Requests, func(ctx context.Context, conn *nbdclient.Conn, job writeJob) error {
		if job.data == nil {
			if err := zeroRange(ctx, conn, job.offset, job.length); err != nil {
				return fmt.Errorf("zeroing %s at offset %d: %w", s.vdi, job.offset, err)
			}
			w.written.Add(job.length)
			return nil
		}
		defer w.pool.put(job.data)
		if err := conn.WriteAt(ctx, job.data, job.offset, 0); err != nil {
			return fmt.Errorf("writing %s at offset %d: %w", s.vdi, job.offset, err)
		}
		w.written.Add(uint64(len(job.data)))
		return nil
	})
	return w
}

// Buffer returns a buffer of up to ChunkLength bytes for Write.
func (w *Writer) Buffer(n int) []byte { return w.pool.get()[:n] }

// Write queues a write of data (of at most ChunkLength bytes; Write owns
// it from now on: get it from Buffer). It reports an earlier failure.
func (w *Writer) Write(offset uint64, data []byte) error {
	if !send(w.ctx, w.jobs, writeJob{offset: offset, data: data}) {
		return context.Cause(w.ctx)
	}
	return nil
}

// Zero queues making [offset, offset+length) read as zeroes.
func (w *Writer) Zero(offset, length uint64) error {
	chunk := uint64(w.s.chunk) * 16
	for length > 0 {
		n := min(length, chunk)
		if !send(w.ctx, w.jobs, writeJob{offset: offset, length: n}) {
			return context.Cause(w.ctx)
		}
		offset, length = offset+n, length-n
	}
	return nil
}

// Close waits for every queued request and flushes: when it returns nil,
// what was written is on the replicas' disks.
func (w *Writer) Close(ctx context.Context) error {
	if err := w.wait(); err != nil {
		return err
	}
	return flush(ctx, w.s.conns)
}

// Written is the bytes written or zeroed so far.
func (w *Writer) Written() uint64 { return w.written.Load() }

// zeroRange makes a range read as zeroes: WRITE_ZEROES where offered,
// else writes of zeroes.
func zeroRange(ctx context.Context, conn *nbdclient.Conn, offset, length uint64) error {
	if conn.CanZero() {
		return conn.Zero(ctx, offset, length, 0)
	}
	_, _, payload := conn.BlockSizes()
	zeros := make([]byte, min(length, uint64(payload)))
	for length > 0 {
		n := min(length, uint64(len(zeros)))
		if err := conn.WriteAt(ctx, zeros[:n], offset, 0); err != nil {
			return err
		}
		offset, length = offset+n, length-n
	}
	return nil
}

// Progress is a progress line on Options.Progress (nothing without it).
type Progress struct{ p *progress }

// Progress starts one; Add counts bytes done, Finish clears the line.
func (s *Session) Progress(label string, total uint64) *Progress {
	return &Progress{s.t.startProgress(label, total)}
}

// NewProgress starts a progress line without a session.
func NewProgress(options Options, label string, total uint64) *Progress {
	return &Progress{newCopier(options).startProgress(label, total)}
}

func (p *Progress) Add(n uint64) { p.p.add(n) }
func (p *Progress) Finish()      { p.p.finish() }
