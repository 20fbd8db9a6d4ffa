package nbdclient

import (
	"errors"
	"fmt"
	"strings"
	"syscall"
	"unicode"

	"github.com/herd-storage/herd/internal/nbd/wire"
)

// Sentinel errors; test with errors.Is.
var (
	// ErrProtocol is wrapped by every error caused by a server breaking the
	// protocol. The connection is closed (a hard disconnect) when it is
	// returned.
	ErrProtocol = errors.New("nbdclient: protocol violation by the server")
	// ErrClosed: the connection was closed by Close, or failed earlier (the
	// error then also wraps the cause).
	ErrClosed = errors.New("nbdclient: connection closed")
	// ErrUnsupported: the server did not offer what the request needs
	// (NBD_FLAG_SEND_TRIM, base:allocation, ...). Nothing was sent.
	ErrUnsupported = errors.New("nbdclient: not supported by the server")
	// ErrReadOnly: a write to an export the server marked read-only. Nothing
	// was sent.
	ErrReadOnly = errors.New("nbdclient: export is read-only")
	// ErrInvalid: a request outside the export, or not aligned to the
	// server's minimum block size. Nothing was sent.
	ErrInvalid = errors.New("nbdclient: invalid request")
)

// OptionError is the server's refusal of an option during the handshake,
// for example NBD_REP_ERR_UNKNOWN for an export that does not exist, or
// NBD_REP_ERR_POLICY for a VDI held by another node. Message is the server's
// text, meant for the user.
type OptionError struct {
	Export  string // the export name asked for
	Option  uint32 // NBD_OPT_*
	Reply   uint32 // NBD_REP_ERR_*
	Message string
}

// ReplyName is the spec's name of the reply, such as "NBD_REP_ERR_POLICY".
func (e *OptionError) ReplyName() string {
	if name, ok := replyErrorNames[e.Reply]; ok {
		return name
	}
	return fmt.Sprintf("NBD_REP_ERR_%d", e.Reply&^wire.RepFlagError)
}

func (e *OptionError) Error() string {
	option := optionNames[e.Option]
	if option == "" {
		option = fmt.Sprintf("option %d", e.Option)
	}
	text := fmt.Sprintf("NBD server refused %s for export %q: %s", option, e.Export, e.ReplyName())
	if e.Message != "" {
		text += ": " + e.Message
	}
	return text
}

// Error is the server's error reply to a command. On Linux, errors.Is(err,
// syscall.ENOSPC) and the like match Errno, whose values are the spec's
// (spec, "Error values").
type Error struct {
	Command string // "READ", "WRITE", ...
	Offset  uint64 // of the request
	Length  uint64 // of the request
	Errno   uint32
	Message string // the server's text (structured replies only); may be empty
	// ErrorOffset is where the error happened, when the server said
	// (NBD_REPLY_TYPE_ERROR_OFFSET); HasErrorOffset tells.
	ErrorOffset    uint64
	HasErrorOffset bool
}

// ErrnoName is the spec's name of Errno, such as "ENOSPC".
func (e *Error) ErrnoName() string {
	if name, ok := errnoNames[wire.Errno(e.Errno)]; ok {
		return name
	}
	return fmt.Sprintf("error %d", e.Errno)
}

func (e *Error) Error() string {
	text := fmt.Sprintf("NBD server failed %s", e.Command)
	if e.Command != "FLUSH" {
		text += fmt.Sprintf(" of %d bytes at offset %d", e.Length, e.Offset)
	}
	if e.HasErrorOffset {
		text += fmt.Sprintf(" (at offset %d)", e.ErrorOffset)
	}
	text += ": " + e.ErrnoName()
	if e.Message != "" {
		text += ": " + e.Message
	}
	return text
}

// Is matches a syscall.Errno of the same number.
func (e *Error) Is(target error) bool {
	errno, ok := target.(syscall.Errno)
	return ok && uint32(errno) == e.Errno
}

// protocolError builds an error wrapping ErrProtocol.
func protocolError(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrProtocol, fmt.Sprintf(format, args...))
}

// cleanMessage turns bytes from the server into text safe to print on a
// terminal: valid UTF-8, no control characters (a hostile server must not
// be able to send escape sequences to the user's terminal), at most the
// spec's 4096 bytes.
func cleanMessage(raw []byte) string {
	if len(raw) > wire.MaximumStringLength {
		raw = raw[:wire.MaximumStringLength]
	}
	text := strings.ToValidUTF8(string(raw), "\uFFFD")
	text = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, text)
	return strings.TrimSpace(text)
}
