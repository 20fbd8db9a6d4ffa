package api

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/pki"
)

type (
	// JoinTokenRequest creates a join token (cluster/jointokens.go).
	JoinTokenRequest struct {
		// TTLSeconds is its lifetime (0: a day).
		TTLSeconds int64 `json:"ttl_seconds,omitempty"`
		// Uses is how many nodes it admits (0: any number until it
		// expires).
		Uses int `json:"uses,omitempty"`
	}
	// JoinTokenCreated is a new join token; Token is shown once.
	JoinTokenCreated struct {
		cluster.JoinToken
		Token string `json:"token"`
	}
)

// joinTokenRoutes: create, list and revoke join tokens.
func (s *Server) joinTokenRoutes(mux *http.ServeMux) {
	c := s.cluster
	s.handle(mux, "POST /v1/join-tokens", func(r *http.Request) (any, error) {
		var req JoinTokenRequest
		if err := decodeBody(r, &req); err != nil {
			return nil, err
		}
		ttl := time.Duration(req.TTLSeconds) * time.Second
		if req.TTLSeconds == 0 {
			ttl = cluster.DefaultJoinTokenTTL
		}
		secret := pki.NewSecret()
		t, err := c.CreateJoinToken(r.Context(), pki.HashSecret(secret), ttl, req.Uses)
		if err != nil {
			return nil, err
		}
		return JoinTokenCreated{JoinToken: t, Token: pki.JoinToken{Fingerprint: s.joinFingerprint(), Secret: secret}.String()}, nil
	})
	s.handle(mux, "GET /v1/join-tokens", func(r *http.Request) (any, error) {
		c.SyncForRead(r.Context())
		tokens := c.JoinTokens()
		if tokens == nil {
			tokens = []cluster.JoinToken{}
		}
		return tokens, nil
	})
	s.handle(mux, "DELETE /v1/join-tokens/{id}", func(r *http.Request) (any, error) {
		return c.RevokeJoinToken(r.Context(), r.PathValue("id"))
	})
}

// CreateJoinToken creates a join token valid for ttl (0: a day) and uses
// admissions (0: any number).
func (c *Client) CreateJoinToken(ctx context.Context, ttl time.Duration, uses int) (JoinTokenCreated, error) {
	if ttl < 0 || (ttl > 0 && ttl < time.Second) {
		return JoinTokenCreated{}, fmt.Errorf("--ttl %v: at least 1s", ttl)
	}
	var out JoinTokenCreated
	return out, c.Do(ctx, http.MethodPost, "/v1/join-tokens", JoinTokenRequest{TTLSeconds: int64(ttl / time.Second), Uses: uses}, &out)
}

// JoinTokens lists the join tokens.
func (c *Client) JoinTokens(ctx context.Context) ([]cluster.JoinToken, error) {
	var out []cluster.JoinToken
	return out, c.Do(ctx, http.MethodGet, "/v1/join-tokens", nil, &out)
}

// RevokeJoinToken revokes join token id.
func (c *Client) RevokeJoinToken(ctx context.Context, id string) (cluster.JoinToken, error) {
	var out cluster.JoinToken
	return out, c.Do(ctx, http.MethodDelete, "/v1/join-tokens/"+url.PathEscape(id), nil, &out)
}
