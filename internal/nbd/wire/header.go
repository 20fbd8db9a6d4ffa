package wire

import (
	"encoding/binary"
	"fmt"
)

// The fixed-size headers of the protocol's messages. Each is appended to a
// byte slice by its Append method and decoded by its Parse function, which
// checks the length and the magic number and nothing else: what the fields
// may hold is for each side to check.

// Header lengths in bytes.
const (
	OptionHeaderLength          = 16 // magic, option, length
	OptionReplyHeaderLength     = 20 // magic, option, reply type, length
	RequestHeaderLength         = 28 // magic, flags, type, cookie, offset, length
	SimpleReplyHeaderLength     = 16 // magic, error, cookie
	StructuredReplyHeaderLength = 20 // magic, flags, type, cookie, length
)

// OptionHeader starts an option: C: IHAVEOPT, 32 bits option, 32 bits
// length of the option data that follows (spec, "Newstyle negotiation").
type OptionHeader struct {
	Option uint32 // OptExportName, OptGo, ...
	Length uint32
}

// Append appends the header to b.
func (h OptionHeader) Append(b []byte) []byte {
	b = binary.BigEndian.AppendUint64(b, IHaveOptMagic)
	b = binary.BigEndian.AppendUint32(b, h.Option)
	return binary.BigEndian.AppendUint32(b, h.Length)
}

// ParseOptionHeader decodes an option header of OptionHeaderLength bytes.
func ParseOptionHeader(header []byte) (OptionHeader, error) {
	if len(header) != OptionHeaderLength {
		return OptionHeader{}, fmt.Errorf("option header of %d bytes", len(header))
	}
	if magic := binary.BigEndian.Uint64(header[0:]); magic != IHaveOptMagic {
		return OptionHeader{}, fmt.Errorf("option magic %#x", magic)
	}
	return OptionHeader{Option: binary.BigEndian.Uint32(header[8:]), Length: binary.BigEndian.Uint32(header[12:])}, nil
}

// OptionReplyHeader starts a fixed newstyle option reply: S: magic, 32 bits
// option, 32 bits reply type, 32 bits length of the reply data that
// follows (spec, "Fixed newstyle negotiation").
type OptionReplyHeader struct {
	Option uint32 // the option answered
	Type   uint32 // RepAck, RepInfo, RepErrUnsup, ...
	Length uint32
}

// Append appends the header to b.
func (h OptionReplyHeader) Append(b []byte) []byte {
	b = binary.BigEndian.AppendUint64(b, OptionReplyMagic)
	b = binary.BigEndian.AppendUint32(b, h.Option)
	b = binary.BigEndian.AppendUint32(b, h.Type)
	return binary.BigEndian.AppendUint32(b, h.Length)
}

// ParseOptionReplyHeader decodes an option reply header of
// OptionReplyHeaderLength bytes.
func ParseOptionReplyHeader(header []byte) (OptionReplyHeader, error) {
	if len(header) != OptionReplyHeaderLength {
		return OptionReplyHeader{}, fmt.Errorf("option reply header of %d bytes", len(header))
	}
	if magic := binary.BigEndian.Uint64(header[0:]); magic != OptionReplyMagic {
		return OptionReplyHeader{}, fmt.Errorf("option reply magic %#x", magic)
	}
	return OptionReplyHeader{
		Option: binary.BigEndian.Uint32(header[8:]),
		Type:   binary.BigEndian.Uint32(header[12:]),
		Length: binary.BigEndian.Uint32(header[16:]),
	}, nil
}

// RequestHeader is a request message without its payload: C: magic, 16
// bits command flags, 16 bits type, 64 bits cookie, 64 bits offset, 32 bits
// length (spec, "Request message"). A WRITE's length bytes of data follow.
type RequestHeader struct {
	Flags  uint16 // CmdFlagFUA, ...
	Type   uint16 // CmdRead, CmdWrite, ...
	Cookie uint64 // chosen by the client, echoed in the reply
	Offset uint64
	Length uint32
}

// Append appends the header to b.
func (h RequestHeader) Append(b []byte) []byte {
	b = binary.BigEndian.AppendUint32(b, RequestMagic)
	b = binary.BigEndian.AppendUint16(b, h.Flags)
	b = binary.BigEndian.AppendUint16(b, h.Type)
	b = binary.BigEndian.AppendUint64(b, h.Cookie)
	b = binary.BigEndian.AppendUint64(b, h.Offset)
	return binary.BigEndian.AppendUint32(b, h.Length)
}

// ParseRequestHeader decodes a request header of RequestHeaderLength bytes.
func ParseRequestHeader(header []byte) (RequestHeader, error) {
	if len(header) != RequestHeaderLength {
		return RequestHeader{}, fmt.Errorf("request header of %d bytes", len(header))
	}
	if magic := binary.BigEndian.Uint32(header[0:]); magic != RequestMagic {
		return RequestHeader{}, fmt.Errorf("request magic %#x", magic)
	}
	return RequestHeader{
		Flags:  binary.BigEndian.Uint16(header[4:]),
		Type:   binary.BigEndian.Uint16(header[6:]),
		Cookie: binary.BigEndian.Uint64(header[8:]),
		Offset: binary.BigEndian.Uint64(header[16:]),
		Length: binary.BigEndian.Uint32(header[24:]),
	}, nil
}

// SimpleReplyHeader is a simple reply: S: magic, 32 bits error, 64 bits
// cookie (spec, "Simple reply message"). A successful READ's data follows.
type SimpleReplyHeader struct {
	Error  Errno
	Cookie uint64
}

// Append appends the header to b.
func (h SimpleReplyHeader) Append(b []byte) []byte {
	b = binary.BigEndian.AppendUint32(b, SimpleReplyMagic)
	b = binary.BigEndian.AppendUint32(b, uint32(h.Error))
	return binary.BigEndian.AppendUint64(b, h.Cookie)
}

// ParseSimpleReplyHeader decodes a simple reply header of
// SimpleReplyHeaderLength bytes.
func ParseSimpleReplyHeader(header []byte) (SimpleReplyHeader, error) {
	if len(header) != SimpleReplyHeaderLength {
		return SimpleReplyHeader{}, fmt.Errorf("simple reply header of %d bytes", len(header))
	}
	if magic := binary.BigEndian.Uint32(header[0:]); magic != SimpleReplyMagic {
		return SimpleReplyHeader{}, fmt.Errorf("simple reply magic %#x", magic)
	}
	return SimpleReplyHeader{Error: Errno(binary.BigEndian.Uint32(header[4:])), Cookie: binary.BigEndian.Uint64(header[8:])}, nil
}

// StructuredReplyHeader starts a structured reply chunk: S: magic, 16 bits
// flags, 16 bits type, 64 bits cookie, 32 bits length of the payload that
// follows (spec, "Structured reply chunk message").
type StructuredReplyHeader struct {
	Flags  uint16 // ReplyFlagDone
	Type   uint16 // ReplyTypeOffsetData, ...
	Cookie uint64
	Length uint32
}

// Append appends the header to b.
func (h StructuredReplyHeader) Append(b []byte) []byte {
	b = binary.BigEndian.AppendUint32(b, StructuredReplyMagic)
	b = binary.BigEndian.AppendUint16(b, h.Flags)
	b = binary.BigEndian.AppendUint16(b, h.Type)
	b = binary.BigEndian.AppendUint64(b, h.Cookie)
	return binary.BigEndian.AppendUint32(b, h.Length)
}

// ParseStructuredReplyHeader decodes a structured reply chunk header of
// StructuredReplyHeaderLength bytes.
func ParseStructuredReplyHeader(header []byte) (StructuredReplyHeader, error) {
	if len(header) != StructuredReplyHeaderLength {
		return StructuredReplyHeader{}, fmt.Errorf("structured reply header of %d bytes", len(header))
	}
	if magic := binary.BigEndian.Uint32(header[0:]); magic != StructuredReplyMagic {
		return StructuredReplyHeader{}, fmt.Errorf("structured reply magic %#x", magic)
	}
	return StructuredReplyHeader{
		Flags:  binary.BigEndian.Uint16(header[4:]),
		Type:   binary.BigEndian.Uint16(header[6:]),
		Cookie: binary.BigEndian.Uint64(header[8:]),
		Length: binary.BigEndian.Uint32(header[16:]),
	}, nil
}
