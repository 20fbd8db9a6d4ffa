package transfer

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/herd-storage/herd/internal/exportname"
	"github.com/herd-storage/herd/internal/nbdclient"
	"github.com/herd-storage/herd/internal/size"
)

// imageSource is the image being imported.
type imageSource struct {
	name   string    // the FILE argument, or "stdin"
	file   *os.File  // nil for stdin
	reader io.Reader // stdin, buffered (the format was peeked)
	size   int64     // -1: unknown (stdin)
	format string    // "raw", "qcow2", ...
}

// imageMagics are the qemu-img formats recognised by their first bytes
// (each format's header specification); anything else is raw.
var imageMagics = []struct {
	format string
	offset int
	magic  string
}{
	{"qcow2", 0, "QFI\xfb"},
	{"qed", 0, "QED\x00"},
	{"vmdk", 0, "KDMV"},
	{"vmdk", 0, "# Disk DescriptorFile"},
	{"vhdx", 0, "vhdxfile"},
	{"vpc", 0, "conectix"},
	{"vdi", 64, "\x7f\x10\xda\xbe"}, // 0xbeda107f, little-endian
}

func detectFormat(head []byte) string {
	for _, m := range imageMagics {
		if len(head) >= m.offset+len(m.magic) && string(head[m.offset:m.offset+len(m.magic)]) == m.magic {
			return m.format
		}
	}
	return "raw"
}

func (t *copier) openSource(name string) (*imageSource, error) {
	var head []byte
	source := &imageSource{name: name, size: -1}
	if name == "-" {
		source.name = "stdin"
		buffered := bufio.NewReaderSize(t.Stdin, 1<<20)
		head, _ = buffered.Peek(512)
		source.reader = buffered
	} else {
		f, err := os.Open(name)
		if err != nil {
			return nil, fmt.Errorf("cannot open the image: %w", err)
		}
		info, err := f.Stat()
		if err != nil {
			f.Close()
			return nil, err
		}
		switch {
		case info.Mode().IsRegular():
			source.size = info.Size()
		case info.Mode()&fs.ModeDevice != 0 && info.Mode()&fs.ModeCharDevice == 0:
			end, err := f.Seek(0, io.SeekEnd)
			if err != nil {
				f.Close()
				return nil, fmt.Errorf("%s: size of the block device: %w", name, err)
			}
			source.size = end
		default:
			f.Close()
			return nil, fmt.Errorf("%s is not a file or a block device (for a pipe, give - and redirect stdin)", name)
		}
		source.file = f
		head = make([]byte, 512)
		n, err := f.ReadAt(head, 0)
		if err != nil && !errors.Is(err, io.EOF) {
			f.Close()
			return nil, fmt.Errorf("reading %s: %w", name, err)
		}
		head = head[:n]
	}
	switch t.Format {
	case "", "auto":
		source.format = detectFormat(head)
	default:
		source.format = t.Format
	}
	return source, nil
}

func (s *imageSource) Close() {
	if s.file != nil {
		s.file.Close()
	}
}

// resizeArgument writes bytes the shortest way `herd vdi resize` reads
// exactly.
func resizeArgument(bytes uint64) string {
	for _, unit := range []struct {
		suffix string
		bytes  uint64
	}{{"T", 1 << 40}, {"G", 1 << 30}, {"M", 1 << 20}, {"K", 1 << 10}} {
		if bytes%unit.bytes == 0 {
			return fmt.Sprintf("%d%s", bytes/unit.bytes, unit.suffix)
		}
	}
	return strconv.FormatUint(bytes, 10)
}

func tooSmall(vdi string, image, vdiSize uint64) error {
	return fmt.Errorf("image is %s, vdi %s is %s: herd vdi resize %s %s first", size.Format(image), vdi, size.Format(vdiSize), vdi, resizeArgument(image))
}

// importImage copies the image file (or "-", stdin) into the VDI.
func (t *copier) importImage(ctx context.Context, vdi, file string) (Summary, error) {
	if parsed := exportname.Parse(vdi); parsed.Snapshot() {
		return Summary{}, fmt.Errorf("%s is a snapshot, which is read-only: import into a vdi", vdi)
	} else if parsed.ReadOnly {
		return Summary{}, fmt.Errorf("%s names a read-only open: import into %s", vdi, parsed.VDI)
	}
	source, err := t.openSource(file)
	if err != nil {
		return Summary{}, err
	}
	defer source.Close()
	if source.format != "raw" {
		return t.importConverted(ctx, vdi, source)
	}
	return t.importRaw(ctx, vdi, source)
}

// importJob is one chunk to import; data is set when the producer read it
// (stdin), hole when the source has no data there.
type importJob struct {
	offset uint64
	length int
	data   []byte
	hole   bool
}

func (t *copier) importRaw(ctx context.Context, vdi string, source *imageSource) (Summary, error) {
	started := time.Now()
	conns, err := t.dial(ctx, vdi, vdi, true)
	if err != nil {
		return Summary{}, err
	}
	defer closeConns(conns)
	first := conns[0]
	vdiSize := first.Size()
	minimum, _, _ := first.BlockSizes()
	if source.size >= 0 {
		imageSize := uint64(source.size)
		if imageSize > vdiSize {
			return Summary{}, tooSmall(vdi, imageSize, vdiSize)
		}
		if imageSize%uint64(minimum) != 0 && imageSize != vdiSize {
			return Summary{}, fmt.Errorf("image is %d bytes, not a multiple of the %d-byte blocks of vdi %s", imageSize, minimum, vdi)
		}
	}
	// Where the VDI already reads as zeroes, a zero chunk (or the VDI past
	// the image) needs nothing; elsewhere it is zeroed.
	var targetZeros zeroMap
	if first.CanBlockStatus() && vdiSize > 0 {
		extents, err := first.BlockStatus(ctx, 0, vdiSize)
		if err != nil {
			return Summary{}, fmt.Errorf("reading the allocation map of vdi %s: %w", vdi, err)
		}
		targetZeros = zeroMapOf(0, extents)
	}
	chunkLength := t.chunkLengthFor(first)
	var sourceHoles zeroMap
	if source.file != nil && source.size > 0 {
		sourceHoles = fileHoles(source.file, uint64(source.size))
	}

	total := uint64(max(source.size, 0))
	progress := t.startProgress("importing "+vdi, total)
	defer progress.finish()
	var dataBytes, zeroBytes atomic.Uint64
	pool := newBufferPool(chunkLength, 2*len(conns)*t.Requests+2)
	work := func(ctx context.Context, conn *nbdclient.Conn, job importJob) error {
		data := job.data
		if data == nil && !job.hole {
			data = pool.get()[:job.length]
			if _, err := source.file.ReadAt(data, int64(job.offset)); err != nil {
				pool.put(data)
				if errors.Is(err, io.EOF) {
					return fmt.Errorf("%s shrank while being imported", source.name)
				}
				return fmt.Errorf("reading %s: %w", source.name, err)
			}
		}
		defer pool.put(data)
		length := uint64(job.length)
		var err error
		switch zero := job.hole || allZero(data); {
		case zero && targetZeros.covers(job.offset, length):
			zeroBytes.Add(length)
		case zero && conn.CanZero():
			// No NO_HOLE flag: the server may punch a hole, which is what
			// an image's zero area should become.
			err = conn.Zero(ctx, job.offset, length, 0)
			zeroBytes.Add(length)
		case zero:
			err = conn.WriteAt(ctx, zeroChunk[:job.length], job.offset, 0)
			dataBytes.Add(length)
		default:
			err = conn.WriteAt(ctx, data, job.offset, 0)
			dataBytes.Add(length)
		}
		if err != nil {
			return fmt.Errorf("vdi %s: %w", vdi, err)
		}
		progress.add(length)
		return nil
	}
	workContext, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	jobs, wait := runWorkers(workContext, cancel, conns, t.Requests, work)

	var produced uint64
	var produceErr error
	if source.file != nil {
		produced = total
		for offset := uint64(0); offset < total; offset += uint64(chunkLength) {
			length := min(uint64(chunkLength), total-offset)
			if !send(workContext, jobs, importJob{offset: offset, length: int(length), hole: sourceHoles.covers(offset, length)}) {
				break
			}
		}
	} else {
		produced, produceErr = t.readStream(workContext, source.reader, jobs, pool, chunkLength, vdi, vdiSize, uint64(minimum))
	}
	if err := wait(); err != nil {
		return Summary{}, err
	}
	if produceErr != nil {
		return Summary{}, produceErr
	}
	if err := zeroTail(ctx, first, targetZeros, produced, vdiSize); err != nil {
		return Summary{}, fmt.Errorf("vdi %s: zeroing it past the image: %w", vdi, err)
	}
	if err := flush(ctx, conns); err != nil {
		return Summary{}, fmt.Errorf("vdi %s: the data was sent but the final flush failed: %w", vdi, err)
	}
	progress.finish()
	summary := Summary{Operation: "import", VDI: vdi, File: source.name, Format: "raw", Bytes: produced,
		DataBytes: dataBytes.Load(), ZeroBytes: zeroBytes.Load()}
	if source.file == nil {
		summary.File = "-"
	}
	summary.finish(started)
	return summary, nil
}

// readStream reads a raw image sequentially (stdin) and hands its chunks to
// the workers; it returns the image's size.
func (t *copier) readStream(ctx context.Context, reader io.Reader, jobs chan<- importJob, pool *bufferPool, chunkLength int, vdi string, vdiSize, minimum uint64) (uint64, error) {
	var offset uint64
	for {
		buffer := pool.get()
		n, err := io.ReadFull(reader, buffer[:chunkLength])
		if n > 0 {
			end := offset + uint64(n)
			if end > vdiSize {
				pool.put(buffer)
				return offset, fmt.Errorf("stdin holds more than %s, the size of vdi %s: grow it first (herd vdi resize %s SIZE)", size.Format(vdiSize), vdi, vdi)
			}
			if n < chunkLength && end%minimum != 0 && end != vdiSize {
				pool.put(buffer)
				return offset, fmt.Errorf("the image on stdin is %d bytes, not a multiple of the %d-byte blocks of vdi %s", end, minimum, vdi)
			}
			if !send(ctx, jobs, importJob{offset: offset, length: n, data: buffer[:n]}) {
				return offset, nil // the workers failed; wait reports why
			}
			offset = end
		} else {
			pool.put(buffer)
		}
		switch {
		case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
			return offset, nil
		case err != nil:
			return offset, fmt.Errorf("reading stdin: %w", err)
		}
	}
}

// importConverted has qemu-img convert a non-raw image straight into the
// VDI's NBD export.
func (t *copier) importConverted(ctx context.Context, vdi string, source *imageSource) (Summary, error) {
	started := time.Now()
	if source.file == nil {
		return Summary{}, fmt.Errorf("stdin is a %s image, which qemu-img cannot convert from a pipe: save it to a file and import the file", source.format)
	}
	qemuImg, err := exec.LookPath("qemu-img")
	if err != nil {
		return Summary{}, fmt.Errorf("%s is a %s image: converting it needs qemu-img (Debian package qemu-utils)", source.name, source.format)
	}
	imageSize, err := qemuImageSize(ctx, qemuImg, source)
	if err != nil {
		return Summary{}, err
	}
	// Check the VDI (exists, writable, large enough) with one connection
	// first, to give herd's own messages rather than qemu-img's.
	// The connection stays open during the conversion: it holds the VDI's
	// write lock on this node, which qemu-img's connection shares.
	probe := *t
	probe.Connections = 1
	conns, err := probe.dial(ctx, vdi, vdi, true)
	if err != nil {
		return Summary{}, err
	}
	defer closeConns(conns)
	conn := conns[0]
	vdiSize := conn.Size()
	if imageSize > vdiSize {
		return Summary{}, tooSmall(vdi, imageSize, vdiSize)
	}

	target := (&url.URL{Scheme: "nbd", Host: t.Address, Path: "/" + vdi}).String()
	// -n: the VDI exists; -W: writes may go out of order (faster, and
	// harmless for a raw target). Zero areas go out as WRITE_ZEROES.
	arguments := []string{"convert", "-n", "-W", "-f", source.format}
	if t.TLSDir != "" {
		// Over TLS the target is given as options: a URI cannot name
		// the credentials.
		host, port, err := net.SplitHostPort(t.Address)
		if err != nil {
			return Summary{}, err
		}
		escape := func(v string) string { return strings.ReplaceAll(v, ",", ",,") }
		arguments = append(arguments, "--object", "tls-creds-x509,id=tls0,endpoint=client,dir="+escape(t.TLSDir), "--target-image-opts")
		target = "driver=raw,file.driver=nbd,file.host=" + host + ",file.port=" + port + ",file.export=" + escape(vdi) + ",file.tls-creds=tls0"
	} else {
		arguments = append(arguments, "-O", "raw")
	}
	if t.Progress != nil {
		arguments = append(arguments, "-p")
	}
	arguments = append(arguments, source.name, target)
	command := exec.CommandContext(ctx, qemuImg, arguments...)
	var stderr limitedBuffer
	command.Stderr = &stderr
	if t.Progress != nil {
		command.Stdout = t.Progress
	}
	if err := command.Run(); err != nil {
		if ctx.Err() != nil {
			return Summary{}, ctx.Err()
		}
		return Summary{}, fmt.Errorf("qemu-img convert of %s into vdi %s failed: %s", source.name, vdi, stderr.lastLine(err))
	}
	if t.Progress != nil {
		fmt.Fprint(t.Progress, "\r\033[K")
	}
	// qemu-img wrote the image's range only.
	if imageSize < vdiSize {
		var tailZeros zeroMap
		if conn.CanBlockStatus() {
			extents, err := conn.BlockStatus(ctx, imageSize, vdiSize-imageSize)
			if err != nil {
				return Summary{}, fmt.Errorf("reading the allocation map of vdi %s: %w", vdi, err)
			}
			tailZeros = zeroMapOf(imageSize, extents)
		}
		if err := zeroTail(ctx, conn, tailZeros, imageSize, vdiSize); err != nil {
			return Summary{}, fmt.Errorf("vdi %s: zeroing it past the image: %w", vdi, err)
		}
		if err := conn.Flush(ctx); err != nil {
			return Summary{}, fmt.Errorf("vdi %s: flush: %w", vdi, err)
		}
	}
	summary := Summary{Operation: "import", VDI: vdi, File: source.name, Format: source.format, Bytes: imageSize, Converter: "qemu-img"}
	summary.finish(started)
	return summary, nil
}

// qemuImageSize asks qemu-img for the image's virtual size.
func qemuImageSize(ctx context.Context, qemuImg string, source *imageSource) (uint64, error) {
	command := exec.CommandContext(ctx, qemuImg, "info", "--output=json", "-f", source.format, source.name)
	var stderr limitedBuffer
	command.Stderr = &stderr
	output, err := command.Output()
	if err != nil {
		return 0, fmt.Errorf("qemu-img cannot read %s as a %s image: %s", source.name, source.format, stderr.lastLine(err))
	}
	var info struct {
		VirtualSize *uint64 `json:"virtual-size"`
	}
	if err := json.Unmarshal(output, &info); err != nil || info.VirtualSize == nil {
		return 0, fmt.Errorf("qemu-img info %s: no virtual size in its answer", source.name)
	}
	return *info.VirtualSize, nil
}

// limitedBuffer keeps the first 64 KiB written to it (a tool's stderr).
type limitedBuffer struct{ bytes.Buffer }

func (b *limitedBuffer) Write(p []byte) (int, error) {
	if room := 64<<10 - b.Len(); room > 0 {
		b.Buffer.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

// lastLine is the last non-empty line, or err's text.
func (b *limitedBuffer) lastLine(err error) string {
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if last := strings.TrimSpace(lines[len(lines)-1]); last != "" {
		return last
	}
	return err.Error()
}
