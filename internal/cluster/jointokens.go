package cluster

import (
	"context"
	"fmt"
	"time"

	"github.com/herd-storage/herd/internal/pki"
)

// CreateJoinToken records a join token for secretHash, valid for ttl and
// uses admissions (0: any number).
func (c *Cluster) CreateJoinToken(ctx context.Context, secretHash string, ttl time.Duration, uses int) (JoinToken, error) {
	if err := c.Requires(FeatureJoinTokens); err != nil {
		return JoinToken{}, err
	}
	return c.cmds().CreateJoinToken(ctx, pki.NewTokenID(), secretHash, ttl, uses)
}

// RevokeJoinToken revokes a join token: joins with it are refused on
// every node once this returns (the join handler reads after a read
// index).
func (c *Cluster) RevokeJoinToken(ctx context.Context, id string) (JoinToken, error) {
	return c.cmds().RevokeJoinToken(ctx, id)
}

// MatchJoinSecret finds what secret is at now: the cluster's join secret
// (tokenID ""), a valid join token, or neither (an error saying why: a
// token that matches but expired, was used up or revoked is named).
func (c *Cluster) MatchJoinSecret(secret string, now time.Time) (tokenID string, err error) {
	err = errWrongJoinSecret
	c.fsm.View(func(s *State) {
		if s.JoinHash != "" && pki.SecretMatches(s.JoinHash, secret) {
			err = nil
			return
		}
		for id, t := range s.JoinTokens {
			if !pki.SecretMatches(t.Hash, secret) {
				continue
			}
			probe := *t
			scratch := &State{JoinTokens: map[string]*JoinToken{id: &probe}}
			tokenID, err = id, scratch.UseJoinToken(id, now)
			return
		}
	})
	return tokenID, err
}

var errWrongJoinSecret = fmt.Errorf("%w: wrong join secret (the token was rotated, revoked or is from another cluster)", ErrUnauthorized)
