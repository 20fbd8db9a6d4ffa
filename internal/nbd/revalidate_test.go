package nbd

import (
	"context"
	"encoding/binary"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/herd-storage/herd/internal/nbd/wire"
)

// revokingBackend is a memoryBackend whose clients are allowed until a
// test revokes them (Revalidator). Its Open may wait (entered is closed
// when one starts, release lets it go on), as herd's waits for a VDI's
// writer lock, and may run afterOpen once the export is open, as a
// revocation landing between the Backend's own check and the connection
// becoming active.
type revokingBackend struct {
	*memoryBackend
	revoked   atomic.Bool
	entered   chan struct{}
	release   chan struct{}
	afterOpen func()
}

func (b *revokingBackend) Open(ctx context.Context, name string, session Session) (Export, error) {
	if b.revoked.Load() {
		return nil, errors.New("revoked")
	}
	if b.entered != nil {
		close(b.entered)
		<-b.release
	}
	export, err := b.memoryBackend.Open(ctx, name, session)
	if err == nil && b.afterOpen != nil {
		b.afterOpen()
	}
	return export, err
}

func (b *revokingBackend) Revalidate(session Session, export string, writable bool) error {
	if b.revoked.Load() {
		return errors.New("client revoked")
	}
	return nil
}

// writeAfterRefusal sends a WRITE as an attacker would, ignoring write
// errors (the server may have closed already), and checks that the
// connection is closed without a reply and that nothing was written.
func writeAfterRefusal(t *testing.T, c *testClient, disk *memoryDisk) {
	t.Helper()
	header := make([]byte, wire.RequestHeaderLength)
	putRequest(header, wire.CmdWrite, 1, 0, 4096)
	c.conn.Write(append(header, make([]byte, 4096)...))
	c.expectClosed()
	if n := disk.allocatedBlocks(); n != 0 {
		t.Fatalf("the refused client wrote %d blocks", n)
	}
}

func putRequest(header []byte, command uint16, cookie, offset uint64, length uint32) {
	binary.BigEndian.PutUint32(header[0:], wire.RequestMagic)
	binary.BigEndian.PutUint16(header[6:], command)
	binary.BigEndian.PutUint64(header[8:], cookie)
	binary.BigEndian.PutUint64(header[16:], offset)
	binary.BigEndian.PutUint32(header[24:], length)
}

// TestRevalidatePendingOpen: a client revoked while its open waits in the
// Backend (herd: for a VDI's writer lock held elsewhere) is refused by
// Server.Revalidate then, not only once active: the open, when it
// completes, is closed and never served.
func TestRevalidatePendingOpen(t *testing.T) {
	disk := newMemoryDisk("vm1", 1<<20)
	memory := newMemoryBackend(disk)
	backend := &revokingBackend{memoryBackend: memory, entered: make(chan struct{}), release: make(chan struct{})}
	server := startServer(t, memory, func(s *Server) { s.Backend = backend })
	c := dial(t, server.address)
	c.greet(wire.FlagCFixedNewstyle | wire.FlagCNoZeroes)
	c.sendOption(wire.OptGo, exportRequestData("vm1"))
	<-backend.entered
	backend.revoked.Store(true)
	if n := server.Revalidate(); n != 1 {
		close(backend.release)
		t.Fatalf("Revalidate ended %d connections while a revoked client's open waited, want 1", n)
	}
	close(backend.release)
	writeAfterRefusal(t, c, disk)
	waitFor(t, "the open export to be closed", func() bool { return disk.opens.Load() == disk.closes.Load() })
}

// TestRevalidateOnceActive: a revocation that lands after the Backend's
// Open checked the client and before the connection is active (where
// Server.Revalidate, run meanwhile, would have found neither an open
// under way nor an active connection) is caught when the connection
// becomes active: nothing it sends is served.
func TestRevalidateOnceActive(t *testing.T) {
	disk := newMemoryDisk("vm1", 1<<20)
	memory := newMemoryBackend(disk)
	backend := &revokingBackend{memoryBackend: memory}
	backend.afterOpen = func() { backend.revoked.Store(true) }
	server := startServer(t, memory, func(s *Server) { s.Backend = backend })
	c := dial(t, server.address)
	c.greet(wire.FlagCFixedNewstyle | wire.FlagCNoZeroes)
	replies := c.option(wire.OptGo, exportRequestData("vm1"))
	if final(replies) != wire.RepAck {
		t.Fatalf("NBD_OPT_GO: %v", replies)
	}
	writeAfterRefusal(t, c, disk)
}

// TestRevalidateActive: an active connection of a revoked client is cut;
// one still allowed is left alone.
func TestRevalidateActive(t *testing.T) {
	disk := newMemoryDisk("vm1", 1<<20)
	memory := newMemoryBackend(disk)
	backend := &revokingBackend{memoryBackend: memory}
	server := startServer(t, memory, func(s *Server) { s.Backend = backend })
	c, _, _ := connect(t, server.address, "vm1", connectOptions{})
	if n := server.Revalidate(); n != 0 {
		t.Fatalf("Revalidate ended %d connections of an allowed client", n)
	}
	if r := c.roundTrip(0, wire.CmdWrite, 0, 512, make([]byte, 512)); r.errno != wire.NoError {
		t.Fatalf("write of an allowed client: %v", r)
	}
	disk.mu.Lock()
	clear(disk.blocks)
	disk.mu.Unlock()
	backend.revoked.Store(true)
	if n := server.Revalidate(); n != 1 {
		t.Fatalf("Revalidate ended %d connections of a revoked client, want 1", n)
	}
	writeAfterRefusal(t, c, disk)
}
