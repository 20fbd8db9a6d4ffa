package export

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/nbd"
)

// TestOpenRevokedWhileWaiting: an open of an exclusive VDI held through
// another node waits for the holder to let go; a client revoked during
// that wait is refused when the lock comes free, and the lock it took is
// released again.
func TestOpenRevokedWhileWaiting(t *testing.T) {
	gw, c := newTestGateway(t)
	var revoked atomic.Bool
	backend := Backend{Gateway: gw, Authorize: func(session nbd.Session) (Access, error) {
		if revoked.Load() {
			return Access{}, errors.New("NBD client \"alice\" was revoked")
		}
		return authorize(session)
	}}
	key := cluster.VDILockKey("gamma")
	c.mu.Lock()
	c.locks[key] = "node0" // the holder, through another node
	c.mu.Unlock()
	go func() {
		time.Sleep(300 * time.Millisecond) // the open is waiting
		revoked.Store(true)
		time.Sleep(300 * time.Millisecond)
		c.mu.Lock()
		delete(c.locks, key) // the holder disconnects
		c.mu.Unlock()
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	e, err := backend.Open(ctx, "gamma", nbd.Session{Client: "alice", TLS: true})
	if err == nil {
		e.Close()
		t.Fatal("the open of a client revoked while it waited for the lock succeeded")
	}
	if !errors.Is(err, nbd.ErrPermission) {
		t.Fatalf("open: %v, want ErrPermission", err)
	}
	if _, held := c.Lock(key); held {
		t.Fatal("the refused open kept the writer lock")
	}
}

// TestClientName: vdi status names a certificate client by its name and
// address, a client without one by its address.
func TestClientName(t *testing.T) {
	if got := clientName(nbd.Session{Client: "hostA", RemoteAddress: "10.0.0.5:51234"}); got != "hostA (10.0.0.5:51234)" {
		t.Errorf("a certificate client: %q", got)
	}
	if got := clientName(nbd.Session{RemoteAddress: "@"}); got != "@" {
		t.Errorf("a client without a certificate: %q", got)
	}
}
