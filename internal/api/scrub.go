package api

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/scrub"
)

// ScrubRequest controls the scrub: Action is "start", "pause", "resume"
// or empty (only MaxRate changes); MaxRate, when set, is the new limit in
// bytes per second.
type ScrubRequest struct {
	Action  string `json:"action,omitempty"`
	MaxRate uint64 `json:"max_rate,omitempty"`
}

// ScrubEntry is one node's scrub state.
type ScrubEntry struct {
	Node    string       `json:"node"`
	Address string       `json:"address"`
	Status  scrub.Status `json:"status"`
	Error   string       `json:"error,omitempty"`
}

// check refuses an unknown action or a rate below 4 KiB/s.
func (req ScrubRequest) check() error {
	switch req.Action {
	case "", "start", "pause", "resume":
	default:
		return fmt.Errorf("%w: scrub action %q: start, pause or resume", cluster.ErrInvalid, req.Action)
	}
	if req.MaxRate != 0 && req.MaxRate < 4096 {
		return fmt.Errorf("%w: scrub rate %d bytes/s: at least 4KiB/s", cluster.ErrInvalid, req.MaxRate)
	}
	return nil
}

// applyScrub applies req to this node's scrub.
func applyScrub(sc *scrub.Scrubber, req ScrubRequest) (scrub.Status, error) {
	if err := req.check(); err != nil {
		return scrub.Status{}, err
	}
	if req.MaxRate != 0 {
		if err := sc.SetMaxRate(req.MaxRate); err != nil {
			return scrub.Status{}, fmt.Errorf("%w: %v", cluster.ErrInvalid, err)
		}
	}
	switch req.Action {
	case "start":
		sc.Start()
	case "pause":
		sc.Pause()
	case "resume":
		sc.Resume()
	}
	return sc.Status(), nil
}

func (s *Server) scrubRoutes(mux *http.ServeMux) {
	s.handle(mux, "GET /v1/local/scrub", func(r *http.Request) (any, error) { return s.data.Scrub().Status(), nil })
	s.handle(mux, "POST /v1/local/scrub", func(r *http.Request) (any, error) {
		var req ScrubRequest
		if err := decodeBody(r, &req); err != nil {
			return nil, err
		}
		return applyScrub(s.data.Scrub(), req)
	})
	s.handle(mux, "GET /v1/scrub", func(r *http.Request) (any, error) { return s.scrubAll(r.Context(), nil) })
	s.handle(mux, "POST /v1/scrub", func(r *http.Request) (any, error) {
		var req ScrubRequest
		if err := decodeBody(r, &req); err != nil {
			return nil, err
		}
		if err := req.check(); err != nil {
			return nil, err // refused before any node is asked
		}
		return s.scrubAll(r.Context(), &req)
	})
}

// scrubAll asks every alive node for its scrub state, after applying req
// to it when req is not nil. A node that cannot be reached is reported in
// its entry.
func (s *Server) scrubAll(ctx context.Context, req *ScrubRequest) ([]ScrubEntry, error) {
	var out []ScrubEntry
	for _, n := range s.cluster.Nodes() {
		if n.State == cluster.NodeAlive {
			out = append(out, ScrubEntry{Node: n.ID, Address: n.Address})
		}
	}
	var wg sync.WaitGroup
	for i := range out {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var err error
			if out[i].Node == s.cluster.ID() {
				if req != nil {
					out[i].Status, err = applyScrub(s.data.Scrub(), *req)
				} else {
					out[i].Status = s.data.Scrub().Status()
				}
			} else {
				n, _ := s.cluster.Node(out[i].Node)
				ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
				defer cancel()
				if req != nil {
					err = s.peerClient(ctx, n.AdminAddr).Do(ctx, http.MethodPost, "/v1/local/scrub", req, &out[i].Status)
				} else {
					err = s.peerClient(ctx, n.AdminAddr).Do(ctx, http.MethodGet, "/v1/local/scrub", nil, &out[i].Status)
				}
			}
			if err != nil {
				out[i].Error = err.Error()
			}
		}()
	}
	wg.Wait()
	return out, nil
}

// Scrub returns every alive node's scrub state.
func (c *Client) Scrub(ctx context.Context) ([]ScrubEntry, error) {
	var v []ScrubEntry
	return v, c.Do(ctx, http.MethodGet, "/v1/scrub", nil, &v)
}

// ControlScrub applies req on every alive node.
func (c *Client) ControlScrub(ctx context.Context, req ScrubRequest) ([]ScrubEntry, error) {
	var v []ScrubEntry
	return v, c.Do(ctx, http.MethodPost, "/v1/scrub", req, &v)
}
