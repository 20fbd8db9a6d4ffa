package cli

import (
	"log/slog"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/herd-storage/herd/internal/server"
	"github.com/herd-storage/herd/internal/size"
)

func serverCommand() *cobra.Command {
	var o server.Options
	var capacity, level string
	cmd := &cobra.Command{
		Use:   "server",
		Short: "run a herd node on this host",
		Long: `Run a herd node. The first node of a cluster is started without --join and
creates the cluster's token in DATA/cluster.token; every other node joins by
naming any member: --join IP --token TOKEN.`,
		Args: args(0, "[flags]"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if capacity != "" {
				bytes, err := size.Parse(capacity)
				if err != nil {
					return err
				}
				o.Capacity = bytes
			}
			var lv slog.Level
			if err := lv.UnmarshalText([]byte(level)); err != nil {
				return err
			}
			o.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lv}))
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
	f.StringVar(&o.Token, "token", os.Getenv("HERD_TOKEN"), "the cluster token, to join (env HERD_TOKEN)")
	f.StringArrayVar(&o.Disks, "disk", nil, "object disk DIR[:WEIGHT], repeatable (default: the data directory)")
	f.StringVar(&capacity, "capacity", "", "capacity weight, e.g. 500G (default: size of the data directory's file system)")
	f.IntVar(&o.PeerPort, "peer-port", server.DefaultPeerPort, "peer port (raft, data)")
	f.IntVar(&o.GossipPort, "gossip-port", server.DefaultGossipPort, "gossip port (tcp+udp)")
	f.IntVar(&o.AdminPort, "admin-port", server.DefaultAdminPort, "admin HTTP port")
	f.IntVar(&o.NBDPort, "nbd-port", server.DefaultNBDPort, "NBD port")
	f.DurationVar(&o.JoinTimeout, "join-timeout", 30*time.Second, "how long a new node keeps trying --join before giving up")
	f.StringVar(&level, "log-level", "info", "debug, info, warn or error")
	return cmd
}
