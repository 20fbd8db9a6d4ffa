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

func (l LocalStore) Write(oid object.OID, p []byte, offset uint32, epoch object.Epoch, flags object.Flags) error {
	return (l.Store.Write(oid, p, offset, epoch, flags))
}

func (l LocalStore) Zero(oid object.OID, offset, length uint32, epoch object.Epoch, flags object.Flags) error {
	if flags.Has(object.FlagNoHole) {
		return (l.Store.WriteZeroes(oid, offset, length, epoch, flags))
	}
	return (l.Store.Trim(oid, offset, length, epoch, flags))
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

func (l LocalStore) SetEpoch(oid object.OID, epoch object.Epoch) error {
	return (l.Store.SetEpoch(oid, epoch))
}

func (l LocalStore) Replace(oid object.OID, data []byte, epoch object.Epoch) error {
	return (l.Store.Replace(oid, data, epoch))
}

func (l LocalStore) Flush() error { return (l.Store.Flush()) }
