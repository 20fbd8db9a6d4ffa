package object

import (
	"fmt"
	"strings"
)

// Flags qualify an operation on a copy: a change (a write, zeroing or
// trim) or, for AnyStamp and Digest, a read or stat. They are a bit set
// whose bits are the peer protocol's request flags, so the gateway, the
// replica, the peer protocol and the store pass the same value and none
// of them converts (internal/objproto puts it on the wire as it is: the
// bit values below are wire encoding and never change).
type Flags uint16

const (
	// FlagSync (FUA): the change is durable before it is acknowledged:
	// the data, the header and, for a new copy, its directory entries.
	FlagSync Flags = 1 << 0
	// FlagCreate: the change may create the copy. Without it a change to
	// a copy the node does not hold fails with ErrNotFound, so that a
	// replica never silently starts a partial copy of an object it should
	// have recovered first.
	FlagCreate Flags = 1 << 1
	// FlagNoHole: zeroing writes zeros (the range stays allocated)
	// instead of punching a hole. Ignored by writes and trims.
	FlagNoHole Flags = 1 << 2
	// FlagAnyStamp (read): read the copy whatever its epoch stamp, even
	// one not yet proven current in this epoch. For recovery reading a
	// source it proved current, and for `herd vdi check`; never for
	// serving a client.
	FlagAnyStamp Flags = 1 << 3
	// FlagFresh (write, with FlagCreate): the write starts the object. A
	// copy that exists already (an orphan left by a change that failed)
	// is emptied first, so that no byte of it shows beside the new piece.
	FlagFresh Flags = 1 << 4
	// FlagRepair (write, whole 4 KiB blocks): a block repair. Each block
	// is written only where the copy's block fails its checksum, so a
	// repair never undoes a newer write. The stamp is left alone.
	FlagRepair Flags = 1 << 5
	// FlagDigest (stat): answer with the copy's content digest instead of
	// its size and allocation (see objproto.ObjectDigestSize).
	FlagDigest Flags = 1 << 6

	// ChangeFlags are the flags of a change: the ones the store takes.
	ChangeFlags = FlagSync | FlagCreate | FlagNoHole | FlagFresh | FlagRepair
)

// Has says whether every flag of x is set in f.
func (f Flags) Has(x Flags) bool { return f&x == x }

var flagNames = [...]struct {
	bit  Flags
	name string
}{{FlagSync, "FUA"}, {FlagCreate, "CREATE"}, {FlagNoHole, "NOHOLE"}, {FlagAnyStamp, "ANY_STAMP"}, {FlagFresh, "FRESH"}, {FlagRepair, "REPAIR"}, {FlagDigest, "DIGEST"}}

// String names the flags as the peer protocol does ("FUA|CREATE"), "0"
// for none; an unknown bit is printed in hex.
func (f Flags) String() string {
	if f == 0 {
		return "0"
	}
	var names []string
	for _, flag := range flagNames {
		if f&flag.bit != 0 {
			names = append(names, flag.name)
			f &^= flag.bit
		}
	}
	if f != 0 {
		names = append(names, fmt.Sprintf("0x%x", uint16(f)))
	}
	return strings.Join(names, "|")
}

// With returns f with the flags of x set if on, cleared if not.
func (f Flags) With(x Flags, on bool) Flags {
	if on {
		return f | x
	}
	return f &^ x
}
