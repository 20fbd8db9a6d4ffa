package cli

// `herd cluster`: format the cluster, its state and history, and the
// upgrade of its feature level. The credentials' commands are in
// jointokens.go and rotation.go.

import (
	"context"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/herd-storage/herd/internal/api"
	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/size"
)

func clusterCommand(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "cluster", Short: "format the cluster, show its state"}
	cmd.AddCommand(clusterFormatCommand(g), clusterInfoCommand(g), clusterHealthCommand(g), clusterEpochsCommand(g), clusterFinalizeUpgradeCommand(g),
		rotateJoinTokenCommand(g), joinTokenCommand(g), rotateGossipKeyCommand(g), rotateCACommand(g))
	return cmd
}

func clusterFormatCommand(g *globals) *cobra.Command {
	var copies int
	var objectSize string
	cmd := &cobra.Command{
		Use:   "format --copies N [--object-size 4MiB]",
		Short: "format the cluster (once): number of copies of every object, object size",
		Args:  args(0, "--copies N [--object-size 4MiB]"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !cmd.Flags().Changed("copies") {
				return usage(fmt.Errorf("--copies is required: how many replicas of every object (e.g. --copies 3)"))
			}
			bytes, err := size.Parse(objectSize)
			if err != nil {
				return usage(fmt.Errorf("--object-size: %w", err))
			}
			return call(g, func(c *api.Client, ctx context.Context) (cluster.Format, error) { return c.Format(ctx, copies, bytes) },
				func(w *tabwriter.Writer, f cluster.Format) {
					fmt.Fprintf(w, "formatted: %d copies, %s objects\n", f.Copies, size.Format(f.ObjectSize))
				})
		},
	}
	cmd.Flags().IntVar(&copies, "copies", 0, "replicas of every object")
	cmd.Flags().StringVar(&objectSize, "object-size", "4MiB", "object size, a power of two from 64KiB to 256MiB")
	return cmd
}

func clusterHealthCommand(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "health",
		Short: "OK, WARN or ERR with every reason (exit status 0, 1 or 2)",
		Args:  args(0, ""),
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := g.context()
			defer cancel()
			h, err := g.client().Health(ctx)
			if err != nil {
				return err
			}
			if err := show(g, h, printHealth); err != nil {
				return err
			}
			switch h.Status {
			case api.HealthWarn:
				return exitCode(1)
			case api.HealthErr:
				return exitCode(2)
			}
			return nil
		},
	}
}

func printHealth(w *tabwriter.Writer, h api.Health) {
	fmt.Fprintln(w, h.Status)
	for _, r := range h.Reasons {
		fmt.Fprintf(w, "%s\t%s\n", r.Level, r.What)
	}
}

func clusterInfoCommand(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "info",
		Short: "format, epoch, leader, voters and quorum state",
		Args:  args(0, ""),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return call(g, gatherClusterInfo, printClusterInfo)
		},
	}
}

// clusterInfo is what cluster info prints: the node's info, with the
// space, checksum counts and recovery summed from every alive node's own
// report.
type clusterInfo struct {
	cluster.Info
	Capacity  *api.Capacity `json:"capacity,omitempty"`
	UsedBytes uint64        `json:"used_bytes"`
	FreeBytes uint64        `json:"free_bytes"`
	Objects   uint64        `json:"objects"`
	// Blocks that failed their data checksum on any node
	// since it started, and those repaired.
	ChecksumErrors uint64              `json:"checksum_errors"`
	BlocksRepaired uint64              `json:"blocks_repaired"`
	Recovery       []api.RecoveryEntry `json:"recovery,omitempty"`

	// For the table only: whether the nodes and their recovery
	// answered, and the recovery summed over the nodes.
	nodesAnswered, recoveryAnswered bool
	recovering                      recoverySum
}

// recoverySum is the recovery of every node together.
type recoverySum struct {
	Recovering, Objects int
	Bytes, Rate         uint64
	ETA                 float64
	Unavailable         int
}

func gatherClusterInfo(c *api.Client, ctx context.Context) (clusterInfo, error) {
	info, err := c.Info(ctx)
	if err != nil {
		return clusterInfo{}, err
	}
	out := clusterInfo{Info: info}
	// Space is summed from every alive node's own report.
	nodes, nodesErr := c.Nodes(ctx)
	for _, n := range nodes {
		out.UsedBytes += n.UsedBytes
		out.FreeBytes += n.FreeBytes
		out.Objects += n.Objects
		out.ChecksumErrors += n.ChecksumErrors
		out.BlocksRepaired += n.BlocksRepaired
	}
	out.nodesAnswered = nodesErr == nil
	// Recovery, summed over the nodes.
	recovery, recoveryErr := c.Recovery(ctx)
	for _, e := range recovery {
		st := e.Status
		if st.State == "pulling" || st.State == "retrying" || st.State == "listing" {
			out.recovering.Recovering++
			out.recovering.Objects += st.Remaining
			out.recovering.Bytes += st.BytesRemaining
			out.recovering.Rate += st.Rate
			out.recovering.ETA = max(out.recovering.ETA, st.ETASeconds)
		}
		out.recovering.Unavailable += st.Unavailable
	}
	out.Recovery, out.recoveryAnswered = recovery, recoveryErr == nil
	if capacity, err := c.Capacity(ctx); err == nil {
		out.Capacity = &capacity
	}
	return out, nil
}

func printClusterInfo(w *tabwriter.Writer, out clusterInfo) {
	info := out.Info
	if info.Format != nil {
		fmt.Fprintf(w, "Format:\t%d copies, %s objects, since %s\n", info.Format.Copies, size.Format(info.Format.ObjectSize), info.Format.Created.Local().Format(time.DateTime))
	} else {
		fmt.Fprintf(w, "Format:\tnot formatted (herd cluster format --copies N)\n")
	}
	fmt.Fprintf(w, "Epoch:\t%d\n", info.Epoch)
	switch {
	case info.SupportedLevel == 0:
		fmt.Fprintf(w, "Feature level:\tunknown: the node answering runs a herd older than feature levels\n")
	case info.Level < info.SupportedLevel:
		fmt.Fprintf(w, "Feature level:\t%d (this node's herd supports %d: once every node runs it, herd cluster finalize-upgrade)\n", info.Level, info.SupportedLevel)
	default:
		fmt.Fprintf(w, "Feature level:\t%d\n", info.Level)
	}
	leader := info.Leader
	if leader == "" {
		leader = "none"
	} else if info.LeaderAddr != "" {
		leader += " (" + info.LeaderAddr + ")"
	}
	fmt.Fprintf(w, "Leader:\t%s\n", leader)
	fmt.Fprintf(w, "Voters:\t%d (%s)\n", len(info.Voters), strings.Join(info.Voters, ", "))
	quorum := "ok"
	if !info.Quorum {
		quorum = "NO QUORUM"
	}
	fmt.Fprintf(w, "Quorum:\t%s: %s\n", quorum, info.QuorumDetail)
	fmt.Fprintf(w, "Nodes:\t%d alive of %d\n", info.NodesAlive, info.NodesTotal)
	fmt.Fprintf(w, "VDIs:\t%d\n", info.VDIs)
	if capacity := out.Capacity; capacity != nil && capacity.RawBytes > 0 {
		fmt.Fprintf(w, "Capacity:\t%s raw (%s used, %s free); %s usable at %.1f copies; %s provisioned (%.2f of usable, warning above %.2f)\n",
			size.Format(capacity.RawBytes), size.Format(capacity.UsedBytes), size.Format(capacity.FreeBytes), size.Format(capacity.UsableBytes), capacity.Copies,
			size.Format(capacity.ProvisionedBytes), capacity.Overcommit, capacity.OvercommitLimit)
		if capacity.Note != "" {
			fmt.Fprintf(w, "Losing a node:\t%s\n", capacity.Note)
		} else {
			fmt.Fprintf(w, "Losing a node:\tthe others' free space (%s) holds a recovery of the largest share (%s, %s)\n", size.Format(capacity.FreeElsewhere), capacity.LargestShare, size.Format(capacity.LargestShareBytes))
		}
	}
	if out.nodesAnswered {
		fmt.Fprintf(w, "Space:\t%s used by %d object copies, %s free\n", size.Format(out.UsedBytes), out.Objects, size.Format(out.FreeBytes))
		fmt.Fprintf(w, "Checksums:\t%d bad blocks found, %d repaired since the nodes started (herd node list, herd scrub status)\n", out.ChecksumErrors, out.BlocksRepaired)
	}
	if out.recoveryAnswered {
		rec := out.recovering
		switch {
		case rec.Recovering > 0:
			fmt.Fprintf(w, "Recovery:\t%d nodes recovering: %d objects, %s left, %s/s, ETA %v (herd node recovery)\n",
				rec.Recovering, rec.Objects, size.Format(rec.Bytes), size.Format(rec.Rate), (time.Duration(rec.ETA) * time.Second).String())
		default:
			fmt.Fprintf(w, "Recovery:\tidle: every node recovered the current epoch\n")
		}
		if rec.Unavailable > 0 {
			fmt.Fprintf(w, "Unavailable:\t%d objects whose newest copies may be on nodes that are down\n", rec.Unavailable)
		}
	}
	securityInfo(w, info)
	fmt.Fprintf(w, "This node:\t%s\n", info.NodeID)
	if info.InsecureNBD {
		fmt.Fprintf(w, "WARNING:\tthis node serves plaintext, unauthenticated NBD on its TCP port (--insecure-nbd)\n")
	}
}

func clusterEpochsCommand(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "epochs",
		Short: "the epoch history: every membership change",
		Args:  args(0, ""),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return call(g, (*api.Client).Epochs, func(w *tabwriter.Writer, list []cluster.Epoch) {
				fmt.Fprintln(w, "EPOCH\tTIME\tNODES\tREASON")
				for _, e := range list {
					fmt.Fprintf(w, "%d\t%s\t%d\t%s\n", e.Number, e.Time.Local().Format(time.DateTime), len(e.Nodes), e.Reason)
				}
			})
		},
	}
}

func clusterFinalizeUpgradeCommand(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "finalize-upgrade",
		Short: "after every node runs the new herd: raise the cluster's feature level, turning on what the new version adds (no way back to the old version after it; docs/UPGRADE.md)",
		Args:  args(0, ""),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return call(g, (*api.Client).FinalizeUpgrade, func(w *tabwriter.Writer, out api.FinalizeResponse) {
				fmt.Fprintf(w, "the cluster is at feature level %d\n", out.Level)
			})
		},
	}
}
