// Package object is the vocabulary every layer of herd's data path shares
// about objects: how object ids are laid out, the conditions an operation
// on an object copy can meet (one set of errors, from the store's disk to
// the peer protocol's statuses to the gateway), and the flags of a change.
//
// The layers translate only at their edges, once each: the store returns
// these errors for what its disks do; the peer protocol maps them to wire
// statuses and back (internal/peer); the NBD adapter maps them to NBD
// errors (internal/export). Everything between tests them with errors.Is.
//
// The package has no dependencies inside herd, so that the store, the
// peer protocol and the cluster can all use it.
package object
