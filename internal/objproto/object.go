package objproto

// The object protocol (peer.ProtocolObject) is how a node's gateway reads and
// writes pieces of objects on the replicas that hold them: DESIGN.md,
// "Gateway and replication" and "Peer protocol". It runs on an authenticated
// peer-port connection (handshake.go) and is a plain request/response protocol
// with a fixed header, pipelined: a client sends many requests without
// waiting, the server serves them concurrently and answers in completion
// order, and the client matches answers to requests by request id. Nothing
// on a connection serialises requests that were sent concurrently, because
// that is what collapsed Sheepdog's and GlusterFS's writes under latency
// (DESIGN.md, "Where it comes from").
//
// Requests in flight together have no order between them: the server runs
// them concurrently, as the gateway sent them. A requester that needs an
// order (a READ after a WRITE of the same range, a FLUSH after the writes it
// covers) waits for the first answer before sending the second, as an NBD
// client does.
//
// All integers are big-endian.
//
// Request: a 48-byte header, followed by Length payload bytes for WRITE only.
//
//	offset size field
//	     0    2 magic          0x48 0x52 ("HR", herd request)
//	     2    1 version        1
//	     3    1 opcode         ObjectOpcode
//	     4    2 flags          object.Flags
//	     6    2 reserved       zero
//	     8    8 epoch          the requester's epoch
//	    16    8 request id     chosen by the client, echoed in the response
//	    24    8 object id      (OID)
//	    32    4 offset         byte offset in the object (LIST: cursor index)
//	    36    4 length         byte count (LIST: maximum entries)
//	    40    4 payload CRC32C of the WRITE payload; zero for other opcodes
//	    44    4 header CRC32C  of bytes 0-43
//
// Response: a 44-byte header, followed by Length payload bytes: READ data,
// the STAT or LIST body, or for a status other than OK an error message in
// UTF-8 text of at most MaxObjectErrorMessage bytes.
//
// STAT with the DIGEST flag (object.FlagDigest) is answered with the copy's
// content digest (8 bytes, 0 when unknown) as its body instead: see the
// compatibility note above allowedObjectFlags for when a requester may send it.
//
//	offset size field
//	     0    2 magic          0x48 0x41 ("HA", herd answer)
//	     2    2 status         ObjectStatus
//	     4    4 reserved       zero
//	     8    8 request id     of the request answered
//	    16    8 epoch          the responder's current epoch
//	    24    8 object epoch   the object's epoch stamp (READ, WRITE, STAT...)
//	    32    4 length         payload bytes that follow
//	    36    4 payload CRC32C of the payload
//	    40    4 header CRC32C  of bytes 0-39
//
// Two refinements of the brief's header, and why:
//
//   - A header CRC32C ends both headers. The payload CRC protects data, but a
//     flipped bit in an offset, an object id or a length would write good
//     data to the wrong place or lose the framing of every later message;
//     TCP's 16-bit checksum lets such errors through at a rate that matters
//     at storage volumes. A bad header CRC closes the connection, since
//     nothing in the header (not even the length) can be trusted.
//   - Requests and responses have different magic numbers, so a peer that
//     loses the framing, or a client connected to a client, is caught on the
//     first header.
//
// Framing errors (bad magic, version or header CRC) close the connection
// with a logged reason: nothing after them can be trusted. Every other
// error is answered: an unknown opcode with UNKNOWN_OPCODE, a READ or WRITE
// longer than MaxPayload with TOO_LARGE (a WRITE's payload is then read and
// discarded, so the connection stays usable), any other field out of range
// with INVALID, a WRITE whose payload does not match its CRC with INVALID,
// and the data is not applied. Only WRITE carries a request payload: an
// opcode added later that needs one needs a new version.

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"strings"
	"unicode/utf8"

	"github.com/herd-storage/herd/internal/object"
)

// Sizes and limits of the object protocol.
const (
	// ObjectRequestHeaderSize is the size of a request header on the wire.
	ObjectRequestHeaderSize = 48
	// ObjectResponseHeaderSize is the size of a response header on the wire.
	ObjectResponseHeaderSize = 44
	// ObjectProtocolVersion is the version this package speaks.
	ObjectProtocolVersion = 1

	// MaxObjectSize bounds Offset+Length of every ranged request: no object
	// is larger (data objects default to 4 MiB, DESIGN.md "Objects and
	// VDIs"; 256 MiB leaves room for larger per-VDI object sizes).
	MaxObjectSize = 256 << 20
	// MaxPayload bounds the data of one READ or WRITE request, and every
	// response payload, so that one request cannot make either side buffer
	// more than this. Larger pieces are split by the caller.
	MaxPayload = 32 << 20
	// MaxObjectErrorMessage bounds the error text of a response whose
	// status is not OK.
	MaxObjectErrorMessage = 4096
	// ObjectListEntrySize is the size of one LIST entry: OID(8) epoch(8).
	ObjectListEntrySize = 16
	// MaxObjectListEntries bounds the Length of a LIST request, so that
	// its body fits in MaxPayload.
	MaxObjectListEntries = MaxPayload / ObjectListEntrySize
	// ObjectStatSize is the size of a STAT body: size(8) allocated(8). The
	// body may also be empty: the epoch stamp, in the header, is all a
	// requester needs to know which copy is current.
	ObjectStatSize = 16
	// ObjectDigestSize is the size of the body of an OK answer to STAT
	// with object.FlagDigest: the copy's content digest (store.Info.Digest),
	// 0 when the responder does not know it. May also be empty (unknown).
	ObjectDigestSize = 8
)

const (
	objectRequestMagic  = 0x4852 // "HR"
	objectResponseMagic = 0x4841 // "HA"
)

// castagnoli is the CRC32C table; on amd64 and arm64 the standard library
// computes it with the CPU's CRC instructions.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// ObjectChecksum returns the CRC32C of p, the checksum the object protocol
// carries for payloads (object.Checksum).
func ObjectChecksum(p []byte) uint32 { return object.Checksum(p) }

// ObjectOpcode is the operation of a request.
type ObjectOpcode uint8

// Opcodes. The handler contract of each is documented on ObjectHandler.
const (
	ObjectRead        ObjectOpcode = 1 // read Length bytes at Offset
	ObjectWrite       ObjectOpcode = 2 // write the payload at Offset
	ObjectWriteZeroes ObjectOpcode = 3 // make [Offset, Offset+Length) read as zeroes
	ObjectTrim        ObjectOpcode = 4 // deallocate [Offset, Offset+Length); reads as zeroes
	ObjectRemove      ObjectOpcode = 5 // delete the object
	ObjectFlush       ObjectOpcode = 6 // make every completed write on this node durable
	ObjectStat        ObjectOpcode = 7 // the object's epoch stamp, size and allocation
	ObjectList        ObjectOpcode = 8 // the objects this node holds, paged
	ObjectPing        ObjectOpcode = 9 // liveness and the responder's epoch
	// ObjectRecover asks the responder to make its copy of the object
	// current in the request's epoch: prove the newest reachable copy
	// current and restamp or fetch it (the paper's Fig. 4).
	ObjectRecover ObjectOpcode = 10
)

var objectOpcodeNames = [...]string{
	ObjectRead:        "READ",
	ObjectWrite:       "WRITE",
	ObjectWriteZeroes: "WRITE_ZEROES",
	ObjectTrim:        "TRIM",
	ObjectRemove:      "REMOVE",
	ObjectFlush:       "FLUSH",
	ObjectStat:        "STAT",
	ObjectList:        "LIST",
	ObjectPing:        "PING",
	ObjectRecover:     "RECOVER",
}

func (o ObjectOpcode) String() string {
	if int(o) < len(objectOpcodeNames) && objectOpcodeNames[o] != "" {
		return objectOpcodeNames[o]
	}
	return fmt.Sprintf("OPCODE(%d)", uint8(o))
}

// known reports whether o is an opcode of this version.
func (o ObjectOpcode) known() bool {
	return o >= ObjectRead && o <= ObjectRecover
}

// A request's flags are object.Flags, on the wire as they are (16 bits).
//
// Compatibility of object.FlagDigest (STAT): a herd built before it
// (commit add0e14 and older) answers a STAT with any flag INVALID (its
// allowedObjectFlags has none for STAT), and its client takes a STAT body
// of other than 0 or 16 bytes for a protocol error and closes the
// connection; neither ignores an addition, so nothing here is sent to one.
// A requester sets the flag only once the cluster's feature level is
// cluster.LevelCopyDigests (replica.Client.Digests), which no member
// running such a herd can reach, and a responder sends the digest body
// only when asked: an older requester never sees it.

// allowedObjectFlags are the flags each opcode accepts; any other bit makes
// the request INVALID.
var allowedObjectFlags = [...]object.Flags{
	ObjectRead:        object.FlagAnyStamp,
	ObjectWrite:       object.FlagSync | object.FlagCreate | object.FlagFresh | object.FlagRepair,
	ObjectWriteZeroes: object.FlagSync | object.FlagCreate | object.FlagNoHole,
	ObjectTrim:        object.FlagSync,
	ObjectRemove:      object.FlagSync,
	ObjectStat:        object.FlagDigest,
	ObjectPing:        0,
}

// ObjectStatus is the outcome of a request. Every status but OK has a
// sentinel error in object_errors.go.
type ObjectStatus uint16

const (
	ObjectStatusOK ObjectStatus = 0
	// ObjectStatusNotFound: the object does not exist on the responder.
	ObjectStatusNotFound ObjectStatus = 1
	// ObjectStatusStaleEpoch: the request's epoch is not the responder's;
	// the response's Epoch is the responder's, so the gateway waits for
	// that epoch and retries on its placement (DESIGN.md, "Gateway and
	// replication").
	ObjectStatusStaleEpoch ObjectStatus = 2
	// ObjectStatusInvalid: a field is out of range, or the payload does
	// not match its CRC.
	ObjectStatusInvalid ObjectStatus = 3
	// ObjectStatusIO: the responder's disk failed.
	ObjectStatusIO ObjectStatus = 4
	// ObjectStatusNoSpace: the responder's disks are full.
	ObjectStatusNoSpace ObjectStatus = 5
	// ObjectStatusCorrupt: the responder's copy fails its checksum.
	ObjectStatusCorrupt ObjectStatus = 6
	// ObjectStatusShuttingDown: the responder is stopping; try another
	// replica or wait for the next epoch.
	ObjectStatusShuttingDown ObjectStatus = 7
	// ObjectStatusUnknownOpcode: the responder does not know the opcode.
	ObjectStatusUnknownOpcode ObjectStatus = 8
	// ObjectStatusTooLarge: the request's Length exceeds MaxPayload.
	ObjectStatusTooLarge ObjectStatus = 9
	// ObjectStatusNotRecovered: the responder's copy is not (yet) proven
	// current in this epoch; the requester sends RECOVER and retries.
	ObjectStatusNotRecovered ObjectStatus = 10
	// ObjectStatusNoCopy: RECOVER found no copy that is provably current:
	// the newest copies may be on nodes that are down. The object is
	// unavailable until one of them returns.
	ObjectStatusNoCopy ObjectStatus = 11
	// ObjectStatusChecksum: some 4 KiB blocks of the responder's copy
	// fail their data checksum; none of them was returned or built on.
	// The requester reads another replica and repairs the blocks.
	ObjectStatusChecksum ObjectStatus = 12

	objectStatusCount = 13
)

var objectStatusNames = [objectStatusCount]string{
	ObjectStatusOK:            "OK",
	ObjectStatusNotFound:      "NOT_FOUND",
	ObjectStatusStaleEpoch:    "STALE_EPOCH",
	ObjectStatusInvalid:       "INVALID",
	ObjectStatusIO:            "IO",
	ObjectStatusNoSpace:       "NO_SPACE",
	ObjectStatusCorrupt:       "CORRUPT",
	ObjectStatusShuttingDown:  "SHUTTING_DOWN",
	ObjectStatusUnknownOpcode: "UNKNOWN_OPCODE",
	ObjectStatusTooLarge:      "TOO_LARGE",
	ObjectStatusNotRecovered:  "NOT_RECOVERED",
	ObjectStatusNoCopy:        "NO_COPY",
	ObjectStatusChecksum:      "CHECKSUM",
}

func (s ObjectStatus) String() string {
	if s < objectStatusCount {
		return objectStatusNames[s]
	}
	return fmt.Sprintf("STATUS(%d)", uint16(s))
}

// ObjectRequest is a decoded request header.
type ObjectRequest struct {
	Opcode ObjectOpcode
	Flags  object.Flags
	// Epoch is the requester's epoch. A replica answers STALE_EPOCH to a
	// request from another epoch (DESIGN.md, "Gateway and replication").
	Epoch object.Epoch
	// ID identifies the request on its connection. ObjectClient.Do
	// assigns it; callers leave it zero.
	ID uint64
	// OID is the object id (DESIGN.md, "Objects and VDIs"). For LIST it is
	// the smallest object id to list.
	OID object.OID
	// Offset is the byte offset in the object. For LIST it is the cursor:
	// the number of entries (from OID on) to skip.
	Offset uint32
	// Length is the byte count of the range; for WRITE it is also the
	// size of the payload that follows the header. For LIST it is the
	// maximum number of entries to return.
	Length uint32
	// Checksum is the CRC32C of the WRITE payload (zero for other
	// opcodes). ObjectClient.Do computes it.
	Checksum uint32

	// reserved holds the header's reserved word: zero in this version,
	// kept so that validation can reject requests that set it.
	reserved uint16
}

// ObjectResponse is a decoded response header, and what an ObjectHandler
// returns.
type ObjectResponse struct {
	Status ObjectStatus
	// ID is the request id of the request answered. The server sets it.
	ID uint64
	// Epoch is the responder's current epoch, so that a requester with a
	// stale epoch learns the new one.
	Epoch object.Epoch
	// ObjectEpoch is the epoch stamp of the object's copy: the epoch at
	// which it was last written or recovered (DESIGN.md, "Consistency and
	// durability promises"). Zero when the opcode has no object.
	ObjectEpoch object.Epoch
	// Length is the payload size. The server sets it from the body.
	Length uint32
	// Checksum is the CRC32C of the payload. The server sets it.
	Checksum uint32

	// Release, if not nil, is called once by the server when the body
	// returned with this response is no longer needed: after it was
	// written to the connection, or when the connection failed first. It
	// is how a handler returns a pooled READ buffer (a *bufpool.Buffer is a
	// Releaser). Never on the wire; always nil on the client side.
	Release Releaser

	reserved uint32
}

// ObjectStatEntry is the body of an OK response to STAT.
type ObjectStatEntry struct {
	// Size is the object's logical size in bytes: one past the last byte
	// ever written.
	Size uint64
	// Allocated is the number of bytes the object takes on disk (less
	// than Size when it has holes).
	Allocated uint64
}

// ObjectListEntry is one entry of the body of an OK response to LIST.
type ObjectListEntry struct {
	OID   object.OID
	Epoch object.Epoch // the copy's epoch stamp
}

// objectFramingError is returned by the decoders when a header cannot be
// trusted: the connection must be closed.
type objectFramingError struct{ reason string }

func (e *objectFramingError) Error() string { return "peer: object protocol framing: " + e.reason }

func (e *objectFramingError) Unwrap() error { return ErrObjectProtocol }

// EncodeObjectRequest writes r's header into header, computing the header
// CRC. It does not validate r (see ValidateObjectRequest).
func EncodeObjectRequest(header *[ObjectRequestHeaderSize]byte, r *ObjectRequest) {
	binary.BigEndian.PutUint16(header[0:], objectRequestMagic)
	header[2] = ObjectProtocolVersion
	header[3] = byte(r.Opcode)
	binary.BigEndian.PutUint16(header[4:], uint16(r.Flags))
	binary.BigEndian.PutUint16(header[6:], r.reserved)
	binary.BigEndian.PutUint64(header[8:], uint64(r.Epoch))
	binary.BigEndian.PutUint64(header[16:], r.ID)
	binary.BigEndian.PutUint64(header[24:], uint64(r.OID))
	binary.BigEndian.PutUint32(header[32:], r.Offset)
	binary.BigEndian.PutUint32(header[36:], r.Length)
	binary.BigEndian.PutUint32(header[40:], r.Checksum)
	binary.BigEndian.PutUint32(header[44:], crc32.Checksum(header[:44], castagnoli))
}

// DecodeObjectRequest decodes a request header. It fails, with an error
// wrapping ErrObjectProtocol, only when the header cannot be trusted (magic,
// version, header CRC): the connection must then be closed. Every other
// field is checked by ValidateObjectRequest, whose failures are answered.
func DecodeObjectRequest(header *[ObjectRequestHeaderSize]byte) (ObjectRequest, error) {
	if magic := binary.BigEndian.Uint16(header[0:]); magic != objectRequestMagic {
		return ObjectRequest{}, &objectFramingError{fmt.Sprintf("bad request magic 0x%04x", magic)}
	}
	if want, got := crc32.Checksum(header[:44], castagnoli), binary.BigEndian.Uint32(header[44:]); want != got {
		return ObjectRequest{}, &objectFramingError{fmt.Sprintf("request header CRC 0x%08x, computed 0x%08x", got, want)}
	}
	if header[2] != ObjectProtocolVersion {
		return ObjectRequest{}, &objectFramingError{fmt.Sprintf("request version %d, this node speaks %d", header[2], ObjectProtocolVersion)}
	}
	return ObjectRequest{
		Opcode:   ObjectOpcode(header[3]),
		Flags:    object.Flags(binary.BigEndian.Uint16(header[4:])),
		reserved: binary.BigEndian.Uint16(header[6:]),
		Epoch:    object.Epoch(binary.BigEndian.Uint64(header[8:])),
		ID:       binary.BigEndian.Uint64(header[16:]),
		OID:      object.OID(binary.BigEndian.Uint64(header[24:])),
		Offset:   binary.BigEndian.Uint32(header[32:]),
		Length:   binary.BigEndian.Uint32(header[36:]),
		Checksum: binary.BigEndian.Uint32(header[40:]),
	}, nil
}

// requestPayloadLength is the number of payload bytes that follow r's header
// on the wire: Length for WRITE, nothing for every other opcode (known or
// not). It holds whether or not r is valid, so that the stream stays framed.
func (r *ObjectRequest) requestPayloadLength() uint32 {
	if r.Opcode == ObjectWrite {
		return r.Length
	}
	return 0
}

// ValidateObjectRequest checks every field of r against its opcode. It
// returns ObjectStatusOK, or the status to answer with and a message saying
// why. It does not check the payload CRC (the payload is not in r).
func ValidateObjectRequest(r *ObjectRequest) (ObjectStatus, string) {
	if !r.Opcode.known() {
		return ObjectStatusUnknownOpcode, fmt.Sprintf("unknown opcode %d", uint8(r.Opcode))
	}
	if r.reserved != 0 {
		return ObjectStatusInvalid, fmt.Sprintf("reserved field is 0x%04x, must be zero", r.reserved)
	}
	var allowed object.Flags
	if int(r.Opcode) < len(allowedObjectFlags) {
		allowed = allowedObjectFlags[r.Opcode]
	}
	if extra := r.Flags &^ allowed; extra != 0 {
		return ObjectStatusInvalid, fmt.Sprintf("%s does not take flags %s", r.Opcode, extra)
	}
	if r.Opcode != ObjectWrite && r.Checksum != 0 {
		return ObjectStatusInvalid, fmt.Sprintf("%s carries no payload but has payload CRC 0x%08x", r.Opcode, r.Checksum)
	}
	switch r.Opcode {
	case ObjectRead, ObjectWrite:
		if r.Length > MaxPayload {
			return ObjectStatusTooLarge, fmt.Sprintf("%s of %d bytes exceeds the %d-byte maximum payload", r.Opcode, r.Length, MaxPayload)
		}
		return validateObjectRange(r)
	case ObjectWriteZeroes, ObjectTrim:
		return validateObjectRange(r)
	case ObjectRemove, ObjectStat, ObjectRecover:
		if r.Offset != 0 || r.Length != 0 {
			return ObjectStatusInvalid, fmt.Sprintf("%s takes no range (offset %d, length %d)", r.Opcode, r.Offset, r.Length)
		}
	case ObjectFlush, ObjectPing:
		if r.OID != 0 || r.Offset != 0 || r.Length != 0 {
			return ObjectStatusInvalid, fmt.Sprintf("%s takes no object and no range (object %016x, offset %d, length %d)", r.Opcode, r.OID, r.Offset, r.Length)
		}
	case ObjectList:
		if r.Length == 0 || r.Length > MaxObjectListEntries {
			return ObjectStatusInvalid, fmt.Sprintf("LIST of %d entries; must be 1 to %d", r.Length, MaxObjectListEntries)
		}
	}
	return ObjectStatusOK, ""
}

func validateObjectRange(r *ObjectRequest) (ObjectStatus, string) {
	if r.Length == 0 {
		return ObjectStatusInvalid, fmt.Sprintf("%s of zero bytes", r.Opcode)
	}
	// Both are 32-bit: the sum cannot overflow 64 bits.
	if end := uint64(r.Offset) + uint64(r.Length); end > MaxObjectSize {
		return ObjectStatusInvalid, fmt.Sprintf("%s of [%d, %d) reaches past the %d-byte maximum object size", r.Opcode, r.Offset, end, MaxObjectSize)
	}
	return ObjectStatusOK, ""
}

// EncodeObjectResponse writes r's header into header, computing the header
// CRC. Length and Checksum are written as they are: the caller sets them to
// describe the payload that follows.
func EncodeObjectResponse(header *[ObjectResponseHeaderSize]byte, r *ObjectResponse) {
	binary.BigEndian.PutUint16(header[0:], objectResponseMagic)
	binary.BigEndian.PutUint16(header[2:], uint16(r.Status))
	binary.BigEndian.PutUint32(header[4:], r.reserved)
	binary.BigEndian.PutUint64(header[8:], r.ID)
	binary.BigEndian.PutUint64(header[16:], uint64(r.Epoch))
	binary.BigEndian.PutUint64(header[24:], uint64(r.ObjectEpoch))
	binary.BigEndian.PutUint32(header[32:], r.Length)
	binary.BigEndian.PutUint32(header[36:], r.Checksum)
	binary.BigEndian.PutUint32(header[40:], crc32.Checksum(header[:40], castagnoli))
}

// DecodeObjectResponse decodes and validates a response header. Any error
// wraps ErrObjectProtocol and means the connection must be closed: the
// responder is broken or not a herd node, and the framing of what follows
// cannot be trusted. An unknown status is not an error here (a newer node
// may send one); the client reports it as ErrObjectIO.
func DecodeObjectResponse(header *[ObjectResponseHeaderSize]byte) (ObjectResponse, error) {
	if magic := binary.BigEndian.Uint16(header[0:]); magic != objectResponseMagic {
		return ObjectResponse{}, &objectFramingError{fmt.Sprintf("bad response magic 0x%04x", magic)}
	}
	if want, got := crc32.Checksum(header[:40], castagnoli), binary.BigEndian.Uint32(header[40:]); want != got {
		return ObjectResponse{}, &objectFramingError{fmt.Sprintf("response header CRC 0x%08x, computed 0x%08x", got, want)}
	}
	r := ObjectResponse{
		Status:      ObjectStatus(binary.BigEndian.Uint16(header[2:])),
		reserved:    binary.BigEndian.Uint32(header[4:]),
		ID:          binary.BigEndian.Uint64(header[8:]),
		Epoch:       object.Epoch(binary.BigEndian.Uint64(header[16:])),
		ObjectEpoch: object.Epoch(binary.BigEndian.Uint64(header[24:])),
		Length:      binary.BigEndian.Uint32(header[32:]),
		Checksum:    binary.BigEndian.Uint32(header[36:]),
	}
	if r.reserved != 0 {
		return ObjectResponse{}, &objectFramingError{fmt.Sprintf("response reserved field is 0x%08x", r.reserved)}
	}
	if r.Status == ObjectStatusOK && r.Length > MaxPayload {
		return ObjectResponse{}, &objectFramingError{fmt.Sprintf("response payload of %d bytes exceeds the %d-byte maximum", r.Length, MaxPayload)}
	}
	if r.Status != ObjectStatusOK && r.Length > MaxObjectErrorMessage {
		return ObjectResponse{}, &objectFramingError{fmt.Sprintf("%s error message of %d bytes exceeds the %d-byte maximum", r.Status, r.Length, MaxObjectErrorMessage)}
	}
	return r, nil
}

// AppendObjectStat appends the wire form of a STAT body to dst.
func AppendObjectStat(dst []byte, s ObjectStatEntry) []byte {
	dst = binary.BigEndian.AppendUint64(dst, s.Size)
	return binary.BigEndian.AppendUint64(dst, s.Allocated)
}

// DecodeObjectStat decodes a STAT body. An empty body (the responder did
// not report size and allocation) fails with an error wrapping
// ErrObjectProtocol, like a malformed one.
func DecodeObjectStat(body []byte) (ObjectStatEntry, error) {
	if len(body) != ObjectStatSize {
		return ObjectStatEntry{}, fmt.Errorf("%w: STAT body of %d bytes, want %d", ErrObjectProtocol, len(body), ObjectStatSize)
	}
	return ObjectStatEntry{Size: binary.BigEndian.Uint64(body[0:]), Allocated: binary.BigEndian.Uint64(body[8:])}, nil
}

// AppendObjectDigest appends the body of an answer to STAT with
// object.FlagDigest to dst.
func AppendObjectDigest(dst []byte, digest uint64) []byte {
	return binary.BigEndian.AppendUint64(dst, digest)
}

// DecodeObjectDigest decodes the body of an answer to STAT with
// object.FlagDigest: 0 (unknown) for an empty one.
func DecodeObjectDigest(body []byte) (uint64, error) {
	switch len(body) {
	case 0:
		return 0, nil
	case ObjectDigestSize:
		return binary.BigEndian.Uint64(body), nil
	}
	return 0, fmt.Errorf("%w: STAT DIGEST body of %d bytes, want %d or none", ErrObjectProtocol, len(body), ObjectDigestSize)
}

// statBodyProblem says what is wrong with an OK answer of n bytes to a
// STAT with flags, or "".
func statBodyProblem(flags object.Flags, n int) string {
	want := ObjectStatSize
	if flags&object.FlagDigest != 0 {
		want = ObjectDigestSize
	}
	if n != want && n != 0 {
		return fmt.Sprintf("STAT (flags %s) answered with %d bytes, not %d or none", flags, n, want)
	}
	return ""
}

// AppendObjectListEntry appends the wire form of one LIST entry to dst.
func AppendObjectListEntry(dst []byte, e ObjectListEntry) []byte {
	dst = binary.BigEndian.AppendUint64(dst, uint64(e.OID))
	return binary.BigEndian.AppendUint64(dst, uint64(e.Epoch))
}

// DecodeObjectList decodes a LIST body, appending its entries to dst.
func DecodeObjectList(dst []ObjectListEntry, body []byte) ([]ObjectListEntry, error) {
	if len(body)%ObjectListEntrySize != 0 {
		return dst, fmt.Errorf("%w: LIST body of %d bytes is not a whole number of %d-byte entries", ErrObjectProtocol, len(body), ObjectListEntrySize)
	}
	for ; len(body) > 0; body = body[ObjectListEntrySize:] {
		dst = append(dst, ObjectListEntry{OID: object.OID(binary.BigEndian.Uint64(body[0:])), Epoch: object.Epoch(binary.BigEndian.Uint64(body[8:]))})
	}
	return dst, nil
}

// objectErrorMessage turns text into what the protocol carries as an error
// message: valid UTF-8, at most MaxObjectErrorMessage bytes, cut at a rune
// boundary.
func objectErrorMessage(text string) string {
	text = strings.ToValidUTF8(text, "\uFFFD")
	if len(text) <= MaxObjectErrorMessage {
		return text
	}
	cut := MaxObjectErrorMessage
	for cut > 0 && !utf8.RuneStart(text[cut]) {
		cut--
	}
	return text[:cut]
}
