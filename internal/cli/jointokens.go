package cli

import (
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/herd-storage/herd/internal/pki"
)

// joinTokenCommand: `herd cluster join-token create|list|revoke`.
func joinTokenCommand(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "join-token", Short: "join tokens with a lifetime: each admits new nodes until it expires, is used up or revoked"}
	var ttl string
	var uses int
	var out string
	create := &cobra.Command{
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
			ctx, cancel := g.context()
			defer cancel()
			created, err := g.client().CreateJoinToken(ctx, lifetime, uses)
			if err != nil {
				return err
			}
			if out != "" {
				if err := pki.WriteSecretFile(out, []byte(created.Token+"\n")); err != nil {
					return err
				}
				created.Token = ""
			}
			return g.output(created, func(w *tabwriter.Writer) {
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
	create.Flags().StringVar(&ttl, "ttl", "24h", "how long it admits nodes (s, m, h or d units)")
	create.Flags().IntVar(&uses, "uses", 0, "how many nodes it admits (0: any number until it expires)")
	create.Flags().StringVar(&out, "out", "", "write the token to this file (mode 0600) instead of printing it")
	list := &cobra.Command{
		Use:   "list",
		Short: "join tokens: id, expiry, uses, revoked",
		Args:  args(0, ""),
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := g.context()
			defer cancel()
			tokens, err := g.client().JoinTokens(ctx)
			if err != nil {
				return err
			}
			return g.output(tokens, func(w *tabwriter.Writer) {
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
	revoke := &cobra.Command{
		Use:   "revoke ID",
		Short: "revoke a join token: every node refuses it once this returns",
		Args:  args(1, "ID"),
		RunE: func(cmd *cobra.Command, a []string) error {
			ctx, cancel := g.context()
			defer cancel()
			t, err := g.client().RevokeJoinToken(ctx, a[0])
			if err != nil {
				return err
			}
			return g.output(t, func(w *tabwriter.Writer) { fmt.Fprintf(w, "join token %s revoked\n", t.ID) })
		},
	}
	cmd.AddCommand(create, list, revoke)
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
