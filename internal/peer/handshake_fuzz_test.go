package peer

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"
)

// The fuzz targets of the bytes the peer port reads from outside once TLS
// is up: the greeting (admit) and the join request frame. TLS itself is
// crypto/tls's; these need no certificates and no randomness, so every
// input replays exactly.

// greetingStream is what admit reads and writes: the client's bytes, and
// the server's answer.
type greetingStream struct {
	input   *bytes.Reader
	written bytes.Buffer
}

func (s *greetingStream) Read(p []byte) (int, error)  { return s.input.Read(p) }
func (s *greetingStream) Write(p []byte) (int, error) { return s.written.Write(p) }

func greeting(v byte, protocol Protocol) []byte {
	return append([]byte(magic), v, byte(protocol))
}

// fuzzIdentities are the clients the greeting fuzzer plays.
var fuzzIdentities = []peerIdentity{
	{},                                      // no certificate (a joining node)
	{certified: true, node: "node-b"},       // a member
	{certified: true, node: "node-removed"}, // a node Allowed refuses
	{certified: true},                       // an operator's client certificate
}

// expectedStatus is the reference for admit's decision, written from the
// rules in the package comment rather than from admit's code.
func expectedStatus(identity peerIdentity, protocol Protocol, joinOffered bool) byte {
	if protocol == ProtocolJoin {
		if joinOffered {
			return statusAccepted
		}
		return statusJoinClosed
	}
	switch {
	case !identity.certified:
		return statusCertificateRequired
	case identity.node == "":
		return statusNotNode
	case identity.node == "node-removed":
		return statusNodeRemoved
	case protocol != ProtocolRaft && protocol != ProtocolObject:
		return statusUnknownProtocol
	}
	return statusAccepted
}

// FuzzPeerGreeting plays arbitrary bytes from each kind of client against
// the server's greeting: bytes that are not a greeting get no answer and
// ErrNotHerd; another version gets statusVersion; otherwise the answer is
// the one status byte the rules give, the protocol is admitted exactly
// when it is 0, and admit never reads past the greeting (the protocol's
// own bytes follow it).
func FuzzPeerGreeting(f *testing.F) {
	for _, protocol := range []Protocol{ProtocolRaft, ProtocolObject, ProtocolForward, ProtocolJoin, 0, 255} {
		for kind := range len(fuzzIdentities) {
			f.Add(greeting(version, protocol), uint8(kind), false)
		}
	}
	f.Add(append(greeting(version, ProtocolJoin), "payload"...), uint8(0), true)
	f.Add(greeting(1, ProtocolRaft), uint8(1), false)
	f.Add(greeting(version, ProtocolRaft)[:7], uint8(1), false)
	f.Add([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"), uint8(1), false)
	f.Add([]byte{}, uint8(0), false)
	f.Fuzz(func(t *testing.T, data []byte, kind uint8, joinClosed bool) {
		identity := fuzzIdentities[int(kind)%len(fuzzIdentities)]
		stream := &greetingStream{input: bytes.NewReader(data)}
		allowed := func(node, _ string) error {
			if node == "node-removed" {
				return errors.New("removed")
			}
			return nil
		}
		offered := func(p Protocol) bool {
			return p == ProtocolRaft || p == ProtocolObject || (p == ProtocolJoin && !joinClosed)
		}
		protocol, err := admit(stream, identity, allowed, offered)
		written := stream.written.Bytes()
		if len(data) < greetingSize || string(data[:len(magic)]) != magic {
			if !errors.Is(err, ErrNotHerd) || len(written) != 0 {
				t.Fatalf("bytes %q: %v, answered %x; want ErrNotHerd and no answer", data, err, written)
			}
			return
		}
		if consumed := len(data) - stream.input.Len(); consumed != greetingSize {
			t.Fatalf("admit read %d bytes, the greeting is %d", consumed, greetingSize)
		}
		if data[len(magic)] != version {
			if !errors.Is(err, ErrVersion) || !bytes.Equal(written, []byte{statusVersion}) {
				t.Fatalf("version %d: %v, answered %x", data[len(magic)], err, written)
			}
			return
		}
		requested := Protocol(data[len(magic)+1])
		want := expectedStatus(identity, requested, !joinClosed)
		if !bytes.Equal(written, []byte{want}) {
			t.Fatalf("identity %+v asking for protocol %d: answered %x, want %x (%v)", identity, requested, written, want, err)
		}
		if accepted := err == nil; accepted != (want == statusAccepted) {
			t.Fatalf("status %d with error %v", want, err)
		}
		if err == nil && protocol != requested {
			t.Fatalf("admitted protocol %d, asked for %d", protocol, requested)
		}
		if err != nil && !errors.Is(err, statusErrors[want].err) {
			t.Fatalf("status %d with error %v, want %v", want, err, statusErrors[want].err)
		}
	})
}

// FuzzJoinRequest reads arbitrary bytes as a join request frame: it
// refuses a length over the limit having read the length alone, reads
// exactly the frame otherwise, and never panics.
func FuzzJoinRequest(f *testing.F) {
	frame := func(body string) []byte {
		return append(binary.BigEndian.AppendUint32(nil, uint32(len(body))), body...)
	}
	f.Add(frame(`{"NodeID":"n","IPs":["10.0.0.1"],"Secret":"s"}`))
	f.Add(frame(`{"NodeID":`))
	f.Add(frame(`[]`))
	f.Add(binary.BigEndian.AppendUint32(nil, maxJoinMessage+1))
	f.Add(binary.BigEndian.AppendUint32(nil, 0xffffffff))
	f.Add([]byte{0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		reader := bytes.NewReader(data)
		body, err := readJoinFrame(reader)
		consumed := len(data) - reader.Len()
		if len(data) < 4 {
			if err == nil {
				t.Fatal("a frame without its length was read")
			}
			return
		}
		length := binary.BigEndian.Uint32(data)
		switch {
		case length > maxJoinMessage:
			if err == nil || consumed != 4 {
				t.Fatalf("length %d: %v after reading %d bytes", length, err, consumed)
			}
		case int(length) > len(data)-4:
			if err == nil {
				t.Fatalf("a frame of %d bytes cut to %d was read", length, len(data)-4)
			}
		default:
			if err != nil || consumed != 4+int(length) || !bytes.Equal(body, data[4:4+length]) {
				t.Fatalf("frame of %d bytes: %v, consumed %d", length, err, consumed)
			}
			parseJoinRequest(body) // must not panic; any JSON error is fine
		}
	})
}
