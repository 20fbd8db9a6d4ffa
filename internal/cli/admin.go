package cli

import (
	"context"
	"fmt"
	"os"
	"strconv"
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
	var copies int
	var objectSize string
	format := &cobra.Command{
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
			ctx, cancel := g.context()
			defer cancel()
			f, err := g.client().Format(ctx, copies, bytes)
			if err != nil {
				return err
			}
			return g.output(f, func(w *tabwriter.Writer) {
				fmt.Fprintf(w, "formatted: %d copies, %s objects\n", f.Copies, size.Format(f.ObjectSize))
			})
		},
	}
	format.Flags().IntVar(&copies, "copies", 0, "replicas of every object")
	format.Flags().StringVar(&objectSize, "object-size", "4MiB", "object size, a power of two from 64KiB to 256MiB")
	health := &cobra.Command{
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
			err = g.output(h, func(w *tabwriter.Writer) {
				fmt.Fprintln(w, h.Status)
				for _, r := range h.Reasons {
					fmt.Fprintf(w, "%s\t%s\n", r.Level, r.What)
				}
			})
			if err != nil {
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
	info := &cobra.Command{
		Use:   "info",
		Short: "format, epoch, leader, voters and quorum state",
		Args:  args(0, ""),
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := g.context()
			defer cancel()
			info, err := g.client().Info(ctx)
			if err != nil {
				return err
			}
			// Space is summed from every alive node's own report.
			nodes, nodesErr := g.client().Nodes(ctx)
			var space struct{ Used, Free, Objects, BadBlocks, Repaired uint64 }
			for _, n := range nodes {
				space.Used += n.UsedBytes
				space.Free += n.FreeBytes
				space.Objects += n.Objects
				space.BadBlocks += n.ChecksumErrors
				space.Repaired += n.BlocksRepaired
			}
			// Recovery, summed over the nodes.
			recovery, recoveryErr := g.client().Recovery(ctx)
			var rec struct {
				Recovering, Objects int
				Bytes, Rate         uint64
				ETA                 float64
				Unavailable         int
			}
			for _, e := range recovery {
				st := e.Status
				if st.State == "pulling" || st.State == "retrying" || st.State == "listing" {
					rec.Recovering++
					rec.Objects += st.Remaining
					rec.Bytes += st.BytesRemaining
					rec.Rate += st.Rate
					rec.ETA = max(rec.ETA, st.ETASeconds)
				}
				rec.Unavailable += st.Unavailable
			}
			capacity, capacityErr := g.client().Capacity(ctx)
			type infoWithSpace struct {
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
			}
			out := infoWithSpace{Info: info, UsedBytes: space.Used, FreeBytes: space.Free, Objects: space.Objects,
				ChecksumErrors: space.BadBlocks, BlocksRepaired: space.Repaired, Recovery: recovery}
			if capacityErr == nil {
				out.Capacity = &capacity
			}
			return g.output(out, func(w *tabwriter.Writer) {
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
				if capacityErr == nil && capacity.RawBytes > 0 {
					fmt.Fprintf(w, "Capacity:\t%s raw (%s used, %s free); %s usable at %.1f copies; %s provisioned (%.2f of usable, warning above %.2f)\n",
						size.Format(capacity.RawBytes), size.Format(capacity.UsedBytes), size.Format(capacity.FreeBytes), size.Format(capacity.UsableBytes), capacity.Copies,
						size.Format(capacity.ProvisionedBytes), capacity.Overcommit, capacity.OvercommitLimit)
					if capacity.Note != "" {
						fmt.Fprintf(w, "Losing a node:\t%s\n", capacity.Note)
					} else {
						fmt.Fprintf(w, "Losing a node:\tthe others' free space (%s) holds a recovery of the largest share (%s, %s)\n", size.Format(capacity.FreeElsewhere), capacity.LargestShare, size.Format(capacity.LargestShareBytes))
					}
				}
				if nodesErr == nil {
					fmt.Fprintf(w, "Space:\t%s used by %d object copies, %s free\n", size.Format(space.Used), space.Objects, size.Format(space.Free))
					fmt.Fprintf(w, "Checksums:\t%d bad blocks found, %d repaired since the nodes started (herd node list, herd scrub status)\n", space.BadBlocks, space.Repaired)
				}
				if recoveryErr == nil {
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
			})
		},
	}
	epochs := &cobra.Command{
		Use:   "epochs",
		Short: "the epoch history: every membership change",
		Args:  args(0, ""),
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := g.context()
			defer cancel()
			list, err := g.client().Epochs(ctx)
			if err != nil {
				return err
			}
			return g.output(list, func(w *tabwriter.Writer) {
				fmt.Fprintln(w, "EPOCH\tTIME\tNODES\tREASON")
				for _, e := range list {
					fmt.Fprintf(w, "%d\t%s\t%d\t%s\n", e.Number, e.Time.Local().Format(time.DateTime), len(e.Nodes), e.Reason)
				}
			})
		},
	}
	finalize := &cobra.Command{
		Use:   "finalize-upgrade",
		Short: "after every node runs the new herd: raise the cluster's feature level, turning on what the new version adds (no way back to the old version after it; docs/UPGRADE.md)",
		Args:  args(0, ""),
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := g.context()
			defer cancel()
			out, err := g.client().FinalizeUpgrade(ctx)
			if err != nil {
				return err
			}
			return g.output(out, func(w *tabwriter.Writer) {
				fmt.Fprintf(w, "the cluster is at feature level %d\n", out.Level)
			})
		},
	}
	cmd.AddCommand(format, info, health, epochs, finalize, rotateJoinTokenCommand(g), joinTokenCommand(g), rotateGossipKeyCommand(g), rotateCACommand(g))
	return cmd
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

func nodeCommand(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "node", Short: "the cluster's nodes"}
	list := &cobra.Command{
		Use:   "list",
		Short: "id, address, zone, capacity, role and state of every node",
		Args:  args(0, ""),
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := g.context()
			defer cancel()
			nodes, err := g.client().Nodes(ctx)
			if err != nil {
				return err
			}
			return g.output(nodes, func(w *tabwriter.Writer) {
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
			})
		},
	}
	var maxRate string
	var concurrency int
	recovery := &cobra.Command{
		Use:   "recovery [--max-rate RATE] [--concurrency N]",
		Short: "per-node recovery after the last epoch change: progress, rate, ETA; --max-rate and --concurrency change its limits live on every node",
		Args:  args(0, "[--max-rate RATE] [--concurrency N]"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := g.context()
			defer cancel()
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
			var entries []api.RecoveryEntry
			var err error
			if req.MaxRate != nil || req.Concurrency != nil {
				entries, err = g.client().SetRecoveryLimits(ctx, req)
			} else {
				entries, err = g.client().Recovery(ctx)
			}
			if err != nil {
				return err
			}
			return g.output(entries, func(w *tabwriter.Writer) {
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
			})
		},
	}
	recovery.Flags().StringVar(&maxRate, "max-rate", "", "copy at most RATE per node (e.g. 100MiB or 100MiB/s; 0 = unlimited)")
	recovery.Flags().IntVar(&concurrency, "concurrency", 0, "recover at most N objects at once per node (1-64)")
	cmd.AddCommand(list, recovery, nodeRemoveCommand(g), nodeMaintenanceCommand(g), nodeDrainCommand(g), nodeSetCommand(g))
	return cmd
}

func vdiCommand(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "vdi", Short: "virtual disk images"}
	var createHandover, createExclusive, setExclusive bool
	var createCopies int
	var setAck string
	printVDI := func(v cluster.VDI) error {
		return g.output(v, func(w *tabwriter.Writer) {
			fmt.Fprintf(w, "Name:\t%s\nID:\t%d\nSize:\t%s (%d bytes)\nCopies:\t%d\nObject size:\t%s\nCreated:\t%s\n",
				v.FullName(), v.ID, size.Format(v.Size), v.Size, v.Copies, size.Format(v.ObjectSize), v.Created.Local().Format(time.DateTime))
			if v.Unclean {
				fmt.Fprintf(w, "Unclean:\tits writer's node died; replicas are made identical when it is next opened for writing (or by vdi check --repair)\n")
			}
			if !v.Snapshot {
				writers := "handover (a second writer takes the lock over: live migration)"
				if v.Exclusive {
					writers = "exclusive (a second writer is refused)"
				}
				fmt.Fprintf(w, "Writers:\t%s\n", writers)
				ack := "all (a write is acknowledged once every replica has it)"
				if v.Ack == cluster.AckZone {
					ack = "zone (a write is acknowledged once the writer's zone has it; the other zones have it before the next FLUSH completes)"
				}
				fmt.Fprintf(w, "Acknowledge:\t%s\n", ack)
				fmt.Fprintf(w, "Limits:\t%s\n", v.Limits)
			}
			if v.Snapshot {
				fmt.Fprintf(w, "Snapshot:\t%s, taken %s (read-only; export %s)\n", v.Tag, v.SnapshotTime.Local().Format(time.DateTime), v.FullName())
			}
			if v.Parent != 0 {
				fmt.Fprintf(w, "Parent:\t%d\n", v.Parent)
			}
		})
	}
	var tag string
	snapshot := &cobra.Command{
		Use:   "snapshot NAME [--tag TAG]",
		Short: "freeze a VDI's content as NAME@TAG (instant; allowed while it is written)",
		Args:  args(1, "NAME [--tag TAG]"),
		RunE: func(cmd *cobra.Command, a []string) error {
			ctx, cancel := g.context()
			defer cancel()
			r, err := g.client().Snapshot(ctx, a[0], tag)
			if err != nil {
				return err
			}
			return g.output(r, func(w *tabwriter.Writer) {
				fmt.Fprintf(w, "snapshot %s taken (id %d); %s continues as vdi id %d\n", r.Snapshot.FullName(), r.Snapshot.ID, r.VDI.Name, r.VDI.ID)
			})
		},
	}
	snapshot.Flags().StringVar(&tag, "tag", "", "the snapshot's tag (default: its id)")
	clone := &cobra.Command{
		Use:   "clone NAME@TAG NEWNAME",
		Short: "a new writable VDI sharing a snapshot's objects (instant)",
		Args:  args(2, "NAME@TAG NEWNAME"),
		RunE: func(cmd *cobra.Command, a []string) error {
			ctx, cancel := g.context()
			defer cancel()
			v, err := g.client().Clone(ctx, a[0], a[1])
			if err != nil {
				return err
			}
			return printVDI(v)
		},
	}
	var to string
	rollback := &cobra.Command{
		Use:   "rollback NAME --to TAG",
		Short: "make a VDI's content a snapshot's again (instant; not while it is open for writing)",
		Args:  args(1, "NAME --to TAG"),
		RunE: func(cmd *cobra.Command, a []string) error {
			if to == "" {
				return usage(fmt.Errorf("--to TAG is required: the snapshot to roll back to (see herd vdi tree)"))
			}
			ctx, cancel := g.context()
			defer cancel()
			v, err := g.client().Rollback(ctx, a[0], to)
			if err != nil {
				return err
			}
			return printVDI(v)
		},
	}
	rollback.Flags().StringVar(&to, "to", "", "the snapshot's tag")
	var flattenNoWait bool
	flatten := &cobra.Command{
		Use:   "flatten NAME",
		Short: "make a clone independent of its parent snapshot, online (copies what it reads from it)",
		Args:  args(1, "NAME"),
		RunE: func(cmd *cobra.Command, a []string) error {
			ctx, cancel := g.context()
			v, err := g.client().Flatten(ctx, a[0])
			cancel()
			if err != nil {
				return err
			}
			// The copy runs in the background, on the node holding the
			// VDI's writer lock (or the leader); wait for the log to say
			// it is done, unless told not to.
			for !flattenNoWait && v.Parent != 0 {
				time.Sleep(500 * time.Millisecond)
				ctx, cancel := g.context()
				v, err = g.client().VDI(ctx, a[0])
				cancel()
				if err != nil {
					return err
				}
				if !v.Flatten && v.Parent != 0 {
					return fmt.Errorf("vdi %s has a parent again (a snapshot or rollback replaced it): flatten it again", a[0])
				}
			}
			return printVDI(v)
		},
	}
	flatten.Flags().BoolVar(&flattenNoWait, "no-wait", false, "return once the flatten is asked for; vdi tree shows it under way")
	tree := &cobra.Command{
		Use:   "tree",
		Short: "the VDI tree: snapshots, clones, space used",
		Args:  args(0, ""),
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := g.context()
			defer cancel()
			entries, err := g.client().Tree(ctx)
			if err != nil {
				return err
			}
			return g.output(entries, func(w *tabwriter.Writer) { printTree(w, entries) })
		},
	}
	create := &cobra.Command{
		Use:   "create NAME SIZE",
		Short: "create a thin VDI (SIZE like 10G, 512M, 1TiB)",
		Args:  args(2, "NAME SIZE"),
		RunE: func(cmd *cobra.Command, a []string) error {
			bytes, err := size.Parse(a[1])
			if err != nil {
				return usage(err)
			}
			ctx, cancel := g.context()
			defer cancel()
			req := api.CreateVDIRequest{Name: a[0], Size: bytes, Exclusive: createExclusive}
			if cmd.Flags().Changed("copies") {
				if createCopies < 1 || createCopies > cluster.MaxCopies {
					return usage(fmt.Errorf("--copies %d: must be between 1 and %d", createCopies, cluster.MaxCopies))
				}
				// A node older than feature levels would ignore the
				// field and create the VDI with the cluster's copies.
				info, err := g.client().Info(ctx)
				if err != nil {
					return err
				}
				if info.SupportedLevel < cluster.FeatureVDICopies.Level {
					return fmt.Errorf("--copies: the node at %s runs a herd that does not know a VDI's own copies; ask an upgraded node (--addr), or upgrade this one", g.addr)
				}
				req.Copies = createCopies
			}
			v, err := g.client().CreateVDIWith(ctx, req)
			if err != nil {
				return err
			}
			return printVDI(v)
		},
	}
	create.Flags().IntVar(&createCopies, "copies", 0, "this VDI's number of copies (default: the cluster's, from cluster format); needs cluster feature level 2")
	create.Flags().BoolVar(&createExclusive, "exclusive", false, "refuse a second writer while the VDI is open for writing; without it a writer through another node takes the writer lock over (live migration)")
	create.Flags().BoolVar(&createHandover, "handover", false, "the default now (kept for scripts)")
	create.Flags().MarkHidden("handover")
	create.MarkFlagsMutuallyExclusive("exclusive", "handover")
	var limitFlags [6]string
	limitNames := [6]string{"iops-limit", "read-iops-limit", "write-iops-limit", "bps-limit", "read-bps-limit", "write-bps-limit"}
	set := &cobra.Command{
		Use:   "set NAME [--exclusive[=false]] [--ack all|zone] [--iops-limit N] [--read-iops-limit N] [--write-iops-limit N] [--bps-limit RATE] [--read-bps-limit RATE] [--write-bps-limit RATE]",
		Short: "change a VDI's settings: exclusive writer, when writes are acknowledged, QoS limits (applied live by every node serving it; 0 = unlimited)",
		Args:  args(1, "NAME [--exclusive[=false]] [--ack all|zone] [--iops-limit N] [--read-iops-limit N] [--write-iops-limit N] [--bps-limit RATE] [--read-bps-limit RATE] [--write-bps-limit RATE]"),
		RunE: func(cmd *cobra.Command, a []string) error {
			var settings cluster.VDISettings
			if cmd.Flags().Changed("exclusive") {
				settings.Exclusive = &setExclusive
			}
			targets := [6]**uint64{&settings.IOPS, &settings.ReadIOPS, &settings.WriteIOPS, &settings.BPS, &settings.ReadBPS, &settings.WriteBPS}
			if cmd.Flags().Changed("ack") {
				settings.Ack = &setAck
			}
			changed := settings.Exclusive != nil || settings.Ack != nil
			for i, name := range limitNames {
				if !cmd.Flags().Changed(name) {
					continue
				}
				parse := parseIOPSLimit
				if i >= 3 {
					parse = parseBPSLimit
				}
				v, err := parse(name, limitFlags[i])
				if err != nil {
					return err
				}
				*targets[i] = &v
				changed = true
			}
			if !changed {
				return fmt.Errorf("nothing to change: give --exclusive[=false], --ack, --iops-limit, --read-iops-limit, --write-iops-limit, --bps-limit, --read-bps-limit or --write-bps-limit")
			}
			ctx, cancel := g.context()
			defer cancel()
			v, err := g.client().SetVDI(ctx, a[0], settings)
			if err != nil {
				return err
			}
			return printVDI(v)
		},
	}
	set.Flags().BoolVar(&setExclusive, "exclusive", true, "true: a second writer is refused while the VDI is open for writing; false: it takes the writer lock over (live migration)")
	set.Flags().StringVar(&setAck, "ack", "", "when a write without FUA is acknowledged: all (every replica has it) or zone (every replica in the writer's zone has it; the other zones have it before the next FLUSH completes: for zones far apart; see docs/ARCHITECTURE.md)")
	for i, name := range limitNames {
		usage := map[string]string{
			"iops-limit":       "at most `N` requests per second, reads and writes together, per node serving the VDI (0 = unlimited)",
			"read-iops-limit":  "at most `N` reads per second (0 = unlimited)",
			"write-iops-limit": "at most `N` writes per second; TRIM and WRITE_ZEROES count as writes (0 = unlimited)",
			"bps-limit":        "at most `RATE` bytes per second read and written together, e.g. 100MiB or 100MiB/s (0 = unlimited)",
			"read-bps-limit":   "at most `RATE` bytes per second read (0 = unlimited)",
			"write-bps-limit":  "at most `RATE` bytes per second written (0 = unlimited)",
		}[name]
		set.Flags().StringVar(&limitFlags[i], name, "", usage)
	}
	status := &cobra.Command{
		Use:   "status NAME",
		Short: "who has a VDI open: through which node, from which client, read-only or writing, since when",
		Args:  args(1, "NAME"),
		RunE: func(cmd *cobra.Command, a []string) error {
			ctx, cancel := g.context()
			defer cancel()
			st, err := g.client().VDIStatus(ctx, a[0])
			if err != nil {
				return err
			}
			return g.output(st, func(w *tabwriter.Writer) { printVDIStatus(w, st) })
		},
	}
	var force bool
	unlock := &cobra.Command{
		Use:   "unlock NAME --force",
		Short: "take a VDI's writer lock away from a holder that is gone; the holder is fenced first (its later writes fail)",
		Args:  args(1, "NAME --force"),
		RunE: func(cmd *cobra.Command, a []string) error {
			ctx, cancel := g.context()
			defer cancel()
			l, err := g.client().UnlockVDI(ctx, a[0], force)
			if err != nil {
				return err
			}
			return g.output(l, func(w *tabwriter.Writer) {
				fmt.Fprintf(w, "unlocked %s: node %s held its writer lock since %s; that node's opens of it are fenced (their writes fail) and the next writer repairs its replicas first\n",
					a[0], l.Node, l.Acquired.Local().Format(time.DateTime))
			})
		},
	}
	unlock.Flags().BoolVar(&force, "force", false, "really take the lock away (required)")
	list := &cobra.Command{
		Use:   "list",
		Short: "list VDIs",
		Args:  args(0, ""),
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := g.context()
			defer cancel()
			vdis, err := g.client().VDIs(ctx)
			if err != nil {
				return err
			}
			writers := map[string]cluster.Lock{}
			if locks, err := g.client().Locks(ctx); err == nil {
				for _, l := range locks {
					writers[l.Key] = l
				}
			}
			return g.output(vdis, func(w *tabwriter.Writer) {
				fmt.Fprintln(w, "NAME\tID\tSIZE\tCOPIES\tCREATED\tWRITER")
				for _, v := range vdis {
					writer := "-"
					if l, ok := writers[cluster.VDILockKey(v.Name)]; ok {
						writer = l.Node
					}
					fmt.Fprintf(w, "%s\t%d\t%s\t%d\t%s\t%s\n", v.Name, v.ID, size.Format(v.Size), v.Copies, v.Created.Local().Format(time.DateTime), writer)
				}
			})
		},
	}
	info := &cobra.Command{
		Use:   "info NAME[@TAG]",
		Short: "show one VDI or snapshot",
		Args:  args(1, "NAME[@TAG]"),
		RunE: func(cmd *cobra.Command, a []string) error {
			ctx, cancel := g.context()
			defer cancel()
			v, err := g.client().VDI(ctx, a[0])
			if err != nil {
				return err
			}
			return printVDI(v)
		},
	}
	remove := &cobra.Command{
		Use:   "delete NAME[@TAG]",
		Short: "delete a VDI or a snapshot (objects nothing else uses are freed)",
		Args:  args(1, "NAME[@TAG]"),
		RunE: func(cmd *cobra.Command, a []string) error {
			ctx, cancel := g.context()
			defer cancel()
			if err := g.client().DeleteVDI(ctx, a[0]); err != nil {
				return err
			}
			return g.output(map[string]string{"deleted": a[0]}, func(w *tabwriter.Writer) { fmt.Fprintf(w, "deleted %s\n", a[0]) })
		},
	}
	resize := &cobra.Command{
		Use:   "resize NAME SIZE",
		Short: "grow a VDI to SIZE (shrinking is refused)",
		Args:  args(2, "NAME SIZE"),
		RunE: func(cmd *cobra.Command, a []string) error {
			bytes, err := size.Parse(a[1])
			if err != nil {
				return usage(err)
			}
			ctx, cancel := g.context()
			defer cancel()
			v, err := g.client().ResizeVDI(ctx, a[0], bytes)
			if err != nil {
				return err
			}
			if err := printVDI(v); err != nil {
				return err
			}
			if st, err := g.client().VDIStatus(ctx, a[0]); err == nil && len(st.Opens) > 0 && !g.json {
				// NBD has no way to tell a connected client its export grew.
				fmt.Fprintf(os.Stderr, "note: vdi %s is open (%d connections); open clients see the new size after they reconnect (qemu: block_resize, or reopen the disk)\n", a[0], len(st.Opens))
			}
			return nil
		},
	}
	var repair bool
	check := &cobra.Command{
		Use:   "check NAME[@TAG] [--repair]",
		Short: "compare every replica of a VDI's objects; --repair makes them identical (VDI closed)",
		Args:  args(1, "NAME[@TAG] [--repair]"),
		RunE: func(cmd *cobra.Command, a []string) error {
			ctx, cancel := context.WithTimeout(context.Background(), max(g.timeout, 30*time.Minute))
			defer cancel()
			r, err := g.client().Check(ctx, a[0], repair)
			if err != nil {
				return err
			}
			if err := g.output(r, func(w *tabwriter.Writer) {
				for _, p := range r.Problems {
					fmt.Fprintln(w, p)
				}
				fmt.Fprintf(w, "%s: %d objects, %d consistent, %d replicas differing, %d missing, %d unavailable, %d blocks failing their checksum (%d lost on every replica), %d repaired\n",
					r.VDI, r.Objects, r.Consistent, r.Mismatched, r.Missing, r.Unavailable, r.BadBlocks, r.LostBlocks, r.Repaired)
			}); err != nil {
				return err
			}
			if r.Unavailable > 0 {
				return fmt.Errorf("vdi %s has %d objects whose newest copies may be on nodes that are down: they are refused until one of those nodes returns", a[0], r.Unavailable)
			}
			if r.LostBlocks > 0 {
				return fmt.Errorf("vdi %s has %d blocks of 4 KiB that fail their checksum on every replica: their data is lost (listed above); restore them from a backup", a[0], r.LostBlocks)
			}
			if r.BadBlocks > 0 && !repair {
				return fmt.Errorf("vdi %s has %d blocks that fail their checksum on some replica (run with --repair, or let the scrub repair them)", a[0], r.BadBlocks)
			}
			if r.Mismatched+r.Missing > r.Repaired {
				return fmt.Errorf("vdi %s has replicas that differ or are missing (run with --repair once it is closed)", a[0])
			}
			return nil
		},
	}
	check.Flags().BoolVar(&repair, "repair", false, "replace differing or missing replicas with the newest copy, rewrite blocks that fail their checksum from a good replica")
	cmd.AddCommand(create, list, info, remove, resize, snapshot, clone, rollback, flatten, tree, check, set, status, unlock)
	return cmd
}

func lockCommand(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "lock", Short: "cluster locks (exclusive VDI opens and others)"}
	list := &cobra.Command{
		Use:   "list",
		Short: "held locks with their owners",
		Args:  args(0, ""),
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := g.context()
			defer cancel()
			locks, err := g.client().Locks(ctx)
			if err != nil {
				return err
			}
			return g.output(locks, func(w *tabwriter.Writer) {
				fmt.Fprintln(w, "KEY\tNODE\tSESSION\tACQUIRED")
				for _, l := range locks {
					fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", l.Key, l.Node, l.Session, l.Acquired.Local().Format(time.DateTime))
				}
			})
		},
	}
	cmd.AddCommand(list)
	return cmd
}

func printVDIStatus(w *tabwriter.Writer, st api.VDIStatus) {
	v := st.VDI
	fmt.Fprintf(w, "vdi\t%s\n", v.FullName())
	mode := "handover (a second writer takes the lock over)"
	if v.Exclusive {
		mode = "exclusive (a second writer is refused)"
	}
	fmt.Fprintf(w, "writers\t%s\n", mode)
	if !v.Snapshot {
		fmt.Fprintf(w, "limits\t%s (per node serving it)\n", v.Limits)
	}
	if st.Lock != nil {
		l := st.Lock
		fmt.Fprintf(w, "writer lock\tnode %s since %s (generation %d)\n", l.Node, l.Acquired.Local().Format(time.DateTime), l.Generation)
		if l.Wanted != nil {
			fmt.Fprintf(w, "wanted by\tnode %s (handover in progress)\n", l.Wanted.Node)
		}
	} else {
		fmt.Fprintf(w, "writer lock\tfree\n")
	}
	fmt.Fprintf(w, "handovers\t%d\n", v.Handovers)
	if v.Unclean {
		fmt.Fprintf(w, "unclean\tyes: its next writer makes its replicas identical first\n")
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "NODE\tADDRESS\tCLIENT\tMODE\tSINCE")
	for _, o := range st.Opens {
		mode := "read-only"
		switch {
		case o.Writer:
			mode = "writing (holds the lock)"
		case o.Fenced:
			mode = "fenced (writes fail)"
		case o.Standby:
			mode = "writable, standby (takes the lock on its first write)"
		}
		client := o.Client
		if client == "" {
			client = "-"
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", o.Node, o.Address, client, mode, o.Since.Local().Format(time.DateTime))
	}
	for _, e := range st.Errors {
		fmt.Fprintf(w, "could not ask %s\n", e)
	}
}

// printTree prints the VDI tree, children indented under their parent.
func printTree(w *tabwriter.Writer, entries []api.TreeEntry) {
	children := map[uint32][]api.TreeEntry{}
	known := map[uint32]bool{}
	for _, e := range entries {
		known[e.ID] = true
	}
	var roots []api.TreeEntry
	for _, e := range entries {
		if e.Parent == 0 || !known[e.Parent] {
			roots = append(roots, e)
		} else {
			children[e.Parent] = append(children[e.Parent], e)
		}
	}
	// UNIQUE is what deleting the VDI or snapshot frees: at once when
	// nothing descends from it, by a merge into its only child otherwise.
	fmt.Fprintln(w, "NAME\tID\tTAG\tTIME\tSIZE\tALLOCATED\tSHARED\tUNIQUE (FREED BY DELETE)")
	var walk func(e api.TreeEntry, depth int)
	walk = func(e api.TreeEntry, depth int) {
		name, tag, at := e.Name, "-", e.Created
		if e.Snapshot {
			tag, at = e.Tag, e.SnapshotTime
		}
		switch kids := len(children[e.ID]); {
		case e.Deleted && kids == 1:
			name += " (deleted, being merged into its child)"
		case e.Deleted:
			name += fmt.Sprintf(" (deleted, kept for its clones: %d children; delete all but one and it merges away, freeing its UNIQUE)", kids)
		case e.Flatten:
			name += " (flattening)"
		case !e.Snapshot:
			name += " (current)"
		}
		fmt.Fprintf(w, "%s%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\n", strings.Repeat("  ", depth), name, e.ID, tag, at.Local().Format(time.DateTime),
			size.Format(e.Size), size.Format(e.AllocatedBytes), size.Format(e.SharedBytes), size.Format(e.UniqueBytes))
		for _, c := range children[e.ID] {
			walk(c, depth+1)
		}
	}
	for _, r := range roots {
		walk(r, 0)
	}
}

// parseRate reads a bandwidth: a size per second ("100MiB", "100MiB/s",
// "1G/s"), or 0 / "unlimited".
func parseRate(text string) (uint64, error) {
	if text == "0" || text == "unlimited" {
		return 0, nil
	}
	n, err := size.Parse(strings.TrimSuffix(text, "/s"))
	if err != nil {
		return 0, fmt.Errorf("--max-rate %q: %v (a size per second such as 100MiB/s, or 0 for unlimited)", text, err)
	}
	return n, nil
}

// parseIOPSLimit reads a --*-iops-limit: a whole number of requests per
// second ("500" or "500/s"), or 0 / "unlimited".
func parseIOPSLimit(flag, text string) (uint64, error) {
	t := strings.TrimSuffix(strings.TrimSpace(text), "/s")
	if t == "unlimited" {
		return 0, nil
	}
	n, err := strconv.ParseUint(t, 10, 64)
	if err != nil || n > cluster.MaxIOPSLimit {
		return 0, fmt.Errorf("--%s %q: give a whole number of requests per second from 1 to %d, or 0 for unlimited", flag, text, cluster.MaxIOPSLimit)
	}
	return n, nil
}

// parseBPSLimit reads a --*-bps-limit: a size per second ("100MiB",
// "100MiB/s"), or 0 / "unlimited".
func parseBPSLimit(flag, text string) (uint64, error) {
	t := strings.TrimSpace(text)
	if t == "0" || t == "unlimited" {
		return 0, nil
	}
	bad := func(why string) error {
		return fmt.Errorf("--%s %q: %s (give a size per second from %s/s to %s/s such as 100MiB or 100MiB/s, or 0 for unlimited)",
			flag, text, why, size.Format(cluster.MinBPSLimit), size.Format(cluster.MaxBPSLimit))
	}
	if strings.HasPrefix(t, "-") {
		return 0, bad("negative")
	}
	n, err := size.Parse(strings.TrimSuffix(t, "/s"))
	switch {
	case err != nil:
		return 0, bad(err.Error())
	case n > cluster.MaxBPSLimit:
		return 0, bad("too large")
	case n < cluster.MinBPSLimit && n != 0:
		return 0, bad("too small: one large request would wait for minutes")
	}
	return n, nil
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
				return fmt.Errorf("give --for DURATION (e.g. --for 30m) or --end")
			}
			if !end && window <= 0 {
				return usage(fmt.Errorf("--for must be a positive duration such as 30m or 2h, not %s (--end ends a window)", window))
			}
			ctx, cancel := g.context()
			defer cancel()
			id, err := resolveNode(ctx, g, a[0])
			if err != nil {
				return err
			}
			n, err := g.client().SetMaintenance(ctx, id, window)
			if err != nil {
				return err
			}
			return g.output(n, func(w *tabwriter.Writer) {
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
func resolveNode(ctx context.Context, g *globals, name string) (string, error) {
	nodes, err := g.client().Nodes(ctx)
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
			ctx, cancel := g.context()
			defer cancel()
			id, err := resolveNode(ctx, g, a[0])
			if err != nil {
				return err
			}
			n, err := g.client().Drain(ctx, id, cancelDrain)
			if err != nil {
				return err
			}
			return g.output(n, func(w *tabwriter.Writer) {
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
			ctx, cancel := g.context()
			defer cancel()
			id, err := resolveNode(ctx, g, a[0])
			if err != nil {
				return err
			}
			n, err := g.client().SetNode(ctx, id, settings)
			if err != nil {
				return err
			}
			return g.output(n, func(w *tabwriter.Writer) {
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
