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

func (l LocalStore) List(fn func(oid, stamp uint64) error) error {
	return (l.Store.List(func(oid uint64, info store.Info) error { return fn(oid, info.Epoch) }))
}

func (l LocalStore) Read(oid uint64, p []byte, offset uint32) (uint64, error) {
	info, err := l.Store.Read(oid, p, offset)
	return info.Epoch, (err)
}

func (l LocalStore) Write(oid uint64, p []byte, offset uint32, epoch uint64, flags object.Flags) error {
	return (l.Store.Write(oid, p, offset, epoch, flags))
}

func (l LocalStore) Zero(oid uint64, offset, length uint32, epoch uint64, flags object.Flags) error {
	if flags.Has(object.FlagNoHole) {
		return (l.Store.WriteZeroes(oid, offset, length, epoch, flags))
	}
	return (l.Store.Trim(oid, offset, length, epoch, flags))
}

func (l LocalStore) Remove(oid uint64) error { return (l.Store.Remove(oid)) }

func (l LocalStore) Stat(oid uint64) (uint64, uint64, error) {
	info, err := l.Store.Stat(oid)
	return info.Epoch, info.Digest, err
}

func (l LocalStore) Epoch(oid uint64) (uint64, error) {
	epoch, err := l.Store.Epoch(oid)
	return epoch, (err)
}

func (l LocalStore) SetEpoch(oid, epoch uint64) error { return (l.Store.SetEpoch(oid, epoch)) }

func (l LocalStore) Replace(oid uint64, data []byte, epoch uint64) error {
	return (l.Store.Replace(oid, data, epoch))
}

func (l LocalStore) Flush() error { return (l.Store.Flush()) }
