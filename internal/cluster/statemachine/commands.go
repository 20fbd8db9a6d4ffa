package statemachine

import (
	"context"
	"encoding/json"
	"fmt"
	"time"
)

// Proposer commits one encoded log entry (a command type byte and its
// payload, as encodeCommand makes it) and returns the result the
// leader's FSM computed for it, as JSON, and the entry's index. It
// returns once the proposing node has applied the entry too (or could
// not wait for it), so a caller reads its own writes.
//
// Cluster implements it with raft (propose through the leader, or
// forward to it); LocalMember and Local with the simulation's log. It is
// safe for concurrent use.
type Proposer interface {
	Propose(ctx context.Context, data []byte) (result json.RawMessage, index uint64, err error)
}

// Commands builds every command the runtime proposes, once: each method
// checks its arguments, stamps the time (the FSM never reads the clock),
// encodes the command and proposes it through its Proposer, and decodes
// the result. Cluster, Local and LocalMember each hold one, so a command
// is never written twice. It is safe for concurrent use.
type Commands struct {
	proposer Proposer
	// fsm is the proposing node's applied state, for what a command
	// reads before it is proposed (the cluster's copies, the rotation
	// under way).
	fsm *FSM
	// node and incarnation name the proposing process: the lock owner,
	// the node reporting a step of a rotation.
	node, incarnation string
}

// NewCommands returns the commands of node's process incarnation,
// proposed through p; fsm is its applied state.
func NewCommands(p Proposer, fsm *FSM, node, incarnation string) *Commands {
	return &Commands{proposer: p, fsm: fsm, node: node, incarnation: incarnation}
}

// propose encodes payload as a command of type t, proposes it and
// decodes its result into out (nil: the result is dropped).
func (c *Commands) propose(ctx context.Context, t commandType, payload any, out any) error {
	data, err := encodeProposal(t, payload)
	if err != nil {
		return err
	}
	value, _, err := c.proposer.Propose(ctx, data)
	if err != nil || out == nil {
		return err
	}
	return json.Unmarshal(value, out)
}

func now() time.Time { return time.Now().UTC() }

// Format fixes the cluster's copies and object size, once.
func (c *Commands) Format(ctx context.Context, copies int, objectSize uint64) (Format, error) {
	var f Format
	if err := validateFormat(copies, objectSize); err != nil {
		return f, err
	}
	err := c.propose(ctx, commandFormat, formatCommand{Copies: copies, ObjectSize: objectSize, Time: now()}, &f)
	return f, err
}

// NodeJoin commits node n (or its new process) as alive; it returns the
// epoch.
func (c *Commands) NodeJoin(ctx context.Context, n Node) (uint64, error) {
	var epoch uint64
	err := c.propose(ctx, commandNodeJoin, nodeJoinCommand{Node: n, Time: now()}, &epoch)
	return epoch, err
}

// NodeLeave commits node id as gone, for reason; it returns the epoch.
func (c *Commands) NodeLeave(ctx context.Context, id, reason string) (uint64, error) {
	var epoch uint64
	err := c.propose(ctx, commandNodeLeave, nodeLeaveCommand{ID: id, Reason: reason, Time: now()}, &epoch)
	return epoch, err
}

// CreateVDI creates a VDI, exclusive or not, with copies copies (0: the
// cluster's number) or erasure-coded with scheme ("K+M"; "": copies).
// Another number than the cluster's needs FeatureVDICopies, a scheme
// FeatureErasureCoding, which requires checks (nil: no check). A scheme
// and copies are not asked for together: an erasure-coded VDI has M+1.
func (c *Commands) CreateVDI(ctx context.Context, name string, size uint64, exclusive bool, copies int, scheme string, requires func(Feature) error) (VDI, error) {
	var v VDI
	if err := ValidateName(name); err != nil {
		return v, err
	}
	if err := ValidateSize(size, 0); err != nil {
		return v, err
	}
	command := vdiCreateCommand{Name: name, Size: size, Exclusive: exclusive, Time: now()}
	if scheme != "" {
		if copies != 0 {
			return v, errCopiesWithScheme(scheme, copies)
		}
		parsed, err := parseScheme(scheme)
		if err != nil {
			return v, err
		}
		// Below the level an older binary would drop the field and
		// create a VDI of copies.
		if requires != nil {
			if err := requires(FeatureErasureCoding); err != nil {
				return v, err
			}
		}
		command.EC = parsed.String()
	} else if copies != 0 {
		if err := validateCopies(copies); err != nil {
			return v, err
		}
		var format int
		c.fsm.View(func(s *State) {
			if s.Format != nil {
				format = s.Format.Copies
			}
		})
		// The cluster's own number needs no field: an older binary
		// creates the same VDI from the command without it.
		if copies != format {
			if requires != nil {
				if err := requires(FeatureVDICopies); err != nil {
					return v, err
				}
			}
			command.Copies = copies
		}
	}
	err := c.propose(ctx, commandVDICreate, command, &v)
	return v, err
}

// SnapshotVDI freezes a VDI's content as NAME@TAG; holder is the node
// the caller saw holding its write lock ("" for none).
func (c *Commands) SnapshotVDI(ctx context.Context, name, tag, holder string) (SnapshotResult, error) {
	var r SnapshotResult
	if tag != "" {
		if err := ValidateTag(tag); err != nil {
			return r, err
		}
	}
	err := c.propose(ctx, commandVDISnapshot, vdiSnapshotCommand{Name: name, Tag: tag, Holder: holder, Time: now()}, &r)
	return r, err
}

// CloneVDI creates a writable VDI sharing a snapshot's objects.
func (c *Commands) CloneVDI(ctx context.Context, snapshot, name string) (VDI, error) {
	var v VDI
	if err := ValidateName(name); err != nil {
		return v, err
	}
	err := c.propose(ctx, commandVDIClone, vdiCloneCommand{Snapshot: snapshot, Name: name, Time: now()}, &v)
	return v, err
}

// RollbackVDI makes a VDI's content a snapshot's again.
func (c *Commands) RollbackVDI(ctx context.Context, name, tag string) (VDI, error) {
	var v VDI
	err := c.propose(ctx, commandVDIRollback, vdiRollbackCommand{Name: name, Tag: tag, Time: now()}, &v)
	return v, err
}

// GarbageDone records that a VDI's objects were freed.
func (c *Commands) GarbageDone(ctx context.Context, id uint32) error {
	return c.propose(ctx, commandGarbageDone, garbageDoneCommand{ID: id}, nil)
}

// DeleteVDI removes a VDI (NAME) or a snapshot (NAME@TAG).
func (c *Commands) DeleteVDI(ctx context.Context, name string) error {
	return c.propose(ctx, commandVDIDelete, vdiDeleteCommand{Name: name}, nil)
}

// SetFull marks the proposing node full (it takes no objects) or not.
func (c *Commands) SetFull(ctx context.Context, full bool) error {
	return c.propose(ctx, commandNodeSpace, nodeSpaceCommand{ID: c.node, Full: full, Time: now()}, nil)
}

// MarkVDIRepaired clears a VDI's unclean mark.
func (c *Commands) MarkVDIRepaired(ctx context.Context, name string) error {
	return c.propose(ctx, commandVDIRepaired, vdiRepairedCommand{Name: name}, nil)
}

// MarkVDIUnclean marks a VDI whose replicas may differ.
func (c *Commands) MarkVDIUnclean(ctx context.Context, name string) error {
	return c.propose(ctx, commandVDIUnclean, vdiRepairedCommand{Name: name}, nil)
}

// ResizeVDI grows a VDI.
func (c *Commands) ResizeVDI(ctx context.Context, name string, size uint64) (VDI, error) {
	var v VDI
	err := c.propose(ctx, commandVDIResize, vdiResizeCommand{Name: name, Size: size}, &v)
	return v, err
}

// AcquireLock claims key for session of the proposing process.
func (c *Commands) AcquireLock(ctx context.Context, key, session string) (Lock, error) {
	var l Lock
	err := c.propose(ctx, commandLockAcquire, lockCommand{Key: key, Node: c.node, Incarnation: c.incarnation, Session: session, Time: now()}, &l)
	return l, err
}

// ReleaseLock releases key held by session of the proposing process.
func (c *Commands) ReleaseLock(ctx context.Context, key, session string) error {
	return c.propose(ctx, commandLockRelease, lockCommand{Key: key, Node: c.node, Incarnation: c.incarnation, Session: session}, nil)
}

// WantLock claims key for session of the proposing process, or records
// that it wants it (handover.go).
func (c *Commands) WantLock(ctx context.Context, key, session string) (LockWant, error) {
	var w LockWant
	err := c.propose(ctx, commandLockWant, lockCommand{Key: key, Node: c.node, Incarnation: c.incarnation, Session: session, Time: now()}, &w)
	return w, err
}

// HandOverLock moves key, held by session of the proposing node, to to.
func (c *Commands) HandOverLock(ctx context.Context, key, session string, to LockOwner) error {
	return c.propose(ctx, commandLockHandover, lockHandoverCommand{Key: key, FromNode: c.node, FromSession: session, To: to, Time: now()}, nil)
}

// BreakLock takes key away from its holder, asked by by.
func (c *Commands) BreakLock(ctx context.Context, key, by string) (Lock, error) {
	var l Lock
	err := c.propose(ctx, commandLockBreak, lockBreakCommand{Key: key, By: by, Time: now()}, &l)
	return l, err
}

// SetVDI changes a VDI's settings.
func (c *Commands) SetVDI(ctx context.Context, name string, settings VDISettings) (VDI, error) {
	var v VDI
	if settings.empty() {
		return v, fmt.Errorf("%w: nothing to change: give %s", ErrInvalid, settingFlags)
	}
	if err := settings.validate(); err != nil {
		return v, err
	}
	err := c.propose(ctx, commandVDISet, vdiSetCommand{Name: name, Settings: settings}, &v)
	return v, err
}

// LayerMerged records that child holds every object it read through the
// deleted layer, whose parent was parent when the job began.
func (c *Commands) LayerMerged(ctx context.Context, layer, child, parent uint32) error {
	return c.propose(ctx, commandVDILayer, vdiLayerCommand{Op: layerMerged, ID: layer, Child: child, Parent: &parent, Time: now()}, nil)
}

// FlattenVDI asks for the writable VDI name to be flattened.
func (c *Commands) FlattenVDI(ctx context.Context, name string) (VDI, error) {
	var v VDI
	err := c.propose(ctx, commandVDILayer, vdiLayerCommand{Op: layerFlatten, Name: name, Time: now()}, &v)
	return v, err
}

// LayerFlattened records that child holds every object it read through
// its ancestors, parent the nearest.
func (c *Commands) LayerFlattened(ctx context.Context, child, parent uint32) error {
	return c.propose(ctx, commandVDILayer, vdiLayerCommand{Op: layerFlattened, ID: parent, Child: child, Time: now()}, nil)
}

// SetNode changes node id's capacity or zone.
func (c *Commands) SetNode(ctx context.Context, id string, settings NodeSettings) (Node, error) {
	var n Node
	if settings.Zone != nil && !zoneRegexp.MatchString(*settings.Zone) {
		return n, fmt.Errorf("%w: zone %q: use up to 64 letters, digits, '.', '_' or '-' (\"\" for none)", ErrInvalid, *settings.Zone)
	}
	if settings.Capacity == nil && settings.Zone == nil && !settings.Reset {
		return n, fmt.Errorf("%w: give --capacity, --zone or --reset", ErrInvalid)
	}
	err := c.propose(ctx, commandNodeSet, nodeSetCommand{ID: id, Settings: settings, Time: now()}, &n)
	return n, err
}

// Drain starts (drain true) or cancels the drain of node id.
func (c *Commands) Drain(ctx context.Context, id string, drain bool) (Node, error) {
	var n Node
	err := c.propose(ctx, commandNodeDrain, nodeDrainCommand{ID: id, Drain: drain, Time: now()}, &n)
	return n, err
}

// SetMaintenance opens a maintenance window of node id from at until
// until (zero: ends it).
func (c *Commands) SetMaintenance(ctx context.Context, id string, at, until time.Time) (Node, error) {
	var n Node
	err := c.propose(ctx, commandNodeMaintenance, nodeMaintenanceCommand{ID: id, Until: until, Time: at}, &n)
	return n, err
}

// StopWindow opens the proposing node's down-out window as it stops
// cleanly, from at until until (depart.go).
func (c *Commands) StopWindow(ctx context.Context, at, until time.Time) error {
	return c.propose(ctx, commandNodeMaintenance, nodeMaintenanceCommand{ID: c.node, Until: until, Time: at, Stop: true}, nil)
}

// RaiseLevel raises the cluster's feature level to level; admitted (from
// below LevelSecurity) admits each member with its certificate's serial.
// It returns the level the cluster is at.
func (c *Commands) RaiseLevel(ctx context.Context, level int, admitted map[string]string) (int, error) {
	var out int
	err := c.propose(ctx, commandFeatureLevel, featureLevelCommand{Level: level, Time: now(), Admitted: admitted}, &out)
	return out, err
}

// Admit records that node id may join with the certificate of serial,
// through join token joinToken ("": the cluster's join secret).
func (c *Commands) Admit(ctx context.Context, id, serial, joinToken string) error {
	if err := validAdmission(id, serial); err != nil {
		return err
	}
	return c.propose(ctx, commandNodeAdmit, nodeAdmitCommand{ID: id, Serial: serial, Time: now(), JoinToken: joinToken}, nil)
}

// InitSecurity records the join secret's hash and the first admin token,
// raises the cluster to level and admits node self with serial.
func (c *Commands) InitSecurity(ctx context.Context, joinHash string, admin Token, level int, self, serial string) error {
	return c.propose(ctx, commandSecurityInit, securityInitCommand{JoinHash: joinHash, Admin: admin, Level: level,
		Self: &nodeAdmitCommand{ID: self, Serial: serial, Time: now()}}, nil)
}

// SetJoinHash replaces the join secret.
func (c *Commands) SetJoinHash(ctx context.Context, hash string) error {
	return c.propose(ctx, commandJoinSecretSet, joinSecretCommand{Hash: hash}, nil)
}

// CreateToken records a new admin token. The data scope of a read-only
// token needs FeatureDataScope, which requires checks.
func (c *Commands) CreateToken(ctx context.Context, t Token, requires func(Feature) error) (Token, error) {
	if err := validToken(t); err != nil {
		return Token{}, err
	}
	if t.Data && !t.ReadOnly {
		return Token{}, fmt.Errorf("%w: the data scope is for read-only tokens: an admin token reads VDI data already", ErrInvalid)
	}
	if t.Data && requires != nil {
		if err := requires(FeatureDataScope); err != nil {
			return Token{}, err
		}
	}
	t.Created = now()
	var created Token
	err := c.propose(ctx, commandTokenCreate, t, &created)
	return created, err
}

// RevokeToken revokes a token by id or name.
func (c *Commands) RevokeToken(ctx context.Context, idOrName string) (Token, error) {
	var t Token
	err := c.propose(ctx, commandTokenRevoke, tokenRevokeCommand{ID: idOrName}, &t)
	return t, err
}

// AddClient records an NBD client certificate's authorization.
func (c *Commands) AddClient(ctx context.Context, client Client) (Client, error) {
	if err := ValidateCredentialName("client", client.Name); err != nil {
		return Client{}, err
	}
	if err := ValidatePattern(client.Pattern); err != nil {
		return Client{}, err
	}
	client.Created = now()
	var added Client
	err := c.propose(ctx, commandClientAdd, client, &added)
	return added, err
}

// RevokeClient revokes an NBD client.
func (c *Commands) RevokeClient(ctx context.Context, name string) (Client, error) {
	var client Client
	err := c.propose(ctx, commandClientRevoke, clientRevokeCommand{Name: name}, &client)
	return client, err
}

// RemoveNode forgets a dead node for good.
func (c *Commands) RemoveNode(ctx context.Context, id string) error {
	return c.propose(ctx, commandNodeRemove, nodeRemoveCommand{ID: id, Time: now()}, nil)
}

// CreateJoinToken records join token id for secretHash, valid for ttl
// and uses admissions (0: any number).
func (c *Commands) CreateJoinToken(ctx context.Context, id, secretHash string, ttl time.Duration, uses int) (JoinToken, error) {
	if ttl <= 0 || ttl > MaxJoinTokenTTL {
		return JoinToken{}, fmt.Errorf("%w: a join token lives from 1s to %v, not %v", ErrInvalid, MaxJoinTokenTTL, ttl)
	}
	if uses < 0 {
		return JoinToken{}, fmt.Errorf("%w: uses %d", ErrInvalid, uses)
	}
	at := now()
	var t JoinToken
	err := c.propose(ctx, commandJoinTokenCreate, JoinToken{ID: id, Hash: secretHash, Created: at, Expires: at.Add(ttl), Uses: uses}, &t)
	return t, err
}

// RevokeJoinToken revokes a join token.
func (c *Commands) RevokeJoinToken(ctx context.Context, id string) (JoinToken, error) {
	var t JoinToken
	err := c.propose(ctx, commandJoinTokenRevoke, joinTokenRevokeCommand{ID: id}, &t)
	return t, err
}

// StartCARotation records a new CA (its PEM certificate and fingerprint),
// whose key holder holds.
func (c *Commands) StartCARotation(ctx context.Context, fingerprint string, certPEM []byte, holder string) (CAState, error) {
	var s CAState
	err := c.propose(ctx, commandCA, caCommand{Op: caStart, Fingerprint: fingerprint, Cert: certPEM, Node: holder, Time: now()}, &s)
	return s, err
}

// RecordCACertificate records the proposing node's certificate (serial)
// from the new CA of fingerprint.
func (c *Commands) RecordCACertificate(ctx context.Context, fingerprint, serial string) error {
	return c.propose(ctx, commandCA, caCommand{Op: caCertificate, Fingerprint: fingerprint, Node: c.node, Serial: serial, Time: now()}, nil)
}

// FinishCARotation makes the new CA of the rotation under way the
// cluster's; with force, although nodes that are down have no
// certificate from it.
func (c *Commands) FinishCARotation(ctx context.Context, force bool) (CAState, error) {
	r := c.caRotation()
	if r == nil {
		return CAState{}, fmt.Errorf("%w: no CA rotation is under way (herd cluster rotate-ca starts one)", ErrNotFound)
	}
	var s CAState
	err := c.propose(ctx, commandCA, caCommand{Op: caFinish, Fingerprint: r.Fingerprint, Force: force, Time: now()}, &s)
	return s, err
}

// CancelCARotation drops the new CA of the rotation under way.
func (c *Commands) CancelCARotation(ctx context.Context) (CAState, error) {
	r := c.caRotation()
	if r == nil {
		return CAState{}, fmt.Errorf("%w: no CA rotation is under way", ErrNotFound)
	}
	var s CAState
	err := c.propose(ctx, commandCA, caCommand{Op: caCancel, Fingerprint: r.Fingerprint, Time: now()}, &s)
	return s, err
}

func (c *Commands) caRotation() (r *CARotation) {
	c.fsm.View(func(s *State) { r = copyCAState(s.CA).Rotation })
	return r
}

// StartGossipKeyRotation starts a rotation to the gossip key of id,
// which holder made.
func (c *Commands) StartGossipKeyRotation(ctx context.Context, id, holder string) (GossipKeyRotation, error) {
	var r GossipKeyRotation
	err := c.propose(ctx, commandGossipKey, gossipKeyCommand{Op: gossipKeyStart, Key: id, Node: holder, Time: now()}, &r)
	return r, err
}

// ReportGossipKey reports that the proposing node holds the gossip key of
// id (using false) or encrypts with it (using true).
func (c *Commands) ReportGossipKey(ctx context.Context, id string, using bool) error {
	op := gossipKeyInstalled
	if using {
		op = gossipKeyUsing
	}
	return c.propose(ctx, commandGossipKey, gossipKeyCommand{Op: op, Key: id, Node: c.node, Time: now()}, nil)
}

// GossipKeyStep commits the leader's step op (GossipKeySwitch or
// GossipKeyDone) of the rotation to the gossip key of id.
func (c *Commands) GossipKeyStep(ctx context.Context, op, id string) error {
	return c.propose(ctx, commandGossipKey, gossipKeyCommand{Op: op, Key: id, Time: now()}, nil)
}
