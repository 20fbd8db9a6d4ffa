package nbdclient

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/nbd"
	"github.com/herd-storage/herd/internal/nbd/wire"
	"github.com/herd-storage/herd/internal/nbdclient/nbdtest"
)

// testTimeout bounds every wait in these tests.
const testTimeout = 20 * time.Second

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

// serve starts a real herd NBD server with disks and returns its address.
func serve(t *testing.T, disks ...*nbdtest.Disk) string {
	return nbdtest.Serve(t, nbdtest.NewBackend(disks...))
}

func dial(t *testing.T, d *Dialer, address, name string) *Conn {
	t.Helper()
	if d == nil {
		d = &Dialer{}
	}
	c, err := d.Dial(testContext(t), address, name)
	if err != nil {
		t.Fatalf("dial %s: %v", name, err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return c
}

func randomBytes(seed uint64, n int) []byte {
	var key [32]byte
	binary.LittleEndian.PutUint64(key[:], seed)
	p := make([]byte, n)
	rand.NewChaCha8(key).Read(p)
	return p
}

func TestNegotiation(t *testing.T) {
	disk := nbdtest.NewDisk("vm1", 3<<20+512)
	disk.Info.PayloadSizeMaximum = 1 << 20
	address := serve(t, disk)
	c := dial(t, nil, address, "vm1")
	if c.Size() != 3<<20+512 {
		t.Errorf("Size = %d", c.Size())
	}
	if c.ExportName() != "vm1" || c.ReadOnly() || !c.CanFlush() || !c.CanFUA() || !c.CanTrim() || !c.CanZero() ||
		!c.CanFastZero() || !c.CanMultiConn() || !c.StructuredReplies() || !c.CanBlockStatus() {
		t.Errorf("features: %+v", c.negotiated)
	}
	if minimum, preferred, payload := c.BlockSizes(); minimum != 1 || preferred != 4096 || payload != 1<<20 {
		t.Errorf("BlockSizes = %d, %d, %d", minimum, preferred, payload)
	}

	readOnly := dial(t, nil, address, "ro/vm1")
	if !readOnly.ReadOnly() || readOnly.CanTrim() || readOnly.CanZero() {
		t.Errorf("ro/vm1 features: %+v", readOnly.negotiated)
	}
	ctx := testContext(t)
	if err := readOnly.WriteAt(ctx, []byte("x"), 0, 0); !errors.Is(err, ErrReadOnly) {
		t.Errorf("write to a read-only export: %v", err)
	}
	if err := readOnly.Zero(ctx, 0, 1, 0); !errors.Is(err, ErrReadOnly) {
		t.Errorf("zero on a read-only export: %v", err)
	}

	simple := dial(t, &Dialer{SimpleReplies: true}, address, "vm1")
	if simple.StructuredReplies() || simple.CanBlockStatus() {
		t.Errorf("simple replies: %+v", simple.negotiated)
	}
	if _, err := simple.BlockStatus(ctx, 0, 1); !errors.Is(err, ErrUnsupported) {
		t.Errorf("BlockStatus without a meta context: %v", err)
	}
}

// TestReadWrite moves data through every command, with structured and
// simple replies, and with requests larger than the payload limit.
func TestReadWrite(t *testing.T) {
	for _, simple := range []bool{false, true} {
		t.Run(fmt.Sprintf("simple=%v", simple), func(t *testing.T) {
			disk := nbdtest.NewDisk("vm1", 8<<20)
			disk.Info.PayloadSizeMaximum = 256 << 10 // ReadAt and WriteAt split
			c := dial(t, &Dialer{SimpleReplies: simple}, serve(t, disk), "vm1")
			ctx := testContext(t)
			data := randomBytes(1, 3<<20+100)
			if err := c.WriteAt(ctx, data, 1<<20+7, 0); err != nil {
				t.Fatal(err)
			}
			if err := c.WriteAt(ctx, data[:4096], 0, FUA); err != nil {
				t.Fatal(err)
			}
			got := make([]byte, len(data))
			if err := c.ReadAt(ctx, got, 1<<20+7); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, data) {
				t.Fatal("read back different data")
			}
			if err := c.Zero(ctx, 1<<20+7, 1<<20, 0); err != nil {
				t.Fatal(err)
			}
			if err := c.Trim(ctx, 2<<20+7, 4096, 0); err != nil {
				t.Fatal(err)
			}
			if err := c.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			want := disk.Contents()
			all := make([]byte, c.Size())
			if err := c.ReadAt(ctx, all, 0); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(all, want) {
				t.Fatal("whole-disk read differs from the disk")
			}
			if !bytes.Equal(all[1<<20+7:2<<20+7], make([]byte, 1<<20)) {
				t.Fatal("zeroed range is not zero")
			}
			if err := c.ReadAt(ctx, nil, c.Size()); err != nil {
				t.Errorf("empty read at the end: %v", err)
			}
		})
	}
}

func TestBlockStatus(t *testing.T) {
	disk := nbdtest.NewDisk("vm1", 1<<20)
	disk.WriteAt([]byte{1}, 8192)           // block 2
	disk.WriteAt(make([]byte, 8192), 65536) // blocks 16, 17
	c := dial(t, nil, serve(t, disk), "vm1")
	extents, err := c.BlockStatus(testContext(t), 4096, 1<<20-4096)
	if err != nil {
		t.Fatal(err)
	}
	want := []Extent{
		{Length: 4096, Hole: true, Zero: true},
		{Length: 4096},
		{Length: 65536 - 12288, Hole: true, Zero: true},
		{Length: 8192},
		{Length: 1<<20 - 65536 - 8192, Hole: true, Zero: true},
	}
	if fmt.Sprint(extents) != fmt.Sprint(want) {
		t.Errorf("extents\n got %v\nwant %v", extents, want)
	}
}

// TestConcurrent runs many goroutines on one connection: replies must reach
// the right callers.
func TestConcurrent(t *testing.T) {
	disk := nbdtest.NewDisk("vm1", 16<<20)
	c := dial(t, nil, serve(t, disk), "vm1")
	ctx := testContext(t)
	var group sync.WaitGroup
	errs := make(chan error, 32)
	for worker := range 32 {
		group.Go(func() {
			region := uint64(worker) * (512 << 10)
			for round := range 8 {
				data := randomBytes(uint64(worker*100+round), 256<<10+round*4096)
				if err := c.WriteAt(ctx, data, region, 0); err != nil {
					errs <- err
					return
				}
				got := make([]byte, len(data))
				if err := c.ReadAt(ctx, got, region); err != nil {
					errs <- err
					return
				}
				if !bytes.Equal(got, data) {
					errs <- fmt.Errorf("worker %d round %d: read another request's data", worker, round)
					return
				}
			}
		})
	}
	group.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestInvalidRequests(t *testing.T) {
	disk := nbdtest.NewDisk("vm1", 1<<20)
	disk.Info.CanFUA = false
	disk.Info.CanFastZero = false
	c := dial(t, nil, serve(t, disk), "vm1")
	ctx := testContext(t)
	for name, err := range map[string]error{
		"read past the end":  c.ReadAt(ctx, make([]byte, 2), 1<<20-1),
		"write past the end": c.WriteAt(ctx, make([]byte, 1), 1<<20, 0),
		"huge offset":        c.Zero(ctx, 1<<63, 1, 0),
		"length overflow":    c.Trim(ctx, 1, 1<<64-1, 0),
		"block status":       func() error { _, err := c.BlockStatus(ctx, 0, 1<<20+1); return err }(),
	} {
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
	if err := c.WriteAt(ctx, []byte{1}, 0, FUA); !errors.Is(err, ErrUnsupported) {
		t.Errorf("FUA without NBD_FLAG_SEND_FUA: %v", err)
	}
	if err := c.Zero(ctx, 0, 1, FastZero); !errors.Is(err, ErrUnsupported) {
		t.Errorf("fast zero without NBD_FLAG_SEND_FAST_ZERO: %v", err)
	}
	if err := c.WriteAt(ctx, []byte{1}, 0, NoHole); !errors.Is(err, ErrInvalid) {
		t.Errorf("NoHole on a write: %v", err)
	}
	// The connection still works.
	if err := c.WriteAt(ctx, []byte{1}, 0, 0); err != nil {
		t.Error(err)
	}
}

func TestOptionErrors(t *testing.T) {
	address := nbdtest.Serve(t, busyBackend{nbdtest.NewBackend(nbdtest.NewDisk("vm1", 1<<20))})
	_, err := Dial(testContext(t), address, "nope")
	var refusal *OptionError
	if !errors.As(err, &refusal) || refusal.ReplyName() != "NBD_REP_ERR_UNKNOWN" || !strings.Contains(refusal.Message, `vdi "nope" not found`) {
		t.Errorf("unknown export: %v", err)
	}
	_, err = Dial(testContext(t), address, "busy")
	if !errors.As(err, &refusal) || refusal.ReplyName() != "NBD_REP_ERR_POLICY" ||
		!strings.Contains(err.Error(), `vdi "busy" is open for writing through node n2 (10.0.0.2)`) {
		t.Errorf("busy export: %v", err)
	}
	if _, err := Dial(testContext(t), address, strings.Repeat("x", 5000)); !errors.Is(err, ErrInvalid) {
		t.Errorf("long name: %v", err)
	}
}

// busyBackend refuses "busy" the way herd's gateway refuses a VDI another
// node writes to.
type busyBackend struct{ *nbdtest.Backend }

func (b busyBackend) Open(ctx context.Context, name string, session nbd.Session) (nbd.Export, error) {
	if name == "busy" {
		return nil, fmt.Errorf(`%w: vdi "busy" is open for writing through node n2 (10.0.0.2); open it read-only as "ro/busy"`, nbd.ErrExportBusy)
	}
	return b.Backend.Open(ctx, name, session)
}

func TestCommandErrors(t *testing.T) {
	for _, simple := range []bool{false, true} {
		t.Run(fmt.Sprintf("simple=%v", simple), func(t *testing.T) {
			disk := nbdtest.NewDisk("vm1", 1<<20)
			disk.Fail = func(operation string, offset, length uint64) error {
				if offset == 4096 {
					return fmt.Errorf("%w: replica r3 is full", nbd.ErrNoSpace)
				}
				if operation == "read" && offset == 8192 {
					return fmt.Errorf("%w: object 7 lost", nbd.ErrIO)
				}
				return nil
			}
			c := dial(t, &Dialer{SimpleReplies: simple}, serve(t, disk), "vm1")
			ctx := testContext(t)
			err := c.WriteAt(ctx, []byte("data"), 4096, 0)
			var commandError *Error
			if !errors.As(err, &commandError) || commandError.Errno != 28 || !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("write: %v", err)
			}
			if commandError.Command != "WRITE" || commandError.Offset != 4096 || commandError.Length != 4 {
				t.Errorf("error fields: %+v", commandError)
			}
			if !simple && !strings.Contains(err.Error(), "replica r3 is full") {
				t.Errorf("structured error without the server's message: %v", err)
			}
			err = c.ReadAt(ctx, make([]byte, 100), 8192)
			if !errors.Is(err, syscall.EIO) {
				t.Errorf("read: %v", err)
			}
			if !simple && !strings.Contains(err.Error(), "object 7 lost") {
				t.Errorf("read error without the server's message: %v", err)
			}
			// The connection survives command errors.
			if err := c.WriteAt(ctx, []byte("data"), 0, 0); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestCancel abandons a request the server is slow to answer: the caller
// returns at once, the late reply is discarded, the connection stays usable.
func TestCancel(t *testing.T) {
	disk := nbdtest.NewDisk("vm1", 1<<20)
	release := make(chan struct{})
	disk.Fail = func(operation string, offset, length uint64) error {
		if operation == "read" && offset == 0 {
			<-release
		}
		return nil
	}
	disk.WriteAt([]byte("hello"), 4096)
	c := dial(t, nil, serve(t, disk), "vm1")
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	buffer := make([]byte, 4096)
	if err := c.ReadAt(ctx, buffer, 0); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("slow read: %v", err)
	}
	close(release)
	got := make([]byte, 5)
	if err := c.ReadAt(testContext(t), got, 4096); err != nil || string(got) != "hello" {
		t.Fatalf("read after an abandoned one: %q, %v", got, err)
	}
	if !bytes.Equal(buffer, make([]byte, 4096)) {
		t.Error("an abandoned read wrote into its buffer after returning")
	}
}

func TestClose(t *testing.T) {
	disk := nbdtest.NewDisk("vm1", 1<<20)
	c, err := Dial(testContext(t), serve(t, disk), "vm1")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
	if err := c.ReadAt(testContext(t), make([]byte, 1), 0); !errors.Is(err, ErrClosed) {
		t.Errorf("read after close: %v", err)
	}
}

func TestErrorText(t *testing.T) {
	refusal := &OptionError{Export: "vm1", Option: wire.OptGo, Reply: wire.RepFlagError + 2, Message: "vdi busy"}
	if got, want := refusal.Error(), `NBD server refused NBD_OPT_GO for export "vm1": NBD_REP_ERR_POLICY: vdi busy`; got != want {
		t.Errorf("OptionError = %q, want %q", got, want)
	}
	commandError := &Error{Command: "WRITE", Offset: 4096, Length: 512, Errno: 28, Message: "full"}
	if got, want := commandError.Error(), "NBD server failed WRITE of 512 bytes at offset 4096: ENOSPC: full"; got != want {
		t.Errorf("Error = %q, want %q", got, want)
	}
	if got := cleanMessage([]byte("bad\x1b[31m\xffred\n")); got != "bad [31m\uFFFDred" {
		t.Errorf("cleanMessage = %q", got)
	}
}
