package cli

import (
	"context"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/herd-storage/herd/internal/api"
	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/pki"
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
				return show(g, started, func(w *tabwriter.Writer, started cluster.GossipKeyRotation) {
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
			return show(g, state, func(w *tabwriter.Writer, state cluster.GossipKeyring) {
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
	if ca := info.CA; ca != nil {
		age := time.Since(ca.Created).Round(time.Hour)
		fmt.Fprintf(w, "CA:\t%s (made %s, %d days ago; expires %s)\n", ca.Fingerprint, ca.Created.Local().Format(time.DateTime), int(age.Hours()/24), ca.Expires.Local().Format(time.DateOnly))
		if r := ca.Rotation; r != nil {
			text := fmt.Sprintf("to CA %s since %s (key on node %s): certificates on %s", r.Fingerprint, r.Started.Local().Format(time.DateTime), r.Holder, listOrNone(r.Done))
			if len(r.Missing) > 0 {
				text += "; getting theirs: " + strings.Join(r.Missing, ", ")
			}
			if len(r.Down) > 0 {
				text += "; down without one: " + strings.Join(r.Down, ", ")
			}
			fmt.Fprintf(w, "CA rotation:\t%s\n", text)
		}
	}
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

func rotateCACommand(g *globals) *cobra.Command {
	var finish, cancel, force, noWait bool
	var tokenOut string
	cmd := &cobra.Command{
		Use:   "rotate-ca [--no-wait] | --finish [--force] [--token-out FILE] | --cancel",
		Short: "replace the cluster CA online: a new CA, trusted with the old one until --finish; every node gets a certificate from it",
		Long: `Replace the cluster CA while the cluster serves (docs/SECURITY.md).

  herd cluster rotate-ca            a node holding the CA key makes a new CA
                                    (its key stays there); every node trusts
                                    both and gets a certificate from the new
                                    one, recorded in the log; waits until
                                    every alive node has one (--no-wait)
  herd client add NAME --renew --out DIR    for each NBD client, then
                                    give QEMU the new files
  herd token refresh --out FILE     each admin token with the new CA's
                                    fingerprint (same id and secret)
  herd cluster rotate-ca --finish   the new CA is the cluster's: the old CA,
                                    and every certificate it issued, is
                                    refused on every port from now on

--finish is refused while a node has no certificate from the new CA; with
--force it goes on without the nodes that are down (they must be removed
and join again). It returns once every alive node trusts the new CA
alone (at most 10 s after the finish: it names the nodes that do not
yet). --token-out writes this command's token with the new fingerprint.
--cancel drops the new CA.`,
		Args: args(0, "[--finish [--force] [--token-out FILE] | --cancel]"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if finish && cancel {
				return usage(fmt.Errorf("--finish or --cancel, not both"))
			}
			if force && !finish {
				return usage(fmt.Errorf("--force goes with --finish"))
			}
			switch {
			case cancel:
				return call(g, (*api.Client).CancelCARotation, func(w *tabwriter.Writer, state cluster.CAState) {
					fmt.Fprintf(w, "CA rotation cancelled: the cluster's CA stays %s; renewed clients use their previous certificate again\n", caText(state.Fingerprint))
				})
			case finish:
				return call(g, func(c *api.Client, ctx context.Context) (api.FinishedCA, error) {
					state, err := c.FinishCARotation(ctx, force)
					if err == nil && tokenOut != "" {
						err = writeRefreshedToken(c.Token(), state.Fingerprint, tokenOut)
					}
					return state, err
				}, func(w *tabwriter.Writer, state api.FinishedCA) {
					if len(state.NotApplied) == 0 {
						fmt.Fprintf(w, "CA rotation finished: the cluster's CA is %s; the old CA and every certificate it issued are refused on every node\n", state.Fingerprint)
					} else {
						fmt.Fprintf(w, "CA rotation finished: the cluster's CA is %s; the old CA and every certificate it issued are refused from now on\n", state.Fingerprint)
						fmt.Fprintf(w, "nodes %s did not trust the new CA alone yet when the node stopped waiting: they refuse the old one once they apply the finish (herd cluster info)\n", strings.Join(state.NotApplied, ", "))
					}
					if tokenOut != "" {
						fmt.Fprintf(w, "this command's admin token, with the new fingerprint, is in %s\n", tokenOut)
					} else {
						fmt.Fprintf(w, "admin tokens name the new CA: herd-admin.%s.ID.SECRET (same id and secret)\n", state.Fingerprint)
					}
				})
			}
			ctx, stop := g.context()
			defer stop()
			client := g.client()
			started, err := client.RotateCA(ctx)
			if err != nil {
				return err
			}
			r := started.Rotation
			if r == nil {
				return fmt.Errorf("the node answered no rotation")
			}
			var info cluster.CAInfo
			for !noWait {
				if info, err = client.CA(ctx); err == nil && info.Rotation != nil && len(info.Rotation.Missing) == 0 {
					break
				}
				select {
				case <-ctx.Done():
					return fmt.Errorf("CA rotation to %s started, but not every node has a certificate from it within --timeout (herd cluster info): %v", r.Fingerprint, err)
				case <-time.After(200 * time.Millisecond):
				}
			}
			return show(g, started, func(w *tabwriter.Writer, started cluster.CAState) {
				fmt.Fprintf(w, "CA rotation started: new CA %s (its key on node %s); every node trusts it and the old one\n", r.Fingerprint, r.Holder)
				if !noWait {
					fmt.Fprintf(w, "every alive node has a certificate from it (%s)\n", listOrNone(info.Rotation.Done))
					if len(info.Rotation.Down) > 0 {
						fmt.Fprintf(w, "nodes down without one: %s (start them before --finish, or they must join again)\n", strings.Join(info.Rotation.Down, ", "))
					}
				}
				fmt.Fprintf(w, "next: herd client add NAME --renew --out DIR for each NBD client; herd token refresh --out FILE for each admin token; then herd cluster rotate-ca --finish\n")
			})
		},
	}
	cmd.Flags().BoolVar(&finish, "finish", false, "make the new CA the cluster's: the old one is refused from then on")
	cmd.Flags().BoolVar(&force, "force", false, "with --finish: although nodes that are down have no certificate from the new CA (they must join again)")
	cmd.Flags().BoolVar(&cancel, "cancel", false, "drop the new CA of the rotation under way")
	cmd.Flags().BoolVar(&noWait, "no-wait", false, "return once the rotation started")
	cmd.Flags().StringVar(&tokenOut, "token-out", "", "with --finish: write this command's admin token with the new CA's fingerprint to FILE (mode 0600)")
	return cmd
}

func caText(fingerprint string) string {
	if fingerprint == "" {
		return "the first one"
	}
	return fingerprint
}

// writeRefreshedToken writes token with the CA fingerprint to path.
func writeRefreshedToken(token, fingerprint, path string) error {
	parsed, err := pki.ParseAdminToken(strings.TrimSpace(token))
	if err != nil {
		return err
	}
	parsed.Fingerprint = fingerprint
	return pki.WriteSecretFile(path, []byte(parsed.String()+"\n"))
}

func tokenRefreshCommand(g *globals) *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use:   "refresh [--out FILE]",
		Short: "print this command's admin token (HERD_TOKEN or --token-file) with the fingerprint of the cluster's newest CA: after herd cluster rotate-ca, before --finish",
		Long: `An admin token carries the cluster CA's fingerprint, which the CLI checks
the node against. During a CA rotation (herd cluster rotate-ca) the token
is accepted with either CA's fingerprint; after --finish with the new
one's only. refresh prints the token (same id and secret) with the newest
CA's fingerprint, alone on stdout, or writes it to --out (mode 0600).`,
		Args: args(0, "[--out FILE]"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := g.context()
			defer cancel()
			client := g.client()
			info, err := client.CA(ctx)
			if err != nil {
				return err
			}
			fingerprint := info.Fingerprint
			if info.Rotation != nil {
				fingerprint = info.Rotation.Fingerprint
			}
			parsed, err := pki.ParseAdminToken(strings.TrimSpace(client.Token()))
			if err != nil {
				return err
			}
			parsed.Fingerprint = fingerprint
			if out != "" {
				if err := pki.WriteSecretFile(out, []byte(parsed.String()+"\n")); err != nil {
					return err
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "token %s with CA %s written to %s\n", parsed.ID, fingerprint, out)
				return nil
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "token %s with CA %s:\n", parsed.ID, fingerprint)
			fmt.Fprintln(g.stdout, parsed.String())
			return nil
		},
	}
	cmd.Flags().StringVar(&out, "out", "", "write the token to FILE (mode 0600) instead of printing it")
	return cmd
}
