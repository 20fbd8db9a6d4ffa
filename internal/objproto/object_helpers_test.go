package objproto

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"github.com/herd-storage/herd/internal/peer"
	"github.com/herd-storage/herd/internal/peer/peertest"
	"io"
	"log/slog"
	"net"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/bufpool"
	"github.com/herd-storage/herd/internal/object"
)

// memoryObjectStore is an ObjectHandler keeping objects in memory: the
// reference the tests compare the protocol's results with. It checks epochs
// as DESIGN.md asks of a replica.
type memoryObjectStore struct {
	mu      sync.Mutex // guards the fields below
	epoch   object.Epoch
	objects map[object.OID]*memoryObject
	flushes int
}

type memoryObject struct {
	pages map[uint32]*[memoryPageSize]byte // sparse: absent pages read as zeroes
	size  uint64                           // one past the last byte written
	epoch object.Epoch
}

const memoryPageSize = 64 << 10

func newMemoryObject(epoch object.Epoch) *memoryObject {
	return &memoryObject{pages: make(map[uint32]*[memoryPageSize]byte), epoch: epoch}
}

// readAt fills p from offset.
func (o *memoryObject) readAt(p []byte, offset uint32) {
	for done := 0; done < len(p); {
		at := offset + uint32(done)
		page, within := at/memoryPageSize, at%memoryPageSize
		n := min(len(p)-done, memoryPageSize-int(within))
		if data := o.pages[page]; data != nil {
			copy(p[done:done+n], data[within:])
		} else {
			clear(p[done : done+n])
		}
		done += n
	}
}

// writeAt stores p at offset; a nil p of length n writes zeroes, and with
// deallocate whole zero pages are dropped.
func (o *memoryObject) writeAt(p []byte, offset, length uint32, deallocate bool) {
	for done := uint32(0); done < length; {
		at := offset + done
		page, within := at/memoryPageSize, at%memoryPageSize
		n := min(length-done, memoryPageSize-within)
		data := o.pages[page]
		switch {
		case deallocate && within == 0 && n == memoryPageSize:
			delete(o.pages, page)
		case p == nil && data == nil && deallocate:
			// already reads as zeroes
		default:
			if data == nil {
				data = new([memoryPageSize]byte)
				o.pages[page] = data
			}
			if p != nil {
				copy(data[within:within+n], p[done:])
			} else {
				clear(data[within : within+n])
			}
		}
		done += n
	}
	o.size = max(o.size, uint64(offset)+uint64(length))
}

func newMemoryObjectStore(epoch object.Epoch) *memoryObjectStore {
	return &memoryObjectStore{epoch: epoch, objects: make(map[object.OID]*memoryObject)}
}

// put stores data as object oid at the store's epoch.
func (m *memoryObjectStore) put(oid object.OID, data []byte) {
	m.mu.Lock()
	defer m.mu.Unlock()
	obj := newMemoryObject(m.epoch)
	obj.writeAt(data, 0, uint32(len(data)), false)
	m.objects[oid] = obj
}

func (m *memoryObjectStore) setEpoch(epoch object.Epoch) {
	m.mu.Lock()
	m.epoch = epoch
	m.mu.Unlock()
}

func (m *memoryObjectStore) ServeObject(ctx context.Context, request *ObjectRequest, payload []byte) (ObjectResponse, []byte) {
	m.mu.Lock()
	defer m.mu.Unlock()
	ok := ObjectResponse{Status: ObjectStatusOK, Epoch: m.epoch}
	if request.Opcode != ObjectPing && request.Epoch != m.epoch {
		return ObjectErrorResponse(m.epoch, &StaleEpochError{Current: m.epoch, Message: "request from another epoch"})
	}
	obj := m.objects[request.OID]
	switch request.Opcode {
	case ObjectRead:
		if obj == nil {
			return ObjectErrorResponse(m.epoch, ErrObjectNotFound)
		}
		buffer := GetObjectBuffer(int(request.Length))
		obj.readAt(buffer.Bytes, request.Offset)
		ok.ObjectEpoch = obj.epoch
		ok.Release = buffer
		return ok, buffer.Bytes
	case ObjectWrite, ObjectWriteZeroes, ObjectTrim:
		if obj == nil {
			if request.Opcode == ObjectTrim || request.Flags&object.FlagCreate == 0 {
				return ObjectErrorResponse(m.epoch, ErrObjectNotFound)
			}
			obj = newMemoryObject(request.Epoch)
			m.objects[request.OID] = obj
		}
		deallocate := request.Opcode == ObjectTrim || (request.Opcode == ObjectWriteZeroes && request.Flags&object.FlagNoHole == 0)
		obj.writeAt(payload, request.Offset, request.Length, deallocate)
		obj.epoch = request.Epoch
		ok.ObjectEpoch = obj.epoch
		return ok, nil
	case ObjectRemove:
		if obj == nil {
			return ObjectErrorResponse(m.epoch, ErrObjectNotFound)
		}
		delete(m.objects, request.OID)
		return ok, nil
	case ObjectFlush:
		m.flushes++
		return ok, nil
	case ObjectStat:
		if obj == nil {
			return ObjectErrorResponse(m.epoch, ErrObjectNotFound)
		}
		ok.ObjectEpoch = obj.epoch
		return ok, AppendObjectStat(nil, ObjectStatEntry{Size: obj.size, Allocated: uint64(len(obj.pages)) * memoryPageSize})
	case ObjectList:
		var ids []object.OID
		for id := range m.objects {
			if id >= request.OID {
				ids = append(ids, id)
			}
		}
		slices.Sort(ids)
		ids = ids[min(int(request.Offset), len(ids)):]
		ids = ids[:min(int(request.Length), len(ids))]
		var body []byte
		for _, id := range ids {
			body = AppendObjectListEntry(body, ObjectListEntry{OID: id, Epoch: m.objects[id].epoch})
		}
		return ok, body
	case ObjectPing:
		return ok, nil
	}
	return ObjectErrorResponse(m.epoch, ErrUnknownObjectOpcode)
}

// trackingListener records the connections it accepts so that a test can
// kill them.
type trackingListener struct {
	net.Listener

	mu          sync.Mutex // guards connections and accepted
	connections []net.Conn
	accepted    int
}

func (l *trackingListener) Accept() (net.Conn, error) {
	conn, err := l.Listener.Accept()
	if err == nil {
		l.mu.Lock()
		l.connections = append(l.connections, conn)
		l.accepted++
		l.mu.Unlock()
	}
	return conn, err
}

// killConnections closes every connection accepted so far, from the server's
// side, as a crash or a network failure would.
func (l *trackingListener) killConnections() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, conn := range l.connections {
		// The socket itself, as a crash would: tls.Conn.Close is an
		// orderly close (close_notify), after which a blocked read may
		// see a clean end of stream.
		if tlsConn, ok := conn.(*tls.Conn); ok {
			tlsConn.NetConn().Close()
			continue
		}
		conn.Close()
	}
	l.connections = nil
}

func (l *trackingListener) acceptedCount() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.accepted
}

// objectTestNode is one node's peer port serving the object protocol on
// loopback.
type objectTestNode struct {
	address  string
	creds    *peer.Credentials // the node's, which its clients in the tests share
	server   *ObjectServer
	listener *trackingListener
	logs     *peertest.LockedBuffer
}

// startObjectNode starts a peer port on loopback serving handler, and stops
// it when the test ends. configure, if not nil, adjusts the server first.
func startObjectNode(t testing.TB, handler ObjectHandler, configure func(*ObjectServer)) *objectTestNode {
	t.Helper()
	logs := &peertest.LockedBuffer{}
	logger := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	creds := peertest.Credentials(t, "object-node")
	port, err := peer.Listen("127.0.0.1:0", creds, logger)
	if err != nil {
		t.Fatal(err)
	}
	listener := &trackingListener{Listener: port.Protocol(peer.ProtocolObject)}
	server := &ObjectServer{Handler: handler, Logger: logger}
	if configure != nil {
		configure(server)
	}
	served := make(chan error, 1)
	go func() { served <- server.Serve(listener) }()
	t.Cleanup(func() {
		server.Close()
		port.Close()
		if err := <-served; err != ErrObjectServerClosed {
			t.Errorf("Serve returned %v, want ErrObjectServerClosed", err)
		}
	})
	return &objectTestNode{address: port.Addr().String(), creds: creds, server: server, listener: listener, logs: logs}
}

func newTestObjectClient(t testing.TB, node *objectTestNode, options ...ObjectClientOption) *ObjectClient {
	t.Helper()
	client := NewObjectClient(node.creds, options...)
	t.Cleanup(func() { client.Close() })
	return client
}

// objectGoroutineMarkers name the functions of this protocol's goroutines.
var objectGoroutineMarkers = []string{
	"objproto.(*objectServerConnection)",
	"objproto.(*objectClientConnection)",
	"objproto.(*ObjectServer).Serve",
	"objproto.(*ObjectServer).startConnection",
	"objproto.(*ObjectClient).dial",
	"objproto.(*ObjectClient).Do",
}

func objectGoroutines() []string {
	buffer := make([]byte, 1<<20)
	buffer = buffer[:runtime.Stack(buffer, true)]
	var found []string
	for _, stack := range strings.Split(string(buffer), "\n\n") {
		for _, marker := range objectGoroutineMarkers {
			if strings.Contains(stack, marker) {
				found = append(found, stack)
				break
			}
		}
	}
	return found
}

// checkObjectLeaks makes the test fail if, once its cleanups have run, any
// goroutine of the object protocol is still running or a pooled buffer has
// not been returned. Call it first in a test, so that its cleanup runs last.
func checkObjectLeaks(t testing.TB) {
	t.Helper()
	buffersBefore := bufpool.Outstanding()
	t.Cleanup(func() {
		deadline := time.Now().Add(5 * time.Second)
		for {
			leaked := objectGoroutines()
			buffers := bufpool.Outstanding() - buffersBefore
			if len(leaked) == 0 && buffers == 0 {
				return
			}
			if time.Now().After(deadline) {
				if buffers != 0 {
					t.Errorf("%d object buffers not released", buffers)
				}
				for _, stack := range leaked {
					t.Errorf("leaked goroutine:\n%s", stack)
				}
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	})
}

// rawObjectConnection is an authenticated object connection without a
// client, to send what ObjectClient never would.
func rawObjectConnection(t testing.TB, node *objectTestNode) net.Conn {
	t.Helper()
	conn, err := peer.Dial(context.Background(), node.address, node.creds, peer.ProtocolObject)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// writeRawRequest sends r as it is (its Checksum is not computed) followed
// by payload.
func writeRawRequest(t testing.TB, conn net.Conn, r ObjectRequest, payload []byte) {
	t.Helper()
	var header [ObjectRequestHeaderSize]byte
	EncodeObjectRequest(&header, &r)
	if _, err := conn.Write(append(header[:], payload...)); err != nil {
		t.Fatalf("writing a raw request: %v", err)
	}
}

func readRawResponse(conn net.Conn) (ObjectResponse, []byte, error) {
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	defer conn.SetReadDeadline(time.Time{})
	var header [ObjectResponseHeaderSize]byte
	if _, err := io.ReadFull(conn, header[:]); err != nil {
		return ObjectResponse{}, nil, err
	}
	response, err := DecodeObjectResponse(&header)
	if err != nil {
		return ObjectResponse{}, nil, err
	}
	body := make([]byte, response.Length)
	if _, err := io.ReadFull(conn, body); err != nil {
		return response, nil, err
	}
	return response, body, nil
}

// pattern returns n bytes that differ by object and offset, so that a piece
// delivered to the wrong call is noticed.
func pattern(oid object.OID, offset uint32, n int) []byte {
	p := make([]byte, n)
	var seed [12]byte
	binary.BigEndian.PutUint64(seed[0:], uint64(oid))
	binary.BigEndian.PutUint32(seed[8:], offset)
	for i := range p {
		p[i] = seed[i%12] ^ byte(i/12) ^ byte(i*7)
	}
	return p
}
