package api

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/size"
)

// Capacity is what an operator plans with (`herd cluster info`, the
// dashboard): raw space on the alive nodes' object disks, what it holds
// once every VDI's copies are counted, what the VDIs were promised, and
// whether the loss of the largest node's share could be re-created.
type Capacity struct {
	// RawBytes is the alive nodes' object disks (used + free); UsedBytes
	// and FreeBytes split it.
	RawBytes  uint64 `json:"raw_bytes"`
	UsedBytes uint64 `json:"used_bytes"`
	FreeBytes uint64 `json:"free_bytes"`
	// Copies is the mean number of copies, weighted by the VDIs' sizes
	// (the format's when there is no VDI); an erasure-coded VDI counts
	// (K+M)/K (VDI.SpaceFactor).
	Copies float64 `json:"copies"`
	// UsableBytes is RawBytes divided by Copies: the VDI data the raw
	// space can hold.
	UsableBytes uint64 `json:"usable_bytes"`
	// ProvisionedBytes is the sum of the writable VDIs' sizes.
	ProvisionedBytes uint64 `json:"provisioned_bytes"`
	// Overcommit is ProvisionedBytes / UsableBytes; OvercommitLimit the
	// ratio above which health warns (herd server --overcommit-ratio).
	Overcommit      float64 `json:"overcommit"`
	OvercommitLimit float64 `json:"overcommit_limit"`
	// Domains is the number of failure domains (alive nodes, or zones
	// when zones are used); with no more domains than copies a lost
	// domain's share cannot be re-created (Recoverable false, Note says
	// so).
	Domains int `json:"failure_domains"`
	// LargestShareBytes is the most a failure domain holds; FreeElsewhere
	// the free space of the others, which a recovery of that share needs.
	LargestShare      string `json:"largest_share_domain,omitempty"`
	LargestShareBytes uint64 `json:"largest_share_bytes"`
	FreeElsewhere     uint64 `json:"free_elsewhere_bytes"`
	Recoverable       bool   `json:"recoverable"`
	// RecoveryShort: domains outnumber copies, but the free space of
	// the others could not hold the largest share (health warns).
	RecoveryShort bool   `json:"recovery_short,omitempty"`
	Note          string `json:"note,omitempty"`
	// Incomplete: some alive node did not report its usage.
	Incomplete bool `json:"incomplete,omitempty"`
}

// DefaultOvercommitRatio is the provisioned/usable ratio above which
// health warns, unless the operator sets another.
const DefaultOvercommitRatio = 1.0

func (s *Server) overcommitRatio() float64 {
	if s.overcommit > 0 {
		return s.overcommit
	}
	return DefaultOvercommitRatio
}

func (s *Server) capacityRoutes(mux *http.ServeMux) {
	s.handle(mux, "GET /v1/cluster/capacity", func(r *http.Request) (any, error) {
		ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
		defer cancel()
		s.cluster.SyncForRead(ctx)
		return s.capacity(s.nodes(ctx)), nil
	})
}

// capacity computes Capacity from the nodes' reports and this node's
// view of the VDIs, and keeps a complete result for the metrics.
func (s *Server) capacity(nodes []NodeEntry) Capacity {
	format := 1
	if info := s.cluster.Info(); info.Format != nil {
		format = info.Format.Copies
	}
	c := computeCapacity(nodes, s.cluster.VDIs(), format, s.overcommitRatio())
	s.capacityCache.remember(c, time.Now())
	return c
}

// computeCapacity is Capacity from the nodes' reports, the VDIs, the
// format's copies and the overcommit limit.
func computeCapacity(nodes []NodeEntry, vdis []cluster.VDI, format int, limit float64) Capacity {
	c := Capacity{OvercommitLimit: limit}
	domainBytes := map[string]uint64{}
	domainFree := map[string]uint64{}
	zoned := false
	for _, n := range nodes {
		if n.Zone != "" {
			zoned = true
		}
	}
	for _, n := range nodes {
		if n.State != cluster.NodeAlive {
			continue
		}
		if n.UsageError != "" {
			c.Incomplete = true
			continue
		}
		c.UsedBytes += n.UsedBytes
		c.FreeBytes += n.FreeBytes
		domain := n.ID
		if zoned {
			domain = "zone " + n.Zone
		}
		domainBytes[domain] += n.UsedBytes
		domainFree[domain] += n.FreeBytes
	}
	c.RawBytes = c.UsedBytes + c.FreeBytes
	var weighted float64
	for _, v := range vdis {
		c.ProvisionedBytes += v.Size
		weighted += float64(v.Size) * v.SpaceFactor()
	}
	c.Copies = float64(format)
	if c.ProvisionedBytes > 0 {
		c.Copies = weighted / float64(c.ProvisionedBytes)
	}
	if c.Copies > 0 {
		c.UsableBytes = uint64(float64(c.RawBytes) / c.Copies)
	}
	if c.UsableBytes > 0 {
		c.Overcommit = float64(c.ProvisionedBytes) / float64(c.UsableBytes)
	}
	c.Domains = len(domainBytes)
	kind := "nodes"
	if zoned {
		kind = "zones"
	}
	// The domains an object needs: its copies, or an erasure-coded
	// VDI's chunks, one a node and at most M a zone (and the M+1 copies
	// of its map objects, in Copies).
	need, needWhat, fewer := format, fmt.Sprintf("%d copies", format), "its objects keep one copy fewer"
	for _, v := range vdis {
		if v.Copies > need {
			need, needWhat = v.Copies, fmt.Sprintf("%d copies", v.Copies)
		}
		if scheme, ok := v.Scheme(); ok {
			chunks := scheme.Chunks()
			if zoned {
				chunks = (scheme.Chunks() + scheme.M - 1) / scheme.M
			}
			if chunks > need {
				need, needWhat, fewer = chunks, "erasure coding "+scheme.String(), "its objects keep one copy or chunk fewer"
			}
		}
	}
	domains := make([]string, 0, len(domainBytes))
	for d := range domainBytes {
		domains = append(domains, d)
	}
	sort.Strings(domains)
	for _, d := range domains {
		if domainBytes[d] > c.LargestShareBytes || c.LargestShare == "" {
			c.LargestShare, c.LargestShareBytes = d, domainBytes[d]
		}
	}
	c.FreeElsewhere = c.FreeBytes - domainFree[c.LargestShare]
	switch {
	case c.Domains <= need:
		c.Note = fmt.Sprintf("%d alive %s for %s: a lost one's share cannot be re-created elsewhere (%s until it returns)", c.Domains, kind, needWhat, fewer)
	case c.FreeElsewhere < c.LargestShareBytes:
		c.RecoveryShort = true
		c.Note = fmt.Sprintf("the free space of the other %s (%s) could not hold a recovery of %s's share (%s)", kind, size.Format(c.FreeElsewhere), c.LargestShare, size.Format(c.LargestShareBytes))
	default:
		c.Recoverable = true
	}
	return c
}

// capacityHealth adds the capacity reasons to h.
func capacityHealth(h *Health, c Capacity) {
	if c.Incomplete || c.RawBytes == 0 {
		return
	}
	if c.Overcommit > c.OvercommitLimit {
		h.add(HealthWarn, "overcommitted: the VDIs are promised %s, %.2f times the %s the disks hold at %.1f copies (limit %.2f, herd server --overcommit-ratio)",
			size.Format(c.ProvisionedBytes), c.Overcommit, size.Format(c.UsableBytes), c.Copies, c.OvercommitLimit)
	}
	if c.RecoveryShort {
		h.add(HealthWarn, "%s", c.Note)
	}
}

// The capacity metrics (herd_cluster_usable_bytes, ..._overcommit_ratio,
// ..._recovery_headroom_short) are read from the last complete
// computation, never computed at scrape time: it asks every alive node
// for its usage, and each of them lists its objects. The leader computes
// it every capacityEvery (RunCapacity); any node also keeps what it
// computed for cluster health, cluster info or the dashboard. A result
// older than capacityStale is not exported, so that a node that stopped
// being the leader does not report old figures for ever; an incomplete
// one (a node did not report its usage) is not kept.
const (
	capacityEvery = time.Minute
	capacityStale = 5 * time.Minute
)

// capacityCache is the last complete capacity this node computed.
type capacityCache struct {
	mu       sync.Mutex
	capacity Capacity
	at       time.Time
}

func (cc *capacityCache) remember(c Capacity, now time.Time) {
	if c.Incomplete || c.RawBytes == 0 {
		return
	}
	cc.mu.Lock()
	defer cc.mu.Unlock()
	cc.capacity, cc.at = c, now
}

// get returns the last complete capacity if it was computed within
// maxAge of now.
func (cc *capacityCache) get(now time.Time, maxAge time.Duration) (Capacity, bool) {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	if cc.at.IsZero() || now.Sub(cc.at) > maxAge {
		return Capacity{}, false
	}
	return cc.capacity, true
}

// CachedCapacity is the capacity the metrics export: the last complete
// computation, if it is recent (see capacityStale).
func (s *Server) CachedCapacity() (Capacity, bool) {
	return s.capacityCache.get(time.Now(), capacityStale)
}

// OvercommitLimit is the provisioned/usable ratio above which health
// warns on this node (herd server --overcommit-ratio).
func (s *Server) OvercommitLimit() float64 { return s.overcommitRatio() }

// RunCapacity computes the capacity every capacityEvery while this node
// is the leader, until ctx ends.
func (s *Server) RunCapacity(ctx context.Context) {
	tick := time.NewTicker(capacityEvery / 4)
	defer tick.Stop()
	for {
		if _, fresh := s.capacityCache.get(time.Now(), capacityEvery); s.cluster.IsLeader() && !fresh {
			nodesCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
			s.capacity(s.nodes(nodesCtx))
			cancel()
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// Capacity asks the node for the cluster's capacity.
func (c *Client) Capacity(ctx context.Context) (Capacity, error) {
	var out Capacity
	return out, c.Do(ctx, http.MethodGet, "/v1/cluster/capacity", nil, &out)
}
