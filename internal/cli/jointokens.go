package cli

// `herd cluster join-token create|list|revoke` and `herd cluster
// rotate-join-token`: the tokens that admit new nodes.

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/herd-storage/herd/internal/api"
	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/pki"
)

// joinTokenCommand: `herd cluster join-token create|list|revoke`.
func joinTokenCommand(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "join-token", Short: "join tokens with a lifetime: each admits new nodes until it expires, is used up or revoked"}
	cmd.AddCommand(joinTokenCreateCommand(g), joinTokenListCommand(g), joinTokenRevokeCommand(g))
	return cmd
}

func joinTokenCreateCommand(g *globals) *cobra.Command {
	var ttl string
	var uses int
	var out string
	cmd := &cobra.Command{
		Use:   "create [--ttl 24h] [--uses N] [--out FILE]",
		Short: "a new join token (shown once): valid for --ttl (default 24h; units s, m, h, d), for --uses nodes (default any number)",
		Args:  args(0, "[--ttl 24h] [--uses N] [--out FILE]"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			lifetime, err := parseLifetime(ttl)
			if err != nil {
				return usage(fmt.Errorf("--ttl: %w", err))
			}
			if uses < 0 {
				return usage(fmt.Errorf("--uses %d: at least 0 (0: any number)", uses))
			}
			return call(g, func(c *api.Client, ctx context.Context) (api.JoinTokenCreated, error) {
				created, err := c.CreateJoinToken(ctx, lifetime, uses)
				if err != nil || out == "" {
					return created, err
				}
				if err := pki.WriteSecretFile(out, []byte(created.Token+"\n")); err != nil {
					return created, err
				}
				created.Token = ""
				return created, nil
			}, func(w *tabwriter.Writer, created api.JoinTokenCreated) {
				limit := "any number of nodes"
				if created.Uses > 0 {
					limit = fmt.Sprintf("%d node(s)", created.Uses)
				}
				if out != "" {
					fmt.Fprintf(w, "join token %s: admits %s until %s; written to %s\n", created.ID, limit, created.Expires.Local().Format(time.DateTime), out)
					return
				}
				// The token alone on stdout (`> FILE` makes a usable
				// --join-token-file); the words on stderr.
				fmt.Fprintf(cmd.ErrOrStderr(), "join token %s: admits %s until %s\n", created.ID, limit, created.Expires.Local().Format(time.DateTime))
				fmt.Fprintf(w, "%s\n", created.Token)
			})
		},
	}
	cmd.Flags().StringVar(&ttl, "ttl", "24h", "how long it admits nodes (s, m, h or d units)")
	cmd.Flags().IntVar(&uses, "uses", 0, "how many nodes it admits (0: any number until it expires)")
	cmd.Flags().StringVar(&out, "out", "", "write the token to this file (mode 0600) instead of printing it")
	return cmd
}

func joinTokenListCommand(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "list",
		Short: "join tokens: id, expiry, uses, revoked",
		Args:  args(0, ""),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return call(g, (*api.Client).JoinTokens, func(w *tabwriter.Writer, tokens []cluster.JoinToken) {
				fmt.Fprintln(w, "ID\tCREATED\tEXPIRES\tUSED\tSTATE")
				now := time.Now()
				for _, t := range tokens {
					used := fmt.Sprintf("%d of any", t.Used)
					if t.Uses > 0 {
						used = fmt.Sprintf("%d of %d", t.Used, t.Uses)
					}
					state := "valid"
					switch {
					case t.Revoked:
						state = "revoked"
					case !now.Before(t.Expires):
						state = "expired"
					case t.Uses > 0 && t.Used >= t.Uses:
						state = "used up"
					}
					fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", t.ID, t.Created.Local().Format(time.DateTime), t.Expires.Local().Format(time.DateTime), used, state)
				}
			})
		},
	}
}

func joinTokenRevokeCommand(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "revoke ID",
		Short: "revoke a join token: every node refuses it once this returns",
		Args:  args(1, "ID"),
		RunE: func(cmd *cobra.Command, a []string) error {
			return call(g, func(c *api.Client, ctx context.Context) (cluster.JoinToken, error) {
				return c.RevokeJoinToken(ctx, a[0])
			},
				func(w *tabwriter.Writer, t cluster.JoinToken) { fmt.Fprintf(w, "join token %s revoked\n", t.ID) })
		},
	}
}

func rotateJoinTokenCommand(g *globals) *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use:   "rotate-join-token [--out FILE]",
		Short: "replace the join secret: joins with the old token are refused from then on",
		Args:  args(0, "[--out FILE]"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return call(g, func(c *api.Client, ctx context.Context) (api.JoinTokenResponse, error) {
				r, err := c.RotateJoinToken(ctx)
				if err != nil || out == "" {
					return r, err
				}
				if err := pki.WriteSecretFile(out, []byte(r.Token+"\n")); err != nil {
					return r, err
				}
				r.Token = ""
				return r, nil
			}, func(w *tabwriter.Writer, r api.JoinTokenResponse) {
				if out != "" {
					fmt.Fprintf(w, "new join token written to %s\n", out)
					return
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "new join token (shown once):\n")
				fmt.Fprintf(w, "%s\n", r.Token)
			})
		},
	}
	cmd.Flags().StringVar(&out, "out", "", "write the token to this file (mode 0600) instead of printing it")
	return cmd
}

// parseLifetime reads a duration in Go's syntax or whole days ("7d").
func parseLifetime(text string) (time.Duration, error) {
	if days, ok := strings.CutSuffix(text, "d"); ok {
		n, err := strconv.Atoi(days)
		if err != nil || n <= 0 {
			return 0, fmt.Errorf("%q: want a number of days like 7d, or a duration like 12h", text)
		}
		return time.Duration(n) * 24 * time.Hour, nil
	}
	d, err := time.ParseDuration(text)
	if err != nil || d < time.Second {
		return 0, fmt.Errorf("%q: want a duration of at least 1s like 30m, 12h or 7d", text)
	}
	return d, nil
}
