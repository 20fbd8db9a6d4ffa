package wire

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"
)

// The vectors below are written by hand from the spec's message layouts,
// field by field, not produced by the code under test: they are what keeps
// a misreading of the spec from passing unnoticed now that the server and
// the client share one codec.

func fromHex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.ReplaceAll(s, " ", ""))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestMagicNumbersSpellTheirNames(t *testing.T) {
	for want, magic := range map[string]uint64{"NBDMAGIC": NBDMagic, "IHAVEOPT": IHaveOptMagic} {
		if got := string(binary.BigEndian.AppendUint64(nil, magic)); got != want {
			t.Errorf("%#x reads %q, want %q", magic, got, want)
		}
	}
}

func TestOptionHeader(t *testing.T) {
	// C: "IHAVEOPT", option 7 (NBD_OPT_GO), length 0x0102.
	vector := fromHex(t, "49484156454f5054 00000007 00000102")
	header := OptionHeader{Option: OptGo, Length: 0x0102}
	if got := header.Append(nil); !bytes.Equal(got, vector) {
		t.Errorf("Append = %x, want %x", got, vector)
	}
	if got, err := ParseOptionHeader(vector); err != nil || got != header {
		t.Errorf("Parse = %+v, %v", got, err)
	}
}

func TestOptionReplyHeader(t *testing.T) {
	// S: 0x3e889045565a9, option 8, reply type 2^31+1 (NBD_REP_ERR_UNSUP),
	// length 5.
	vector := fromHex(t, "0003e889045565a9 00000008 80000001 00000005")
	header := OptionReplyHeader{Option: OptStructuredReply, Type: RepErrUnsup, Length: 5}
	if got := header.Append(nil); !bytes.Equal(got, vector) {
		t.Errorf("Append = %x, want %x", got, vector)
	}
	if got, err := ParseOptionReplyHeader(vector); err != nil || got != header {
		t.Errorf("Parse = %+v, %v", got, err)
	}
}

func TestRequestHeader(t *testing.T) {
	// C: 0x25609513, flags 1 (FUA), type 1 (WRITE), cookie, offset 2^40+1,
	// length 4096.
	vector := fromHex(t, "25609513 0001 0001 0102030405060708 0000010000000001 00001000")
	header := RequestHeader{Flags: CmdFlagFUA, Type: CmdWrite, Cookie: 0x0102030405060708, Offset: 1<<40 + 1, Length: 4096}
	if got := header.Append(nil); !bytes.Equal(got, vector) {
		t.Errorf("Append = %x, want %x", got, vector)
	}
	if got, err := ParseRequestHeader(vector); err != nil || got != header {
		t.Errorf("Parse = %+v, %v", got, err)
	}
}

func TestSimpleReplyHeader(t *testing.T) {
	// S: 0x67446698, error 28 (ENOSPC), cookie.
	vector := fromHex(t, "67446698 0000001c 1112131415161718")
	header := SimpleReplyHeader{Error: ENOSPC, Cookie: 0x1112131415161718}
	if got := header.Append(nil); !bytes.Equal(got, vector) {
		t.Errorf("Append = %x, want %x", got, vector)
	}
	if got, err := ParseSimpleReplyHeader(vector); err != nil || got != header {
		t.Errorf("Parse = %+v, %v", got, err)
	}
}

func TestStructuredReplyHeader(t *testing.T) {
	// S: 0x668e33ef, flags 1 (DONE), type 2^15+2 (ERROR_OFFSET), cookie,
	// length 14.
	vector := fromHex(t, "668e33ef 0001 8002 2122232425262728 0000000e")
	header := StructuredReplyHeader{Flags: ReplyFlagDone, Type: ReplyTypeErrorOffset, Cookie: 0x2122232425262728, Length: 14}
	if got := header.Append(nil); !bytes.Equal(got, vector) {
		t.Errorf("Append = %x, want %x", got, vector)
	}
	if got, err := ParseStructuredReplyHeader(vector); err != nil || got != header {
		t.Errorf("Parse = %+v, %v", got, err)
	}
}

// TestParseRefuses checks that every parser refuses a wrong length and a
// wrong magic number, naming what it read.
func TestParseRefuses(t *testing.T) {
	parsers := map[string]struct {
		length, magicLength int
		parse               func([]byte) error
	}{
		"option":           {OptionHeaderLength, 8, func(b []byte) error { _, err := ParseOptionHeader(b); return err }},
		"option reply":     {OptionReplyHeaderLength, 8, func(b []byte) error { _, err := ParseOptionReplyHeader(b); return err }},
		"request":          {RequestHeaderLength, 4, func(b []byte) error { _, err := ParseRequestHeader(b); return err }},
		"simple reply":     {SimpleReplyHeaderLength, 4, func(b []byte) error { _, err := ParseSimpleReplyHeader(b); return err }},
		"structured reply": {StructuredReplyHeaderLength, 4, func(b []byte) error { _, err := ParseStructuredReplyHeader(b); return err }},
	}
	for name, p := range parsers {
		if err := p.parse(make([]byte, p.length-1)); err == nil || err.Error() != fmt.Sprintf("%s header of %d bytes", name, p.length-1) {
			t.Errorf("%s: short header: %v", name, err)
		}
		want := name + " magic 0x" + strings.Repeat("48", p.magicLength)
		if err := p.parse(bytes.Repeat([]byte{'H'}, p.length)); err == nil || err.Error() != want {
			t.Errorf("%s: bad magic: %v, want %q", name, err, want)
		}
	}
}

// FuzzParse checks that the parsers never panic and that whatever they
// accept is appended back to the same bytes.
func FuzzParse(f *testing.F) {
	f.Add(RequestHeader{Type: CmdRead, Length: 512}.Append(nil))
	f.Add(StructuredReplyHeader{Flags: ReplyFlagDone}.Append(nil))
	f.Fuzz(func(t *testing.T, data []byte) {
		if h, err := ParseOptionHeader(data); err == nil && !bytes.Equal(h.Append(nil), data) {
			t.Errorf("option header %x -> %+v", data, h)
		}
		if h, err := ParseOptionReplyHeader(data); err == nil && !bytes.Equal(h.Append(nil), data) {
			t.Errorf("option reply header %x -> %+v", data, h)
		}
		if h, err := ParseRequestHeader(data); err == nil && !bytes.Equal(h.Append(nil), data) {
			t.Errorf("request header %x -> %+v", data, h)
		}
		if h, err := ParseSimpleReplyHeader(data); err == nil && !bytes.Equal(h.Append(nil), data) {
			t.Errorf("simple reply header %x -> %+v", data, h)
		}
		if h, err := ParseStructuredReplyHeader(data); err == nil && !bytes.Equal(h.Append(nil), data) {
			t.Errorf("structured reply header %x -> %+v", data, h)
		}
	})
}
