package gateway

import (
	"errors"
	"fmt"

	"github.com/herd-storage/herd/internal/store"
)

// LocalStore adapts the node's object store to the replica side.
type LocalStore struct{ Store *store.Store }

var _ ObjectStore = LocalStore{}

func storeFlags(flags WriteFlags) store.WriteFlags {
	var f store.WriteFlags
	if flags.Create {
		f |= store.Create
	}
	if flags.Sync {
		f |= store.Sync
	}
	if flags.NoHole {
		f |= store.NoHole
	}
	return f
}

// fromStore translates the store's errors to the gateway's.
func fromStore(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, store.ErrNotFound):
		return fmt.Errorf("%w: %v", ErrNotFound, err)
	case errors.Is(err, store.ErrNoSpace):
		return fmt.Errorf("%w: %v", ErrNoSpace, err)
	}
	return err
}

func (l LocalStore) List(fn func(oid, stamp uint64) error) error {
	return fromStore(l.Store.List(func(oid uint64, info store.Info) error { return fn(oid, info.Epoch) }))
}

func (l LocalStore) Read(oid uint64, p []byte, offset uint32) (uint64, error) {
	info, err := l.Store.Read(oid, p, offset)
	return info.Epoch, fromStore(err)
}

func (l LocalStore) Write(oid uint64, p []byte, offset uint32, epoch uint64, flags WriteFlags) error {
	return fromStore(l.Store.Write(oid, p, offset, epoch, storeFlags(flags)))
}

func (l LocalStore) Zero(oid uint64, offset, length uint32, epoch uint64, flags WriteFlags) error {
	if flags.NoHole {
		return fromStore(l.Store.WriteZeroes(oid, offset, length, epoch, storeFlags(flags)))
	}
	return fromStore(l.Store.Trim(oid, offset, length, epoch, storeFlags(flags)))
}

func (l LocalStore) Remove(oid uint64) error { return fromStore(l.Store.Remove(oid)) }

func (l LocalStore) Stat(oid uint64) (uint64, error) {
	info, err := l.Store.Stat(oid)
	return info.Epoch, fromStore(err)
}

func (l LocalStore) Epoch(oid uint64) (uint64, error) {
	epoch, err := l.Store.Epoch(oid)
	return epoch, fromStore(err)
}

func (l LocalStore) SetEpoch(oid, epoch uint64) error { return fromStore(l.Store.SetEpoch(oid, epoch)) }

func (l LocalStore) Flush() error { return fromStore(l.Store.Flush()) }
