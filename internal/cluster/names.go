package cluster

// The state machine's names, as the rest of herd knew them before it
// became a package of its own (internal/cluster/statemachine): aliases,
// so that callers need no change.

import (
	"github.com/herd-storage/herd/internal/cluster/statemachine"
)

type (
	Build             = statemachine.Build
	BuildInfo         = statemachine.BuildInfo
	CARotation        = statemachine.CARotation
	CAState           = statemachine.CAState
	Client            = statemachine.Client
	Commands          = statemachine.Commands
	Epoch             = statemachine.Epoch
	EpochView         = statemachine.EpochView
	Event             = statemachine.Event
	Feature           = statemachine.Feature
	Format            = statemachine.Format
	Garbage           = statemachine.Garbage
	GossipKeyRotation = statemachine.GossipKeyRotation
	GossipKeyring     = statemachine.GossipKeyring
	JoinToken         = statemachine.JoinToken
	LayerJob          = statemachine.LayerJob
	LimitSettings     = statemachine.LimitSettings
	Limits            = statemachine.Limits
	Lock              = statemachine.Lock
	LockHeldError     = statemachine.LockHeldError
	LockOwner         = statemachine.LockOwner
	LockWant          = statemachine.LockWant
	Member            = statemachine.Member
	Node              = statemachine.Node
	NodeSettings      = statemachine.NodeSettings
	NodeState         = statemachine.NodeState
	Proposer          = statemachine.Proposer
	RemoteError       = statemachine.RemoteError
	RetiredCA         = statemachine.RetiredCA
	Sentinel          = statemachine.Sentinel
	SnapshotResult    = statemachine.SnapshotResult
	State             = statemachine.State
	Token             = statemachine.Token
	VDI               = statemachine.VDI
	VDISettings       = statemachine.VDISettings
)

const (
	AckAll              = statemachine.AckAll
	AckZone             = statemachine.AckZone
	DefaultJoinTokenTTL = statemachine.DefaultJoinTokenTTL
	DefaultObjectSize   = statemachine.DefaultObjectSize
	GossipKeyInstall    = statemachine.GossipKeyInstall
	GossipKeyOpDone     = statemachine.GossipKeyOpDone
	GossipKeyOpSwitch   = statemachine.GossipKeyOpSwitch
	GossipKeyUse        = statemachine.GossipKeyUse
	LevelBase           = statemachine.LevelBase
	LevelCopyDigests    = statemachine.LevelCopyDigests
	LevelErasureCoding  = statemachine.LevelErasureCoding
	LevelSessionProof   = statemachine.LevelSessionProof
	LevelSecurity       = statemachine.LevelSecurity
	LevelVDICopies      = statemachine.LevelVDICopies
	MaxAddressLength    = statemachine.MaxAddressLength
	MaxBPSLimit         = statemachine.MaxBPSLimit
	MaxCopies           = statemachine.MaxCopies
	MaxCredentialName   = statemachine.MaxCredentialName
	MaxEvents           = statemachine.MaxEvents
	MaxIOPSLimit        = statemachine.MaxIOPSLimit
	MaxJoinTokenTTL     = statemachine.MaxJoinTokenTTL
	MaxLockKeyLength    = statemachine.MaxLockKeyLength
	MaxMaintenance      = statemachine.MaxMaintenance
	MaxNameLength       = statemachine.MaxNameLength
	MaxObjectSize       = statemachine.MaxObjectSize
	MaxOwnerLength      = statemachine.MaxOwnerLength
	MaxReasonLength     = statemachine.MaxReasonLength
	MaxVDIID            = statemachine.MaxVDIID
	MaxZoneLength       = statemachine.MaxZoneLength
	MinBPSLimit         = statemachine.MinBPSLimit
	MinObjectSize       = statemachine.MinObjectSize
	NodeAlive           = statemachine.NodeAlive
	NodeDead            = statemachine.NodeDead
	SectorSize          = statemachine.SectorSize
	SupportedLevel      = statemachine.SupportedLevel
)

var (
	ErrAlreadyExists         = statemachine.ErrAlreadyExists
	ErrAlreadyFormatted      = statemachine.ErrAlreadyFormatted
	ErrBusy                  = statemachine.ErrBusy
	ErrExhausted             = statemachine.ErrExhausted
	ErrForbidden             = statemachine.ErrForbidden
	ErrIncompatible          = statemachine.ErrIncompatible
	ErrInvalid               = statemachine.ErrInvalid
	ErrLockHeld              = statemachine.ErrLockHeld
	ErrNoQuorum              = statemachine.ErrNoQuorum
	ErrNotFormatted          = statemachine.ErrNotFormatted
	ErrNotFound              = statemachine.ErrNotFound
	ErrNotLockOwner          = statemachine.ErrNotLockOwner
	ErrShrink                = statemachine.ErrShrink
	ErrTooFewNodes           = statemachine.ErrTooFewNodes
	ErrUnauthorized          = statemachine.ErrUnauthorized
	ErrUpgradeRequired       = statemachine.ErrUpgradeRequired
	FeatureCARotation        = statemachine.FeatureCARotation
	FeatureDataScope         = statemachine.FeatureDataScope
	FeatureErasureCoding     = statemachine.FeatureErasureCoding
	FeatureGossipKeyRotation = statemachine.FeatureGossipKeyRotation
	FeatureJoinTokens        = statemachine.FeatureJoinTokens
	FeatureLayerMerge        = statemachine.FeatureLayerMerge
	FeatureVDICopies         = statemachine.FeatureVDICopies
)

// CheckNodeLengths is statemachine.CheckNodeLengths.
func CheckNodeLengths(n Node) error { return statemachine.CheckNodeLengths(n) }

// ErrorCode is statemachine.ErrorCode.
func ErrorCode(err error) string { return statemachine.ErrorCode(err) }

// ErrorFromCode is statemachine.ErrorFromCode.
func ErrorFromCode(code, message string) error { return statemachine.ErrorFromCode(code, message) }

// GossipKeyID is statemachine.GossipKeyID.
func GossipKeyID(key []byte) string { return statemachine.GossipKeyID(key) }

// MatchPattern is statemachine.MatchPattern.
func MatchPattern(pattern, name string) bool { return statemachine.MatchPattern(pattern, name) }

// MemberOf is statemachine.MemberOf.
func MemberOf(n Node) Member { return statemachine.MemberOf(n) }

// Sentinels is statemachine.Sentinels.
func Sentinels() []Sentinel { return statemachine.Sentinels() }

// SplitName is statemachine.SplitName.
func SplitName(full string) (name, tag string) { return statemachine.SplitName(full) }

// VDILockKey is statemachine.VDILockKey.
func VDILockKey(name string) string { return statemachine.VDILockKey(name) }

// ValidateCredentialName is statemachine.ValidateCredentialName.
func ValidateCredentialName(kind, name string) error {
	return statemachine.ValidateCredentialName(kind, name)
}

// ValidateName is statemachine.ValidateName.
func ValidateName(name string) error { return statemachine.ValidateName(name) }

// ValidatePattern is statemachine.ValidatePattern.
func ValidatePattern(pattern string) error { return statemachine.ValidatePattern(pattern) }

// ValidateSize is statemachine.ValidateSize.
func ValidateSize(bytes, objectSize uint64) error {
	return statemachine.ValidateSize(bytes, objectSize)
}

// ValidateTag is statemachine.ValidateTag.
func ValidateTag(tag string) error { return statemachine.ValidateTag(tag) }
