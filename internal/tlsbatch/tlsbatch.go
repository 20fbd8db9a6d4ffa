// Package tlsbatch writes to a TLS connection with as few system calls as
// a plain connection's vectored write.
//
// crypto/tls turns every Write into records of at most 16 KiB and writes
// each record to the network connection with its own Write: a 1 MiB reply
// costs 64 system calls, and a reply made of a 16-byte header and a 4 KiB
// payload costs two records and two system calls, where the plaintext
// connection writes either with one writev. Herd's replies are exactly
// such vectors (NBD replies, object protocol batches).
//
// Conn goes between crypto/tls and the TCP connection (tls.Server(Wrap(raw),
// ...)). Write coalesces the small parts of a vector into full records
// above TLS, and while it runs Conn gathers the encrypted records below
// TLS and writes them together: one system call per 256 KiB instead of
// one per record. Outside Write (the handshake, alerts, key updates)
// records go straight through.
package tlsbatch

import (
	"bufio"
	"crypto/tls"
	"net"
	"sync"
)

// batchBytes is how many encrypted bytes Conn gathers before it writes
// them: 16 full records.
const batchBytes = 256 << 10

// coalesceBytes is the buffer above TLS that gathers small parts into full
// records (four of them); a part larger than what is free in it goes
// through it in place.
const coalesceBytes = 64 << 10

// Conn is a network connection under crypto/tls that can gather records.
type Conn struct {
	net.Conn
	mu       sync.Mutex // guards batching, pending; serialises writes to Conn
	batching int
	pending  []byte
}

// Wrap returns raw ready to go under tls.Server or tls.Client.
func Wrap(raw net.Conn) *Conn { return &Conn{Conn: raw} }

// Write is called by crypto/tls with one record (or handshake flight).
func (c *Conn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.batching == 0 {
		return c.Conn.Write(p)
	}
	c.pending = append(c.pending, p...)
	if len(c.pending) >= batchBytes {
		if err := c.flushLocked(); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

func (c *Conn) flushLocked() error {
	if len(c.pending) == 0 {
		return nil
	}
	_, err := c.Conn.Write(c.pending)
	if cap(c.pending) > 2*batchBytes {
		c.pending = nil // one huge record run: do not keep its buffer
	} else {
		c.pending = c.pending[:0]
	}
	return err
}

func (c *Conn) begin() {
	c.mu.Lock()
	c.batching++
	c.mu.Unlock()
}

func (c *Conn) end() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.batching--
	return c.flushLocked()
}

var coalescers = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, coalesceBytes) }}

// Write writes parts to t in order, as one vectored write would: small
// parts share records, and when t runs over a Conn the records share
// system calls. Concurrent calls for one connection must be serialised
// by the caller, as for any stream write.
func Write(t *tls.Conn, parts net.Buffers) (int64, error) {
	raw, batched := t.NetConn().(*Conn)
	if batched {
		raw.begin()
	}
	w := coalescers.Get().(*bufio.Writer)
	w.Reset(t)
	n, err := parts.WriteTo(w)
	if err == nil {
		err = w.Flush()
	}
	w.Reset(nil)
	coalescers.Put(w)
	if batched {
		if endErr := raw.end(); err == nil {
			err = endErr
		}
	}
	return n, err
}
