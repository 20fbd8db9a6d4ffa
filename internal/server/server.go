// Package server wires one herd node together from its parts: identity and
// secret in the data directory, the peer port, the cluster log, the admin
// API. It holds no logic of its own.
package server

import (
	"context"
	"crypto/rand"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/herd-storage/herd/internal/api"
	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/export"
	"github.com/herd-storage/herd/internal/gateway"
	"github.com/herd-storage/herd/internal/layout"
	"github.com/herd-storage/herd/internal/maintenance"
	"github.com/herd-storage/herd/internal/metrics"
	"github.com/herd-storage/herd/internal/nbd"
	"github.com/herd-storage/herd/internal/object"
	"github.com/herd-storage/herd/internal/objproto"
	"github.com/herd-storage/herd/internal/peer"
	"github.com/herd-storage/herd/internal/pki"
	"github.com/herd-storage/herd/internal/recovery"
	"github.com/herd-storage/herd/internal/replica"
	"github.com/herd-storage/herd/internal/scrub"
	"github.com/herd-storage/herd/internal/size"
	"github.com/herd-storage/herd/internal/store"
	"github.com/herd-storage/herd/internal/version"
	"github.com/prometheus/client_golang/prometheus"
)

// Default ports on the bind address.
const (
	DefaultPeerPort   = 7000
	DefaultGossipPort = 7001
	DefaultAdminPort  = 7080
	DefaultNBDPort    = 10809
)

// Options are `herd server`'s flags.
type Options struct {
	DataDir string
	BindIP  string
	Join    string // IP[:PEER PORT][,IP[:PEER PORT]...]
	Zone    string
	// JoinToken is "herd-join.FINGERPRINT.SECRET", needed only to join
	// (the CLI reads it from HERD_JOIN_TOKEN or --join-token-file).
	JoinToken  string
	Capacity   uint64   // 0: the data directory's file system size
	Disks      []string // DIR[:WEIGHT] object disks; none: the data directory
	PeerPort   int
	GossipPort int
	AdminPort  int
	NBDPort    int
	// NBDSocket is the local plaintext NBD socket (default DATA/nbd.sock,
	// or SharedNBDSocket with NBDSocketGroup; "none" for none); access is
	// its file mode, 0660.
	NBDSocket string
	// NBDSocketGroup, when set, is the socket's group (a name or id): the
	// hypervisor's QEMU group, e.g. libvirt-qemu.
	NBDSocketGroup string
	// InsecureNBD serves plaintext NBD on the TCP port (labs only).
	InsecureNBD bool
	// NBDLimits bound what NBD clients may make the node spend.
	NBDLimits NBDLimits
	// AdminLimits bound the admin port's connections.
	AdminLimits api.ConnectionLimits
	// Gateway bounds the data path's work per request and per node.
	Gateway     gateway.Options
	JoinTimeout time.Duration
	// DownOutInterval: stopped cleanly, this node is down but not out
	// for this long (cluster.Config.DownOutInterval); 0: none.
	DownOutInterval time.Duration
	// OvercommitRatio: cluster health warns when the VDIs' sizes exceed
	// the usable space times this (api.Capacity); 0: 1.0.
	OvercommitRatio float64
	// ScrubInterval is the time between two scrub passes' starts;
	// ScrubMaxRate bounds the bytes a pass reads per second.
	ScrubInterval time.Duration
	ScrubMaxRate  uint64
	// MergeRate bounds the bytes per second that merges of deleted
	// snapshots and flattens copy (gateway/merge.go); 0: unlimited.
	MergeRate uint64
	// ScrubDeepEvery makes every Nth pass compare replicas across nodes.
	ScrubDeepEvery int
	Logger         *slog.Logger
}

var zoneRegexp = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

// Run starts the node and serves until ctx ends.
func Run(ctx context.Context, o Options) error {
	logger := o.Logger
	if o.DataDir == "" {
		return errors.New("--data is required: the directory holding this node's identity, cluster log and objects")
	}
	ip := net.ParseIP(o.BindIP)
	if ip == nil {
		return fmt.Errorf("--bind %q is not an IP address", o.BindIP)
	}
	if ip.IsUnspecified() {
		return fmt.Errorf("--bind %s: give this node's own address (other nodes connect to it), not a wildcard", o.BindIP)
	}
	if o.Zone != "" && !zoneRegexp.MatchString(o.Zone) {
		return fmt.Errorf("--zone %q: use up to 64 letters, digits, '.', '_' or '-'", o.Zone)
	}
	for name, port := range map[string]int{"--peer-port": o.PeerPort, "--gossip-port": o.GossipPort, "--admin-port": o.AdminPort, "--nbd-port": o.NBDPort} {
		if port < 1 || port > 65535 {
			return fmt.Errorf("%s %d: not a TCP port", name, port)
		}
	}
	members, err := joinAddresses(o.Join)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(o.DataDir, 0o700); err != nil {
		return fmt.Errorf("data directory: %w", err)
	}
	// The data directory holds the node's keys: only its owner enters
	// it. A directory made by hand (mkdir: 0755) is tightened, not
	// refused; one this process cannot tighten is refused.
	if err := pki.CheckDirMode(o.DataDir); err != nil {
		if chmodErr := os.Chmod(o.DataDir, 0o700); chmodErr != nil {
			return fmt.Errorf("%w (%v)", err, chmodErr)
		}
		logger.Warn("data directory was open to other users; made it 0700", "dir", o.DataDir)
	}
	unlock, err := lockDataDir(o.DataDir)
	if err != nil {
		return err
	}
	defer unlock()
	id, err := loadOrCreateID(o.DataDir)
	if err != nil {
		return err
	}
	host := ip.String()
	credentials, err := setupCredentials(ctx, o, id, ip, members, logger)
	if err != nil {
		return err
	}
	disks, err := parseDisks(o.Disks, o.DataDir)
	if err != nil {
		return err
	}
	// A disk taken out of service loses its copies without an epoch
	// change: recovery makes another pass to re-create them. The store
	// reports it here before recovery exists; recovery's kicker (below)
	// takes it from there.
	diskFailed := make(chan struct{}, 1)
	onDiskFailure := func(path string, cause error) {
		select {
		case diskFailed <- struct{}{}:
		default:
		}
	}
	applyTestKnobs(logger)
	objects, err := store.Open(store.Options{Disks: disks, Logger: logger, OnDiskFailure: onDiskFailure})
	if err != nil {
		return fmt.Errorf("object store: %w", err)
	}
	defer objects.Close()
	capacity := o.Capacity
	if capacity == 0 {
		if _, capacity, err = objects.Usage(); err != nil {
			return err
		}
	}
	peerAddr := net.JoinHostPort(host, strconv.Itoa(o.PeerPort))
	gossipAddr := net.JoinHostPort(host, strconv.Itoa(o.GossipPort))
	adminAddr := net.JoinHostPort(host, strconv.Itoa(o.AdminPort))
	// The peer port admits joining nodes once this node's cluster has
	// started (clusterStarted, closed after cluster.Start below); until
	// then it asks them to come again, as it does while the cluster does
	// not know its join secret yet.
	var c *cluster.Cluster
	clusterStarted := make(chan struct{})
	join := func(ctx context.Context, request peer.JoinRequest, remote net.Addr) (peer.JoinResponse, error) {
		select {
		case <-clusterStarted:
		default:
			return peer.JoinResponse{}, fmt.Errorf("%w: this node's cluster is starting", peer.ErrJoinNotReady)
		}
		return credentials.joinHandler(c, gossipAddr, logger)(ctx, request, remote)
	}
	peerListener, err := peer.ListenJoin(peerAddr, credentials.peer, logger, join)
	if err != nil {
		return fmt.Errorf("peer port: %w", err)
	}
	defer peerListener.Close()
	adminListener, err := net.Listen("tcp", adminAddr)
	if err != nil {
		return fmt.Errorf("admin port: %w", err)
	}
	defer adminListener.Close()
	nbdAddr := net.JoinHostPort(host, strconv.Itoa(o.NBDPort))
	nbdListener, err := net.Listen("tcp", nbdAddr)
	if err != nil {
		return fmt.Errorf("NBD port: %w", err)
	}
	defer nbdListener.Close()
	socketPath, socketListener, err := listenNBDSocket(o)
	if err != nil {
		return err
	}
	if socketListener != nil {
		defer socketListener.Close()
	}

	incarnation := make([]byte, 8)
	rand.Read(incarnation)
	meters := metrics.New()
	if err := meters.RouteLibraryMetrics(); err != nil {
		logger.Warn("raft's and memberlist's metrics are not exported", "err", err)
	}
	build := version.Get()
	c, err = cluster.Start(ctx, cluster.Config{
		Build:           cluster.Build{Version: build.Version, Commit: build.Commit, StoreFormat: store.FormatVersion, PeerProtocol: objproto.ObjectProtocolVersion, Signs: credentials.now().current.CanSign()},
		CurrentCA:       func() *x509.Certificate { return credentials.now().current.Cert },
		DataDir:         o.DataDir,
		NodeID:          id,
		Incarnation:     hex.EncodeToString(incarnation),
		BindIP:          host,
		PeerAddr:        peerAddr,
		GossipPort:      o.GossipPort,
		AdminAddr:       adminAddr,
		NBDAddr:         nbdAddr,
		Zone:            o.Zone,
		Capacity:        capacity,
		GossipKeys:      credentials.gossipRing,
		Join:            credentials.gossipSeeds(members, o.GossipPort),
		JoinTimeout:     o.JoinTimeout,
		Logger:          logger,
		Peer:            peerListener,
		PeerCredentials: credentials.peer,
		InsecureNBD:     o.InsecureNBD,
		DownOutInterval: o.DownOutInterval,
		ObserveApply:    func(d time.Duration) { meters.RaftApply.Observe(d.Seconds()) },
	})
	if err != nil {
		return err
	}
	defer c.Close()
	credentials.cluster.Store(c)
	credentials.signing = c
	go credentials.trustLoop(ctx, c, logger)
	close(clusterStarted)
	go peer.ServeCalls(peerListener.Protocol(peer.ProtocolSecrets), credentials.serveSecrets)
	go peer.ServeCalls(peerListener.Protocol(peer.ProtocolSign), credentials.serveSign)
	if err := credentials.initSecurity(ctx, c, logger); err != nil {
		return err
	}
	if credentials.created {
		logger.Info("new cluster: admin token in "+filepath.Join(o.DataDir, AdminTokenFile)+" (HERD_TOKEN or --token-file), join token in "+filepath.Join(o.DataDir, JoinTokenFile)+"; other nodes join with --join "+host+" and HERD_JOIN_TOKEN or --join-token-file", "node", id, "ca", credentials.fingerprint)
	}
	// The data path: this node's copies served to every gateway (its own
	// directly, others' over the peer port), and its gateway serving VDIs
	// over NBD.
	replicaSide := replica.New(c, replica.LocalStore{Store: objects})
	objectClient := objproto.NewObjectClient(credentials.peer)
	defer objectClient.Close()
	// Digests: STAT asks for copies' content digests only at the level
	// where every member knows the flag (object.FlagDigest).
	digests := func() bool { return c.Level() >= cluster.LevelCopyDigests }
	layouts := layout.NewHistory(c, logger)
	// Recovery reaches every replica but asks none to recover; the node
	// serves RECOVER (from its own gateway and maintenance through
	// replicas, from other nodes through objectServer) with it.
	rec := recovery.New(c, layouts, &replica.Client{Self: id, Local: replicaSide, Peer: objectClient, Metrics: meters, Digests: digests}, replicaSide, id, logger)
	side := replica.Served{Replica: replicaSide, Recoverer: rec.RecoverObject}
	replicas := &replica.Client{Self: id, Local: replicaSide, Peer: objectClient, Metrics: meters, Digests: digests, LocalRecover: side.Recover}
	objectServer := &objproto.ObjectServer{Handler: side, Logger: logger, Epoch: c.Epoch}
	go objectServer.Serve(peerListener.Protocol(peer.ProtocolObject))
	defer objectServer.Close()
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-diskFailed:
				rec.Kick()
			}
		}
	}()
	maint := maintenance.New(c, layouts, replicas, rec.Proof(), logger)
	// The gateway repairs an unclean VDI before its next writer serves it,
	// reading it through itself.
	gatewayOptions := o.Gateway
	gatewayOptions.Repair = func(ctx context.Context, g *gateway.Gateway, vdi cluster.VDI) error {
		return maint.RepairUnclean(ctx, g, vdi)
	}
	gatewayOptions.Pace = rec.Pace
	gw := gateway.New(c, layouts, replicas, logger, gatewayOptions)
	gw.StartFolder()
	defer gw.Close()
	go rec.Run(ctx)
	// NBD over TCP needs TLS with a client certificate from the cluster
	// CA (unless --insecure-nbd); the local socket is plaintext with
	// full access, guarded by its file mode.
	nbdMemory := o.NBDLimits.memory()
	nbdServer := o.NBDLimits.server(export.Backend{Gateway: gw, Authorize: nbdAuthorizer(c), Metrics: meters}, nbdMemory, logger)
	if o.InsecureNBD {
		logger.Warn("NBD on " + nbdAddr + " is plaintext and unauthenticated (--insecure-nbd): anyone who reaches it reads and writes every VDI")
	} else {
		nbdServer.TLSConfig = credentials.nbdTLS()
		nbdServer.RequireTLS = true
	}
	go nbdServer.Serve(context.Background(), nbdListener)
	go revalidateNBDClients(ctx, c, nbdServer, logger)
	var localNBD *nbd.Server
	if socketListener != nil {
		localNBD = o.NBDLimits.server(export.Backend{Gateway: gw, Metrics: meters}, nbdMemory, logger)
		go localNBD.Serve(context.Background(), socketListener)
	}

	scrubber := scrub.New(objects, replicas, layouts, id, scrub.Options{
		Interval:  o.ScrubInterval,
		MaxRate:   o.ScrubMaxRate,
		StatePath: filepath.Join(o.DataDir, "scrub.json"),
		Exclusive: func(oid object.OID, fn func() error) error {
			return replicaSide.Exclusive(oid, func(object.Epoch, bool) error { return fn() })
		},
		ObjectSize: gw.ObjectSize,
		Chunks:     gw.ScrubChunks,
		Copies:     func(oid object.OID) (int, bool) { return c.VDICopies(uint32(object.VDI(oid))) },
		DeepEvery:  o.ScrubDeepEvery,
		Logger:     logger,
	})
	go scrubber.Run(ctx)

	go maint.RunGarbageCollector(ctx, c, gw)
	go gw.RunMerges(ctx, c, gateway.NewMergeRate(int64(o.MergeRate)))
	meters.AddGauges(
		metrics.Gauge{Name: "herd_merge_objects_copied_total", Help: "Objects this node copied into a child while merging a deleted snapshot or flattening.", Read: func() []metrics.Sample { return []metrics.Sample{{Value: float64(gw.Merges().Copied.Load())}} }},
		metrics.Gauge{Name: "herd_merge_layers_merged_total", Help: "Deleted snapshots this node merged into their only child.", Read: func() []metrics.Sample { return []metrics.Sample{{Value: float64(gw.Merges().Merged.Load())}} }},
		metrics.Gauge{Name: "herd_merge_flattened_total", Help: "VDIs this node flattened.", Read: func() []metrics.Sample { return []metrics.Sample{{Value: float64(gw.Merges().Flattens.Load())}} }},
		metrics.Gauge{Name: "herd_merge_running", Help: "Merge and flatten jobs under way on this node.", Read: func() []metrics.Sample { return []metrics.Sample{{Value: float64(gw.Merges().Running.Load())}} }},
	)
	go maintenance.WatchSpace(ctx, c, objects, logger)
	security := api.Security{Fingerprint: credentials.fingerprint, ServerTLS: credentials.serverTLS(), PeerTLS: credentials.peerTLS(), Authority: credentials, Trust: credentials, CA: credentials}
	meters.AddGauges(nodeGauges(c, objects, rec, nbdServer, localNBD)...)
	meters.AddGauges(scrubGauges(scrubber)...)
	meters.AddGauges(credentials.gauges(c)...)
	meters.AddGauges(metrics.Gauge{Name: "herd_gateway_zone_lag_bytes", Help: "Bytes of writes to VDIs set to --ack zone that this node acknowledged once its zone had them, not yet in the other zones.",
		Read: func() []metrics.Sample { return []metrics.Sample{{Value: float64(gw.LagBytes())}} }})
	apiServer := api.NewServer(c, dataPath{gateway: gw, store: objects, recovery: rec, maintenance: maint, metrics: meters, scrub: scrubber}, security, logger,
		api.Options{OvercommitRatio: o.OvercommitRatio, Connections: o.AdminLimits})
	meters.AddGauges(capacityGauges(apiServer)...)
	go apiServer.RunCapacity(ctx)
	served := make(chan error, 1)
	go func() { served <- apiServer.Serve(adminListener) }()
	logger.Info("herd node running", "node", id, "bind", host, "peer", peerAddr, "admin", adminAddr, "nbd", nbdAddr, "nbd_socket", socketPath, "insecure_nbd", o.InsecureNBD, "zone", o.Zone, "capacity", capacity)
	select {
	case <-ctx.Done():
	case err := <-served:
		return fmt.Errorf("admin API stopped: %w", err)
	case err := <-c.Halted():
		shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		nbdServer.Shutdown(shutdownCtx)
		if localNBD != nil {
			localNBD.Shutdown(shutdownCtx)
		}
		apiServer.Shutdown(shutdownCtx)
		c.Close()
		return err
	}
	stopping := time.Now()
	logger.Info("stopping")
	// A clean stop is a departure, not a failure: the node tells the
	// cluster first and hands its raft roles over (at most a few seconds)
	// while the NBD clients drain; Close waits for it.
	go c.Depart()
	// The NBD clients of both servers at once: each connection stops
	// reading requests, those it read are answered, the export is
	// flushed, and the connection closes its end first (nbd.Server
	// Shutdown), so that a client with reconnect-delay sends the rest
	// again once this node is back. Those still running after
	// nbdDrainTimeout are cut.
	shutdownCtx, cancel := context.WithTimeout(context.Background(), nbdDrainTimeout)
	defer cancel()
	var drained sync.WaitGroup
	for _, s := range []*nbd.Server{nbdServer, localNBD} {
		if s == nil {
			continue
		}
		drained.Add(1)
		go func() {
			defer drained.Done()
			if err := s.Shutdown(shutdownCtx); err != nil {
				logger.Warn("stopping: NBD requests still in flight were cut", "after", nbdDrainTimeout, "err", err)
			}
		}()
	}
	drained.Wait()
	apiServer.Shutdown(shutdownCtx)
	err = c.Close()
	logger.Info("stopped", "after", time.Since(stopping).Round(time.Millisecond))
	return err
}

// nbdDrainTimeout bounds how long a stopping node waits for the NBD
// requests in flight to be answered (a write's replicas answer in
// milliseconds; one waiting for an unreachable replica is retried for
// the gateway's RetryTimeout).
const nbdDrainTimeout = 5 * time.Second

func loadOrCreateID(dir string) (string, error) {
	path := filepath.Join(dir, "node.json")
	var identity struct {
		ID string `json:"id"`
	}
	data, err := os.ReadFile(path)
	if err == nil {
		if err := json.Unmarshal(data, &identity); err != nil || len(identity.ID) != 16 {
			return "", fmt.Errorf("%s is damaged (%v); it holds this node's identity", path, err)
		}
		return identity.ID, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return "", err
	}
	raw := make([]byte, 8)
	rand.Read(raw)
	identity.ID = hex.EncodeToString(raw)
	data, _ = json.Marshal(identity)
	return identity.ID, writeFileSync(path, data, 0o600)
}

func writeFileSync(path string, data []byte, mode os.FileMode) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func lockDataDir(dir string) (func(), error) {
	f, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("data directory %s is in use by another herd process", dir)
	}
	return func() { f.Close() }, nil
}

// parseDisks reads --disk DIR[:WEIGHT] values; no value means the data
// directory alone.
func parseDisks(values []string, dataDir string) ([]store.Disk, error) {
	if len(values) == 0 {
		return []store.Disk{{Path: dataDir}}, nil
	}
	var disks []store.Disk
	for _, v := range values {
		path, weightText, hasWeight := strings.Cut(v, ":")
		d := store.Disk{Path: path}
		if hasWeight {
			w, err := size.Parse(weightText)
			if err != nil || w == 0 {
				return nil, fmt.Errorf("--disk %q: weight %q is not a size like 500G", v, weightText)
			}
			d.Weight = w
		}
		if info, err := os.Stat(path); err != nil || !info.IsDir() {
			return nil, fmt.Errorf("--disk %q: not a directory", path)
		}
		disks = append(disks, d)
	}
	return disks, nil
}

// dataPath gives the admin API this node's data path.
type dataPath struct {
	gateway     *gateway.Gateway
	metrics     *metrics.Node
	store       *store.Store
	recovery    *recovery.Recovery
	maintenance *maintenance.Maintenance
	scrub       *scrub.Scrubber
}

func (d dataPath) Scrub() *scrub.Scrubber { return d.scrub }

func (d dataPath) Recovery() recovery.Status { return d.recovery.Status() }

func (d dataPath) RecoveryLimits() recovery.Limits { return d.recovery.Limits() }

func (d dataPath) SetRecoveryLimits(l recovery.Limits) error { return d.recovery.SetLimits(l) }

func (d dataPath) Check(ctx context.Context, name string, repair bool) (maintenance.CheckReport, error) {
	return d.maintenance.Check(ctx, d.gateway, name, repair)
}

func (d dataPath) Diff(ctx context.Context, name, since string) (gateway.Diff, error) {
	return d.gateway.Diff(ctx, name, since)
}

func (d dataPath) Snapshot(ctx context.Context, name, tag string) (cluster.SnapshotResult, error) {
	return d.gateway.Snapshot(ctx, name, tag)
}

func (d dataPath) Space(ctx context.Context) (map[uint32]maintenance.Space, error) {
	return d.maintenance.Space(ctx, d.gateway)
}

// Usage is what this node's objects take on its disks, and the free
// space left there.
//
// Objects counts the copies of replicated objects only: chunks of
// erasure-coded objects (object.IsChunk) take their bytes in UsedBytes
// but are not counted. A drain is done when the node holds no objects
// (`node list`'s "drained", `cluster health`), and recovery never moves a
// chunk (one copy, placed by its object's head, not by the epoch): the
// gateway's fold moves chunks off a drained node, so counted here they
// would hold a drain's completion until every VDI was next folded.
func (d dataPath) Usage() (api.Usage, error) {
	var u api.Usage
	err := d.store.List(func(oid object.OID, _ store.Info) error {
		info, err := d.store.Stat(oid)
		if err != nil {
			return nil // removed meanwhile
		}
		if !object.IsChunk(oid) {
			u.Objects++
		}
		u.UsedBytes += info.AllocatedBytes
		return nil
	})
	if err != nil {
		return u, err
	}
	u.FailedDisks = d.store.FailedDisks()
	for _, disk := range d.store.Disks() {
		u.ChecksumErrors += disk.ChecksumErrors
		u.BlocksRepaired += disk.BlocksRepaired
	}
	used, capacity, err := d.store.Usage()
	if err == nil && capacity > used {
		u.FreeBytes = capacity - used
	}
	return u, err
}

// capacityGauges export the cluster's capacity as the admin server last
// computed it (api.Server.CachedCapacity: by the leader each minute, and
// by any node answering cluster health or info); none while it has no
// recent complete one. The limit is this node's --overcommit-ratio.
func capacityGauges(a *api.Server) []metrics.Gauge {
	cached := func(value func(api.Capacity) float64) func() []metrics.Sample {
		return func() []metrics.Sample {
			c, ok := a.CachedCapacity()
			if !ok {
				return nil
			}
			return []metrics.Sample{{Value: value(c)}}
		}
	}
	return []metrics.Gauge{
		{Name: "herd_cluster_usable_bytes", Help: "The VDI data the alive nodes' raw space holds: raw divided by the copies (the mean of the VDIs', weighted by size), as cluster info shows it; exported by the leader and by a node that computed it for cluster health or info in the last 5 minutes.",
			Read: cached(func(c api.Capacity) float64 { return float64(c.UsableBytes) })},
		{Name: "herd_cluster_provisioned_bytes", Help: "The writable VDIs' sizes summed: what they are promised, to compare with herd_cluster_usable_bytes.",
			Read: cached(func(c api.Capacity) float64 { return float64(c.ProvisionedBytes) })},
		{Name: "herd_cluster_overcommit_ratio", Help: "Provisioned divided by usable space; cluster health warns above herd_cluster_overcommit_limit.",
			Read: cached(func(c api.Capacity) float64 { return c.Overcommit })},
		{Name: "herd_cluster_overcommit_limit", Help: "The overcommit ratio above which this node's cluster health warns (herd server --overcommit-ratio).",
			Read: func() []metrics.Sample { return []metrics.Sample{{Value: a.OvercommitLimit()}} }},
		{Name: "herd_cluster_recovery_headroom_short", Help: "1 when failure domains (nodes, or zones) outnumber the copies but the free space of the others could not hold a recovery of the largest domain's share; cluster health warns.",
			Read: cached(func(c api.Capacity) float64 {
				if c.RecoveryShort {
					return 1
				}
				return 0
			})},
	}
}

// nodeGauges are the metrics read at scrape time from state the node
// keeps anyway.
func nodeGauges(c *cluster.Cluster, objects *store.Store, rec *recovery.Recovery, servers ...*nbd.Server) []metrics.Gauge {
	one := func(v float64) []metrics.Sample { return []metrics.Sample{{Value: v}} }
	flag := func(b bool) float64 {
		if b {
			return 1
		}
		return 0
	}
	return []metrics.Gauge{
		{Name: "herd_cluster_epoch", Help: "The epoch this node has applied.", Read: func() []metrics.Sample { return one(float64(c.Epoch())) }},
		{Name: "herd_build_info", Help: "1, labelled with this node's herd version, commit, the highest cluster feature level it supports, the object file format it writes and its object protocol version.", Labels: []string{"version", "commit", "supported_feature_level", "object_format", "object_protocol"}, Read: func() []metrics.Sample {
			v := version.Get()
			return []metrics.Sample{{Labels: []string{v.Version, v.Commit, strconv.Itoa(cluster.SupportedLevel), strconv.Itoa(store.FormatVersion), strconv.Itoa(objproto.ObjectProtocolVersion)}, Value: 1}}
		}},
		{Name: "herd_cluster_provisioned_raw_bytes", Help: "The writable VDIs' sizes times their copies, or (K+M)/K for an erasure-coded VDI: the raw space they are promised (the same on every node; compare with the sum of herd_disk_capacity_bytes).", Read: func() []metrics.Sample {
			var promised float64
			for _, v := range c.VDIs() {
				promised += float64(v.Size) * v.SpaceFactor()
			}
			return one(promised)
		}},
		{Name: "herd_cluster_feature_level", Help: "The cluster's feature level as this node applied it (herd cluster finalize-upgrade raises it).", Read: func() []metrics.Sample { return one(float64(c.Level())) }},
		{Name: "herd_cluster_quorum", Help: "1 if this node reaches a majority of the voters.", Read: func() []metrics.Sample {
			ok, _ := c.QuorumStatus()
			return one(flag(ok))
		}},
		{Name: "herd_cluster_nodes", Help: "Nodes in the cluster log, by state.", Labels: []string{"state"}, Read: func() []metrics.Sample {
			counts := map[string]float64{}
			for _, n := range c.Nodes() {
				counts[string(n.State)]++
			}
			var out []metrics.Sample
			for state, n := range counts {
				out = append(out, metrics.Sample{Labels: []string{state}, Value: n})
			}
			return out
		}},
		{Name: "herd_recovery_objects_remaining", Help: "Objects this node's recovery pass has still to make current.", Read: func() []metrics.Sample { return one(float64(rec.Status().Remaining)) }},
		{Name: "herd_recovery_bytes_remaining", Help: "Estimated bytes this node's recovery pass has still to copy.", Read: func() []metrics.Sample { return one(float64(rec.Status().BytesRemaining)) }},
		{Name: "herd_recovery_rate_bytes_per_second", Help: "Copy rate of this node's recovery pass.", Read: func() []metrics.Sample { return one(float64(rec.Status().Rate)) }},
		{Name: "herd_recovery_objects_deferred", Help: "Objects placed here that recovery leaves alone while a node is down inside its maintenance window.", Read: func() []metrics.Sample { return one(float64(rec.Status().Deferred)) }},
		{Name: "herd_recovery_objects_unavailable", Help: "Objects placed here whose newest copies may be on nodes that are down.", Read: func() []metrics.Sample { return one(float64(rec.Status().Unavailable)) }},
		{Name: "herd_disk_used_bytes", Help: "Used space of each object disk's file system.", Labels: []string{"disk"}, Read: func() []metrics.Sample {
			var out []metrics.Sample
			for _, d := range objects.Disks() {
				out = append(out, metrics.Sample{Labels: []string{d.Path}, Value: float64(d.UsedBytes)})
			}
			return out
		}},
		{Name: "herd_disk_capacity_bytes", Help: "Size of each object disk's file system.", Labels: []string{"disk"}, Read: func() []metrics.Sample {
			var out []metrics.Sample
			for _, d := range objects.Disks() {
				out = append(out, metrics.Sample{Labels: []string{d.Path}, Value: float64(d.CapacityBytes)})
			}
			return out
		}},
		{Name: "herd_disk_checksum_errors_total", Help: "4 KiB blocks found failing their data checksum on each object disk (reads, writes, scrub).", Labels: []string{"disk"}, Counter: true, Read: func() []metrics.Sample {
			var out []metrics.Sample
			for _, d := range objects.Disks() {
				out = append(out, metrics.Sample{Labels: []string{d.Path}, Value: float64(d.ChecksumErrors)})
			}
			return out
		}},
		{Name: "herd_disk_blocks_repaired_total", Help: "4 KiB blocks that failed their checksum and were rewritten from a good replica, on each object disk.", Labels: []string{"disk"}, Counter: true, Read: func() []metrics.Sample {
			var out []metrics.Sample
			for _, d := range objects.Disks() {
				out = append(out, metrics.Sample{Labels: []string{d.Path}, Value: float64(d.BlocksRepaired)})
			}
			return out
		}},
		{Name: "herd_disk_failed", Help: "1 for an object disk taken out of service after an I/O error.", Labels: []string{"disk"}, Read: func() []metrics.Sample {
			var out []metrics.Sample
			for _, d := range objects.Disks() {
				out = append(out, metrics.Sample{Labels: []string{d.Path}, Value: flag(d.Failed)})
			}
			return out
		}},
		{Name: "herd_nbd_connections", Help: "Open NBD connections (TCP and local socket).", Read: func() []metrics.Sample {
			n := 0
			for _, s := range servers {
				if s != nil {
					n += s.Connections()
				}
			}
			return one(float64(n))
		}},
	}
}

func (d dataPath) Metrics() prometheus.Gatherer { return d.metrics.Registry }

// scrubGauges are the scrub's progress and findings on this node.
func scrubGauges(sc *scrub.Scrubber) []metrics.Gauge {
	one := func(v float64) []metrics.Sample { return []metrics.Sample{{Value: v}} }
	return []metrics.Gauge{
		{Name: "herd_scrub_passes_total", Help: "Scrub passes this node completed since it started.", Counter: true, Read: func() []metrics.Sample { return one(float64(sc.Status().Passes)) }},
		{Name: "herd_scrub_pass_bytes_verified", Help: "Bytes the current (or last) scrub pass has read and verified.", Read: func() []metrics.Sample { return one(float64(sc.Status().BytesVerified)) }},
		{Name: "herd_scrub_pass_objects_remaining", Help: "Copies the current scrub pass has still to verify.", Read: func() []metrics.Sample {
			st := sc.Status()
			return one(float64(max(st.Objects-st.Done, 0)))
		}},
		{Name: "herd_scrub_last_complete_timestamp_seconds", Help: "Unix time of the end of the last complete scrub pass (0: none yet).", Read: func() []metrics.Sample {
			st := sc.Status()
			if st.LastComplete.IsZero() {
				return one(0)
			}
			return one(float64(st.LastComplete.Unix()))
		}},
		{Name: "herd_scrub_unrepairable_blocks_total", Help: "Blocks scrub passes found bad on every replica (their data is lost), or bad in a chunk of an erasure-coded object (one copy: left to its gateway), since the node started.", Counter: true, Read: func() []metrics.Sample { return one(float64(sc.Status().Unrepairable)) }},
	}
}

func (d dataPath) Opens() []gateway.OpenInfo { return d.gateway.Opens() }
