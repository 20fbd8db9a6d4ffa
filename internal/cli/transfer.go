package cli

// `herd vdi import` and `herd vdi export`: disk images in and out of a VDI.
// The data goes straight to the NBD port of the node named by --addr, never
// through the admin API: parallel connections, several requests in flight
// on each, zero areas skipped on both sides (sparse-aware), FLUSH before an
// import reports success.

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
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/herd-storage/herd/internal/nbdclient"
	"github.com/herd-storage/herd/internal/size"
)

// Transfer defaults.
const (
	defaultNBDPort     = 10809
	defaultConnections = 4
	// defaultRequests is the requests in flight per connection: with 4 MiB
	// chunks, 4 connections x 4 requests keep 64 MiB moving, enough to
	// hide the network round trip and the replication behind each write.
	defaultRequests = 4
	// defaultChunkLength is herd's default object size, so that a chunk
	// maps to one object and a zero chunk is a whole hole.
	defaultChunkLength = 4 << 20
	// progressInterval: the progress line is redrawn at most 5 times/s.
	progressInterval = 200 * time.Millisecond
	// sparseBlockLength is the granularity at which zeroes inside data are
	// left as holes in an exported file (the usual file system block).
	sparseBlockLength = 4096
)

// transferFlags are the flags of import and export.
type transferFlags struct {
	nbdPort     int
	connections int
	requests    int
	format      string
	force       bool
}

func addTransferFlags(cmd *cobra.Command, f *transferFlags) {
	cmd.Flags().IntVar(&f.nbdPort, "nbd-port", defaultNBDPort, "NBD port of the node given by --addr")
	cmd.Flags().IntVar(&f.connections, "connections", defaultConnections, "parallel NBD connections")
	cmd.Flags().IntVar(&f.requests, "requests", defaultRequests, "requests in flight on each connection")
}

// transferCommands returns `herd vdi import` and `herd vdi export`; Main adds
// them to the vdi group.
func transferCommands(g *globals) []*cobra.Command {
	var importFlags, exportFlags transferFlags
	importCommand := &cobra.Command{
		Use:   "import NAME FILE|-",
		Short: "copy a disk image into an existing VDI over NBD (raw; qcow2, vmdk, ... through qemu-img; - is raw from stdin)",
		Long: `Copy a disk image into the existing VDI NAME, which must be at least as
large as the image. The data goes straight to the NBD port of the node given
by --addr. A raw FILE is read in 4 MiB chunks sent over --connections
connections; chunks of zeroes are not sent (nor zeroed, where the VDI already
reads as zeroes). A qcow2, vmdk, vhdx, vdi, vpc or qed FILE is converted by
qemu-img (Debian package qemu-utils) writing to the node's NBD export. "-"
reads a raw image from stdin. The VDI past the image's end is zeroed, so that
it reads back as the image followed by zeroes. The import ends with a FLUSH:
when it reports success, the data is on the replicas' disks.`,
		Args: args(2, "NAME FILE|-"),
		RunE: func(cmd *cobra.Command, a []string) error {
			t, err := newTransfer(g, importFlags, cmd)
			if err != nil {
				return err
			}
			ctx, cancel := signalContext()
			defer cancel()
			summary, err := t.importImage(ctx, a[0], a[1])
			if err != nil {
				if ctx.Err() != nil {
					return fmt.Errorf("interrupted: vdi %s is only partly written", a[0])
				}
				return err
			}
			return t.report(summary)
		},
	}
	addTransferFlags(importCommand, &importFlags)
	importCommand.Flags().StringVar(&importFlags.format, "format", "auto", "image format: auto (detected from the file's magic), raw, or a qemu-img format such as qcow2")

	exportCommand := &cobra.Command{
		Use:   "export NAME[@TAG] FILE|-",
		Short: "copy a VDI or snapshot into a raw image file over NBD (sparse; - writes to stdout)",
		Long: `Copy the VDI NAME (opened read-only, so a VM may keep running on it; the
copy is then not crash-consistent) or its snapshot NAME@TAG into a raw image.
The data comes straight from the NBD port of the node given by --addr.
Unallocated areas are not read, and zero areas are left as holes: FILE is
sparse. FILE must not exist, unless --force; "-" writes the image to stdout.`,
		Args: args(2, "NAME[@TAG] FILE|-"),
		RunE: func(cmd *cobra.Command, a []string) error {
			if a[1] == "-" && g.json {
				return errors.New("--json prints to stdout, which carries the image with FILE -: drop --json or give a FILE")
			}
			t, err := newTransfer(g, exportFlags, cmd)
			if err != nil {
				return err
			}
			ctx, cancel := signalContext()
			defer cancel()
			summary, err := t.exportImage(ctx, a[0], a[1])
			if err != nil {
				if ctx.Err() != nil {
					return fmt.Errorf("interrupted: %s was not exported", a[0])
				}
				return err
			}
			return t.report(summary)
		},
	}
	addTransferFlags(exportCommand, &exportFlags)
	exportCommand.Flags().BoolVar(&exportFlags.force, "force", false, "overwrite FILE if it exists")
	return []*cobra.Command{importCommand, exportCommand}
}

// transfer holds what an import or export needs; the tests build it
// directly.
type transfer struct {
	address     string // NBD host:port
	connections int
	requests    int // per connection
	chunkLength int
	format      string // "auto", "raw", or a qemu-img format
	force       bool
	dialTimeout time.Duration
	stdin       io.Reader
	stdout      io.Writer // the image with export to "-"; the JSON summary
	stderr      io.Writer // the summary line
	progress    io.Writer // nil: no progress line
	json        bool
}

func newTransfer(g *globals, f transferFlags, cmd *cobra.Command) (*transfer, error) {
	if f.nbdPort < 1 || f.nbdPort > 65535 {
		return nil, fmt.Errorf("--nbd-port %d: not a TCP port", f.nbdPort)
	}
	if f.connections < 1 || f.connections > 64 {
		return nil, fmt.Errorf("--connections %d: give 1 to 64", f.connections)
	}
	if f.requests < 1 || f.requests > 64 {
		return nil, fmt.Errorf("--requests %d: give 1 to 64", f.requests)
	}
	address, err := nbdAddress(g.addr, f.nbdPort)
	if err != nil {
		return nil, err
	}
	t := &transfer{
		address:     address,
		connections: f.connections,
		requests:    f.requests,
		chunkLength: defaultChunkLength,
		format:      f.format,
		force:       f.force,
		dialTimeout: g.timeout,
		stdin:       cmd.InOrStdin(),
		stdout:      g.stdout,
		stderr:      cmd.ErrOrStderr(),
		json:        g.json,
	}
	if isTerminal(t.stderr) {
		t.progress = t.stderr
	}
	return t, nil
}

// nbdAddress turns the admin address IP[:PORT] into the node's NBD address.
func nbdAddress(admin string, port int) (string, error) {
	host := admin
	if h, _, err := net.SplitHostPort(admin); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if host == "" {
		return "", fmt.Errorf("--addr %q: give the IP of a herd node", admin)
	}
	return net.JoinHostPort(host, strconv.Itoa(port)), nil
}

// isTerminal reports whether w is a terminal (progress lines are for people
// only).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// transferSummary is the result of an import or export (the --json
// output).
type transferSummary struct {
	Operation string `json:"operation"` // "import" or "export"
	VDI       string `json:"vdi"`       // NAME or NAME@TAG
	File      string `json:"file"`      // "-" for stdin/stdout
	Format    string `json:"format"`    // of FILE: raw, qcow2, ...
	Bytes     uint64 `json:"bytes"`     // the image's size
	// DataBytes were sent as data (import) or read and written (export);
	// ZeroBytes were zero areas not transferred as data. Unknown (zero)
	// when qemu-img converted the image.
	DataBytes      uint64  `json:"data_bytes"`
	ZeroBytes      uint64  `json:"zero_bytes"`
	Seconds        float64 `json:"seconds"`
	BytesPerSecond float64 `json:"bytes_per_second"`
	Converter      string  `json:"converter,omitempty"` // "qemu-img" when it did the work
}

func (s *transferSummary) finish(started time.Time) {
	s.Seconds = time.Since(started).Seconds()
	if s.Seconds > 0 {
		s.BytesPerSecond = float64(s.Bytes) / s.Seconds
	}
}

// line is the one-line summary for people.
func (s transferSummary) line() string {
	rate := size.Format(uint64(s.BytesPerSecond)) + "/s"
	var text string
	if s.Operation == "import" {
		source := ""
		if s.Format != "raw" {
			source = fmt.Sprintf(" from a %s image", s.Format)
		}
		text = fmt.Sprintf("imported %s%s into %s in %.1f s (%s)", size.Format(s.Bytes), source, s.VDI, s.Seconds, rate)
	} else {
		target := s.File
		if target == "-" {
			target = "stdout"
		}
		text = fmt.Sprintf("exported %s of %s to %s in %.1f s (%s)", size.Format(s.Bytes), s.VDI, target, s.Seconds, rate)
	}
	switch {
	case s.Converter != "":
		text += ", converted by " + s.Converter
	case s.ZeroBytes > 0:
		text += fmt.Sprintf(", %s skipped as zeros", size.Format(s.ZeroBytes))
	}
	return text
}

func (t *transfer) report(s transferSummary) error {
	fmt.Fprintln(t.stderr, s.line())
	if t.json {
		encoder := json.NewEncoder(t.stdout)
		encoder.SetIndent("", "  ")
		return encoder.Encode(s)
	}
	return nil
}

// ---- connections ----

// dial opens t.connections connections to exportName.
func (t *transfer) dial(ctx context.Context, exportName, vdi string, writing bool) ([]*nbdclient.Conn, error) {
	var conns []*nbdclient.Conn
	for i := 0; i < t.connections; i++ {
		dialContext, cancel := context.WithTimeout(ctx, t.dialTimeout)
		conn, err := nbdclient.Dial(dialContext, t.address, exportName)
		cancel()
		if err != nil {
			closeConns(conns)
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, t.dialError(err, vdi, writing)
		}
		if len(conns) > 0 && conn.Size() != conns[0].Size() {
			conn.Close()
			closeConns(conns)
			return nil, fmt.Errorf("vdi %s changed size while connecting (%d, then %d bytes): try again", vdi, conns[0].Size(), conn.Size())
		}
		conns = append(conns, conn)
	}
	if writing && conns[0].ReadOnly() {
		closeConns(conns)
		return nil, fmt.Errorf("vdi %s is read-only through %s", vdi, t.address)
	}
	return conns, nil
}

// dialError turns a connection failure into one line for people.
func (t *transfer) dialError(err error, vdi string, writing bool) error {
	var refusal *nbdclient.OptionError
	if errors.As(err, &refusal) {
		message := refusal.Message
		if message == "" {
			message = refusal.ReplyName()
		}
		if writing && strings.Contains(message, "unknown export") {
			return fmt.Errorf("%s (via %s); create the vdi first: herd vdi create %s SIZE", message, t.address, vdi)
		}
		return fmt.Errorf("%s (via %s)", message, t.address)
	}
	var opError *net.OpError
	if errors.As(err, &opError) && opError.Op == "dial" {
		return fmt.Errorf("cannot connect to the NBD port of %s: %v (see --addr, --nbd-port)", t.address, opError.Err)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("no answer from the NBD port of %s within %s (see --addr, --nbd-port, --timeout)", t.address, t.dialTimeout)
	}
	return fmt.Errorf("opening vdi %s on %s: %w", vdi, t.address, err)
}

func closeConns(conns []*nbdclient.Conn) {
	for _, conn := range conns {
		conn.Close()
	}
}

// flush makes every completed write durable: one FLUSH covers the writes of
// every connection when the server offers multi-conn (spec,
// "NBD_FLAG_CAN_MULTI_CONN"), else each connection flushes its own.
func flush(ctx context.Context, conns []*nbdclient.Conn) error {
	if conns[0].CanMultiConn() {
		return conns[0].Flush(ctx)
	}
	for _, conn := range conns {
		if err := conn.Flush(ctx); err != nil {
			return err
		}
	}
	return nil
}

// chunkLength is the size of the pieces an image is moved in: at most the
// server's payload limit, a multiple of its minimum block size.
func (t *transfer) chunkLengthFor(conn *nbdclient.Conn) int {
	minimum, _, payload := conn.BlockSizes()
	length := min(uint32(t.chunkLength), payload)
	return int(max(length/minimum*minimum, minimum))
}

// ---- zero maps ----

// span is a byte range [start, end).
type span struct{ start, end uint64 }

// zeroMap lists the ranges known to read as zeroes, sorted and disjoint.
type zeroMap struct{ spans []span }

func (z *zeroMap) add(start, end uint64) {
	if start >= end {
		return
	}
	if last := len(z.spans) - 1; last >= 0 && z.spans[last].end == start {
		z.spans[last].end = end
		return
	}
	z.spans = append(z.spans, span{start, end})
}

// zeroMapOf builds the map of a block status answer from offset. Only
// NBD_STATE_ZERO counts: a hole without it has undefined contents (spec,
// "base:allocation").
func zeroMapOf(offset uint64, extents []nbdclient.Extent) zeroMap {
	var z zeroMap
	for _, extent := range extents {
		if extent.Zero {
			z.add(offset, offset+extent.Length)
		}
		offset += extent.Length
	}
	return z
}

// covers reports whether all of [offset, offset+length) reads as zeroes.
func (z zeroMap) covers(offset, length uint64) bool {
	i := sort.Search(len(z.spans), func(i int) bool { return z.spans[i].end > offset })
	return i < len(z.spans) && z.spans[i].start <= offset && z.spans[i].end >= offset+length
}

// gaps lists the parts of [from, to) not known to read as zeroes.
func (z zeroMap) gaps(from, to uint64) []span {
	var gaps []span
	position := from
	for i := sort.Search(len(z.spans), func(i int) bool { return z.spans[i].end > from }); position < to; i++ {
		if i >= len(z.spans) || z.spans[i].start >= to {
			gaps = append(gaps, span{position, to})
			break
		}
		if z.spans[i].start > position {
			gaps = append(gaps, span{position, z.spans[i].start})
		}
		position = max(position, z.spans[i].end)
	}
	return gaps
}

// zeroTail zeroes [from, to) where it does not already read as zeroes, so
// that after an import the VDI reads back as the image followed by zeroes,
// like a VDI created for it. It needs WRITE_ZEROES (herd always offers it):
// writing zeroes as data over a large tail would cost more than the import.
func zeroTail(ctx context.Context, conn *nbdclient.Conn, zeros zeroMap, from, to uint64) error {
	if from >= to || !conn.CanZero() {
		return nil
	}
	for _, gap := range zeros.gaps(from, to) {
		if err := conn.Zero(ctx, gap.start, gap.end-gap.start, 0); err != nil {
			return err
		}
	}
	return nil
}

// fileHoles maps the holes of a regular file with SEEK_DATA and SEEK_HOLE
// (lseek(2)), so that they are not even read. On file systems without them
// the map is empty and every chunk is read.
func fileHoles(f *os.File, fileSize uint64) zeroMap {
	var holes zeroMap
	for offset := uint64(0); offset < fileSize; {
		data, err := f.Seek(int64(offset), unix.SEEK_DATA)
		if errors.Is(err, syscall.ENXIO) {
			holes.add(offset, fileSize) // no data after offset
			break
		}
		if err != nil || data < int64(offset) {
			return zeroMap{}
		}
		holes.add(offset, min(uint64(data), fileSize))
		if uint64(data) >= fileSize {
			break
		}
		hole, err := f.Seek(data, unix.SEEK_HOLE)
		if err != nil || hole <= data {
			return zeroMap{}
		}
		offset = uint64(hole)
	}
	return holes
}

var zeroChunk = make([]byte, 32<<20) // read-only: compared against, written from

func allZero(p []byte) bool {
	for len(p) > 0 {
		n := min(len(p), len(zeroChunk))
		if !bytes.Equal(p[:n], zeroChunk[:n]) {
			return false
		}
		p = p[n:]
	}
	return true
}

// ---- parallel work ----

// bufferPool recycles chunk buffers; it never holds more than it was given.
type bufferPool struct {
	length int
	free   chan []byte
}

func newBufferPool(length, capacity int) *bufferPool {
	return &bufferPool{length: length, free: make(chan []byte, capacity)}
}

func (p *bufferPool) get() []byte {
	select {
	case b := <-p.free:
		return b
	default:
		return make([]byte, p.length)
	}
}

func (p *bufferPool) put(b []byte) {
	if cap(b) < p.length {
		return
	}
	select {
	case p.free <- b[:p.length]:
	default:
	}
}

// workers runs work for every job sent to the returned channel, with
// t.requests goroutines per connection. The first error cancels ctx (its
// cause is the error). wait closes the channel, waits for the workers and
// returns the first error.
func runWorkers[J any](ctx context.Context, cancel context.CancelCauseFunc, conns []*nbdclient.Conn, requests int, work func(context.Context, *nbdclient.Conn, J) error) (jobs chan<- J, wait func() error) {
	channel := make(chan J, len(conns)*requests)
	var group sync.WaitGroup
	for _, conn := range conns {
		for range requests {
			group.Go(func() {
				for job := range channel {
					if ctx.Err() != nil {
						continue // drain
					}
					if err := work(ctx, conn, job); err != nil {
						cancel(err)
					}
				}
			})
		}
	}
	return channel, func() error {
		close(channel)
		group.Wait()
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		return nil
	}
}

// send hands job to the workers unless ctx ends first.
func send[J any](ctx context.Context, jobs chan<- J, job J) bool {
	if ctx.Err() != nil {
		return false
	}
	select {
	case jobs <- job:
		return true
	case <-ctx.Done():
		return false
	}
}

// ---- progress ----

// progress counts the bytes done and, on a terminal, redraws one line.
type progress struct {
	done    atomic.Uint64
	total   uint64 // 0: unknown (stdin)
	label   string
	started time.Time
	w       io.Writer
	stop    chan struct{}
	stopped chan struct{}
}

func (t *transfer) startProgress(label string, total uint64) *progress {
	p := &progress{total: total, label: label, started: time.Now(), w: t.progress}
	if p.w == nil {
		return p
	}
	p.stop, p.stopped = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(p.stopped)
		ticker := time.NewTicker(progressInterval)
		defer ticker.Stop()
		for {
			select {
			case <-ticker.C:
				p.draw()
			case <-p.stop:
				fmt.Fprint(p.w, "\r\033[K") // clear the line for the summary
				return
			}
		}
	}()
	return p
}

func (p *progress) add(n uint64) { p.done.Add(n) }

func (p *progress) draw() {
	done := p.done.Load()
	elapsed := time.Since(p.started).Seconds()
	rate := 0.0
	if elapsed > 0 {
		rate = float64(done) / elapsed
	}
	line := fmt.Sprintf("%s: %s", p.label, size.Format(done))
	if p.total > 0 {
		line += fmt.Sprintf(" / %s (%d%%)", size.Format(p.total), done*100/p.total)
	}
	line += fmt.Sprintf(", %s/s", size.Format(uint64(rate)))
	if p.total > 0 && rate > 0 && done < p.total {
		eta := time.Duration(float64(p.total-done) / rate * float64(time.Second)).Round(time.Second)
		line += ", ETA " + eta.String()
	}
	fmt.Fprintf(p.w, "\r%s\033[K", line)
}

func (p *progress) finish() {
	if p.stop != nil {
		close(p.stop)
		<-p.stopped
		p.stop = nil
	}
}

// ---- import ----

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

func (t *transfer) openSource(name string) (*imageSource, error) {
	var head []byte
	source := &imageSource{name: name, size: -1}
	if name == "-" {
		source.name = "stdin"
		buffered := bufio.NewReaderSize(t.stdin, 1<<20)
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
	switch t.format {
	case "", "auto":
		source.format = detectFormat(head)
	default:
		source.format = t.format
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
func (t *transfer) importImage(ctx context.Context, vdi, file string) (transferSummary, error) {
	if strings.Contains(vdi, "@") {
		return transferSummary{}, fmt.Errorf("%s is a snapshot, which is read-only: import into a vdi", vdi)
	}
	if strings.HasPrefix(vdi, "ro/") {
		return transferSummary{}, fmt.Errorf("%s names a read-only open: import into %s", vdi, strings.TrimPrefix(vdi, "ro/"))
	}
	source, err := t.openSource(file)
	if err != nil {
		return transferSummary{}, err
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

func (t *transfer) importRaw(ctx context.Context, vdi string, source *imageSource) (transferSummary, error) {
	started := time.Now()
	conns, err := t.dial(ctx, vdi, vdi, true)
	if err != nil {
		return transferSummary{}, err
	}
	defer closeConns(conns)
	first := conns[0]
	vdiSize := first.Size()
	minimum, _, _ := first.BlockSizes()
	if source.size >= 0 {
		imageSize := uint64(source.size)
		if imageSize > vdiSize {
			return transferSummary{}, tooSmall(vdi, imageSize, vdiSize)
		}
		if imageSize%uint64(minimum) != 0 && imageSize != vdiSize {
			return transferSummary{}, fmt.Errorf("image is %d bytes, not a multiple of the %d-byte blocks of vdi %s", imageSize, minimum, vdi)
		}
	}
	// Where the VDI already reads as zeroes, a zero chunk (or the VDI past
	// the image) needs nothing; elsewhere it is zeroed.
	var targetZeros zeroMap
	if first.CanBlockStatus() && vdiSize > 0 {
		extents, err := first.BlockStatus(ctx, 0, vdiSize)
		if err != nil {
			return transferSummary{}, fmt.Errorf("reading the allocation map of vdi %s: %w", vdi, err)
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
	pool := newBufferPool(chunkLength, 2*len(conns)*t.requests+2)
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
	jobs, wait := runWorkers(workContext, cancel, conns, t.requests, work)

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
		return transferSummary{}, err
	}
	if produceErr != nil {
		return transferSummary{}, produceErr
	}
	if err := zeroTail(ctx, first, targetZeros, produced, vdiSize); err != nil {
		return transferSummary{}, fmt.Errorf("vdi %s: zeroing it past the image: %w", vdi, err)
	}
	if err := flush(ctx, conns); err != nil {
		return transferSummary{}, fmt.Errorf("vdi %s: the data was sent but the final flush failed: %w", vdi, err)
	}
	progress.finish()
	summary := transferSummary{Operation: "import", VDI: vdi, File: source.name, Format: "raw", Bytes: produced,
		DataBytes: dataBytes.Load(), ZeroBytes: zeroBytes.Load()}
	if source.file == nil {
		summary.File = "-"
	}
	summary.finish(started)
	return summary, nil
}

// readStream reads a raw image sequentially (stdin) and hands its chunks to
// the workers; it returns the image's size.
func (t *transfer) readStream(ctx context.Context, reader io.Reader, jobs chan<- importJob, pool *bufferPool, chunkLength int, vdi string, vdiSize, minimum uint64) (uint64, error) {
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
func (t *transfer) importConverted(ctx context.Context, vdi string, source *imageSource) (transferSummary, error) {
	started := time.Now()
	if source.file == nil {
		return transferSummary{}, fmt.Errorf("stdin is a %s image, which qemu-img cannot convert from a pipe: save it to a file and import the file", source.format)
	}
	qemuImg, err := exec.LookPath("qemu-img")
	if err != nil {
		return transferSummary{}, fmt.Errorf("%s is a %s image: converting it needs qemu-img (Debian package qemu-utils)", source.name, source.format)
	}
	imageSize, err := qemuImageSize(ctx, qemuImg, source)
	if err != nil {
		return transferSummary{}, err
	}
	// Check the VDI (exists, writable, large enough) with one connection
	// first, to give herd's own messages rather than qemu-img's.
	// The connection stays open during the conversion: it holds the VDI's
	// write lock on this node, which qemu-img's connection shares.
	probe := *t
	probe.connections = 1
	conns, err := probe.dial(ctx, vdi, vdi, true)
	if err != nil {
		return transferSummary{}, err
	}
	defer closeConns(conns)
	conn := conns[0]
	vdiSize := conn.Size()
	if imageSize > vdiSize {
		return transferSummary{}, tooSmall(vdi, imageSize, vdiSize)
	}

	target := (&url.URL{Scheme: "nbd", Host: t.address, Path: "/" + vdi}).String()
	// -n: the VDI exists; -W: writes may go out of order (faster, and
	// harmless for a raw target). Zero areas go out as WRITE_ZEROES.
	arguments := []string{"convert", "-n", "-W", "-f", source.format, "-O", "raw"}
	if t.progress != nil {
		arguments = append(arguments, "-p")
	}
	arguments = append(arguments, source.name, target)
	command := exec.CommandContext(ctx, qemuImg, arguments...)
	var stderr limitedBuffer
	command.Stderr = &stderr
	if t.progress != nil {
		command.Stdout = t.progress
	}
	if err := command.Run(); err != nil {
		if ctx.Err() != nil {
			return transferSummary{}, ctx.Err()
		}
		return transferSummary{}, fmt.Errorf("qemu-img convert of %s into vdi %s failed: %s", source.name, vdi, stderr.lastLine(err))
	}
	if t.progress != nil {
		fmt.Fprint(t.progress, "\r\033[K")
	}
	// qemu-img wrote the image's range only.
	if imageSize < vdiSize {
		var tailZeros zeroMap
		if conn.CanBlockStatus() {
			extents, err := conn.BlockStatus(ctx, imageSize, vdiSize-imageSize)
			if err != nil {
				return transferSummary{}, fmt.Errorf("reading the allocation map of vdi %s: %w", vdi, err)
			}
			tailZeros = zeroMapOf(imageSize, extents)
		}
		if err := zeroTail(ctx, conn, tailZeros, imageSize, vdiSize); err != nil {
			return transferSummary{}, fmt.Errorf("vdi %s: zeroing it past the image: %w", vdi, err)
		}
		if err := conn.Flush(ctx); err != nil {
			return transferSummary{}, fmt.Errorf("vdi %s: flush: %w", vdi, err)
		}
	}
	summary := transferSummary{Operation: "import", VDI: vdi, File: source.name, Format: source.format, Bytes: imageSize, Converter: "qemu-img"}
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

// ---- export ----

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
func (t *transfer) openOutput(name string, imageSize uint64) (io.Writer, *os.File, outputMode, func(), error) {
	if name == "-" {
		return t.stdout, nil, outputStream, func() {}, nil
	}
	info, err := os.Stat(name)
	var f *os.File
	mode := outputSparse
	switch {
	case err == nil && !t.force:
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
func (t *transfer) exportImage(ctx context.Context, vdi, file string) (transferSummary, error) {
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
		return transferSummary{}, err
	}
	defer closeConns(conns)
	first := conns[0]
	imageSize := first.Size()
	var zeros zeroMap
	if first.CanBlockStatus() && imageSize > 0 {
		extents, err := first.BlockStatus(ctx, 0, imageSize)
		if err != nil {
			return transferSummary{}, fmt.Errorf("reading the allocation map of %s: %w", vdi, err)
		}
		zeros = zeroMapOf(0, extents)
	}
	chunkLength := t.chunkLengthFor(first)

	writer, f, mode, remove, err := t.openOutput(file, imageSize)
	if err != nil {
		return transferSummary{}, err
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
	windowLength := 2 * len(conns) * t.requests
	pool := newBufferPool(chunkLength, windowLength+len(conns)*t.requests+2)
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
	jobs, wait := runWorkers(workContext, cancel, conns, t.requests, work)

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
		return transferSummary{}, workErr
	}
	if mode == outputSparse || mode == outputPositional {
		if err := f.Sync(); err != nil {
			return transferSummary{}, fmt.Errorf("%s: %w", file, err)
		}
	}
	if f != nil {
		err := f.Close()
		f = nil
		if err != nil {
			return transferSummary{}, fmt.Errorf("%s: %w", file, err)
		}
	}
	succeeded = true
	progress.finish()
	summary := transferSummary{Operation: "export", VDI: vdi, File: file, Format: "raw", Bytes: imageSize,
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
