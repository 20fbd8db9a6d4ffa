package cluster

import (
	"context"
	"crypto/tls"
	"fmt"
	"sort"
	"time"

	"github.com/herd-storage/herd/internal/peer"
	"github.com/herd-storage/herd/internal/pki"
)

// Admit records that node id may join with the certificate of serial,
// through join token joinToken ("": the cluster's join secret).
func (c *Cluster) Admit(ctx context.Context, id, serial, joinToken string) error {
	return c.cmds().Admit(ctx, id, serial, joinToken)
}

// memberSerials asks every member of the log (not removed) for its node
// certificate in a TLS handshake on its peer port and returns each one's
// serial: what the finalize to LevelSecurity records (a member proves the
// certificate it holds; gossip's word is not taken).
func (c *Cluster) memberSerials(ctx context.Context) (map[string]string, error) {
	creds := c.cfg.PeerCredentials
	if creds == nil || creds.Leaf() == nil {
		return nil, fmt.Errorf("%w: this node has no peer certificate to ask the others with", ErrInvalid)
	}
	type member struct{ id, address string }
	var members []member
	c.fsm.View(func(s *State) {
		for id, n := range s.Nodes {
			if _, removed := s.Removed[id]; !removed {
				members = append(members, member{id, n.PeerAddr})
			}
		}
	})
	sort.Slice(members, func(i, j int) bool { return members[i].id < members[j].id })
	serials := map[string]string{}
	for _, m := range members {
		if m.id == c.cfg.NodeID {
			serials[m.id] = pki.Serial(creds.Leaf())
			continue
		}
		dialCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		conn, err := peer.Dial(dialCtx, m.address, creds, peer.ProtocolForward)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("%w: cannot ask node %s (%s) for its certificate: %v", ErrUpgradeRequired, m.id, m.address, err)
		}
		state := conn.(*tls.Conn).ConnectionState()
		conn.Close()
		id, _ := pki.NodeID(state.PeerCertificates[0])
		if id != m.id {
			return nil, fmt.Errorf("%w: node %s's peer address %s answered as node %q", ErrInvalid, m.id, m.address, id)
		}
		serials[m.id] = pki.Serial(state.PeerCertificates[0])
	}
	return serials, nil
}
