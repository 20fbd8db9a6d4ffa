package cluster

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/cluster/statemachine"
)

// forwardRequestFrame is a whole request frame as writeLoop sends it.
func forwardRequestFrame(id uint64, command []byte) []byte {
	header := make([]byte, 12)
	putForwardRequestHeader(header, id, len(command))
	return append(header, command...)
}

// checkForwardStream reads frames from data as the leader (requests) or a
// follower (responses) does until the stream ends or is refused, and checks
// that every frame accepted re-encodes to exactly the bytes it was read
// from, and that the reading ends for the reason the bytes give: io.EOF
// only between frames, io.ErrUnexpectedEOF only when the data ran out
// inside a length or a frame, errForwardFrame only for a length out of
// bounds or (responses) an unknown status.
func checkForwardStream(t *testing.T, data []byte, minimum uint32, reencode func(frame []byte) ([]byte, error)) {
	t.Helper()
	reader := bytes.NewReader(data)
	boundary := 0 // where the last accepted frame ended
	for {
		frame, err := readForwardFrame(reader, minimum)
		consumed := len(data) - reader.Len()
		if err != nil {
			switch {
			case err == io.EOF:
				if consumed != boundary || consumed != len(data) {
					t.Fatalf("io.EOF after %d bytes of %d, the last frame ended at %d", consumed, len(data), boundary)
				}
			case err == io.ErrUnexpectedEOF:
				if reader.Len() != 0 || consumed == boundary {
					t.Fatalf("io.ErrUnexpectedEOF with %d bytes left, %d read after the last frame", reader.Len(), consumed-boundary)
				}
			case errors.Is(err, errForwardFrame):
				if consumed != boundary+4 {
					t.Fatalf("length refused after reading %d bytes past the last frame, want 4: %v", consumed-boundary, err)
				}
				if length := binary.BigEndian.Uint32(data[boundary:]); length >= minimum && length <= maxForwardFrame {
					t.Fatalf("length %d refused: %v", length, err)
				}
			default:
				t.Fatalf("unexpected error after %d bytes: %v", consumed, err)
			}
			return
		}
		if consumed != boundary+4+len(frame) {
			t.Fatalf("a frame of %d bytes consumed %d bytes", len(frame), consumed-boundary)
		}
		again, err := reencode(frame)
		if err != nil {
			return // refused by the parser; reencode checked why
		}
		if !bytes.Equal(again, data[boundary:consumed]) {
			t.Fatalf("frame %x re-encodes as %x", data[boundary:consumed], again)
		}
		boundary = consumed
	}
}

// FuzzForwardRequests feeds arbitrary bytes to the leader's side of a
// forwarding connection: every frame accepted is a well-formed request
// that re-encodes to its own bytes; everything else is refused.
func FuzzForwardRequests(f *testing.F) {
	lock, _ := encoded("n1", "i", func(c *statemachine.Commands) error {
		_, err := c.AcquireLock(context.Background(), "vdi/disk", "s")
		return err
	})
	create, _ := encoded("", "", func(c *statemachine.Commands) error {
		_, err := c.CreateVDI(context.Background(), "disk", 1<<30, false, 0, "", nil)
		return err
	})
	f.Add(forwardRequestFrame(1, lock))
	f.Add(append(forwardRequestFrame(1, []byte{barrierRequest}), forwardRequestFrame(2, create)...))
	f.Add(forwardRequestFrame(3, create)[:20])            // cut inside the frame
	f.Add([]byte{0, 0, 0, 8, 1, 2, 3, 4, 5, 6, 7, 8})     // an id and no command
	f.Add([]byte{0, 0, 0, 9})                             // a length and no frame
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})                 // 4 GiB
	f.Add([]byte{0, 0x10, 0, 1})                          // just over the limit
	f.Add([]byte("GET / HTTP/1.1\r\nHost: herd\r\n\r\n")) // another protocol
	f.Fuzz(func(t *testing.T, data []byte) {
		checkForwardStream(t, data, minForwardRequest, func(frame []byte) ([]byte, error) {
			id, command, err := parseForwardRequest(frame)
			if err != nil {
				t.Fatalf("a request frame of %d bytes passed the length check but not the parser: %v", len(frame), err)
			}
			return forwardRequestFrame(id, command), nil
		})
	})
}

// FuzzForwardResponses feeds arbitrary bytes to a follower's side of a
// forwarding connection: every frame accepted re-encodes to its own bytes
// (through the encoder the leader uses) unless its error code is one this
// binary does not know, and an error keeps exactly its sentinel identity.
func FuzzForwardResponses(f *testing.F) {
	f.Add(appendForwardResponse(nil, 1, 10, json.RawMessage(`{"epoch":3}`), nil))
	f.Add(appendForwardResponse(nil, 2, 11, nil, fmt.Errorf("vdi %q %w", "disk", ErrAlreadyExists)))
	f.Add(appendForwardResponse(nil, 3, 0, nil, errors.New("disk on fire"))) // code "internal"
	f.Add(appendForwardResponse(appendForwardResponse(nil, 4, 12, nil, &LockHeldError{Lock: Lock{Key: "k", Node: "n"}}), 5, 13, json.RawMessage("null"), nil))
	f.Add([]byte{0, 0, 0, 17, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2, 7})           // status 7
	f.Add([]byte{0, 0, 0, 19, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2, 1, 'x', 'y'}) // error body without NUL
	f.Add([]byte{0, 0, 0, 16})
	f.Add([]byte{0, 0, 0, 17}) // a length and no frame
	f.Fuzz(func(t *testing.T, data []byte) {
		checkForwardStream(t, data, minForwardResponse, func(frame []byte) ([]byte, error) {
			id, result, err := parseForwardResponse(frame)
			if err != nil {
				if status := frame[16]; status == forwardOK || status == forwardError || !errors.Is(err, errForwardFrame) {
					t.Fatalf("status %d refused: %v", status, err)
				}
				return nil, err
			}
			if result.index != binary.BigEndian.Uint64(frame[8:]) {
				t.Fatalf("index %d, the frame says %d", result.index, binary.BigEndian.Uint64(frame[8:]))
			}
			if result.err == nil {
				if frame[16] != forwardOK || !bytes.Equal(result.value, frame[17:]) {
					t.Fatalf("status %d read as success with value %q", frame[16], result.value)
				}
				return appendForwardResponse(nil, id, result.index, result.value, nil), nil
			}
			code, message, hasSeparator := strings.Cut(string(frame[17:]), "\x00")
			var remote *RemoteError
			if frame[16] != forwardError || !errors.As(result.err, &remote) || remote.Code != code || remote.Message != message {
				t.Fatalf("status %d body %q read as %#v", frame[16], frame[17:], result.err)
			}
			known := code == "internal"
			for _, c := range statemachine.Sentinels() {
				if errors.Is(result.err, c.Err) != (c.Code == code) {
					t.Fatalf("code %q: errors.Is(%v) = %v", code, c.Err, !(c.Code == code))
				}
				known = known || c.Code == code
			}
			again := appendForwardResponse(nil, id, result.index, nil, result.err)
			if !known || !hasSeparator {
				// Re-encoded as "internal", or with the separator the frame
				// lacked: the message and the identity survive.
				_, reparsed, err := parseForwardResponse(again[4:])
				if err != nil || reparsed.err.Error() != message || (known && ErrorCode(reparsed.err) != code) {
					t.Fatalf("re-encoding %q gave %q: %v", frame[17:], again[21:], err)
				}
				return wireFrame(frame), nil
			}
			return again, nil
		})
	})
}

// wireFrame returns a frame with its length in front, as on the wire.
func wireFrame(frame []byte) []byte {
	return append(binary.BigEndian.AppendUint32(nil, uint32(len(frame))), frame...)
}

// FuzzForwardRoundTrip encodes requests and responses as the two sides do
// and decodes them as the other side does: the id, command, index, value,
// error message and error identity all arrive unchanged.
func FuzzForwardRoundTrip(f *testing.F) {
	f.Add(uint64(1), []byte{5, '{', '}'}, uint64(7), []byte(`{"name":"disk"}`), "", uint8(0))
	f.Add(uint64(1<<63), []byte{barrierRequest}, uint64(0), []byte(nil), "vdi \"disk\" not found", uint8(5))
	f.Add(uint64(0), []byte{7}, uint64(1<<40), []byte("null"), "no\x00nul\x00please", uint8(6))
	f.Fuzz(func(t *testing.T, id uint64, command []byte, index uint64, value []byte, message string, sentinel uint8) {
		if len(command) >= minForwardRequest-8 && len(command) <= maxForwardFrame-8 {
			frame, err := readForwardFrame(bytes.NewReader(forwardRequestFrame(id, command)), minForwardRequest)
			if err != nil {
				t.Fatalf("request of %d bytes: %v", len(command), err)
			}
			gotID, gotCommand, err := parseForwardRequest(frame)
			if err != nil || gotID != id || !bytes.Equal(gotCommand, command) {
				t.Fatalf("request %d %q arrived as %d %q (%v)", id, command, gotID, gotCommand, err)
			}
		}
		var sent error
		if message != "" {
			// A leader's error: a message wrapping one of the sentinels.
			sentinels := statemachine.Sentinels()
			sent = fmt.Errorf("%s: %w", message, sentinels[int(sentinel)%len(sentinels)].Err)
		}
		encoded := appendForwardResponse(nil, id, index, value, sent)
		if len(encoded)-4 > maxForwardFrame {
			return // the follower would refuse it; FuzzForwardResponses covers that
		}
		frame, err := readForwardFrame(bytes.NewReader(encoded), minForwardResponse)
		if err != nil {
			t.Fatalf("response of %d bytes: %v", len(encoded), err)
		}
		gotID, result, err := parseForwardResponse(frame)
		if err != nil || gotID != id || result.index != index {
			t.Fatalf("response %d/%d arrived as %d/%d (%v)", id, index, gotID, result.index, err)
		}
		if sent == nil {
			if result.err != nil || !bytes.Equal(result.value, value) {
				t.Fatalf("value %q arrived as %q, %v", value, result.value, result.err)
			}
			return
		}
		if result.err == nil || result.err.Error() != sent.Error() {
			t.Fatalf("error %q arrived as %v", sent, result.err)
		}
		for _, c := range statemachine.Sentinels() {
			if errors.Is(result.err, c.Err) != errors.Is(sent, c.Err) {
				t.Fatalf("error %q wrapping %q: errors.Is(%q) differs after the trip", sent, ErrorCode(sent), c.Code)
			}
		}
	})
}

// TestForwardConnDeliversAndRefuses checks the follower's read loop: a
// result and an error reach the commands that wait for them, and a frame
// with an unknown status closes the connection with an error saying so.
func TestForwardConnDeliversAndRefuses(t *testing.T) {
	follower, leader := net.Pipe()
	defer leader.Close()
	c := &forwardConn{net: follower, queue: make(chan forwardRequest, 1), pending: map[uint64]chan forwardResult{}, done: make(chan struct{})}
	first, second := make(chan forwardResult, 1), make(chan forwardResult, 1)
	c.pending[7], c.pending[8] = first, second
	go c.readLoop()
	receive := func(reply chan forwardResult) forwardResult {
		t.Helper()
		select {
		case result := <-reply:
			return result
		case <-time.After(10 * time.Second):
			t.Fatal("no result within 10 s")
			return forwardResult{}
		}
	}
	// The second first: replies are matched by id, not by order.
	leader.Write(appendForwardResponse(nil, 8, 43, nil, fmt.Errorf("vdi %q %w", "disk", ErrNotFound)))
	leader.Write(appendForwardResponse(nil, 7, 42, json.RawMessage(`{"ok":true}`), nil))
	if result := receive(first); result.err != nil || result.index != 42 || string(result.value) != `{"ok":true}` {
		t.Errorf("result of command 7: %+v", result)
	}
	if result := receive(second); !errors.Is(result.err, ErrNotFound) || result.index != 43 || result.err.Error() != `vdi "disk" not found` {
		t.Errorf("result of command 8: %+v", result)
	}
	bad := appendForwardResponse(nil, 9, 0, nil, nil)
	bad[20] = 9
	leader.Write(bad)
	select {
	case <-c.done:
	case <-time.After(10 * time.Second):
		t.Fatal("a frame with status 9 did not close the connection within 10 s")
	}
	if err := c.failure(); !errors.Is(err, errForwardFrame) || !strings.Contains(err.Error(), "status 9") {
		t.Errorf("closed with %v, want a bad frame with status 9", err)
	}
}

// TestServeForwardRefusesBadLength checks the leader's side: a request
// length out of bounds ends the connection before anything is read or
// proposed, and is logged.
func TestServeForwardRefusesBadLength(t *testing.T) {
	for _, length := range []uint32{0, 8, maxForwardFrame + 1} {
		var log bytes.Buffer
		c := &Cluster{logger: slog.New(slog.NewTextHandler(&log, nil))}
		leader, follower := net.Pipe()
		served := make(chan struct{})
		go func() {
			defer close(served)
			c.serveForwardConn(leader)
		}()
		follower.Write(binary.BigEndian.AppendUint32(nil, length))
		follower.SetReadDeadline(time.Now().Add(10 * time.Second))
		if n, err := follower.Read(make([]byte, 1)); err != io.EOF {
			t.Errorf("length %d: the leader answered %d bytes, %v; want the connection closed", length, n, err)
		}
		follower.Close()
		<-served
		if !strings.Contains(log.String(), "refused a forwarding connection") || !strings.Contains(log.String(), fmt.Sprintf("length %d", length)) {
			t.Errorf("length %d: logged %q", length, log.String())
		}
	}
}

// A request that times out while nothing at all came back on the
// connection closes it, so the next request dials afresh: after a
// partition heals, TCP may take minutes to retransmit on the old one
// (seen in TestPartitionMinorityRefusesMajorityContinues: every request
// through a former minority node timed out after the heal). A timeout on
// a connection that answers other requests keeps it.
func TestForwardDropsASilentConnection(t *testing.T) {
	open := func() (*forwarder, *forwardConn, net.Conn) {
		follower, leader := net.Pipe()
		t.Cleanup(func() { leader.Close() })
		c := &forwardConn{net: follower, queue: make(chan forwardRequest, 8), pending: map[uint64]chan forwardResult{}, done: make(chan struct{})}
		go c.writeLoop()
		go c.readLoop()
		return &forwarder{conn: c, address: "leader"}, c, leader
	}
	timeout := func() context.Context {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		t.Cleanup(cancel)
		return ctx
	}

	f, c, leader := open()
	go io.Copy(io.Discard, leader) // reads every request, answers none
	if _, _, err := f.send(timeout(), "leader", []byte{barrierRequest}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("send to a silent leader: %v", err)
	}
	select {
	case <-c.done:
	default:
		t.Fatal("a connection that answered nothing was kept")
	}

	f, c, leader = open()
	go func() {
		r := bufio.NewReader(leader)
		for {
			frame, err := readForwardFrame(r, minForwardRequest)
			if err != nil {
				return
			}
			// Answer another request, not this one: the connection is alive.
			id := binary.BigEndian.Uint64(frame)
			leader.Write(appendForwardResponse(nil, id+100, 1, json.RawMessage("null"), nil))
		}
	}()
	if _, _, err := f.send(timeout(), "leader", []byte{barrierRequest}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("send: %v", err)
	}
	select {
	case <-c.done:
		t.Fatalf("a connection that was answering was closed: %v", c.failure())
	default:
	}
}

// Command types as the state machine numbers them (a log entry's first
// byte; internal/cluster/statemachine keeps the names to itself).
type commandType = byte

const (
	commandNodeJoin        commandType = 2
	commandVDICreate       commandType = 4
	commandLockAcquire     commandType = 7
	commandTokenCreate     commandType = 16
	commandClientAdd       commandType = 18
	commandNodeRemove      commandType = 20
	commandJoinSecretSet   commandType = 21
	commandNodeAdmit       commandType = 31
	commandJoinTokenCreate commandType = 32
	commandGossipKey       commandType = 34
	commandCA              commandType = 36
)

// TestForwardedCredentialChangesNeedARunningNode: the leader proposes a
// forwarded change of credentials (here an admin token with a hash the
// sender chose) only from a node that runs as a member, raft or gossip;
// an id the log merely admitted, or a connection that names no node, is
// refused before anything is proposed. Other commands are not its
// business.
func TestForwardedCredentialChangesNeedARunningNode(t *testing.T) {
	var log bytes.Buffer
	c := &Cluster{
		cfg:    Config{NodeID: "leader"},
		logger: slog.New(slog.NewTextHandler(&log, nil)),
		seen:   map[string]gossipState{"member": {alive: true}, "gone": {alive: false}},
	}
	token, err := json.Marshal(Token{ID: "0123abcd", Name: "backdoor", Hash: strings.Repeat("ab", 32)})
	if err != nil {
		t.Fatal(err)
	}
	create := append([]byte{byte(commandTokenCreate)}, token...)
	for _, command := range []commandType{commandTokenCreate, commandClientAdd, commandJoinTokenCreate, commandJoinSecretSet, commandNodeAdmit, commandGossipKey, commandCA, commandNodeRemove} {
		data := []byte{byte(command), '{', '}'}
		if err := c.forwardRefusal("member", data); err != nil {
			t.Errorf("command %d from a member alive in gossip: %v", command, err)
		}
		for _, node := range []string{"admitted", "gone", ""} {
			if err := c.forwardRefusal(node, data); !errors.Is(err, ErrForbidden) {
				t.Errorf("command %d from %q: %v, want refused", command, node, err)
			}
		}
	}
	for _, command := range []commandType{commandVDICreate, commandLockAcquire, commandNodeJoin} {
		if err := c.forwardRefusal("admitted", []byte{byte(command), '{', '}'}); err != nil {
			t.Errorf("command %d: %v, want left to the log", command, err)
		}
	}

	// Over the wire: the refusal comes back as an error with its code,
	// and the connection stays open.
	leader, follower := net.Pipe()
	defer follower.Close()
	go c.serveForwardConn(leader)
	follower.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := follower.Write(forwardRequestFrame(5, create)); err != nil {
		t.Fatal(err)
	}
	frame, err := readForwardFrame(follower, minForwardResponse)
	if err != nil {
		t.Fatal(err)
	}
	id, result, err := parseForwardResponse(frame)
	if err != nil || id != 5 || !errors.Is(result.err, ErrForbidden) || !strings.Contains(result.err.Error(), "names no node") {
		t.Fatalf("a token create from a connection that names no node: id %d, %+v, %v", id, result, err)
	}
	if !strings.Contains(log.String(), "refused a forwarded command") {
		t.Errorf("not logged: %q", log.String())
	}
}
