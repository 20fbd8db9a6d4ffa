package cli

import (
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"time"

	"github.com/spf13/cobra"

	"github.com/herd-storage/herd/internal/api"
	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/gateway"
	"github.com/herd-storage/herd/internal/logging"
	"github.com/herd-storage/herd/internal/server"
	"github.com/herd-storage/herd/internal/size"
	"github.com/herd-storage/herd/internal/version"
)

func serverCommand() *cobra.Command {
	var o server.Options
	var capacity, level, logFormat, joinTokenFile, memoryBudget, cowMemory, zoneLag, scrubRate, mergeRate string
	var cpus int
	cmd := &cobra.Command{
		Use:   "server",
		Short: "run a herd node on this host",
		Long: `Run a herd node. The first node of a cluster is started without --join: it
creates the cluster's CA and writes two secrets, mode 0600:

  DATA/admin.token  the admin API token (herd commands: HERD_TOKEN or --token-file)
  DATA/join.token   the join token (new nodes: HERD_JOIN_TOKEN or --join-token-file)

Every other node joins by naming any member: --join IP with the join token.
NBD on the TCP port needs TLS with a client certificate (herd client add);
the local socket DATA/nbd.sock (mode 0660) is plaintext for this host's
hypervisor.`,
		Args: args(0, "[flags]"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.JoinToken = os.Getenv("HERD_JOIN_TOKEN")
			if joinTokenFile != "" {
				token, err := tokenFromFile(joinTokenFile)
				if err != nil {
					return usage(fmt.Errorf("--join-token-file: %w", err))
				}
				o.JoinToken = token
			}
			for name, value := range map[string]int{"--pieces-per-request": o.Gateway.PiecesPerRequest, "--zero-pieces": o.Gateway.ZeroPieces,
				"--nbd-max-connections": o.NBDLimits.MaxConnections, "--nbd-max-connections-per-client": o.NBDLimits.MaxConnectionsPerClient, "--nbd-max-options": o.NBDLimits.MaxOptions,
				"--nbd-max-unauthenticated": o.NBDLimits.MaxUnauthenticated, "--nbd-max-unauthenticated-per-source": o.NBDLimits.MaxUnauthenticatedPerSource,
				"--admin-max-connections": o.AdminLimits.MaxConnections, "--admin-max-unauthenticated": o.AdminLimits.MaxUnauthenticated, "--admin-max-unauthenticated-per-source": o.AdminLimits.MaxUnauthenticatedPerSource} {
				if value < 1 {
					return fmt.Errorf("%s %d: must be at least 1", name, value)
				}
			}
			if o.NBDLimits.HandshakeTimeout <= 0 || o.NBDLimits.ReplyTimeout <= 0 {
				return usage(fmt.Errorf("--nbd-handshake-timeout and --nbd-reply-timeout must be positive durations"))
			}
			if o.ScrubDeepEvery < 1 {
				return usage(fmt.Errorf("--scrub-deep-every %d: must be at least 1", o.ScrubDeepEvery))
			}
			if o.ScrubInterval <= 0 {
				return usage(fmt.Errorf("--scrub-interval %v: must be a positive duration (such as 168h)", o.ScrubInterval))
			}
			if o.OvercommitRatio <= 0 || o.OvercommitRatio > 1e6 {
				return usage(fmt.Errorf("--overcommit-ratio %g: a ratio above 0, such as 1.0 (warn when promised more than the disks hold) or 3 (thin provisioning)", o.OvercommitRatio))
			}
			if o.DownOutInterval < 0 || o.DownOutInterval > cluster.MaxMaintenance {
				return usage(fmt.Errorf("--down-out-interval %v: between 0 (recover a stopped node's objects elsewhere at once) and %v", o.DownOutInterval, cluster.MaxMaintenance))
			}
			if cpus < 0 {
				return usage(fmt.Errorf("--cpus %d: a number of cores, at least 1 (0: every core the host or its cgroup allows)", cpus))
			}
			rate, err := parseRate(scrubRate)
			if err != nil || rate == 0 {
				return usage(fmt.Errorf("--scrub-max-rate %q: a size per second such as 50MiB/s (the scrub is always limited)", scrubRate))
			}
			o.ScrubMaxRate = rate
			mergeBytes, err := parseRate(mergeRate)
			if err != nil {
				return usage(fmt.Errorf("--merge-rate %q: a size per second such as 64MiB/s, or 0 for unlimited", mergeRate))
			}
			o.MergeRate = mergeBytes
			if cowMemory != "" {
				bytes, err := size.Parse(cowMemory)
				if err != nil {
					return usage(fmt.Errorf("--cow-memory: %w", err))
				}
				o.Gateway.CopyBytes = int64(bytes)
			}
			if zoneLag != "" {
				bytes, err := size.Parse(zoneLag)
				if err != nil {
					return usage(fmt.Errorf("--zone-lag: %w", err))
				}
				if bytes == 0 {
					return usage(fmt.Errorf("--zone-lag 0: give a size such as 64MiB (the bytes of writes acknowledged in this zone and not yet in the others)"))
				}
				o.Gateway.LagBytes = int64(bytes)
			}
			if memoryBudget != "" {
				bytes, err := size.Parse(memoryBudget)
				if err != nil {
					return usage(fmt.Errorf("--nbd-memory: %w", err))
				}
				o.NBDLimits.MemoryBudget = int64(bytes)
			}
			if capacity != "" {
				bytes, err := size.Parse(capacity)
				if err != nil {
					return err
				}
				o.Capacity = bytes
			}
			var lv slog.Level
			if err := lv.UnmarshalText([]byte(level)); err != nil {
				return usage(fmt.Errorf("--log-level %q: use debug, info, warn or error", level))
			}
			logger, err := logging.New(os.Stderr, logFormat, lv)
			if err != nil {
				return err
			}
			o.Logger = logger
			if cpus > 0 {
				// Go's scheduler keeps up to GOMAXPROCS threads running herd's
				// goroutines, and idle ones spin looking for work: on a host
				// whose cores also run the VMs, --cpus bounds herd's share.
				runtime.GOMAXPROCS(cpus)
			}
			logger.Info("herd starting", "version", version.Get().String(), "cpus", runtime.GOMAXPROCS(0))
			ctx, cancel := signalContext()
			defer cancel()
			return server.Run(ctx, o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.DataDir, "data", "", "data directory: node identity, cluster log, objects (required)")
	f.StringVar(&o.BindIP, "bind", "127.0.0.1", "this node's IP address")
	f.StringVar(&o.Join, "join", "", "IP[:PORT][,IP...] of any existing members (omit on the first node)")
	f.StringVar(&o.Zone, "zone", "", "failure domain (rack, room...); replicas go to distinct zones")
	f.StringVar(&joinTokenFile, "join-token-file", "", "file holding the join token, to join (else env HERD_JOIN_TOKEN)")
	f.StringArrayVar(&o.Disks, "disk", nil, "object disk DIR[:WEIGHT], repeatable (default: the data directory)")
	f.StringVar(&capacity, "capacity", "", "capacity weight, e.g. 500G (default: size of the data directory's file system)")
	f.IntVar(&o.PeerPort, "peer-port", server.DefaultPeerPort, "peer port (raft, data)")
	f.IntVar(&o.GossipPort, "gossip-port", server.DefaultGossipPort, "gossip port (tcp+udp)")
	f.IntVar(&o.AdminPort, "admin-port", server.DefaultAdminPort, "admin HTTP port")
	f.IntVar(&o.NBDPort, "nbd-port", server.DefaultNBDPort, "NBD port (TLS with a client certificate)")
	f.StringVar(&o.NBDSocket, "nbd-socket", "", "local plaintext NBD socket, mode 0660 (default DATA/nbd.sock, reachable by root and herd's user only; with --nbd-socket-group "+server.SharedNBDSocket+"; 'none' for none)")
	f.StringVar(&o.NBDSocketGroup, "nbd-socket-group", "", "group of the local NBD socket, whose members may use every VDI through it: the hypervisor's, e.g. libvirt-qemu (herd must be in it; every directory above the socket must let it in)")
	f.BoolVar(&o.InsecureNBD, "insecure-nbd", false, "serve plaintext, unauthenticated NBD on the TCP port (labs only)")
	f.StringVar(&memoryBudget, "nbd-memory", "256MiB", "payload memory for all NBD connections together")
	f.IntVar(&o.NBDLimits.MaxConnections, "nbd-max-connections", 1024, "NBD connections in all")
	f.IntVar(&o.NBDLimits.MaxConnectionsPerClient, "nbd-max-connections-per-client", 64, "NBD connections per client certificate (or remote IP)")
	f.IntVar(&o.NBDLimits.MaxOptions, "nbd-max-options", 1024, "options per NBD handshake")
	f.IntVar(&o.NBDLimits.MaxUnauthenticated, "nbd-max-unauthenticated", 512, "NBD connections not through their TLS handshake yet, in all (when full, the oldest is closed to admit a new one)")
	f.IntVar(&o.NBDLimits.MaxUnauthenticatedPerSource, "nbd-max-unauthenticated-per-source", 64, "NBD connections not through their TLS handshake yet, per remote IP")
	f.IntVar(&o.AdminLimits.MaxConnections, "admin-max-connections", api.DefaultMaxConnections, "admin API connections that carried a valid token, in all")
	f.IntVar(&o.AdminLimits.MaxUnauthenticated, "admin-max-unauthenticated", api.DefaultMaxUnauthenticated, "admin API connections without a valid token yet, in all (when full, the oldest is closed to admit a new one)")
	f.IntVar(&o.AdminLimits.MaxUnauthenticatedPerSource, "admin-max-unauthenticated-per-source", api.DefaultMaxUnauthenticatedPerSource, "admin API connections without a valid token yet, per remote IP")
	f.DurationVar(&o.NBDLimits.HandshakeTimeout, "nbd-handshake-timeout", 30*time.Second, "time allowed for an NBD handshake, TLS included")
	f.IntVar(&o.Gateway.PiecesPerRequest, "pieces-per-request", gateway.DefaultPiecesPerRequest, "object pieces of one NBD request handled at once")
	f.IntVar(&o.Gateway.ZeroPieces, "zero-pieces", gateway.DefaultZeroPieces, "TRIM/WRITE_ZEROES object pieces in flight on this node")
	f.IntVar(&o.Gateway.FairSlots, "fair-slots", gateway.DefaultFairSlots, "NBD requests doing replica I/O at once on this node, shared fairly between VDIs (-1: no bound)")
	f.IntVar(&cpus, "cpus", 0, "cores herd runs on at once (Go's GOMAXPROCS; 0: all the host or its cgroup allows); on a host that also runs VMs, leaves the rest to them")
	f.StringVar(&cowMemory, "cow-memory", "32MiB", "memory for copy-on-write buffers on this node")
	f.StringVar(&zoneLag, "zone-lag", "64MiB", "for VDIs set to --ack zone: at most this many bytes of writes acknowledged in this node's zone and not yet in the other zones (memory held meanwhile)")
	f.DurationVar(&o.NBDLimits.ReplyTimeout, "nbd-reply-timeout", 30*time.Second, "an NBD client that does not read its replies this long is disconnected")
	f.DurationVar(&o.ScrubInterval, "scrub-interval", 7*24*time.Hour, "time between the starts of two scrub passes (every copy read and verified)")
	f.IntVar(&o.ScrubDeepEvery, "scrub-deep-every", 4, "every Nth scrub pass also compares each object's replicas across nodes")
	f.StringVar(&scrubRate, "scrub-max-rate", "50MiB/s", "bytes per second a scrub pass reads (herd scrub --max-rate changes it live)")
	f.StringVar(&mergeRate, "merge-rate", "64MiB/s", "bytes per second merges of deleted snapshots and flattens copy (0: unlimited)")
	f.DurationVar(&o.JoinTimeout, "join-timeout", 30*time.Second, "how long a new node keeps trying --join before giving up")
	f.Float64Var(&o.OvercommitRatio, "overcommit-ratio", 1.0, "cluster health (and the HerdOvercommitted alert) warns when the VDIs' sizes add up to more than the usable space (raw space divided by the copies) times this; each node's own, so give every node the same")
	f.DurationVar(&o.DownOutInterval, "down-out-interval", 10*time.Minute, "stopped cleanly (SIGTERM), this node is down but not out for this long: its objects are re-replicated elsewhere only if it has not returned by then (0: at once)")
	f.StringVar(&level, "log-level", "info", "debug, info, warn or error")
	f.StringVar(&logFormat, "log-format", "text", "text or json (one stream: raft's and gossip's lines too)")
	return cmd
}
