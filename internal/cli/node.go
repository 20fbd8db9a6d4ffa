package cli

// `herd node`: the cluster's nodes, their recovery, and what an operator
// does to one (remove, maintenance, drain, set).

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

func nodeCommand(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "node", Short: "the cluster's nodes"}
	cmd.AddCommand(nodeListCommand(g), nodeRecoveryCommand(g), nodeRemoveCommand(g), nodeMaintenanceCommand(g), nodeDrainCommand(g), nodeSetCommand(g))
	return cmd
}

func nodeListCommand(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "list",
		Short: "id, address, zone, capacity, role and state of every node",
		Args:  args(0, ""),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return call(g, (*api.Client).Nodes, printNodes)
		},
	}
}

func printNodes(w *tabwriter.Writer, nodes []api.NodeEntry) {
	fmt.Fprintln(w, "ID\tADDRESS\tZONE\tCAPACITY\tUSED\tFREE\tOBJECTS\tBAD BLOCKS\tREPAIRED\tROLE\tVERSION\tSTATE")
	for _, n := range nodes {
		zone := n.Zone
		if zone == "" {
			zone = "-"
		}
		used, free, objects := size.Format(n.UsedBytes), size.Format(n.FreeBytes), fmt.Sprint(n.Objects)
		bad, repaired := fmt.Sprint(n.ChecksumErrors), fmt.Sprint(n.BlocksRepaired)
		if n.State != "alive" || n.UsageError != "" {
			used, free, objects, bad, repaired = "-", "-", "-", "-", "-"
		}
		state := string(n.State)
		if n.Full {
			state += ", FULL: takes no objects"
		}
		if n.Draining && n.State == "alive" {
			if n.Objects == 0 && n.UsageError == "" {
				state += ", drained: holds nothing"
			} else {
				state += ", draining"
			}
		}
		switch now := time.Now(); {
		case n.Stopped && n.State != "alive" && n.InMaintenance(now):
			state += ", stopped: marked out at " + n.MaintenanceUntil.Local().Format(time.DateTime) + " unless back first"
		case n.Stopped && n.State != "alive":
			state += ", stopped: out since " + n.MaintenanceUntil.Local().Format(time.DateTime)
		case n.InMaintenance(now):
			state += ", maintenance until " + n.MaintenanceUntil.Local().Format(time.DateTime)
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", n.ID, n.Address, zone, size.Format(n.Capacity), used, free, objects, bad, repaired, n.Role, buildColumn(n.Build), state)
	}
}

// buildColumn is a node's VERSION: "0.9.0 (commit) level 2" (the feature
// level its binary supports; no version for a herd older than feature
// levels), "-" when gossip does not see the node.
func buildColumn(b *cluster.BuildInfo) string {
	switch {
	case b == nil:
		return "-"
	case b.Version == "":
		return fmt.Sprintf("old, level %d", b.Level)
	}
	s := b.Version
	if b.Commit != "" {
		s += " (" + b.Commit + ")"
	}
	return fmt.Sprintf("%s level %d", s, b.Level)
}

func nodeRecoveryCommand(g *globals) *cobra.Command {
	var maxRate string
	var concurrency int
	cmd := &cobra.Command{
		Use:   "recovery [--max-rate RATE] [--concurrency N]",
		Short: "per-node recovery after the last epoch change: progress, rate, ETA; --max-rate and --concurrency change its limits live on every node",
		Args:  args(0, "[--max-rate RATE] [--concurrency N]"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			var req api.RecoveryLimitsRequest
			if cmd.Flags().Changed("max-rate") {
				rate, err := parseRate(maxRate)
				if err != nil {
					return err
				}
				req.MaxRate = &rate
			}
			if cmd.Flags().Changed("concurrency") {
				req.Concurrency = &concurrency
			}
			return call(g, func(c *api.Client, ctx context.Context) ([]api.RecoveryEntry, error) {
				if req.MaxRate != nil || req.Concurrency != nil {
					return c.SetRecoveryLimits(ctx, req)
				}
				return c.Recovery(ctx)
			}, printRecovery)
		},
	}
	cmd.Flags().StringVar(&maxRate, "max-rate", "", "copy at most RATE per node (e.g. 100MiB or 100MiB/s; 0 = unlimited)")
	cmd.Flags().IntVar(&concurrency, "concurrency", 0, "recover at most N objects at once per node (1-64)")
	return cmd
}

func printRecovery(w *tabwriter.Writer, entries []api.RecoveryEntry) {
	fmt.Fprintln(w, "NODE\tADDRESS\tEPOCH\tSTATE\tOBJECTS\tCOPIED\tREMAINING\tBYTES COPIED\tBYTES LEFT\tRATE\tETA\tSURPLUS\tLIMITS\tNOTE")
	for _, e := range entries {
		st := e.Status
		note := e.Error
		if note == "" {
			note = st.LastError
		}
		if note == "" && st.Deferred > 0 {
			note = fmt.Sprintf("%d objects wait for the maintenance of %s (until %s)", st.Deferred, strings.Join(st.HeldBy, ", "), st.HeldUntil.Local().Format(time.DateTime))
		}
		if note == "" && st.Unavailable > 0 {
			note = fmt.Sprintf("%d objects unavailable until nodes holding their newest copies return", st.Unavailable)
		}
		rate, eta := "-", "-"
		if st.Rate > 0 {
			rate = size.Format(st.Rate) + "/s"
			eta = (time.Duration(st.ETASeconds) * time.Second).String()
		}
		limit := "unlimited"
		if st.Limits.MaxRate > 0 {
			limit = size.Format(st.Limits.MaxRate) + "/s"
		}
		// Epoch 0: no recovery pass since the node started
		// (nothing to recover yet), not the cluster's epoch.
		epoch := "-"
		if st.Epoch > 0 {
			epoch = fmt.Sprint(st.Epoch)
		}
		if note == "" && st.Epoch == 0 {
			note = "no recovery pass since this node started"
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%d\t%d\t%s\t%s\t%s\t%s\t%d\t%s x%d\t%s\n", e.Node, e.Address, epoch, st.State,
			st.Objects, st.Copied, st.Remaining, size.Format(st.Bytes), size.Format(st.BytesRemaining), rate, eta, st.Surplus, limit, st.Limits.Concurrency, note)
	}
}

func nodeRemoveCommand(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "remove ID",
		Short: "forget a dead node for good: its certificate is refused from then on",
		Args:  args(1, "ID"),
		RunE: func(cmd *cobra.Command, a []string) error {
			return call(g, func(c *api.Client, ctx context.Context) (map[string]string, error) {
				return map[string]string{"removed": a[0]}, c.RemoveNode(ctx, a[0])
			}, func(w *tabwriter.Writer, _ map[string]string) {
				fmt.Fprintf(w, "node %s removed for good\n", a[0])
			})
		},
	}
}

func nodeMaintenanceCommand(g *globals) *cobra.Command {
	var window time.Duration
	var end bool
	cmd := &cobra.Command{
		Use:   "maintenance NODE --for DURATION | --end",
		Short: "let a node be down for a while (a reboot) without re-replicating its data; NODE is its id or address",
		Long: `While a node is down inside its maintenance window, the cluster serves
its VDIs from the other replicas and copies only the objects clients use
to the nodes standing in for it; its other objects are not copied. When
it returns it catches up only what changed. When the window closes first,
recovery copies the rest as after any failure.`,
		Args: args(1, "NODE"),
		RunE: func(cmd *cobra.Command, a []string) error {
			if end == cmd.Flags().Changed("for") {
				return usage(fmt.Errorf("give --for DURATION (e.g. --for 30m) or --end"))
			}
			if !end && window <= 0 {
				return usage(fmt.Errorf("--for must be a positive duration such as 30m or 2h, not %s (--end ends a window)", window))
			}
			return call(g, func(c *api.Client, ctx context.Context) (cluster.Node, error) {
				id, err := resolveNode(c, ctx, a[0])
				if err != nil {
					return cluster.Node{}, err
				}
				return c.SetMaintenance(ctx, id, window)
			}, func(w *tabwriter.Writer, n cluster.Node) {
				if n.MaintenanceUntil.IsZero() {
					fmt.Fprintf(w, "node %s (%s): maintenance ended\n", n.ID, n.Address)
					return
				}
				fmt.Fprintf(w, "node %s (%s) in maintenance until %s\n", n.ID, n.Address, n.MaintenanceUntil.Local().Format(time.DateTime))
			})
		},
	}
	cmd.Flags().DurationVar(&window, "for", 0, "length of the window, e.g. 30m (at most 168h)")
	cmd.Flags().BoolVar(&end, "end", false, "end the node's window now")
	return cmd
}

// resolveNode turns a node id or address into its id.
func resolveNode(c *api.Client, ctx context.Context, name string) (string, error) {
	nodes, err := c.Nodes(ctx)
	if err != nil {
		return "", err
	}
	for _, n := range nodes {
		if n.ID == name || n.Address == name {
			return n.ID, nil
		}
	}
	return "", fmt.Errorf("no node %q: give a node id or address from herd node list", name)
}

func nodeDrainCommand(g *globals) *cobra.Command {
	var cancelDrain bool
	cmd := &cobra.Command{
		Use:   "drain NODE [--cancel]",
		Short: "move a node's data to the other nodes, keeping every object's copies throughout; NODE is its id or address",
		Long: `The node stays in the cluster but takes no objects: recovery copies each
of its objects to another node and deletes the node's copy once the new
one is durable, so every object keeps its full number of copies. When
'herd node list' says "drained: holds nothing", stop the node and, for
good, 'herd node remove' it. --cancel makes it take objects again.`,
		Args: args(1, "NODE"),
		RunE: func(cmd *cobra.Command, a []string) error {
			return call(g, func(c *api.Client, ctx context.Context) (cluster.Node, error) {
				id, err := resolveNode(c, ctx, a[0])
				if err != nil {
					return cluster.Node{}, err
				}
				return c.Drain(ctx, id, cancelDrain)
			}, func(w *tabwriter.Writer, n cluster.Node) {
				if n.Draining {
					fmt.Fprintf(w, "node %s (%s) draining: its objects move to the other nodes (herd node list, herd node recovery)\n", n.ID, n.Address)
				} else {
					fmt.Fprintf(w, "node %s (%s) takes objects again\n", n.ID, n.Address)
				}
			})
		},
	}
	cmd.Flags().BoolVar(&cancelDrain, "cancel", false, "stop draining: the node takes objects again")
	return cmd
}

func nodeSetCommand(g *globals) *cobra.Command {
	var capacity, zone string
	var reset bool
	cmd := &cobra.Command{
		Use:   "set NODE [--capacity SIZE] [--zone ZONE] [--reset]",
		Short: "change a node's capacity (placement weight) or zone at run time: a new epoch; NODE is its id or address",
		Long: `The new values are recorded in the cluster log and win over the node's
own --capacity and --zone flags, also across its restarts, until --reset
(from its next start its flags count again). A change is a new epoch:
recovery moves objects to match the new placement.`,
		Args: args(1, "NODE"),
		RunE: func(cmd *cobra.Command, a []string) error {
			var settings cluster.NodeSettings
			if cmd.Flags().Changed("capacity") {
				bytes, err := size.Parse(capacity)
				if err != nil {
					return usage(fmt.Errorf("--capacity: %w", err))
				}
				settings.Capacity = &bytes
			}
			if cmd.Flags().Changed("zone") {
				settings.Zone = &zone
			}
			settings.Reset = reset
			return call(g, func(c *api.Client, ctx context.Context) (cluster.Node, error) {
				id, err := resolveNode(c, ctx, a[0])
				if err != nil {
					return cluster.Node{}, err
				}
				return c.SetNode(ctx, id, settings)
			}, func(w *tabwriter.Writer, n cluster.Node) {
				z := n.Zone
				if z == "" {
					z = "-"
				}
				fmt.Fprintf(w, "node %s (%s): capacity %s, zone %s\n", n.ID, n.Address, size.Format(n.Capacity), z)
			})
		},
	}
	cmd.Flags().StringVar(&capacity, "capacity", "", "placement weight as a size, e.g. 500G")
	cmd.Flags().StringVar(&zone, "zone", "", "failure domain (\"\" for none)")
	cmd.Flags().BoolVar(&reset, "reset", false, "drop earlier settings: the node's flags count from its next start")
	return cmd
}
