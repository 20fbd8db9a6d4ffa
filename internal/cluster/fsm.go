package cluster

import (
	"io"

	"github.com/hashicorp/raft"
	"github.com/herd-storage/herd/internal/cluster/statemachine"
	"github.com/herd-storage/herd/internal/pki"
)

func init() {
	// The state machine checks a CA rotation's certificate through this
	// (it cannot import crypto/x509: statemachine.ParseCA).
	statemachine.ParseCA = func(certPEM []byte) (string, bool, error) {
		cert, err := pki.ParseCertificate(certPEM)
		if err != nil {
			return "", false, err
		}
		return pki.Fingerprint(cert), cert.IsCA, nil
	}
}

// FSM is the cluster's state machine (statemachine.FSM) as raft's FSM:
// a thin adapter from raft's log entries, snapshots and sinks to the
// state machine's, which knows nothing of raft.
type FSM struct{ *statemachine.FSM }

// applied is the read side of this node's state (statemachine.Reads):
// Cluster, Local and LocalMember embed it.
type applied = statemachine.Reads

func newFSM() *FSM { return &FSM{statemachine.New()} }

// Apply implements raft.FSM.
func (f *FSM) Apply(entry *raft.Log) any {
	return f.ApplyBatch([]*raft.Log{entry})[0]
}

// ApplyBatch implements raft.BatchingFSM: the batch is applied under one
// lock and with one wake-up. An entry that is no command (a
// configuration change, a barrier) only advances the applied index.
func (f *FSM) ApplyBatch(logs []*raft.Log) []any {
	entries := make([]statemachine.Entry, len(logs))
	for i, l := range logs {
		entries[i] = statemachine.Entry{Index: l.Index, Time: l.AppendedAt}
		if l.Type == raft.LogCommand {
			entries[i].Data = l.Data
		}
	}
	return f.ApplyEntries(entries)
}

// Snapshot implements raft.FSM.
func (f *FSM) Snapshot() (raft.FSMSnapshot, error) {
	data, err := f.FSM.Snapshot()
	if err != nil {
		return nil, err
	}
	return fsmSnapshot(data), nil
}

// Restore implements raft.FSM.
func (f *FSM) Restore(reader io.ReadCloser) error {
	defer reader.Close()
	return f.FSM.Restore(reader)
}

type fsmSnapshot []byte

func (s fsmSnapshot) Persist(sink raft.SnapshotSink) error {
	if _, err := sink.Write(s); err != nil {
		sink.Cancel()
		return err
	}
	return sink.Close()
}

func (s fsmSnapshot) Release() {}
