package cli

import (
	"context"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/herd-storage/herd/internal/api"
	"github.com/herd-storage/herd/internal/size"
)

// scrubCommand is `herd scrub status|start|pause|resume [--max-rate]`.
func scrubCommand(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "scrub",
		Short: "the background scrub: every node reads and verifies every copy it holds, and repairs bad blocks",
	}
	cmd.AddCommand(
		scrubActionCommand(g, "status", "per node: state, progress of the pass, errors found and repaired, last complete pass", ""),
		scrubActionCommand(g, "start", "start a pass on every node now", "start"),
		scrubActionCommand(g, "pause", "pause the scrub on every node (no pass starts until resume or start)", "pause"),
		scrubActionCommand(g, "resume", "resume a paused scrub on every node", "resume"))
	return cmd
}

// scrubActionCommand is `herd scrub NAME`: action asked of every node
// ("" asks nothing), the scrub's state printed.
func scrubActionCommand(g *globals, name, short, action string) *cobra.Command {
	var maxRate string
	cmd := &cobra.Command{
		Use:   name + " [--max-rate RATE]",
		Short: short,
		Args:  args(0, ""),
		RunE: func(cmd *cobra.Command, _ []string) error {
			req := api.ScrubRequest{Action: action}
			if maxRate != "" {
				rate, err := parseRate(maxRate)
				if err != nil {
					return err
				}
				if rate == 0 {
					return usage(fmt.Errorf("--max-rate %q: the scrub is always limited; give a size per second such as 50MiB/s", maxRate))
				}
				req.MaxRate = rate
			}
			return call(g, func(c *api.Client, ctx context.Context) ([]api.ScrubEntry, error) {
				if req == (api.ScrubRequest{}) {
					return c.Scrub(ctx)
				}
				return c.ControlScrub(ctx, req)
			}, printScrub)
		},
	}
	cmd.Flags().StringVar(&maxRate, "max-rate", "", "read at most RATE per node (e.g. 50MiB/s), changed live")
	return cmd
}

func printScrub(w *tabwriter.Writer, entries []api.ScrubEntry) {
	fmt.Fprintln(w, "NODE\tADDRESS\tSTATE\tPROGRESS\tVERIFIED\tBAD CHUNKS\tREPAIRED BLOCKS\tUNREPAIRABLE\tUPGRADED\tREPLICAS DIFFERING\tLAST COMPLETE\tNEXT\tRATE\tNOTE")
	for _, e := range entries {
		st := e.Status
		note := e.Error
		if note == "" {
			note = st.LastError
		}
		last, next := "never", "-"
		if !st.LastComplete.IsZero() {
			last = st.LastComplete.Local().Format(time.DateTime)
		}
		if !st.NextPass.IsZero() {
			next = st.NextPass.Local().Format(time.DateTime)
		}
		progress := "-"
		if st.Objects > 0 {
			progress = fmt.Sprintf("%d/%d objects", st.Done, st.Objects)
		}
		state := st.State
		if st.Deep && st.State != "idle" {
			state += " (deep: comparing replicas)"
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%s\t%s\t%s/s\t%s\n", e.Node, e.Address, state, progress,
			size.Format(st.BytesVerified), st.ChecksumErrors, st.Repaired, st.Unrepairable, st.Upgraded, st.Mismatched, last, next, size.Format(st.MaxRate), note)
	}
}
