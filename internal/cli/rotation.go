package cli

import (
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/herd-storage/herd/internal/cluster"
)

func rotateGossipKeyCommand(g *globals) *cobra.Command {
	var noWait bool
	cmd := &cobra.Command{
		Use:   "rotate-gossip-key [--no-wait]",
		Short: "replace the gossip key on every node, online: each installs the new key, then all switch to it, then the old key is removed",
		Long: `Replace the gossip (memberlist) encryption key on every node while the
cluster serves. The node asked makes a new key; the log records its id
(never the key) and every node fetches it over mutual TLS from a member,
installs it and says so; once every alive node has it, every node switches
to it; once every alive node uses it, the old key is removed everywhere.
Each step is in herd events. A node that is down meanwhile fetches the
current keys over mutual TLS when it starts. Waits until the rotation
ends (--timeout), unless --no-wait.`,
		Args: args(0, "[--no-wait]"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := g.context()
			defer cancel()
			client := g.client()
			started, err := client.RotateGossipKey(ctx)
			if err != nil {
				return err
			}
			if noWait {
				return g.output(started, func(w *tabwriter.Writer) {
					fmt.Fprintf(w, "gossip key rotation to key %s started (herd cluster info, herd events)\n", started.Key)
				})
			}
			var state cluster.GossipKeyring
			for {
				if state, err = client.GossipKey(ctx); err == nil && state.Rotation == nil && state.Primary == started.Key {
					break
				}
				select {
				case <-ctx.Done():
					where := "unknown"
					if err != nil {
						where = err.Error()
					} else if r := state.Rotation; r != nil {
						where = gossipRotationText(*r)
					}
					return fmt.Errorf("the gossip key rotation to key %s did not end within --timeout; it goes on by itself (herd cluster info): %s", started.Key, where)
				case <-time.After(200 * time.Millisecond):
				}
			}
			return g.output(state, func(w *tabwriter.Writer) {
				fmt.Fprintf(w, "gossip key %s in use on every node; the old key is removed\n", state.Primary)
			})
		},
	}
	cmd.Flags().BoolVar(&noWait, "no-wait", false, "return once the rotation started")
	return cmd
}

// gossipRotationText says where a gossip key rotation is.
func gossipRotationText(r cluster.GossipKeyRotation) string {
	switch r.Phase {
	case cluster.GossipKeyInstall:
		return fmt.Sprintf("to key %s since %s: installing (done on %s)", r.Key, r.Started.Local().Format(time.DateTime), listOrNone(r.Installed))
	default:
		return fmt.Sprintf("to key %s since %s: switching (done on %s)", r.Key, r.Started.Local().Format(time.DateTime), listOrNone(r.Using))
	}
}

func listOrNone(ids []string) string {
	if len(ids) == 0 {
		return "none yet"
	}
	return strings.Join(ids, ", ")
}

// securityInfo adds cluster info's lines about the cluster's secrets.
func securityInfo(w *tabwriter.Writer, info cluster.Info) {
	if k := info.GossipKey; k != nil {
		key := k.Primary
		if k.Rotated.IsZero() {
			key += " (never rotated)"
		} else {
			key += " (rotated " + k.Rotated.Local().Format(time.DateTime) + ")"
		}
		if r := k.Rotation; r != nil {
			key += "; rotation " + gossipRotationText(*r)
		}
		fmt.Fprintf(w, "Gossip key:\t%s\n", key)
	}
}
