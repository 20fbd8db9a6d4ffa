package cluster

// The trust records on Local (the log without raft, local.go): admission
// at LevelSecurity, CA rotation (carotation.go) and gossip key rotation
// (gossipkeys.go), committed through the real commands and FSM, for the
// simulator (internal/sim) and for the node's side of a rotation in tests
// (server/trust_test.go). Local stands for the leader: what an operator's
// command or the leader's loop commits is a Local method; what a node
// reports is a LocalMember method, committed only while the member
// reaches the leader, as Cluster.propose.

import (
	"context"
	"crypto/x509"
	"fmt"
	"slices"

	"github.com/herd-storage/herd/internal/pki"
)

// InitSecurity raises the cluster to LevelSecurity as a first node of
// this version does (Cluster.InitSecurity), admitting each node of
// admitted (id to its node certificate's serial; first the one named
// first, the rest in any order): from then on the log names the
// certificate each node may use on the peer port.
func (l *Local) InitSecurity(first string, admitted map[string]string) error {
	self, ok := admitted[first]
	if !ok {
		return fmt.Errorf("%w: the first node %s has no serial", ErrInvalid, first)
	}
	ctx := context.Background()
	if err := l.cmds.InitSecurity(ctx, "sim", Token{ID: "sim", Name: "admin", Hash: "sim"}, LevelSecurity, first, self); err != nil {
		return err
	}
	ids := make([]string, 0, len(admitted))
	for id := range admitted {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		if id == first {
			continue
		}
		if err := l.cmds.Admit(ctx, id, admitted[id], ""); err != nil {
			return err
		}
	}
	return nil
}

// FinalizeSecurity raises the cluster to LevelSecurity as `herd cluster
// finalize-upgrade` does from an older level: every member is admitted
// with the serial of its node certificate in admitted (what each proved
// in a handshake with the proposer). It returns the level.
func (l *Local) FinalizeSecurity(admitted map[string]string) (int, error) {
	return l.cmds.RaiseLevel(context.Background(), LevelSecurity, admitted)
}

// StartCARotation commits the start of a rotation to the CA of certPEM,
// whose key holder holds (`herd cluster rotate-ca`).
func (l *Local) StartCARotation(certPEM []byte, holder string) (CAState, error) {
	cert, err := pki.ParseCertificate(certPEM)
	if err != nil {
		return CAState{}, err
	}
	return l.cmds.StartCARotation(context.Background(), pki.Fingerprint(cert), certPEM, holder)
}

// FinishCARotation commits the end of the rotation under way (`rotate-ca
// --finish [--force]`); the log refuses it while a node has no
// certificate from the new CA.
func (l *Local) FinishCARotation(force bool) (CAState, error) {
	return l.cmds.FinishCARotation(context.Background(), force)
}

// CancelCARotation commits the cancel of the rotation under way.
func (l *Local) CancelCARotation() (CAState, error) {
	return l.cmds.CancelCARotation(context.Background())
}

// StartGossipKeyRotation commits the start of a rotation to the gossip
// key of id, made by holder (`herd cluster rotate-gossip-key`).
func (l *Local) StartGossipKeyRotation(id, holder string) error {
	_, err := l.cmds.StartGossipKeyRotation(context.Background(), id, holder)
	return err
}

// AdvanceGossipKeyRotation is the leader's turn of gossipKeyLoop: it
// commits the switch once every alive member installed the key, the end
// once every alive member uses it. It returns the step committed ("":
// none is due yet).
func (l *Local) AdvanceGossipKeyRotation() (string, error) {
	var r *GossipKeyRotation
	var missingInstall, missingUse []string
	l.fsm.View(func(s *State) {
		if s.GossipKeys.Rotation != nil {
			copied := s.GossipKeys.Clone()
			r = copied.Rotation
			missingInstall, missingUse = s.Missing(r.Installed), s.Missing(r.Using)
		}
	})
	switch {
	case r == nil:
		return "", nil
	case r.Phase == GossipKeyInstall && len(missingInstall) == 0:
		return GossipKeyOpSwitch, l.cmds.GossipKeyStep(context.Background(), GossipKeyOpSwitch, r.Key)
	case r.Phase == GossipKeyUse && len(missingUse) == 0:
		return GossipKeyOpDone, l.cmds.GossipKeyStep(context.Background(), GossipKeyOpDone, r.Key)
	}
	return "", nil
}

// CommitGossipKeyStep commits a step of the gossip key rotation under way
// as given (switch or done), whether or not it is due: how a test checks
// that the log refuses a step too early.
func (l *Local) CommitGossipKeyStep(op string) error {
	r := l.GossipKeyState().Rotation
	if r == nil {
		return fmt.Errorf("%w: no gossip key rotation is under way", ErrNotFound)
	}
	return l.cmds.GossipKeyStep(context.Background(), op, r.Key)
}

// Sync waits until this member applied everything committed, as
// Cluster.Sync does after the leader's read index; a member that does not
// reach the leader cannot (ErrNoQuorum).
func (m *LocalMember) Sync(ctx context.Context) error {
	m.mu.Lock()
	connected := m.connected && !m.stopped
	m.mu.Unlock()
	if !connected {
		return fmt.Errorf("%w: the leader is unreachable from node %s", ErrNoQuorum, m.id)
	}
	return m.fsm.WaitApplied(ctx, m.log.Len())
}

// StartCARotation commits the start of a rotation to cert's CA, whose key
// this member's node holds (Cluster.StartCARotation).
func (m *LocalMember) StartCARotation(ctx context.Context, cert *x509.Certificate, certPEM []byte) (CAState, error) {
	return m.cmds.StartCARotation(ctx, pki.Fingerprint(cert), certPEM, m.id)
}

// RecordCACertificate records this member's node certificate from the new
// CA (Cluster.RecordCACertificate).
func (m *LocalMember) RecordCACertificate(ctx context.Context, fingerprint, serial string) error {
	return m.cmds.RecordCACertificate(ctx, fingerprint, serial)
}

// ReportGossipKey reports that this member's node holds the gossip key of
// id (using false) or encrypts with it (using true), as gossipKeyLoop
// does.
func (m *LocalMember) ReportGossipKey(ctx context.Context, id string, using bool) error {
	return m.cmds.ReportGossipKey(ctx, id, using)
}
