package cluster

import (
	"context"
)

// ---- operations ----

// InitSecurity records the first node's join secret hash and admin token
// unless the log already has them; it returns once committed.
//
// A new cluster starts at the feature level this binary supports, with
// this node admitted by its certificate's serial (admission.go).
func (c *Cluster) InitSecurity(ctx context.Context, joinHash string, admin Token, serial string) error {
	if c.JoinHash() != "" {
		return nil
	}
	return c.cmds().InitSecurity(ctx, joinHash, admin, SupportedLevel, c.cfg.NodeID, serial)
}

// SetJoinHash replaces the join secret (rotation); joins with the old one
// are refused once a node applied this.
func (c *Cluster) SetJoinHash(ctx context.Context, hash string) error {
	return c.cmds().SetJoinHash(ctx, hash)
}

// CreateToken records a new admin token. The data scope of a read-only
// token needs FeatureDataScope.
func (c *Cluster) CreateToken(ctx context.Context, t Token) (Token, error) {
	return c.cmds().CreateToken(ctx, t, c.Requires)
}

// RevokeToken revokes a token by id or name.
func (c *Cluster) RevokeToken(ctx context.Context, idOrName string) (Token, error) {
	return c.cmds().RevokeToken(ctx, idOrName)
}

// AddClient records an NBD client certificate's authorization.
func (c *Cluster) AddClient(ctx context.Context, client Client) (Client, error) {
	return c.cmds().AddClient(ctx, client)
}

// RevokeClient revokes an NBD client: its certificate is refused from then
// on.
func (c *Cluster) RevokeClient(ctx context.Context, name string) (Client, error) {
	return c.cmds().RevokeClient(ctx, name)
}

// RemoveNode forgets a dead node for good.
func (c *Cluster) RemoveNode(ctx context.Context, id string) error {
	return c.cmds().RemoveNode(ctx, id)
}
