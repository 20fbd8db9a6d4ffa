package api

// Rotations of the cluster's secrets (cluster/gossipkeys.go).

import (
	"context"
	"fmt"
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
	// CA rotation (cluster/carotation.go, server/trust.go): a new CA made
	// on a node holding the cluster CA's key; finish once every node has
	// a certificate from it; or cancel.
	s.handle(mux, "POST /v1/cluster/ca/rotate", func(r *http.Request) (any, error) {
		if s.sec.CA == nil {
			return nil, fmt.Errorf("%w: this node cannot rotate the CA", cluster.ErrInvalid)
		}
		return s.sec.CA.StartCARotation(r.Context())
	})
	s.handle(mux, "POST /v1/cluster/ca/finish", func(r *http.Request) (any, error) {
		var req FinishCARequest
		if err := decodeBody(r, &req); err != nil {
			return nil, err
		}
		if s.sec.CA == nil {
			state, err := c.FinishCARotation(r.Context(), req.Force)
			return FinishedCA{CAState: state}, err
		}
		state, pending, err := s.sec.CA.FinishCARotation(r.Context(), req.Force)
		return FinishedCA{CAState: state, NotApplied: pending}, err
	})
	s.handle(mux, "POST /v1/cluster/ca/cancel", func(r *http.Request) (any, error) {
		return c.CancelCARotation(r.Context())
	})
	s.handle(mux, "GET /v1/cluster/ca", func(r *http.Request) (any, error) {
		c.SyncForRead(r.Context())
		info := c.Info().CA
		if info == nil {
			return nil, fmt.Errorf("%w: this node does not say", cluster.ErrNotFound)
		}
		return info, nil
	})
}

// FinishCARequest ends a CA rotation; Force leaves nodes that are down
// without a certificate from the new CA behind (they join again).
type FinishCARequest struct {
	Force bool `json:"force,omitempty"`
}

// FinishedCA answers a finish: the CA record, and the alive nodes that
// did not trust the new CA alone yet when the node answering stopped
// waiting for them (server/trust.go's finishWait).
type FinishedCA struct {
	cluster.CAState
	NotApplied []string `json:"not_applied,omitempty"`
}

// RotateCA starts a CA rotation.
func (c *Client) RotateCA(ctx context.Context) (cluster.CAState, error) {
	var v cluster.CAState
	return v, c.Do(ctx, http.MethodPost, "/v1/cluster/ca/rotate", nil, &v)
}

// FinishCARotation ends the CA rotation under way.
func (c *Client) FinishCARotation(ctx context.Context, force bool) (FinishedCA, error) {
	var v FinishedCA
	return v, c.Do(ctx, http.MethodPost, "/v1/cluster/ca/finish", FinishCARequest{Force: force}, &v)
}

// CancelCARotation drops the new CA of the rotation under way.
func (c *Client) CancelCARotation(ctx context.Context) (cluster.CAState, error) {
	var v cluster.CAState
	return v, c.Do(ctx, http.MethodPost, "/v1/cluster/ca/cancel", nil, &v)
}

// CA is the cluster CA: fingerprint, age and any rotation under way.
func (c *Client) CA(ctx context.Context) (cluster.CAInfo, error) {
	var v cluster.CAInfo
	return v, c.Do(ctx, http.MethodGet, "/v1/cluster/ca", nil, &v)
}

// RenewClient issues a new certificate to client name, same pattern and
// scope.
func (c *Client) RenewClient(ctx context.Context, name string) (AddedClient, error) {
	var v AddedClient
	return v, c.Do(ctx, http.MethodPost, "/v1/clients", AddClientRequest{Name: name, Renew: true}, &v)
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

// Token is the admin token the client sends.
func (c *Client) Token() string { return c.token }
