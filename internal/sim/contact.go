package sim

import (
	"context"
	"fmt"

	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/replica"
)

// epochSource is what a process's replica side asks of the cluster: its
// member of the log, leases and all, or with the seeded bug
// lease-by-contact (bugs.go) the member as the replica side saw it
// before leases.
func epochSource(m *cluster.LocalMember) replica.EpochSource {
	if bugLeaseByContact {
		return contactLease{m}
	}
	return m
}

// contactLease is the cluster before leases: a node served data while it
// had contact with the leader (HasQuorum: a heartbeat in the last 3 s,
// whatever it had applied), and admitted every write (no activation).
type contactLease struct{ *cluster.LocalMember }

func (c contactLease) LeaseValid() bool          { return c.HasQuorum() }
func (c contactLease) LeaseValidMonotonic() bool { return c.HasQuorum() }

func (c contactLease) WaitLease(ctx context.Context) error {
	if ok, detail := c.QuorumStatus(); !ok {
		return fmt.Errorf("%w: %s", cluster.ErrNoQuorum, detail)
	}
	return nil
}

func (c contactLease) WaitActive(ctx context.Context, epoch uint64) error { return nil }
