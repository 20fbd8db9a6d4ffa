// Package exportname is the grammar of the names a VDI is opened by, over
// NBD and in the CLI's transfers, parsed in this one place:
//
//	NAME        the VDI (written by one writer at a time)
//	ro/NAME     the VDI read-only, beside its writer and any number of readers
//	NAME@TAG    a snapshot (always read-only); ro/NAME@TAG is the same
//
// '/' and '@' are not allowed in VDI names or tags (cluster.ValidateName),
// so the forms cannot clash.
package exportname

import "strings"

// ReadOnlyPrefix opens a VDI read-only.
const ReadOnlyPrefix = "ro/"

// Name is a parsed export name.
type Name struct {
	VDI      string // NAME
	Tag      string // TAG of NAME@TAG
	ReadOnly bool   // the ro/ prefix was given
	snapshot bool   // an '@' was given (even with an empty tag)
}

// Parse parses an export name. It never fails: whether NAME and TAG are
// valid names is the cluster's to say.
func Parse(s string) Name {
	var n Name
	s, n.ReadOnly = strings.CutPrefix(s, ReadOnlyPrefix)
	n.VDI, n.Tag, n.snapshot = strings.Cut(s, "@")
	return n
}

// Snapshot reports whether the name is a snapshot's, NAME@TAG.
func (n Name) Snapshot() bool { return n.snapshot }

// Writable reports whether opening the name takes the VDI's writer lock:
// a plain NAME.
func (n Name) Writable() bool { return !n.ReadOnly && !n.snapshot }

// Full is the name of what the cluster looks up: NAME or NAME@TAG.
func (n Name) Full() string {
	if n.snapshot {
		return n.VDI + "@" + n.Tag
	}
	return n.VDI
}

// AsReadOnly is the same name opened read-only.
func (n Name) AsReadOnly() Name {
	n.ReadOnly = true
	return n
}

// String is the export name: the inverse of Parse.
func (n Name) String() string {
	if n.ReadOnly {
		return ReadOnlyPrefix + n.Full()
	}
	return n.Full()
}
