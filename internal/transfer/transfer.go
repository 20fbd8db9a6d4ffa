package transfer

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	"github.com/herd-storage/herd/internal/nbdclient"
	"github.com/herd-storage/herd/internal/size"
)

// Defaults for the zero values of Options.
const (
	DefaultConnections = 4
	// DefaultRequests is the requests in flight per connection: with 4 MiB
	// chunks, 4 connections x 4 requests keep 64 MiB moving, enough to
	// hide the network round trip and the replication behind each write.
	DefaultRequests = 4
	// DefaultChunkLength is herd's default object size, so that a chunk
	// maps to one object and a zero chunk is a whole hole.
	DefaultChunkLength = 4 << 20
	// DefaultDialTimeout bounds each connection and its handshake.
	DefaultDialTimeout = 30 * time.Second
)

const (
	// progressInterval: the progress line is redrawn at most 5 times/s.
	progressInterval = 200 * time.Millisecond
	// sparseBlockLength is the granularity at which zeroes inside data are
	// left as holes in an exported file (the usual file system block).
	sparseBlockLength = 4096
)

// Options say where an image goes to or comes from, and how. Zero values
// take the defaults above.
type Options struct {
	// Address is the node's NBD address, host:port.
	Address string
	// Connections is the number of parallel NBD connections; Requests the
	// requests in flight on each.
	Connections int
	Requests    int
	// ChunkLength is the size of the pieces the image is moved in; it is
	// cut to the server's payload limit and rounded to its block size.
	ChunkLength int
	// Format is the image format of an import: "auto" or "" (detected from
	// the file's magic), "raw", or a qemu-img format such as "qcow2".
	Format string
	// Force lets an export overwrite an existing file.
	Force bool
	// DialTimeout bounds each connection and its handshake.
	DialTimeout time.Duration
	// TLSConfig, when set, makes every NBD connection TLS (STARTTLS),
	// and TLSDir holds the same client credentials as files (ca-cert.pem,
	// client-cert.pem, client-key.pem) for qemu-img.
	TLSConfig *tls.Config
	TLSDir    string
	// Stdin is the image of an import from "-"; Stdout receives the image
	// of an export to "-".
	Stdin  io.Reader
	Stdout io.Writer
	// Progress, if set, receives a progress line redrawn in place (a
	// terminal).
	Progress io.Writer
}

// Import copies the image file (or "-", Options.Stdin) into the existing
// VDI named vdi.
func Import(ctx context.Context, options Options, vdi, file string) (Summary, error) {
	return newCopier(options).importImage(ctx, vdi, file)
}

// Export copies the VDI or snapshot (NAME@TAG) named vdi into a raw image
// file (or "-", Options.Stdout).
func Export(ctx context.Context, options Options, vdi, file string) (Summary, error) {
	return newCopier(options).exportImage(ctx, vdi, file)
}

// copier is one import or export: the options with their defaults filled in.
type copier struct {
	Options
}

func newCopier(options Options) *copier {
	t := &copier{Options: options}
	if t.Connections <= 0 {
		t.Connections = DefaultConnections
	}
	if t.Requests <= 0 {
		t.Requests = DefaultRequests
	}
	if t.ChunkLength <= 0 {
		t.ChunkLength = DefaultChunkLength
	}
	if t.DialTimeout <= 0 {
		t.DialTimeout = DefaultDialTimeout
	}
	if t.Stdin == nil {
		t.Stdin = strings.NewReader("")
	}
	if t.Stdout == nil {
		t.Stdout = io.Discard
	}
	return t
}

// Summary is the result of an import or export (the JSON output of the
// commands).
type Summary struct {
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

func (s *Summary) finish(started time.Time) {
	s.Seconds = time.Since(started).Seconds()
	if s.Seconds > 0 {
		s.BytesPerSecond = float64(s.Bytes) / s.Seconds
	}
}

// Line is the one-line summary for people.
func (s Summary) Line() string {
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

// dial opens t.Connections connections to exportName.
func (t *copier) dial(ctx context.Context, exportName, vdi string, writing bool) ([]*nbdclient.Conn, error) {
	var conns []*nbdclient.Conn
	for i := 0; i < t.Connections; i++ {
		dialContext, cancel := context.WithTimeout(ctx, t.DialTimeout)
		dialer := nbdclient.Dialer{TLSConfig: t.TLSConfig}
		conn, err := dialer.Dial(dialContext, t.Address, exportName)
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
		return nil, fmt.Errorf("vdi %s is read-only through %s", vdi, t.Address)
	}
	return conns, nil
}

// dialError turns a connection failure into one line for people.
func (t *copier) dialError(err error, vdi string, writing bool) error {
	var refusal *nbdclient.OptionError
	if errors.As(err, &refusal) {
		message := refusal.Message
		if message == "" {
			message = refusal.ReplyName()
		}
		if writing && strings.Contains(message, "unknown export") {
			return fmt.Errorf("%s (via %s); create the vdi first: herd vdi create %s SIZE", message, t.Address, vdi)
		}
		return fmt.Errorf("%s (via %s)", message, t.Address)
	}
	var opError *net.OpError
	if errors.As(err, &opError) && opError.Op == "dial" {
		return fmt.Errorf("cannot connect to the NBD port of %s: %v (see --addr, --nbd-port)", t.Address, opError.Err)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("no answer from the NBD port of %s within %s (see --addr, --nbd-port, --timeout)", t.Address, t.DialTimeout)
	}
	return fmt.Errorf("opening vdi %s on %s: %w", vdi, t.Address, err)
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

// chunkLengthFor is the size of the pieces an image is moved in: at most the
// server's payload limit, a multiple of its minimum block size.
func (t *copier) chunkLengthFor(conn *nbdclient.Conn) int {
	minimum, _, payload := conn.BlockSizes()
	length := min(uint32(t.ChunkLength), payload)
	return int(max(length/minimum*minimum, minimum))
}
