package transfer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/herd-storage/herd/internal/nbdclient"
)

// exportJob is one chunk to export. With a stream output, done is closed
// once data is ready (or the chunk failed or was skipped).
type exportJob struct {
	offset uint64
	length int
	hole   bool   // reads as zeroes: not read
	data   []byte // what was read; nil for holes
	done   chan struct{}
}

// outputMode is how the image is written.
type outputMode int

const (
	outputSparse     outputMode = iota // regular file: positional writes, holes skipped
	outputPositional                   // block device: positional writes, zeroes written
	outputStream                       // stdout, pipe, character device: in order
)

// openOutput opens the export's destination.
func (t *copier) openOutput(name string, imageSize uint64) (io.Writer, *os.File, outputMode, func(), error) {
	if name == "-" {
		return t.Stdout, nil, outputStream, func() {}, nil
	}
	info, err := os.Stat(name)
	var f *os.File
	mode := outputSparse
	switch {
	case err == nil && !t.Force:
		return nil, nil, 0, nil, fmt.Errorf("%s exists: add --force to overwrite it", name)
	case err == nil && info.Mode().IsRegular():
		f, err = os.OpenFile(name, os.O_WRONLY|os.O_TRUNC, 0)
	case err == nil && info.Mode()&fs.ModeDevice != 0 && info.Mode()&fs.ModeCharDevice == 0:
		f, err = os.OpenFile(name, os.O_WRONLY, 0)
		mode = outputPositional
	case err == nil:
		f, err = os.OpenFile(name, os.O_WRONLY, 0)
		mode = outputStream
	case errors.Is(err, fs.ErrNotExist):
		f, err = os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	}
	if err != nil {
		return nil, nil, 0, nil, fmt.Errorf("cannot create the image file: %w", err)
	}
	remove := func() {}
	if mode == outputSparse {
		// A partial image must not be mistaken for a whole one.
		remove = func() { os.Remove(name) }
		if err := f.Truncate(int64(imageSize)); err != nil {
			f.Close()
			remove()
			return nil, nil, 0, nil, fmt.Errorf("%s: %w", name, err)
		}
	}
	return f, f, mode, remove, nil
}

// exportImage copies the VDI or snapshot into file ("-": stdout).
func (t *copier) exportImage(ctx context.Context, vdi, file string) (Summary, error) {
	started := time.Now()
	// A VDI is opened read-only ("ro/NAME"), so that exporting neither
	// takes its write lock nor is refused while a VM runs on it; a snapshot
	// is read-only by nature.
	exportName := vdi
	if !strings.Contains(vdi, "@") && !strings.HasPrefix(vdi, "ro/") {
		exportName = "ro/" + vdi
	}
	conns, err := t.dial(ctx, exportName, vdi, false)
	if err != nil {
		return Summary{}, err
	}
	defer closeConns(conns)
	first := conns[0]
	imageSize := first.Size()
	var zeros zeroMap
	if first.CanBlockStatus() && imageSize > 0 {
		extents, err := first.BlockStatus(ctx, 0, imageSize)
		if err != nil {
			return Summary{}, fmt.Errorf("reading the allocation map of %s: %w", vdi, err)
		}
		zeros = zeroMapOf(0, extents)
	}
	chunkLength := t.chunkLengthFor(first)

	writer, f, mode, remove, err := t.openOutput(file, imageSize)
	if err != nil {
		return Summary{}, err
	}
	succeeded := false
	defer func() {
		if f != nil {
			f.Close()
		}
		if !succeeded {
			remove()
		}
	}()

	progress := t.startProgress("exporting "+vdi, imageSize)
	defer progress.finish()
	var dataBytes, zeroBytes atomic.Uint64
	windowLength := 2 * len(conns) * t.Requests
	pool := newBufferPool(chunkLength, windowLength+len(conns)*t.Requests+2)
	work := func(ctx context.Context, conn *nbdclient.Conn, job *exportJob) error {
		if job.done != nil {
			defer close(job.done)
		}
		if job.hole {
			if mode != outputStream {
				if err := writeZeroes(f, mode, job); err != nil {
					return err
				}
				zeroBytes.Add(uint64(job.length))
				progress.add(uint64(job.length))
			}
			return nil
		}
		data := pool.get()[:job.length]
		if err := conn.ReadAt(ctx, data, job.offset); err != nil {
			pool.put(data)
			return fmt.Errorf("%s: %w", vdi, err)
		}
		if mode == outputStream {
			job.data = data // the stream writer takes it from here
			return nil
		}
		defer pool.put(data)
		written, err := writeChunk(f, mode, data, job.offset)
		if err != nil {
			return err
		}
		dataBytes.Add(written)
		zeroBytes.Add(uint64(job.length) - written)
		progress.add(uint64(job.length))
		return nil
	}
	workContext, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	jobs, wait := runWorkers(workContext, cancel, conns, t.Requests, work)

	// A stream is written in order by one goroutine; the window bounds how
	// far the readers run ahead of it.
	var window chan *exportJob
	streamDone := make(chan error, 1)
	if mode == outputStream {
		window = make(chan *exportJob, windowLength)
		go func() {
			err := writeStream(workContext, writer, window, pool, progress, &dataBytes, &zeroBytes)
			if err != nil {
				cancel(err) // stops the readers and the producer
			}
			streamDone <- err
		}()
	}
	for offset := uint64(0); offset < imageSize; offset += uint64(chunkLength) {
		length := min(uint64(chunkLength), imageSize-offset)
		job := &exportJob{offset: offset, length: int(length), hole: zeros.covers(offset, length)}
		if window != nil {
			job.done = make(chan struct{})
			select {
			case window <- job:
			case <-workContext.Done():
			}
		}
		if !send(workContext, jobs, job) {
			if job.done != nil {
				close(job.done) // never reaches a worker
			}
			break
		}
	}
	if window != nil {
		close(window)
	}
	workErr := wait()
	if window != nil {
		if err := <-streamDone; err != nil && workErr == nil {
			workErr = err
		}
	}
	if workErr != nil {
		return Summary{}, workErr
	}
	if mode == outputSparse || mode == outputPositional {
		if err := f.Sync(); err != nil {
			return Summary{}, fmt.Errorf("%s: %w", file, err)
		}
	}
	if f != nil {
		err := f.Close()
		f = nil
		if err != nil {
			return Summary{}, fmt.Errorf("%s: %w", file, err)
		}
	}
	succeeded = true
	progress.finish()
	summary := Summary{Operation: "export", VDI: vdi, File: file, Format: "raw", Bytes: imageSize,
		DataBytes: dataBytes.Load(), ZeroBytes: zeroBytes.Load()}
	summary.finish(started)
	return summary, nil
}

// writeChunk writes data at offset. In a sparse file, blocks of zeroes are
// skipped (the file was truncated to size, so they read as zeroes); it
// returns the bytes written.
func writeChunk(f *os.File, mode outputMode, data []byte, offset uint64) (uint64, error) {
	if mode != outputSparse {
		if _, err := f.WriteAt(data, int64(offset)); err != nil {
			return 0, fmt.Errorf("writing the image: %w", err)
		}
		return uint64(len(data)), nil
	}
	var written uint64
	for start := 0; start < len(data); {
		// Skip zero blocks, then write the run of data blocks after them.
		for start < len(data) && allZero(data[start:min(start+sparseBlockLength, len(data))]) {
			start = min(start+sparseBlockLength, len(data))
		}
		end := start
		for end < len(data) && !allZero(data[end:min(end+sparseBlockLength, len(data))]) {
			end = min(end+sparseBlockLength, len(data))
		}
		if end > start {
			if _, err := f.WriteAt(data[start:end], int64(offset)+int64(start)); err != nil {
				return written, fmt.Errorf("writing the image: %w", err)
			}
			written += uint64(end - start)
		}
		start = end
	}
	return written, nil
}

// writeZeroes fills a hole chunk on a device (a sparse file already reads
// zeroes there).
func writeZeroes(f *os.File, mode outputMode, job *exportJob) error {
	if mode != outputPositional {
		return nil
	}
	if _, err := f.WriteAt(zeroChunk[:job.length], int64(job.offset)); err != nil {
		return fmt.Errorf("writing the image: %w", err)
	}
	return nil
}

// writeStream writes the chunks of window in order.
func writeStream(ctx context.Context, w io.Writer, window <-chan *exportJob, pool *bufferPool, meter *progress, dataBytes, zeroBytes *atomic.Uint64) error {
	for job := range window {
		select {
		case <-job.done:
		case <-ctx.Done():
			return nil // the workers' error is reported
		}
		if ctx.Err() != nil {
			return nil
		}
		data := job.data
		if job.hole {
			data = zeroChunk[:job.length]
		} else if data == nil {
			return nil // the chunk failed: its error is reported
		}
		_, err := w.Write(data)
		if !job.hole {
			pool.put(data)
		}
		if err != nil {
			if errors.Is(err, syscall.EPIPE) {
				return errors.New("writing the image to stdout: the reader went away (broken pipe)")
			}
			return fmt.Errorf("writing the image: %w", err)
		}
		if job.hole {
			zeroBytes.Add(uint64(job.length))
		} else {
			dataBytes.Add(uint64(job.length))
		}
		meter.add(uint64(job.length))
	}
	return nil
}
