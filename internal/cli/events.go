package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"os/signal"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/herd-storage/herd/internal/cluster"
)

func eventsCommand(g *globals) *cobra.Command {
	var follow bool
	var last int
	cmd := &cobra.Command{
		Use:   "events",
		Short: "the cluster's history in words: epochs, nodes joining and leaving, locks taken away, vdis, credentials (--follow for new ones)",
		Args:  args(0, ""),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if last < 0 {
				return usage(fmt.Errorf("--last must be 0 (all) or more, not %d", last))
			}
			ctx, cancel := g.context()
			events, err := g.client().Events(ctx, 0)
			cancel()
			if err != nil {
				return err
			}
			if last > 0 && len(events) > last {
				events = events[len(events)-last:]
			}
			if !follow {
				return show(g, events, func(w *tabwriter.Writer, events []cluster.Event) {
					fmt.Fprintln(w, "TIME\tKIND\tEVENT")
					printEvents(w, events)
				})
			}
			// --follow: one line (or one JSON object) per event, as they come.
			stop, cancelStop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
			defer cancelStop()
			var after uint64
			for {
				if g.json {
					enc := json.NewEncoder(g.stdout)
					for _, e := range events {
						if err := enc.Encode(e); err != nil {
							return err
						}
					}
				} else {
					w := tabwriter.NewWriter(g.stdout, 0, 0, 2, ' ', 0)
					printEvents(w, events)
					w.Flush()
				}
				if len(events) > 0 {
					after = events[len(events)-1].Index
				}
				select {
				case <-stop.Done():
					return nil
				case <-time.After(time.Second):
				}
				ctx, cancel := context.WithTimeout(stop, g.timeout)
				events, err = g.client().Events(ctx, after)
				cancel()
				if err != nil && stop.Err() == nil {
					return err
				}
			}
		},
	}
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing new events until interrupted")
	cmd.Flags().IntVar(&last, "last", 0, "print only the newest N events first (0: all the cluster keeps)")
	return cmd
}

func printEvents(w *tabwriter.Writer, events []cluster.Event) {
	for _, e := range events {
		at := "-"
		if !e.Time.IsZero() {
			at = e.Time.Local().Format(time.DateTime)
		}
		fmt.Fprintf(w, "%s\t%s\t%s\n", at, e.Kind, e.Text)
	}
}
