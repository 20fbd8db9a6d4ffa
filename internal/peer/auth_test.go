package peer

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"
)

func listen(t *testing.T, token string) *Listener {
	t.Helper()
	l, err := Listen("127.0.0.1:0", Key(token), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func TestHandshakeAcceptsSameToken(t *testing.T) {
	l := listen(t, "secret")
	sub := l.Protocol(ProtocolRaft)
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := sub.Accept()
		if err == nil {
			accepted <- c
		}
	}()
	conn, err := Dial(context.Background(), l.Addr().String(), Key("secret"), ProtocolRaft)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	defer conn.Close()
	select {
	case server := <-accepted:
		conn.Write([]byte("ping"))
		buf := make([]byte, 4)
		if _, err := io.ReadFull(server, buf); err != nil || string(buf) != "ping" {
			t.Fatalf("payload after handshake: %q, %v", buf, err)
		}
		server.Close()
	case <-time.After(5 * time.Second):
		t.Fatal("connection never reached the raft sub-listener")
	}
}

func TestHandshakeRefusesWrongToken(t *testing.T) {
	l := listen(t, "secret")
	l.Protocol(ProtocolRaft)
	_, err := Dial(context.Background(), l.Addr().String(), Key("other"), ProtocolRaft)
	if !errors.Is(err, ErrWrongToken) {
		t.Fatalf("dial with wrong token: %v, want ErrWrongToken", err)
	}
}

func TestServerRefusesGarbageAndWrongProof(t *testing.T) {
	server, client := net.Pipe()
	defer client.Close()
	go client.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n........................................"))
	if _, err := ServerHandshake(server, Key("secret")); !errors.Is(err, ErrNotHerd) {
		t.Fatalf("garbage greeting: %v, want ErrNotHerd", err)
	}

	server, client = net.Pipe()
	defer client.Close()
	done := make(chan error, 1)
	go func() { _, err := ServerHandshake(server, Key("secret")); done <- err }()
	if err := ClientHandshake(client, Key("wrong"), ProtocolRaft); !errors.Is(err, ErrWrongToken) {
		t.Fatalf("client with wrong token: %v", err)
	}
	client.Close()
	if err := <-done; err == nil {
		t.Fatal("server accepted a client without the token")
	}
}

func TestDialNonHerdPort(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		c, err := l.Accept()
		if err == nil {
			c.Write([]byte("SSH-2.0-OpenSSH_9.2\r\n" + string(make([]byte, 64))))
			c.Close()
		}
	}()
	_, err = Dial(context.Background(), l.Addr().String(), Key("secret"), ProtocolRaft)
	if !errors.Is(err, ErrNotHerd) {
		t.Fatalf("dial non-herd port: %v, want ErrNotHerd", err)
	}
}
