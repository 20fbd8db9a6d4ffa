package peer

import (
	"bytes"
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

// TestDelayConn: a delayed connection delivers every byte in order, a
// round trip takes at least twice the delay, and a read deadline still
// ends a read.
func TestDelayConn(t *testing.T) {
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer listener.Close()
	go func() {
		conn, err := listener.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		io.Copy(conn, conn) // echo
	}()
	raw, err := net.Dial("tcp", listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	const delay = 20 * time.Millisecond
	conn := newDelayConn(raw, delay)
	defer conn.Close()
	var sent bytes.Buffer
	start := time.Now()
	for i := range 200 {
		p := bytes.Repeat([]byte{byte(i)}, 1000+i)
		sent.Write(p)
		if _, err := conn.Write(p); err != nil {
			t.Fatal(err)
		}
	}
	got := make([]byte, sent.Len())
	if _, err := io.ReadFull(conn, got); err != nil || !bytes.Equal(got, sent.Bytes()) {
		t.Fatalf("echo: %v, equal %v", err, bytes.Equal(got, sent.Bytes()))
	}
	if took := time.Since(start); took < 2*delay {
		t.Fatalf("a round trip took %v, less than twice the delay %v", took, delay)
	}
	conn.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
	var timeout net.Error
	if _, err := conn.Read(make([]byte, 1)); !errors.As(err, &timeout) || !timeout.Timeout() {
		t.Fatalf("read past the deadline: %v", err)
	}
	if got := parseDelays("127.0.0.3,127.0.0.4=25ms;127.0.0.9=1s;bad"); got["127.0.0.4"] != 25*time.Millisecond || got["127.0.0.9"] != time.Second || len(got) != 3 {
		t.Fatalf("parseDelays: %v", got)
	}
}
