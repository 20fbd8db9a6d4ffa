package nbd

import (
	"context"
	"errors"
	"strings"
	"syscall"
	"unicode/utf8"

	"github.com/herd-storage/herd/internal/nbd/wire"
)

// Errors a Backend returns from Open, translated to option replies by
// optionReplyFor.
var (
	// ErrUnknownExport: no export of that name.
	ErrUnknownExport = errors.New("nbd: unknown export")
	// ErrExportBusy: the export is held by another client; wrap it with a
	// message naming the holder.
	ErrExportBusy = errors.New("nbd: export busy")
	// ErrNotReady: the export exists but cannot be served now (for example
	// the cluster has no quorum).
	ErrNotReady = errors.New("nbd: export not ready")
)

// Errors an Export returns from its methods (and some also from
// Backend.Open), translated to NBD error values by errnoFor.
var (
	ErrIO           = errors.New("nbd: input/output error")
	ErrNoSpace      = errors.New("nbd: no space left")
	ErrInvalid      = errors.New("nbd: invalid argument")
	ErrReadOnly     = errors.New("nbd: export is read-only")
	ErrPermission   = errors.New("nbd: permission denied")
	ErrNotSupported = errors.New("nbd: operation not supported")
	ErrOverflow     = errors.New("nbd: value too large")
	ErrShutdown     = errors.New("nbd: server shutting down")
)

// Errors of the server itself.
var (
	// ErrServerClosed is returned by Serve after Close or Shutdown.
	ErrServerClosed = errors.New("nbd: server closed")
	// ErrProtocol is wrapped by the errors that end a connection because
	// the client broke the protocol.
	ErrProtocol = errors.New("nbd: protocol violation")
	// errAborted ends a connection whose client sent NBD_OPT_ABORT.
	errAborted = errors.New("nbd: client aborted the negotiation")
	// errTLSRequired ends a connection that tried to go on without TLS
	// on a server with RequireTLS (spec, "FORCEDTLS mode").
	errTLSRequired = errors.New("nbd: this server requires TLS (NBD_OPT_STARTTLS) with a client certificate")
	// errTLSHandshake ends a connection whose TLS handshake failed (no
	// client certificate, one from another CA, a client speaking
	// something else); after the ACK to NBD_OPT_STARTTLS there is no
	// going back to plaintext (spec, "FORCEDTLS mode").
	errTLSHandshake = errors.New("nbd: TLS handshake failed")
	// errTooManyOptions ends a connection that sent more than
	// Server.MaxOptions options.
	errTooManyOptions = errors.New("nbd: too many options in one handshake")
	// errClientRefused ends a connection refused by a connection limit
	// that sent NBD_OPT_EXPORT_NAME, which has no error reply.
	errClientRefused = errors.New("nbd: connection refused by a connection limit")
	// errInvalidExportInfo reports a Backend bug: Info returned values
	// the protocol cannot carry.
	errInvalidExportInfo = errors.New("nbd: export reported invalid block sizes")
)

// errnoFor translates an error from an Export to the NBD error value sent to
// the client (spec, "Error values"). It is the only place that does so. The
// spec asks to map EDQUOT and EFBIG to ENOSPC; host errno values are
// recognised too so that a Backend may pass errors from the operating system
// through unchanged.
func errnoFor(err error) wire.Errno {
	switch {
	case err == nil:
		return wire.NoError
	case errors.Is(err, ErrReadOnly), errors.Is(err, ErrPermission),
		errors.Is(err, syscall.EPERM), errors.Is(err, syscall.EACCES), errors.Is(err, syscall.EROFS):
		return wire.EPERM
	case errors.Is(err, ErrNoSpace),
		errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT), errors.Is(err, syscall.EFBIG):
		return wire.ENOSPC
	case errors.Is(err, ErrInvalid), errors.Is(err, syscall.EINVAL):
		return wire.EINVAL
	case errors.Is(err, ErrNotSupported), errors.Is(err, syscall.ENOTSUP), errors.Is(err, syscall.EOPNOTSUPP):
		return wire.ENOTSUP
	case errors.Is(err, ErrOverflow), errors.Is(err, syscall.EOVERFLOW):
		return wire.EOVERFLOW
	case errors.Is(err, ErrShutdown), errors.Is(err, syscall.ESHUTDOWN), errors.Is(err, context.Canceled):
		// A cancelled context means the connection or the server is going
		// away; the spec's value for that is ESHUTDOWN (spec, "Terminating
		// the transmission phase").
		return wire.ESHUTDOWN
	default:
		// ErrIO, context.DeadlineExceeded and everything unknown.
		return wire.EIO
	}
}

// optionReplyFor translates an error from Backend.Open or Backend.List to the
// option reply type sent to the client (spec, "Option reply types").
func optionReplyFor(err error) uint32 {
	switch {
	case errors.Is(err, ErrUnknownExport):
		return wire.RepErrUnknown
	case errors.Is(err, ErrExportBusy), errors.Is(err, ErrPermission), errors.Is(err, ErrReadOnly),
		errors.Is(err, ErrNotReady):
		// NBD_REP_ERR_POLICY: "known ... and syntactically valid, but
		// server-side policy forbids the server to allow the option"; one
		// writer per VDI is such a policy, and so is serving an export
		// only while the cluster can. Not NBD_REP_ERR_UNKNOWN for an
		// export that is not ready: clients report that as "no export
		// named" (libnbd: ENOENT), and the export exists.
		return wire.RepErrPolicy
	case errors.Is(err, ErrInvalid):
		return wire.RepErrInvalid
	case errors.Is(err, ErrShutdown), errors.Is(err, context.Canceled):
		return wire.RepErrShutdown
	default:
		return wire.RepErrUnknown
	}
}

// messageFor turns an error into a string the spec allows on the wire: valid
// UTF-8, no NUL, at most wire.MaximumStringLength bytes (spec, "Conventions").
func messageFor(err error) string {
	if err == nil {
		return ""
	}
	return cleanString(err.Error())
}

// cleanString makes s a valid protocol string, truncating it if needed.
func cleanString(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	s = strings.ReplaceAll(s, "\x00", "")
	if len(s) <= wire.MaximumStringLength {
		return s
	}
	cut := wire.MaximumStringLength
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}

// validString reports whether a client-supplied string follows the spec's
// rules for strings: UTF-8, no NUL, at most 4096 bytes.
func validString(s []byte) bool {
	return len(s) <= wire.MaximumStringLength && utf8.Valid(s) && !containsZeroByte(s)
}

func containsZeroByte(s []byte) bool {
	for _, b := range s {
		if b == 0 {
			return true
		}
	}
	return false
}
