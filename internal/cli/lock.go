package cli

// `herd lock list`, and a VDI's writers: `herd vdi status|unlock`.

import (
	"context"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/herd-storage/herd/internal/api"
	"github.com/herd-storage/herd/internal/cluster"
)

func lockCommand(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "lock", Short: "cluster locks (exclusive VDI opens and others)"}
	cmd.AddCommand(lockListCommand(g))
	return cmd
}

func lockListCommand(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "list",
		Short: "held locks with their owners",
		Args:  args(0, ""),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return call(g, (*api.Client).Locks, func(w *tabwriter.Writer, locks []cluster.Lock) {
				fmt.Fprintln(w, "KEY\tNODE\tSESSION\tACQUIRED")
				for _, l := range locks {
					fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", l.Key, l.Node, l.Session, l.Acquired.Local().Format(time.DateTime))
				}
			})
		},
	}
}

func vdiStatusCommand(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "status NAME",
		Short: "who has a VDI open: through which node, from which client, read-only or writing, since when",
		Args:  args(1, "NAME"),
		RunE: func(cmd *cobra.Command, a []string) error {
			return call(g, func(c *api.Client, ctx context.Context) (api.VDIStatus, error) { return c.VDIStatus(ctx, a[0]) }, printVDIStatus)
		},
	}
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

func vdiUnlockCommand(g *globals) *cobra.Command {
	var force bool
	cmd := &cobra.Command{
		Use:   "unlock NAME --force",
		Short: "take a VDI's writer lock away from a holder that is gone; the holder is fenced first (its later writes fail)",
		Args:  args(1, "NAME --force"),
		RunE: func(cmd *cobra.Command, a []string) error {
			return call(g, func(c *api.Client, ctx context.Context) (cluster.Lock, error) { return c.UnlockVDI(ctx, a[0], force) },
				func(w *tabwriter.Writer, l cluster.Lock) {
					fmt.Fprintf(w, "unlocked %s: node %s held its writer lock since %s; that node's opens of it are fenced (their writes fail) and the next writer repairs its replicas first\n",
						a[0], l.Node, l.Acquired.Local().Format(time.DateTime))
				})
		},
	}
	cmd.Flags().BoolVar(&force, "force", false, "really take the lock away (required)")
	return cmd
}
