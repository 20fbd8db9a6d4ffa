package cli

// `herd vdi`: virtual disk images. Snapshots and clones are in
// snapshot.go, writers and locks in lock.go, import and export in
// transfer.go, diff in diff.go.

import (
	"context"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/herd-storage/herd/internal/api"
	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/ec"
	"github.com/herd-storage/herd/internal/maintenance"
	"github.com/herd-storage/herd/internal/size"
)

func vdiCommand(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "vdi", Short: "virtual disk images"}
	cmd.AddCommand(vdiCreateCommand(g), vdiListCommand(g), vdiInfoCommand(g), vdiDeleteCommand(g), vdiResizeCommand(g),
		vdiSnapshotCommand(g), vdiCloneCommand(g), vdiRollbackCommand(g), vdiFlattenCommand(g), vdiTreeCommand(g),
		vdiCheckCommand(g), vdiSetCommand(g), vdiStatusCommand(g), vdiUnlockCommand(g),
		vdiImportCommand(g), vdiExportCommand(g), vdiDiffCommand(g))
	return cmd
}

// printVDI is the table of one VDI or snapshot.
func printVDI(w *tabwriter.Writer, v cluster.VDI) {
	fmt.Fprintf(w, "Name:\t%s\nID:\t%d\nSize:\t%s (%d bytes)\n", v.FullName(), v.ID, size.Format(v.Size), v.Size)
	if _, ok := v.Scheme(); ok {
		fmt.Fprintf(w, "Redundancy:\terasure coding %s (%sx space; its map objects and recent writes: %d copies)\n", v.EC, spaceFactor(v), v.Copies)
	} else {
		fmt.Fprintf(w, "Copies:\t%d\n", v.Copies)
	}
	fmt.Fprintf(w, "Object size:\t%s\nCreated:\t%s\n", size.Format(v.ObjectSize), v.Created.Local().Format(time.DateTime))
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
}

// spaceFactor is the raw space a byte of an erasure-coded VDI takes,
// (K+M)/K, as "1.5" or "1.67".
func spaceFactor(v cluster.VDI) string {
	return strconv.FormatFloat(math.Round(v.SpaceFactor()*100)/100, 'f', -1, 64)
}

// redundancy is a VDI's copies, or its scheme, for a table's column.
func redundancy(v cluster.VDI) string {
	if v.EC != "" {
		return "ec " + v.EC
	}
	return strconv.Itoa(v.Copies)
}

func vdiCreateCommand(g *globals) *cobra.Command {
	var handover, exclusive bool
	var copies int
	var scheme string
	cmd := &cobra.Command{
		Use:   "create NAME SIZE",
		Short: "create a thin VDI (SIZE like 10G, 512M, 1TiB)",
		Args:  args(2, "NAME SIZE"),
		RunE: func(cmd *cobra.Command, a []string) error {
			bytes, err := size.Parse(a[1])
			if err != nil {
				return usage(err)
			}
			req := api.CreateVDIRequest{Name: a[0], Size: bytes, Exclusive: exclusive}
			copiesGiven, ecGiven := cmd.Flags().Changed("copies"), cmd.Flags().Changed("ec")
			if copiesGiven && ecGiven {
				return usage(fmt.Errorf("--copies and --ec cannot be used together: an erasure-coded VDI keeps M+1 copies of its map objects and recent writes by itself"))
			}
			if copiesGiven && (copies < 1 || copies > cluster.MaxCopies) {
				return usage(fmt.Errorf("--copies %d: must be between 1 and %d", copies, cluster.MaxCopies))
			}
			if ecGiven {
				parsed, err := ec.Parse(scheme)
				if err != nil {
					return usage(fmt.Errorf("--ec: %s", strings.TrimPrefix(err.Error(), "ec: ")))
				}
				scheme = parsed.String()
			}
			return call(g, func(c *api.Client, ctx context.Context) (cluster.VDI, error) {
				if ecGiven {
					// A node that does not know the field refuses it, or
					// (older still) ignores it and creates copies.
					info, err := c.Info(ctx)
					if err != nil {
						return cluster.VDI{}, err
					}
					if info.SupportedLevel < cluster.FeatureErasureCoding.Level {
						return cluster.VDI{}, fmt.Errorf("--ec: the node at %s runs a herd that does not know erasure-coded VDIs; ask an upgraded node (--addr), or upgrade this one", g.addr)
					}
					req.EC = scheme
				}
				if copiesGiven {
					// A node older than feature levels would ignore the
					// field and create the VDI with the cluster's copies.
					info, err := c.Info(ctx)
					if err != nil {
						return cluster.VDI{}, err
					}
					if info.SupportedLevel < cluster.FeatureVDICopies.Level {
						return cluster.VDI{}, fmt.Errorf("--copies: the node at %s runs a herd that does not know a VDI's own copies; ask an upgraded node (--addr), or upgrade this one", g.addr)
					}
					req.Copies = copies
				}
				return c.CreateVDIWith(ctx, req)
			}, printVDI)
		},
	}
	cmd.Flags().IntVar(&copies, "copies", 0, "this VDI's number of copies (default: the cluster's, from cluster format); needs cluster feature level 2")
	cmd.Flags().StringVar(&scheme, "ec", "", "erasure-code the VDI's data with `K+M` data and parity chunks (K 2..8, M 1..3; e.g. 4+2: survives 2 lost nodes for 1.5x space), on K+M nodes, at most M in a zone; its map objects and recent writes keep M+1 copies; not with --copies; needs cluster feature level 6")
	cmd.Flags().BoolVar(&exclusive, "exclusive", false, "refuse a second writer while the VDI is open for writing; without it a writer through another node takes the writer lock over (live migration)")
	cmd.Flags().BoolVar(&handover, "handover", false, "the default now (kept for scripts)")
	cmd.Flags().MarkHidden("handover")
	cmd.MarkFlagsMutuallyExclusive("exclusive", "handover")
	return cmd
}

func vdiListCommand(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "list",
		Short: "list VDIs",
		Args:  args(0, ""),
		RunE: func(cmd *cobra.Command, _ []string) error {
			// The WRITER column, from the locks (left out if they
			// cannot be had).
			writers := map[string]cluster.Lock{}
			return call(g, func(c *api.Client, ctx context.Context) ([]cluster.VDI, error) {
				vdis, err := c.VDIs(ctx)
				if err != nil {
					return nil, err
				}
				if locks, err := c.Locks(ctx); err == nil {
					for _, l := range locks {
						writers[l.Key] = l
					}
				}
				return vdis, nil
			}, func(w *tabwriter.Writer, vdis []cluster.VDI) {
				// COPIES: the VDI's copies, or "ec K+M" for an
				// erasure-coded one.
				fmt.Fprintln(w, "NAME\tID\tSIZE\tCOPIES\tCREATED\tWRITER")
				for _, v := range vdis {
					writer := "-"
					if l, ok := writers[cluster.VDILockKey(v.Name)]; ok {
						writer = l.Node
					}
					fmt.Fprintf(w, "%s\t%d\t%s\t%s\t%s\t%s\n", v.Name, v.ID, size.Format(v.Size), redundancy(v), v.Created.Local().Format(time.DateTime), writer)
				}
			})
		},
	}
}

func vdiInfoCommand(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "info NAME[@TAG]",
		Short: "show one VDI or snapshot",
		Args:  args(1, "NAME[@TAG]"),
		RunE: func(cmd *cobra.Command, a []string) error {
			return call(g, func(c *api.Client, ctx context.Context) (cluster.VDI, error) { return c.VDI(ctx, a[0]) }, printVDI)
		},
	}
}

func vdiDeleteCommand(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "delete NAME[@TAG]",
		Short: "delete a VDI or a snapshot (objects nothing else uses are freed)",
		Args:  args(1, "NAME[@TAG]"),
		RunE: func(cmd *cobra.Command, a []string) error {
			return call(g, func(c *api.Client, ctx context.Context) (map[string]string, error) {
				return map[string]string{"deleted": a[0]}, c.DeleteVDI(ctx, a[0])
			}, func(w *tabwriter.Writer, _ map[string]string) { fmt.Fprintf(w, "deleted %s\n", a[0]) })
		},
	}
}

func vdiResizeCommand(g *globals) *cobra.Command {
	return &cobra.Command{
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
			client := g.client()
			v, err := client.ResizeVDI(ctx, a[0], bytes)
			if err != nil {
				return err
			}
			if err := show(g, v, printVDI); err != nil {
				return err
			}
			if st, err := client.VDIStatus(ctx, a[0]); err == nil && len(st.Opens) > 0 && !g.json {
				// NBD has no way to tell a connected client its export grew.
				fmt.Fprintf(os.Stderr, "note: vdi %s is open (%d connections); open clients see the new size after they reconnect (qemu: block_resize, or reopen the disk)\n", a[0], len(st.Opens))
			}
			return nil
		},
	}
}

// limitFlags are vdi set's QoS flags, in the order of their targets in
// cluster.VDISettings (vdiSetCommand); the first three count requests,
// the others bytes.
var limitFlags = [6]struct{ name, usage string }{
	{"iops-limit", "at most `N` requests per second, reads and writes together, per node serving the VDI (0 = unlimited)"},
	{"read-iops-limit", "at most `N` reads per second (0 = unlimited)"},
	{"write-iops-limit", "at most `N` writes per second; TRIM and WRITE_ZEROES count as writes (0 = unlimited)"},
	{"bps-limit", "at most `RATE` bytes per second read and written together, e.g. 100MiB or 100MiB/s (0 = unlimited)"},
	{"read-bps-limit", "at most `RATE` bytes per second read (0 = unlimited)"},
	{"write-bps-limit", "at most `RATE` bytes per second written (0 = unlimited)"},
}

func vdiSetCommand(g *globals) *cobra.Command {
	var exclusive bool
	var ack string
	var limits [6]string
	cmd := &cobra.Command{
		Use:   "set NAME [--exclusive[=false]] [--ack all|zone] [--iops-limit N] [--read-iops-limit N] [--write-iops-limit N] [--bps-limit RATE] [--read-bps-limit RATE] [--write-bps-limit RATE]",
		Short: "change a VDI's settings: exclusive writer, when writes are acknowledged, QoS limits (applied live by every node serving it; 0 = unlimited)",
		Args:  args(1, "NAME [--exclusive[=false]] [--ack all|zone] [--iops-limit N] [--read-iops-limit N] [--write-iops-limit N] [--bps-limit RATE] [--read-bps-limit RATE] [--write-bps-limit RATE]"),
		RunE: func(cmd *cobra.Command, a []string) error {
			var settings cluster.VDISettings
			if cmd.Flags().Changed("exclusive") {
				settings.Exclusive = &exclusive
			}
			targets := [6]**uint64{&settings.IOPS, &settings.ReadIOPS, &settings.WriteIOPS, &settings.BPS, &settings.ReadBPS, &settings.WriteBPS}
			if cmd.Flags().Changed("ack") {
				settings.Ack = &ack
			}
			changed := settings.Exclusive != nil || settings.Ack != nil
			for i, flag := range limitFlags {
				if !cmd.Flags().Changed(flag.name) {
					continue
				}
				parse := parseIOPSLimit
				if i >= 3 {
					parse = parseBPSLimit
				}
				v, err := parse(flag.name, limits[i])
				if err != nil {
					return err
				}
				*targets[i] = &v
				changed = true
			}
			if !changed {
				return usage(fmt.Errorf("nothing to change: give --exclusive[=false], --ack, --iops-limit, --read-iops-limit, --write-iops-limit, --bps-limit, --read-bps-limit or --write-bps-limit"))
			}
			return call(g, func(c *api.Client, ctx context.Context) (cluster.VDI, error) { return c.SetVDI(ctx, a[0], settings) }, printVDI)
		},
	}
	cmd.Flags().BoolVar(&exclusive, "exclusive", true, "true: a second writer is refused while the VDI is open for writing; false: it takes the writer lock over (live migration)")
	cmd.Flags().StringVar(&ack, "ack", "", "when a write without FUA is acknowledged: all (every replica has it) or zone (every replica in the writer's zone has it; the other zones have it before the next FLUSH completes: for zones far apart; see docs/ARCHITECTURE.md)")
	for i, flag := range limitFlags {
		cmd.Flags().StringVar(&limits[i], flag.name, "", flag.usage)
	}
	return cmd
}

func vdiCheckCommand(g *globals) *cobra.Command {
	var repair bool
	cmd := &cobra.Command{
		Use:   "check NAME[@TAG] [--repair]",
		Short: "compare every replica of a VDI's objects; --repair makes them identical (VDI closed)",
		Args:  args(1, "NAME[@TAG] [--repair]"),
		RunE: func(cmd *cobra.Command, a []string) error {
			// A check reads every replica: it may take longer than
			// --timeout's default.
			ctx, cancel := context.WithTimeout(context.Background(), max(g.timeout, 30*time.Minute))
			defer cancel()
			r, err := g.client().Check(ctx, a[0], repair)
			if err != nil {
				return err
			}
			if err := show(g, r, printCheck); err != nil {
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
			if r.BadChunks > 0 && !repair {
				return fmt.Errorf("vdi %s has %d chunks of erasure-coded objects missing or failing their checksums (listed above; run with --repair once it is closed)", a[0], r.BadChunks)
			}
			if r.Mismatched+r.Missing+r.BadChunks > r.Repaired {
				return fmt.Errorf("vdi %s has replicas that differ or are missing (run with --repair once it is closed)", a[0])
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&repair, "repair", false, "replace differing or missing replicas with the newest copy, rewrite blocks that fail their checksum from a good replica")
	return cmd
}

func printCheck(w *tabwriter.Writer, r maintenance.CheckReport) {
	for _, p := range r.Problems {
		fmt.Fprintln(w, p)
	}
	fmt.Fprintf(w, "%s: %d objects, %d consistent, %d replicas differing, %d missing, %d unavailable, %d blocks failing their checksum (%d lost on every replica), %d repaired\n",
		r.VDI, r.Objects, r.Consistent, r.Mismatched, r.Missing, r.Unavailable, r.BadBlocks, r.LostBlocks, r.Repaired)
	if r.Chunks > 0 {
		fmt.Fprintf(w, "%s: %d chunks of erasure-coded objects checked against their heads, %d missing or bad\n", r.VDI, r.Chunks, r.BadChunks)
	}
}
