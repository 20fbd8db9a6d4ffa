// Package api is herd's admin interface: HTTP/JSON on every node (port
// 7080 by default). Any node answers for the cluster: reads come from the
// node's applied copy of the log (VDI reads after catching up with the
// leader, so a change made through another node is seen), changes are
// committed through the raft leader (the cluster package forwards them to the leader over the peer
// port). It speaks HTTPS only, with the node's certificate from the
// cluster CA. Every route but /v1/health needs an admin token
// (auth.go): GET routes any live token, the others a token that is not
// read-only; tokens are checked against the node's copy of the log.
package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"net/url"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/gateway"
	"github.com/herd-storage/herd/internal/maintenance"
	"github.com/herd-storage/herd/internal/recovery"
	"github.com/herd-storage/herd/internal/scrub"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Request and response bodies.
type (
	// DrainRequest starts a node's drain, or cancels it.
	DrainRequest struct {
		Cancel bool `json:"cancel,omitempty"`
	}
	// MaintenanceRequest opens a node's maintenance window for Seconds
	// (0 ends it).
	MaintenanceRequest struct {
		Seconds float64 `json:"seconds"`
	}
	FormatRequest struct {
		Copies     int    `json:"copies"`
		ObjectSize uint64 `json:"object_size"`
	}
	CreateVDIRequest struct {
		Name string `json:"name"`
		Size uint64 `json:"size"`
		// Exclusive refuses a second writer while the VDI is open for
		// writing; without it a writer through another node takes the
		// writer lock over (handover: live migration).
		Exclusive bool `json:"exclusive,omitempty"`
		// Handover is what an older client sent to ask for what is now
		// the default; accepted and ignored.
		Handover bool `json:"handover,omitempty"`
		// Copies is the VDI's own number of copies (0: the cluster's).
		Copies int `json:"copies,omitempty"`
		// EC makes the VDI erasure-coded with this scheme, "K+M" as in
		// "4+2" ("": copies); not with Copies.
		EC string `json:"ec,omitempty"`
	}
	// FinalizeResponse is the cluster's feature level after a finalize.
	FinalizeResponse struct {
		Level int `json:"feature_level"`
	}
	// UnlockRequest takes a VDI's writer lock away (Force must be set).
	UnlockRequest struct {
		Force bool `json:"force"`
	}
	// VDIStatus is who has a VDI open (`herd vdi status`).
	VDIStatus struct {
		VDI   cluster.VDI   `json:"vdi"`
		Lock  *cluster.Lock `json:"lock,omitempty"`
		Opens []NodeOpen    `json:"opens"`
		// Errors name the nodes that could not be asked.
		Errors []string `json:"errors,omitempty"`
	}
	// NodeOpen is one open of a VDI through a node.
	NodeOpen struct {
		Node    string `json:"node"`
		Address string `json:"address"`
		gateway.OpenInfo
	}
	ResizeVDIRequest struct {
		Size uint64 `json:"size"`
	}
	SnapshotRequest struct {
		Tag string `json:"tag"`
	}
	CloneRequest struct {
		Name string `json:"name"`
	}
	RollbackRequest struct {
		Tag string `json:"tag"`
	}
	// TreeEntry is one VDI of the tree with its space accounting.
	TreeEntry struct {
		cluster.VDI
		maintenance.Space
	}
	// NodeEntry is a node with its disk usage (from the node itself).
	NodeEntry struct {
		cluster.NodeInfo
		UsedBytes uint64 `json:"used_bytes"`
		FreeBytes uint64 `json:"free_bytes"`
		Objects   uint64 `json:"objects"`
		// FailedDisks are object disks taken out of service after an
		// I/O error.
		FailedDisks []string `json:"failed_disks,omitempty"`
		// ChecksumErrors and BlocksRepaired count this node's 4 KiB
		// blocks that failed their data checksum, and those rewritten
		// from a good replica, since it started.
		ChecksumErrors uint64 `json:"checksum_errors"`
		BlocksRepaired uint64 `json:"blocks_repaired"`
		UsageError     string `json:"usage_error,omitempty"`
		// CertificateExpires is when the node's certificate expires
		// (zero from a herd that does not say).
		CertificateExpires time.Time `json:"certificate_expires,omitzero"`
	}
	// Usage is a node's own disk usage.
	Usage struct {
		UsedBytes   uint64   `json:"used_bytes"`
		FreeBytes   uint64   `json:"free_bytes"`
		Objects     uint64   `json:"objects"`
		FailedDisks []string `json:"failed_disks,omitempty"`
		// Checksum counts of this node's disks (see NodeEntry).
		ChecksumErrors uint64 `json:"checksum_errors"`
		BlocksRepaired uint64 `json:"blocks_repaired"`
		// CertificateExpires is when the node's certificate expires.
		CertificateExpires time.Time `json:"certificate_expires,omitzero"`
	}
	LockRequest struct {
		Key     string `json:"key"`
		Session string `json:"session"`
	}
	ErrorResponse struct {
		Error string `json:"error"`
		Code  string `json:"code"`
	}
	// HealthResponse is all an unauthenticated caller learns.
	HealthResponse struct {
		Status string `json:"status"`
	}
)

const maxBodyBytes = 1 << 20

// DataPath is what the admin API needs from this node's data path.
type DataPath interface {
	Snapshot(ctx context.Context, name, tag string) (cluster.SnapshotResult, error)
	Space(ctx context.Context) (map[uint32]maintenance.Space, error)
	Usage() (Usage, error)
	Recovery() recovery.Status
	RecoveryLimits() recovery.Limits
	SetRecoveryLimits(recovery.Limits) error
	Check(ctx context.Context, name string, repair bool) (maintenance.CheckReport, error)
	// Diff is what changed in a VDI or snapshot since an ancestor snapshot.
	Diff(ctx context.Context, name, since string) (gateway.Diff, error)
	// Opens lists the VDIs open through this node.
	Opens() []gateway.OpenInfo
	// Metrics are the node's Prometheus metrics (GET /metrics).
	Metrics() prometheus.Gatherer
	// Scrub is this node's background scrub.
	Scrub() *scrub.Scrubber
}

// CheckRequest asks for a replica comparison of a VDI.
type CheckRequest struct {
	Repair bool `json:"repair"`
}

// RecoveryLimitsRequest changes recovery limits; absent fields keep their
// value. MaxRate is in bytes per second, 0 for unlimited.
type RecoveryLimitsRequest struct {
	MaxRate     *uint64 `json:"max_rate,omitempty"`
	Concurrency *int    `json:"concurrency,omitempty"`
}

// RecoveryEntry is one node's recovery state.
type RecoveryEntry struct {
	Node    string          `json:"node"`
	Address string          `json:"address"`
	Status  recovery.Status `json:"status"`
	Error   string          `json:"error,omitempty"`
}

// forwardedHeader marks a request another node forwarded to this one.
const forwardedHeader = "X-Herd-Forwarded"

// Server serves the admin API of one node.
type Server struct {
	cluster *cluster.Cluster
	data    DataPath
	sec     Security
	logger  *slog.Logger
	http    *http.Server
	// conns bounds and counts the port's connections (conns.go).
	conns *connections
	// overcommit is the provisioned/usable ratio health warns above
	// (capacity.go).
	overcommit float64
	// capacityCache is the last complete capacity, for the metrics
	// (capacity.go).
	capacityCache capacityCache
	// peerHTTP carries every call to other nodes' admin APIs (peerClient).
	peerHTTP     *http.Client
	peerHTTPOnce sync.Once
}

// Options are an admin server's settings (`herd server` flags).
type Options struct {
	// OvercommitRatio: cluster health warns when the VDIs' sizes exceed
	// the usable space times this (--overcommit-ratio; 0:
	// DefaultOvercommitRatio).
	OvercommitRatio float64
	// Connections bound the admin port's connections (zero fields: the
	// defaults).
	Connections ConnectionLimits
}

// NewServer builds the handler set; Serve starts it.
func NewServer(c *cluster.Cluster, data DataPath, sec Security, logger *slog.Logger, options Options) *Server {
	if options.OvercommitRatio <= 0 {
		options.OvercommitRatio = DefaultOvercommitRatio
	}
	s := &Server{cluster: c, data: data, sec: sec, logger: logger, overcommit: options.OvercommitRatio}
	s.conns = newConnections(s, options.Connections)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/health", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, HealthResponse{Status: "ok"})
	})
	s.securityRoutes(mux)
	s.handle(mux, "GET /v1/cluster", func(r *http.Request) (any, error) { return c.Info(), nil })
	s.handle(mux, "GET /v1/cluster/health", func(r *http.Request) (any, error) { return s.health(r.Context()), nil })
	s.handle(mux, "GET /v1/cluster/epochs", func(r *http.Request) (any, error) { return c.Epochs(), nil })
	s.handle(mux, "POST /v1/nodes/{id}/maintenance", func(r *http.Request) (any, error) {
		var req MaintenanceRequest
		if err := decodeBody(r, &req); err != nil {
			return nil, err
		}
		return c.SetMaintenance(r.Context(), r.PathValue("id"), time.Duration(req.Seconds*float64(time.Second)))
	})
	s.handle(mux, "POST /v1/nodes/{id}/settings", func(r *http.Request) (any, error) {
		var req cluster.NodeSettings
		if err := decodeBody(r, &req); err != nil {
			return nil, err
		}
		return c.SetNode(r.Context(), r.PathValue("id"), req)
	})
	s.handle(mux, "POST /v1/nodes/{id}/drain", func(r *http.Request) (any, error) {
		var req DrainRequest
		if err := decodeBody(r, &req); err != nil {
			return nil, err
		}
		return c.Drain(r.Context(), r.PathValue("id"), !req.Cancel)
	})
	s.handle(mux, "GET /v1/events", func(r *http.Request) (any, error) {
		var after uint64
		if v := r.URL.Query().Get("after"); v != "" {
			var err error
			if after, err = strconv.ParseUint(v, 10, 64); err != nil {
				return nil, fmt.Errorf("%w: after=%q: want a log index", cluster.ErrInvalid, v)
			}
		}
		events := c.Events(after)
		if events == nil {
			events = []cluster.Event{}
		}
		return events, nil
	})
	s.handle(mux, "POST /v1/cluster/format", func(r *http.Request) (any, error) {
		var req FormatRequest
		if err := decodeBody(r, &req); err != nil {
			return nil, err
		}
		return c.Format(r.Context(), req.Copies, req.ObjectSize)
	})
	// Raise the cluster's feature level once every member supports it
	// (cluster/features.go, docs/UPGRADE.md).
	s.handle(mux, "POST /v1/cluster/finalize-upgrade", func(r *http.Request) (any, error) {
		level, err := c.FinalizeUpgrade(r.Context())
		if err != nil {
			return nil, err
		}
		return FinalizeResponse{Level: level}, nil
	})
	s.handle(mux, "GET /v1/nodes", func(r *http.Request) (any, error) { return s.nodes(r.Context()), nil })
	s.handle(mux, "GET /v1/local/usage", func(r *http.Request) (any, error) { return s.localUsage() })
	s.scrubRoutes(mux)
	s.joinTokenRoutes(mux)
	s.rotationRoutes(mux)
	s.capacityRoutes(mux)
	s.handle(mux, "GET /v1/local/recovery", func(r *http.Request) (any, error) { return data.Recovery(), nil })
	s.handle(mux, "GET /v1/recovery", func(r *http.Request) (any, error) { return s.recovery(r.Context()), nil })
	s.handle(mux, "PUT /v1/local/recovery/limits", func(r *http.Request) (any, error) {
		var req RecoveryLimitsRequest
		if err := decodeBody(r, &req); err != nil {
			return nil, err
		}
		limits := data.RecoveryLimits()
		if req.MaxRate != nil {
			limits.MaxRate = *req.MaxRate
		}
		if req.Concurrency != nil {
			limits.Concurrency = *req.Concurrency
		}
		if err := data.SetRecoveryLimits(limits); err != nil {
			return nil, fmt.Errorf("%w: %v", cluster.ErrInvalid, err)
		}
		return data.Recovery(), nil
	})
	s.handle(mux, "PUT /v1/recovery/limits", func(r *http.Request) (any, error) {
		var req RecoveryLimitsRequest
		if err := decodeBody(r, &req); err != nil {
			return nil, err
		}
		return s.setRecoveryLimits(r.Context(), req)
	})
	s.handle(mux, "POST /v1/vdis/{name}/snapshot", func(r *http.Request) (any, error) {
		var req SnapshotRequest
		if err := decodeBody(r, &req); err != nil {
			return nil, err
		}
		name := r.PathValue("name")
		// The node holding the VDI open for writing pauses its writes for
		// the snapshot: send the request there.
		if l, held := c.Lock(cluster.VDILockKey(name)); held && l.Node != c.ID() && r.Header.Get(forwardedHeader) == "" {
			holder, ok := c.Node(l.Node)
			if !ok {
				return nil, fmt.Errorf("%w: vdi %q is held by unknown node %s", cluster.ErrBusy, name, l.Node)
			}
			var result cluster.SnapshotResult
			err := s.peerClient(r.Context(), holder.AdminAddr).do(r.Context(), http.MethodPost, "/v1/vdis/"+url.PathEscape(name)+"/snapshot", req, &result, true)
			return result, err
		}
		return data.Snapshot(r.Context(), name, req.Tag)
	})
	s.handle(mux, "POST /v1/vdis/{name}/clone", func(r *http.Request) (any, error) {
		var req CloneRequest
		if err := decodeBody(r, &req); err != nil {
			return nil, err
		}
		return c.CloneVDI(r.Context(), r.PathValue("name"), req.Name)
	})
	s.handle(mux, "POST /v1/vdis/{name}/rollback", func(r *http.Request) (any, error) {
		var req RollbackRequest
		if err := decodeBody(r, &req); err != nil {
			return nil, err
		}
		return c.RollbackVDI(r.Context(), r.PathValue("name"), req.Tag)
	})
	// Flatten is a request in the log: the node holding the VDI's writer
	// lock (or the leader) copies, then records it (cluster/merge.go).
	s.handle(mux, "POST /v1/vdis/{name}/flatten", func(r *http.Request) (any, error) {
		return c.FlattenVDI(r.Context(), r.PathValue("name"))
	})
	s.handle(mux, "POST /v1/vdis/{name}/check", func(r *http.Request) (any, error) {
		var req CheckRequest
		if err := decodeBody(r, &req); err != nil {
			return nil, err
		}
		return data.Check(r.Context(), r.PathValue("name"), req.Repair)
	})
	s.handle(mux, "GET /v1/vdis/{name}/diff", func(r *http.Request) (any, error) {
		since := r.URL.Query().Get("since")
		if since == "" {
			return nil, fmt.Errorf("%w: give the snapshot to compare with: ?since=TAG", cluster.ErrInvalid)
		}
		return data.Diff(r.Context(), r.PathValue("name"), since)
	})
	s.handle(mux, "GET /v1/tree", func(r *http.Request) (any, error) {
		space, err := data.Space(r.Context())
		if err != nil {
			return nil, err
		}
		var out []TreeEntry
		for _, v := range c.Tree() {
			out = append(out, TreeEntry{VDI: v, Space: space[v.ID]})
		}
		return out, nil
	})
	// A VDI read sees a change made through another node just before
	// (SyncForRead): an operator sets a limit on one host and looks at it
	// from another.
	s.handle(mux, "GET /v1/vdis", func(r *http.Request) (any, error) {
		c.SyncForRead(r.Context())
		return c.VDIs(), nil
	})
	s.handle(mux, "POST /v1/vdis", func(r *http.Request) (any, error) {
		var req CreateVDIRequest
		if err := decodeBody(r, &req); err != nil {
			return nil, err
		}
		exclusive := req.Exclusive
		return c.CreateVDIWith(r.Context(), req.Name, req.Size, cluster.VDISettings{Exclusive: &exclusive}, req.Copies, req.EC)
	})
	s.handle(mux, "GET /v1/vdis/{name}", func(r *http.Request) (any, error) {
		c.SyncForRead(r.Context())
		return c.LookupVDI(r.Context(), r.PathValue("name"))
	})
	s.handle(mux, "GET /v1/local/opens", func(r *http.Request) (any, error) {
		opens := data.Opens()
		if opens == nil {
			opens = []gateway.OpenInfo{}
		}
		return opens, nil
	})
	s.handle(mux, "GET /v1/vdis/{name}/status", func(r *http.Request) (any, error) { return s.vdiStatus(r.Context(), r.PathValue("name")) })
	s.handle(mux, "PUT /v1/vdis/{name}/settings", func(r *http.Request) (any, error) {
		var req cluster.VDISettings
		if err := decodeBody(r, &req); err != nil {
			return nil, err
		}
		return c.SetVDI(r.Context(), r.PathValue("name"), req)
	})
	s.handle(mux, "POST /v1/vdis/{name}/unlock", func(r *http.Request) (any, error) {
		var req UnlockRequest
		if err := decodeBody(r, &req); err != nil {
			return nil, err
		}
		name := r.PathValue("name")
		v, err := c.LookupVDI(r.Context(), name)
		if err != nil {
			return nil, err
		}
		l, held := c.Lock(cluster.VDILockKey(v.Name))
		if !held {
			return nil, fmt.Errorf("%w: vdi %q is not open for writing: nothing to unlock", cluster.ErrNotFound, v.Name)
		}
		if !req.Force {
			return nil, fmt.Errorf("%w: vdi %q is open for writing through node %s since %s; --force takes the lock away and fences that writer (its later writes fail)",
				cluster.ErrInvalid, v.Name, l.Node, l.Acquired.UTC().Format(time.RFC3339))
		}
		s.logger.Warn("api: breaking a vdi's writer lock", "vdi", v.Name, "holder", l.Node, "from", r.RemoteAddr)
		return c.BreakLock(r.Context(), cluster.VDILockKey(v.Name), "an operator through node "+c.ID()+"'s admin API")
	})
	s.handle(mux, "DELETE /v1/vdis/{name}", func(r *http.Request) (any, error) {
		return map[string]string{"deleted": r.PathValue("name")}, c.DeleteVDI(r.Context(), r.PathValue("name"))
	})
	s.handle(mux, "POST /v1/vdis/{name}/resize", func(r *http.Request) (any, error) {
		var req ResizeVDIRequest
		if err := decodeBody(r, &req); err != nil {
			return nil, err
		}
		return c.ResizeVDI(r.Context(), r.PathValue("name"), req.Size)
	})
	s.handle(mux, "GET /v1/locks", func(r *http.Request) (any, error) { return c.Locks(), nil })
	s.handle(mux, "POST /v1/locks/acquire", func(r *http.Request) (any, error) {
		var req LockRequest
		if err := decodeBody(r, &req); err != nil {
			return nil, err
		}
		return c.AcquireLock(r.Context(), req.Key, req.Session)
	})
	s.handle(mux, "POST /v1/locks/release", func(r *http.Request) (any, error) {
		var req LockRequest
		if err := decodeBody(r, &req); err != nil {
			return nil, err
		}
		return map[string]string{"released": req.Key}, c.ReleaseLock(r.Context(), req.Key, req.Session)
	})
	// Prometheus metrics: any live token, read-only ones included
	// (Prometheus sends it as a bearer token: authorization.credentials_file).
	mux.Handle("GET /metrics", s.guardWith(readAccess, promhttp.HandlerFor(data.Metrics(), promhttp.HandlerOpts{
		ErrorLog: slog.NewLogLogger(logger.Handler(), slog.LevelWarn), MaxRequestsInFlight: 4,
	}).ServeHTTP))
	// Profiling for operators and benchmarks: an admin (not read-only)
	// token, whatever the method.
	mux.HandleFunc("/debug/pprof/", s.guardWith(writeAccess, pprof.Index))
	mux.HandleFunc("/debug/pprof/profile", s.guardWith(writeAccess, pprof.Profile))
	mux.HandleFunc("/debug/pprof/symbol", s.guardWith(writeAccess, pprof.Symbol))
	s.handle(mux, "POST /v1/bench/locks", func(r *http.Request) (any, error) {
		var req LockBenchRequest
		if err := decodeBody(r, &req); err != nil {
			return nil, err
		}
		return lockBench(r.Context(), c, req)
	})
	dashboardRoutes(mux)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, fmt.Errorf("%w: no such API route %s %s", cluster.ErrNotFound, r.Method, r.URL.Path))
	})
	s.http = &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 5 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelDebug),
		ConnContext:       connContext,
		ConnState:         func(c net.Conn, state http.ConnState) { s.conns.connState(c, state) },
	}
	return s
}

// Serve serves HTTPS on l until Shutdown, within the connection limits
// (conns.go). A plain HTTP request gets "400 Client sent an HTTP request
// to an HTTPS server" from net/http.
func (s *Server) Serve(l net.Listener) error {
	s.http.TLSConfig = s.sec.ServerTLS
	err := s.http.ServeTLS(&connectionListener{Listener: l, conns: s.conns}, "", "")
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Shutdown stops the server, letting requests in progress finish.
func (s *Server) Shutdown(ctx context.Context) error { return s.http.Shutdown(ctx) }

func (s *Server) handle(mux *http.ServeMux, pattern string, fn func(*http.Request) (any, error)) {
	mux.HandleFunc(pattern, s.guard(func(w http.ResponseWriter, r *http.Request) {
		value, err := fn(r)
		if err != nil {
			writeError(w, err)
			return
		}
		writeJSON(w, http.StatusOK, value)
	}))
}

// nodes lists the nodes with each alive node's own disk usage, asked in
// parallel.
func (s *Server) nodes(ctx context.Context) []NodeEntry {
	nodes := s.cluster.Nodes()
	out := make([]NodeEntry, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		out[i].NodeInfo = n
		if n.State != cluster.NodeAlive {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			defer cancel()
			var u Usage
			var err error
			if n.ID == s.cluster.ID() {
				u, err = s.localUsage()
			} else {
				err = s.peerClient(ctx, n.AdminAddr).Do(ctx, http.MethodGet, "/v1/local/usage", nil, &u)
			}
			if err != nil {
				out[i].UsageError = err.Error()
				return
			}
			out[i].UsedBytes, out[i].FreeBytes, out[i].Objects, out[i].FailedDisks = u.UsedBytes, u.FreeBytes, u.Objects, u.FailedDisks
			out[i].ChecksumErrors, out[i].BlocksRepaired = u.ChecksumErrors, u.BlocksRepaired
			out[i].CertificateExpires = u.CertificateExpires
		}()
	}
	wg.Wait()
	return out
}

// setRecoveryLimits applies new limits on every alive node; a node that
// refuses or cannot be reached is reported in its entry.
func (s *Server) setRecoveryLimits(ctx context.Context, req RecoveryLimitsRequest) ([]RecoveryEntry, error) {
	var out []RecoveryEntry
	for _, n := range s.cluster.Nodes() {
		if n.State == cluster.NodeAlive {
			out = append(out, RecoveryEntry{Node: n.ID, Address: n.Address})
		}
	}
	errs := make([]error, len(out))
	var wg sync.WaitGroup
	for i := range out {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n, _ := s.cluster.Node(out[i].Node)
			ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			defer cancel()
			if err := s.peerClient(ctx, n.AdminAddr).Do(ctx, http.MethodPut, "/v1/local/recovery/limits", req, &out[i].Status); err != nil {
				out[i].Error, errs[i] = err.Error(), err
			}
		}()
	}
	wg.Wait()
	for i := range out {
		if errs[i] != nil && errors.Is(errs[i], cluster.ErrInvalid) {
			return out, errs[i] // the same limits are refused everywhere
		}
	}
	return out, nil
}

// recovery asks every alive node for its recovery state.
func (s *Server) recovery(ctx context.Context) []RecoveryEntry {
	var out []RecoveryEntry
	for _, n := range s.cluster.Nodes() {
		if n.State == cluster.NodeAlive {
			out = append(out, RecoveryEntry{Node: n.ID, Address: n.Address})
		}
	}
	var wg sync.WaitGroup
	for i := range out {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if out[i].Node == s.cluster.ID() {
				out[i].Status = s.data.Recovery()
				return
			}
			n, _ := s.cluster.Node(out[i].Node)
			ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			defer cancel()
			if err := s.peerClient(ctx, n.AdminAddr).Do(ctx, http.MethodGet, "/v1/local/recovery", nil, &out[i].Status); err != nil {
				out[i].Error = err.Error()
			}
		}()
	}
	wg.Wait()
	return out
}

// vdiStatus asks every live node which opens of a VDI it serves.
func (s *Server) vdiStatus(ctx context.Context, name string) (VDIStatus, error) {
	s.cluster.SyncForRead(ctx)
	v, err := s.cluster.VDI(name)
	if err != nil {
		return VDIStatus{}, err
	}
	status := VDIStatus{VDI: v, Opens: []NodeOpen{}}
	if l, held := s.cluster.Lock(cluster.VDILockKey(v.Name)); held && !v.Snapshot {
		status.Lock = &l
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, n := range s.cluster.Nodes() {
		if n.State != cluster.NodeAlive {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			var opens []gateway.OpenInfo
			if n.ID == s.cluster.ID() {
				opens = s.data.Opens()
			} else {
				ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
				defer cancel()
				if err := s.peerClient(ctx, n.AdminAddr).Do(ctx, http.MethodGet, "/v1/local/opens", nil, &opens); err != nil {
					mu.Lock()
					status.Errors = append(status.Errors, fmt.Sprintf("node %s: %v", n.ID, err))
					mu.Unlock()
					return
				}
			}
			mu.Lock()
			defer mu.Unlock()
			for _, o := range opens {
				if o.VDI == v.FullName() {
					status.Opens = append(status.Opens, NodeOpen{Node: n.ID, Address: n.Address, OpenInfo: o})
				}
			}
		}()
	}
	wg.Wait()
	sort.Slice(status.Opens, func(i, j int) bool {
		a, b := status.Opens[i], status.Opens[j]
		if a.Node != b.Node {
			return a.Node < b.Node
		}
		return a.Since.Before(b.Since)
	})
	sort.Strings(status.Errors)
	return status, nil
}

func decodeBody(r *http.Request, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(nil, r.Body, maxBodyBytes))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%w: request body: %v", cluster.ErrInvalid, err)
	}
	return nil
}

var statusByCode = map[string]int{
	"no_quorum":         http.StatusServiceUnavailable,
	"not_formatted":     http.StatusConflict,
	"already_formatted": http.StatusConflict,
	"already_exists":    http.StatusConflict,
	"not_found":         http.StatusNotFound,
	"invalid":           http.StatusBadRequest,
	"lock_held":         http.StatusConflict,
	"not_lock_owner":    http.StatusConflict,
	"too_few_nodes":     http.StatusConflict,
	"shrink":            http.StatusBadRequest,
	"busy":              http.StatusConflict,
	"unauthorized":      http.StatusUnauthorized,
	"forbidden":         http.StatusForbidden,
	"exhausted":         http.StatusInsufficientStorage,
	"incompatible":      http.StatusConflict,
	"upgrade_required":  http.StatusConflict,
}

func writeError(w http.ResponseWriter, err error) {
	code := cluster.ErrorCode(err)
	status, ok := statusByCode[code]
	if !ok {
		status = http.StatusInternalServerError
	}
	writeJSON(w, status, ErrorResponse{Error: err.Error(), Code: code})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}
