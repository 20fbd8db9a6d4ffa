// Package metrics is a node's Prometheus metrics, served at /metrics on
// the admin port (an admin or read-only token).
//
// Names follow Prometheus conventions (herd_ prefix, base units in the
// name, _total for counters, _seconds histograms). Labels are bounded: a
// vdi label exists only for the VDIs open through this node (its series
// are deleted when the last connection closes), so a cluster of 10,000
// VDIs costs each node only the VDIs its VMs use; peer labels are node
// ids (one per node); op labels are a fixed set.
//
// The data path's instruments are resolved once per open VDI or peer, so
// a request costs a counter increment and a histogram observation, no
// label lookup. State that exists anyway (epoch, recovery progress, disk
// space, connections) is read at scrape time by collectors (Gauges).
package metrics

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	gometrics "github.com/armon/go-metrics"
	gmprometheus "github.com/armon/go-metrics/prometheus"
)

// Op is an NBD request kind.
type Op int

const (
	OpRead Op = iota
	OpWrite
	OpFlush
	OpTrim
	OpWriteZeroes
	OpBlockStatus
	opCount
)

var opNames = [opCount]string{"read", "write", "flush", "trim", "write_zeroes", "block_status"}

func (o Op) String() string { return opNames[o] }

// latencyBuckets span 50 µs to 10 s.
var latencyBuckets = prometheus.ExponentialBuckets(50e-6, 2.5, 14)

// Node holds one node's metrics.
type Node struct {
	Registry *prometheus.Registry

	nbdRequests *prometheus.CounterVec
	nbdErrors   *prometheus.CounterVec
	nbdBytes    *prometheus.CounterVec
	nbdDuration *prometheus.HistogramVec

	peerDuration *prometheus.HistogramVec
	peerErrors   *prometheus.CounterVec

	RaftApply prometheus.Histogram

	mu   sync.Mutex
	vdis map[string]*vdiEntry
}

type vdiEntry struct {
	refs int
	vdi  *VDI
}

// New returns a node's metrics, with the Go runtime's and the process's
// collectors registered.
func New() *Node {
	n := &Node{
		Registry: prometheus.NewRegistry(),
		nbdRequests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "herd_nbd_requests_total",
			Help: "NBD requests served, by VDI (open through this node) and kind."}, []string{"vdi", "op"}),
		nbdErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "herd_nbd_request_errors_total",
			Help: "NBD requests that failed, by VDI and kind."}, []string{"vdi", "op"}),
		nbdBytes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "herd_nbd_bytes_total",
			Help: "Bytes read or written by NBD requests (payload), by VDI and kind."}, []string{"vdi", "op"}),
		nbdDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "herd_nbd_request_duration_seconds",
			Help: "Time to serve an NBD request, by VDI and kind.", Buckets: latencyBuckets}, []string{"vdi", "op"}),
		peerDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "herd_peer_request_duration_seconds",
			Help: "Time of object requests to other nodes' replicas, by peer node and opcode.", Buckets: latencyBuckets}, []string{"peer", "op"}),
		peerErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "herd_peer_request_errors_total",
			Help: "Object requests to other nodes that failed, by peer node and opcode."}, []string{"peer", "op"}),
		RaftApply: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "herd_raft_apply_duration_seconds",
			Help: "Time from proposing a cluster log entry to its being applied on this node.", Buckets: latencyBuckets}),
		vdis: map[string]*vdiEntry{},
	}
	n.Registry.MustRegister(n.nbdRequests, n.nbdErrors, n.nbdBytes, n.nbdDuration, n.peerDuration, n.peerErrors, n.RaftApply,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return n
}

// VDI holds the instruments of one VDI open through this node.
type VDI struct {
	requests, errors, bytes [opCount]prometheus.Counter
	duration                [opCount]prometheus.Observer
}

// OpenVDI returns the instruments of VDI name; every OpenVDI is matched
// by a CloseVDI, and the last one deletes the VDI's series. A nil Node
// returns nil, whose Observe does nothing.
func (n *Node) OpenVDI(name string) *VDI {
	if n == nil {
		return nil
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if e, ok := n.vdis[name]; ok {
		e.refs++
		return e.vdi
	}
	v := &VDI{}
	for op := Op(0); op < opCount; op++ {
		labels := prometheus.Labels{"vdi": name, "op": op.String()}
		v.requests[op] = n.nbdRequests.With(labels)
		v.errors[op] = n.nbdErrors.With(labels)
		v.bytes[op] = n.nbdBytes.With(labels)
		v.duration[op] = n.nbdDuration.With(labels)
	}
	n.vdis[name] = &vdiEntry{refs: 1, vdi: v}
	return v
}

// CloseVDI drops one OpenVDI of name.
func (n *Node) CloseVDI(name string) {
	if n == nil {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	e, ok := n.vdis[name]
	if !ok {
		return
	}
	if e.refs--; e.refs > 0 {
		return
	}
	delete(n.vdis, name)
	for _, vec := range []*prometheus.CounterVec{n.nbdRequests, n.nbdErrors, n.nbdBytes} {
		vec.DeletePartialMatch(prometheus.Labels{"vdi": name})
	}
	n.nbdDuration.DeletePartialMatch(prometheus.Labels{"vdi": name})
}

// Observe records one request of kind op that moved bytes of payload,
// started at start and ended with err.
func (v *VDI) Observe(op Op, bytes int, start time.Time, err error) {
	if v == nil {
		return
	}
	v.requests[op].Inc()
	if err != nil {
		v.errors[op].Inc()
	}
	if bytes > 0 {
		v.bytes[op].Add(float64(bytes))
	}
	v.duration[op].Observe(time.Since(start).Seconds())
}

// Peer records one object request to node peer (opcode op).
func (n *Node) Peer(peer, op string, start time.Time, err error) {
	n.PeerDuration(peer, op, time.Since(start), err)
}

// PeerDuration records one object request to node peer that took d.
func (n *Node) PeerDuration(peer, op string, d time.Duration, err error) {
	if n == nil {
		return
	}
	n.peerDuration.WithLabelValues(peer, op).Observe(d.Seconds())
	if err != nil {
		n.peerErrors.WithLabelValues(peer, op).Inc()
	}
}

// Gauge is a value read at scrape time.
type Gauge struct {
	Name, Help string
	Labels     []string
	// Read returns the current values: one per label set (label values
	// in Labels' order; none when Labels is empty).
	Read func() []Sample
	// Counter exposes the values as a counter (a total that only grows,
	// kept by the node anyway), not a gauge; its name ends in _total.
	Counter bool
}

// Sample is one value of a Gauge.
type Sample struct {
	Labels []string
	Value  float64
}

// AddGauges registers gauges read at scrape time.
func (n *Node) AddGauges(gauges ...Gauge) {
	n.Registry.MustRegister(&gaugeCollector{gauges: gauges, descs: descs(gauges)})
}

func descs(gauges []Gauge) []*prometheus.Desc {
	out := make([]*prometheus.Desc, len(gauges))
	for i, g := range gauges {
		out[i] = prometheus.NewDesc(g.Name, g.Help, g.Labels, nil)
	}
	return out
}

type gaugeCollector struct {
	gauges []Gauge
	descs  []*prometheus.Desc
}

func (c *gaugeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}

func (c *gaugeCollector) Collect(ch chan<- prometheus.Metric) {
	for i, g := range c.gauges {
		kind := prometheus.GaugeValue
		if g.Counter {
			kind = prometheus.CounterValue
		}
		for _, s := range g.Read() {
			if m, err := prometheus.NewConstMetric(c.descs[i], kind, s.Value, s.Labels...); err == nil {
				ch <- m
			}
		}
	}
}

// RouteLibraryMetrics sends what hashicorp/raft and memberlist measure
// (through go-metrics' process-wide sink) to this node's registry: raft's
// commit and apply times, leader contact, elections (herd_raft_state_*),
// memberlist's probes and gossip, with go-metrics' names under herd_.
// Series not updated for a minute go (a follower has no leader-only ones).
// Once per process: the sink is global.
func (n *Node) RouteLibraryMetrics() error {
	sink, err := gmprometheus.NewPrometheusSinkFrom(gmprometheus.PrometheusOpts{Registerer: n.Registry, Expiration: time.Minute, Name: "herd_library_metrics"})
	if err != nil {
		return err
	}
	config := gometrics.DefaultConfig("herd")
	config.EnableHostname, config.EnableHostnameLabel, config.EnableRuntimeMetrics, config.EnableServiceLabel = false, false, false, false
	_, err = gometrics.NewGlobal(config, sink)
	return err
}
