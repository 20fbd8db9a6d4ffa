package cli

// `herd vdi snapshot|clone|rollback|flatten|tree`: snapshots, clones and
// the tree they make.

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

func vdiSnapshotCommand(g *globals) *cobra.Command {
	var tag string
	cmd := &cobra.Command{
		Use:   "snapshot NAME [--tag TAG]",
		Short: "freeze a VDI's content as NAME@TAG (instant; allowed while it is written)",
		Args:  args(1, "NAME [--tag TAG]"),
		RunE: func(cmd *cobra.Command, a []string) error {
			return call(g, func(c *api.Client, ctx context.Context) (cluster.SnapshotResult, error) {
				return c.Snapshot(ctx, a[0], tag)
			},
				func(w *tabwriter.Writer, r cluster.SnapshotResult) {
					fmt.Fprintf(w, "snapshot %s taken (id %d); %s continues as vdi id %d\n", r.Snapshot.FullName(), r.Snapshot.ID, r.VDI.Name, r.VDI.ID)
				})
		},
	}
	cmd.Flags().StringVar(&tag, "tag", "", "the snapshot's tag (default: its id)")
	return cmd
}

func vdiCloneCommand(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "clone NAME@TAG NEWNAME",
		Short: "a new writable VDI sharing a snapshot's objects (instant)",
		Args:  args(2, "NAME@TAG NEWNAME"),
		RunE: func(cmd *cobra.Command, a []string) error {
			return call(g, func(c *api.Client, ctx context.Context) (cluster.VDI, error) { return c.Clone(ctx, a[0], a[1]) }, printVDI)
		},
	}
}

func vdiRollbackCommand(g *globals) *cobra.Command {
	var to string
	cmd := &cobra.Command{
		Use:   "rollback NAME --to TAG",
		Short: "make a VDI's content a snapshot's again (instant; not while it is open for writing)",
		Args:  args(1, "NAME --to TAG"),
		RunE: func(cmd *cobra.Command, a []string) error {
			if to == "" {
				return usage(fmt.Errorf("--to TAG is required: the snapshot to roll back to (see herd vdi tree)"))
			}
			return call(g, func(c *api.Client, ctx context.Context) (cluster.VDI, error) { return c.Rollback(ctx, a[0], to) }, printVDI)
		},
	}
	cmd.Flags().StringVar(&to, "to", "", "the snapshot's tag")
	return cmd
}

func vdiFlattenCommand(g *globals) *cobra.Command {
	var noWait bool
	cmd := &cobra.Command{
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
			for !noWait && v.Parent != 0 {
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
			return show(g, v, printVDI)
		},
	}
	cmd.Flags().BoolVar(&noWait, "no-wait", false, "return once the flatten is asked for; vdi tree shows it under way")
	return cmd
}

func vdiTreeCommand(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "tree",
		Short: "the VDI tree: snapshots, clones, space used",
		Args:  args(0, ""),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return call(g, (*api.Client).Tree, printTree)
		},
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
		if e.EC != "" {
			name += " [ec " + e.EC + "]"
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
