package pkitest

import (
	"errors"
	"io"
	"log/slog"
	"testing"

	"github.com/herd-storage/herd/internal/peer"
)

func TestCredentials(t *testing.T) {
	ca := CA(t)
	l, err := peer.Listen("127.0.0.1:0", Credentials(t, ca, "a"), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	l.Protocol(peer.ProtocolForward)
	conn, err := peer.Dial(t.Context(), l.Addr().String(), Credentials(t, ca, "b"), peer.ProtocolForward)
	if err != nil {
		t.Fatalf("same CA: %v", err)
	}
	conn.Close()
	if _, err := peer.Dial(t.Context(), l.Addr().String(), Credentials(t, CA(t), "c"), peer.ProtocolForward); !errors.Is(err, peer.ErrWrongCluster) {
		t.Fatalf("another CA: %v", err)
	}
}
