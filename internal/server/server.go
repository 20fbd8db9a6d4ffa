// Package server wires one herd node together from its parts: identity and
// secret in the data directory, the peer port, the cluster log, the admin
// API. It holds no logic of its own.
package server

import (
	"context"
	"crypto/rand"
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
	"sync/atomic"
	"syscall"
	"time"

	"github.com/herd-storage/herd/internal/api"
	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/gateway"
	"github.com/herd-storage/herd/internal/nbd"
	"github.com/herd-storage/herd/internal/peer"
	"github.com/herd-storage/herd/internal/size"
	"github.com/herd-storage/herd/internal/store"
)

// Default ports on the bind address (issue 2).
const (
	DefaultPeerPort   = 7000
	DefaultGossipPort = 7001
	DefaultAdminPort  = 7080
	DefaultNBDPort    = 10809
)

// Options are `herd server`'s flags.
type Options struct {
	DataDir     string
	BindIP      string
	Join        string // IP[:PORT][,IP[:PORT]...]
	Zone        string
	Token       string
	Capacity    uint64   // 0: the data directory's file system size
	Disks       []string // DIR[:WEIGHT] object disks; none: the data directory
	PeerPort    int
	GossipPort  int
	AdminPort   int
	NBDPort     int
	JoinTimeout time.Duration
	Logger      *slog.Logger
}

const tokenFile = "cluster.token"

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
	join, err := ParseJoin(o.Join)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(o.DataDir, 0o700); err != nil {
		return fmt.Errorf("data directory: %w", err)
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
	token, created, err := loadToken(o.DataDir, o.Token, len(join) > 0)
	if err != nil {
		return err
	}
	disks, err := parseDisks(o.Disks, o.DataDir)
	if err != nil {
		return err
	}
	// A disk taken out of service loses its copies without an epoch
	// change: recovery makes another pass to re-create them.
	var recoveryKick atomic.Pointer[func()]
	onDiskFailure := func(path string, cause error) {
		if kick := recoveryKick.Load(); kick != nil {
			(*kick)()
		}
	}
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
	host := ip.String()
	peerAddr := net.JoinHostPort(host, strconv.Itoa(o.PeerPort))
	adminAddr := net.JoinHostPort(host, strconv.Itoa(o.AdminPort))
	peerListener, err := peer.Listen(peerAddr, peer.Key(token), logger)
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

	incarnation := make([]byte, 8)
	rand.Read(incarnation)
	c, err := cluster.Start(ctx, cluster.Config{
		DataDir:     o.DataDir,
		NodeID:      id,
		Incarnation: hex.EncodeToString(incarnation),
		BindIP:      host,
		PeerAddr:    peerAddr,
		GossipPort:  o.GossipPort,
		AdminAddr:   adminAddr,
		NBDAddr:     nbdAddr,
		Zone:        o.Zone,
		Capacity:    capacity,
		Token:       token,
		Join:        join,
		JoinTimeout: o.JoinTimeout,
		Logger:      logger,
		Peer:        peerListener,
	})
	if err != nil {
		return err
	}
	defer c.Close()
	if created {
		logger.Info("new cluster: its token is in "+filepath.Join(o.DataDir, tokenFile)+"; other nodes join with --join "+host+" --token TOKEN", "node", id)
	}
	// The data path: this node's copies served to every gateway (its own
	// directly, others' over the peer port), and its gateway serving VDIs
	// over NBD.
	replica := gateway.NewReplica(c, gateway.LocalStore{Store: objects})
	objectServer := &peer.ObjectServer{Handler: replica, Logger: logger, Epoch: c.Epoch}
	go objectServer.Serve(peerListener.Protocol(peer.ProtocolObject))
	defer objectServer.Close()
	objectClient := peer.NewObjectClient(peer.Key(token))
	defer objectClient.Close()
	replicas := &gateway.PeerReplicas{Self: id, Local: replica, Client: objectClient}
	gw := gateway.New(c, replicas, logger, gateway.Options{})
	recovery := gateway.NewRecovery(gw, replica, replicas, id, logger)
	kick := recovery.Kick
	recoveryKick.Store(&kick)
	go recovery.Run(ctx)
	nbdServer := &nbd.Server{Backend: gw, Logger: logger}
	go nbdServer.Serve(context.Background(), nbdListener)

	go collectGarbage(ctx, c, gw, logger)
	go watchSpace(ctx, c, objects, logger)
	apiServer := api.NewServer(c, dataPath{gateway: gw, store: objects, recovery: recovery}, token, logger)
	served := make(chan error, 1)
	go func() { served <- apiServer.Serve(adminListener) }()
	logger.Info("herd node running", "node", id, "bind", host, "peer", peerAddr, "admin", adminAddr, "zone", o.Zone, "capacity", capacity)
	select {
	case <-ctx.Done():
	case err := <-served:
		return fmt.Errorf("admin API stopped: %w", err)
	}
	logger.Info("stopping")
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	nbdServer.Shutdown(shutdownCtx)
	apiServer.Shutdown(shutdownCtx)
	return c.Close()
}

// ParseJoin splits "IP[:PORT][,IP[:PORT]...]" into gossip addresses.
func ParseJoin(list string) ([]string, error) {
	var out []string
	for _, part := range strings.Split(list, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		host, port, err := net.SplitHostPort(part)
		if err != nil {
			host, port = part, strconv.Itoa(DefaultGossipPort)
		}
		if host == "" {
			return nil, fmt.Errorf("--join %q: missing address", part)
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return nil, fmt.Errorf("--join %q: %q is not a port", part, port)
		}
		out = append(out, net.JoinHostPort(host, port))
	}
	return out, nil
}

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

// loadToken returns the cluster secret: the one stored in the data
// directory, else the one given (stored for restarts), else, for the first
// node of a new cluster, a new one.
func loadToken(dir, given string, joining bool) (token string, created bool, err error) {
	path := filepath.Join(dir, tokenFile)
	data, err := os.ReadFile(path)
	if err == nil {
		stored := strings.TrimSpace(string(data))
		if given != "" && given != stored {
			return "", false, fmt.Errorf("the token given does not match %s: this node belongs to another cluster (use another --data directory)", path)
		}
		return stored, false, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return "", false, err
	}
	if given == "" {
		if joining {
			return "", false, fmt.Errorf("joining needs the cluster's token: give --token or HERD_TOKEN (it is in the first node's DATA/%s)", tokenFile)
		}
		if _, err := os.Stat(filepath.Join(dir, "raft")); err == nil {
			return "", false, fmt.Errorf("%s is missing but the node has cluster state; give --token", path)
		}
		raw := make([]byte, 24)
		rand.Read(raw)
		given, created = "herd-"+hex.EncodeToString(raw), true
	}
	if len(given) < 16 {
		return "", false, errors.New("the token is too short (at least 16 characters)")
	}
	return given, created, writeFileSync(path, []byte(given+"\n"), 0o600)
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
	gateway  *gateway.Gateway
	store    *store.Store
	recovery *gateway.Recovery
}

func (d dataPath) Recovery() gateway.RecoveryStatus { return d.recovery.Status() }

func (d dataPath) RecoveryLimits() gateway.RecoveryLimits { return d.recovery.Limits() }

func (d dataPath) SetRecoveryLimits(l gateway.RecoveryLimits) error { return d.recovery.SetLimits(l) }

func (d dataPath) Check(ctx context.Context, name string, repair bool) (gateway.CheckReport, error) {
	return d.gateway.Check(ctx, name, repair)
}

func (d dataPath) Snapshot(ctx context.Context, name, tag string) (cluster.SnapshotResult, error) {
	return d.gateway.Snapshot(ctx, name, tag)
}

func (d dataPath) Space(ctx context.Context) (map[uint32]gateway.Space, error) {
	return d.gateway.Space(ctx)
}

// Usage is what this node's objects take on its disks, and the free
// space left there.
func (d dataPath) Usage() (api.Usage, error) {
	var u api.Usage
	err := d.store.List(func(oid uint64, _ store.Info) error {
		info, err := d.store.Stat(oid)
		if err != nil {
			return nil // removed meanwhile
		}
		u.Objects++
		u.UsedBytes += info.AllocatedBytes
		return nil
	})
	if err != nil {
		return u, err
	}
	used, capacity, err := d.store.Usage()
	if err == nil && capacity > used {
		u.FreeBytes = capacity - used
	}
	return u, err
}

// Space thresholds, in multiples of the disks' reserve (the free space
// below which the store takes no new object: 5% of a disk, at most 1 GiB).
// Below fullAt this node asks the cluster to give it no objects; it takes
// them again above clearAt, and no sooner than fullFor after it became
// full, so that a node whose share does not fit does not flap.
const (
	fullAt  = 2
	clearAt = 4
	fullFor = 5 * time.Minute
)

// watchSpace marks this node full when its disks are nearly full: the
// placement then gives it no objects, its copies are re-created on other
// nodes and only then deleted here (issue 5 item 7, "never fills a disk").
func watchSpace(ctx context.Context, c *cluster.Cluster, objects *store.Store, logger *slog.Logger) {
	ticker := time.NewTicker(2 * time.Second)
	defer ticker.Stop()
	var since time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		free, total, reserve, err := objects.Pressure()
		if err != nil {
			logger.Warn("cannot read disk space", "err", err)
			continue
		}
		if reserve == 0 {
			reserve = total / 20
		}
		self, ok := c.Node(c.ID())
		if !ok || self.State != cluster.NodeAlive {
			continue
		}
		want := self.Full
		switch {
		case !self.Full && free < fullAt*reserve:
			want = true
		case self.Full && free > clearAt*reserve && time.Since(since) > fullFor:
			want = false
		}
		if want == self.Full {
			continue
		}
		work, cancel := context.WithTimeout(ctx, 10*time.Second)
		err = c.SetFull(work, want)
		cancel()
		switch {
		case err != nil:
			logger.Warn("cannot tell the cluster about this node's disk space", "full", want, "err", err)
		case want:
			since = time.Now()
			logger.Warn("this node's disks are nearly full: it takes no new objects, and its copies move to other nodes",
				"free", free, "total", total, "reserve", reserve)
		default:
			logger.Info("this node has space again: it takes objects again", "free", free, "total", total)
		}
	}
}

// collectGarbage frees, on the leader, the objects of VDIs nothing reads
// any more (deleted VDIs and snapshots, rolled-back VDIs), then records
// each in the log. Any node may become leader and continue the list.
func collectGarbage(ctx context.Context, c *cluster.Cluster, gw *gateway.Gateway, logger *slog.Logger) {
	ticker := time.NewTicker(time.Second)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		if !c.IsLeader() {
			continue
		}
		for _, g := range c.Garbage() {
			work, cancel := context.WithTimeout(ctx, 5*time.Minute)
			err := gw.CollectGarbage(work, g)
			if err == nil {
				err = c.GarbageDone(work, g.ID)
			}
			cancel()
			if err != nil {
				logger.Warn("freeing objects of a deleted vdi failed; will retry", "vdi", g.ID, "err", err)
				break
			}
			logger.Info("freed the objects of a deleted vdi", "vdi", g.ID)
		}
	}
}
