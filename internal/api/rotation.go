package api

// Rotations of the cluster's secrets (cluster/gossipkeys.go).

import (
	"context"
	"net/http"

	"github.com/herd-storage/herd/internal/cluster"
)

func (s *Server) rotationRoutes(mux *http.ServeMux) {
	c := s.cluster
	// A new gossip key, made here; the rotation goes on by itself: GET
	// tells how far it is.
	s.handle(mux, "POST /v1/cluster/gossip-key/rotate", func(r *http.Request) (any, error) {
		return c.RotateGossipKey(r.Context(), cluster.NewGossipKey())
	})
	s.handle(mux, "GET /v1/cluster/gossip-key", func(r *http.Request) (any, error) {
		c.SyncForRead(r.Context())
		return c.GossipKeyState(), nil
	})
}

// RotateGossipKey starts a gossip key rotation.
func (c *Client) RotateGossipKey(ctx context.Context) (cluster.GossipKeyRotation, error) {
	var v cluster.GossipKeyRotation
	return v, c.Do(ctx, http.MethodPost, "/v1/cluster/gossip-key/rotate", nil, &v)
}

// GossipKey is the log's record of the gossip key and its rotation.
func (c *Client) GossipKey(ctx context.Context) (cluster.GossipKeyring, error) {
	var v cluster.GossipKeyring
	return v, c.Do(ctx, http.MethodGet, "/v1/cluster/gossip-key", nil, &v)
}
