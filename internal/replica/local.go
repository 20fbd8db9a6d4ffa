package replica

import (
	"github.com/herd-storage/herd/internal/object"
	"github.com/herd-storage/herd/internal/store"
)

// LocalStore adapts the node's object store to the replica side. The
// store speaks the data path's error vocabulary (internal/object), so
// nothing is translated here.
type LocalStore struct{ Store *store.Store }

var _ ObjectStore = LocalStore{}

func (l LocalStore) List(fn func(oid object.OID, stamp object.Epoch) error) error {
	return (l.Store.List(func(oid object.OID, info store.Info) error { return fn(oid, info.Epoch) }))
}

func (l LocalStore) Read(oid object.OID, p []byte, offset uint32) (object.Epoch, error) {
	info, err := l.Store.Read(oid, p, offset)
	return info.Epoch, (err)
}

func (l LocalStore) Write(epoch object.Epoch, oid object.OID, p []byte, offset uint32, flags object.Flags) error {
	return (l.Store.Write(epoch, oid, p, offset, flags))
}

func (l LocalStore) Zero(epoch object.Epoch, oid object.OID, offset, length uint32, flags object.Flags) error {
	if flags.Has(object.FlagNoHole) {
		return (l.Store.WriteZeroes(epoch, oid, offset, length, flags))
	}
	return (l.Store.Trim(epoch, oid, offset, length, flags))
}

func (l LocalStore) Remove(oid object.OID) error { return (l.Store.Remove(oid)) }

func (l LocalStore) Stat(oid object.OID) (object.Epoch, uint64, error) {
	info, err := l.Store.Stat(oid)
	return info.Epoch, info.Digest, err
}

func (l LocalStore) Epoch(oid object.OID) (object.Epoch, error) {
	epoch, err := l.Store.Epoch(oid)
	return epoch, (err)
}

func (l LocalStore) SetEpoch(epoch object.Epoch, oid object.OID) error {
	return (l.Store.SetEpoch(epoch, oid))
}

func (l LocalStore) Replace(epoch object.Epoch, oid object.OID, data []byte) error {
	return (l.Store.Replace(epoch, oid, data))
}

func (l LocalStore) Flush() error { return (l.Store.Flush()) }
