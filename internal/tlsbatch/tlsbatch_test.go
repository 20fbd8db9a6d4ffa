package tlsbatch

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"io"
	"math/big"
	"net"
	"sync/atomic"
	"testing"
	"time"
)

// countingConn counts the writes that reach the network.
type countingConn struct {
	net.Conn
	writes atomic.Int64
}

func (c *countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

func selfSigned(t *testing.T) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	template := &x509.Certificate{SerialNumber: big.NewInt(1), NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), DNSNames: []string{"test"}}
	der, err := x509.CreateCertificate(rand.Reader, template, template, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// pair returns a TLS client over a counted, batching connection and the
// server end, handshakes done.
func pair(t *testing.T) (*tls.Conn, *countingConn, *tls.Conn) {
	t.Helper()
	a, b := net.Pipe()
	counted := &countingConn{Conn: a}
	client := tls.Client(Wrap(counted), &tls.Config{InsecureSkipVerify: true, DynamicRecordSizingDisabled: true})
	server := tls.Server(b, &tls.Config{Certificates: []tls.Certificate{selfSigned(t)}})
	errs := make(chan error, 1)
	go func() { errs <- server.Handshake() }()
	if err := client.Handshake(); err != nil {
		t.Fatal(err)
	}
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(); b.Close() }) // not a TLS close: its alert would wait for a reader
	return client, counted, server
}

func TestWriteGathersRecords(t *testing.T) {
	client, counted, server := pair(t)
	header := []byte("sixteen-byte-hdr")
	payload := make([]byte, 1<<20)
	rand.Read(payload)
	trailer := []byte("end")
	want := append(append(append([]byte(nil), header...), payload...), trailer...)
	got := make(chan []byte, 1)
	go func() {
		b := make([]byte, len(want))
		io.ReadFull(server, b)
		got <- b
	}()
	before := counted.writes.Load()
	n, err := Write(client, net.Buffers{header, payload, trailer})
	if err != nil || n != int64(len(want)) {
		t.Fatalf("Write: %d, %v", n, err)
	}
	if b := <-got; !bytes.Equal(b, want) {
		t.Fatal("the other end read different bytes")
	}
	// 1 MiB is 65 records of 16 KiB at least; gathered 256 KiB at a time
	// it takes 5 writes.
	if writes := counted.writes.Load() - before; writes > 6 {
		t.Fatalf("%d network writes for 1 MiB and two small parts (one per record would be 65)", writes)
	}
	// Outside Write, writes go straight through: a plain Write of the
	// tls.Conn is not held back.
	go func() {
		b := make([]byte, 5)
		io.ReadFull(server, b)
		got <- b
	}()
	if _, err := client.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	select {
	case b := <-got:
		if string(b) != "hello" {
			t.Fatalf("read %q", b)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a plain write outside a batch was held back")
	}
}

func TestWriteReportsNetworkErrors(t *testing.T) {
	client, counted, _ := pair(t)
	counted.Conn.Close()
	if _, err := Write(client, net.Buffers{make([]byte, 100<<10)}); err == nil {
		t.Fatal("a write to a closed connection succeeded")
	}
}
