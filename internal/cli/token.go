package cli

// `herd token`: admin API tokens. `herd token refresh` is in rotation.go.

import (
	"context"
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/herd-storage/herd/internal/api"
	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/pki"
)

// tokenFromFile reads a token from a file that only its owner can read.
func tokenFromFile(path string) (string, error) {
	data, err := pki.ReadSecretFile(path)
	if err != nil {
		return "", err
	}
	token := strings.TrimSpace(string(data))
	if token == "" {
		return "", fmt.Errorf("%s is empty", path)
	}
	return token, nil
}

func tokenCommand(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "token", Short: "admin API tokens: create, list, revoke"}
	cmd.AddCommand(tokenCreateCommand(g), tokenListCommand(g), tokenRevokeCommand(g), tokenRefreshCommand(g))
	return cmd
}

func tokenCreateCommand(g *globals) *cobra.Command {
	var readOnly, data bool
	var out string
	cmd := &cobra.Command{
		Use:   "create NAME [--read-only [--data]] [--out FILE]",
		Short: "create an admin token; it is shown once (or written to --out, mode 0600)",
		Long: `Create an admin token. Its scope is one of:

  admin               (default) everything, VDI data included
  read-only           --read-only: the cluster's state (GET requests, the
                      dashboard, /metrics), not VDI data
  read-only+data      --read-only --data: that, and reading VDI data (NBD
                      session certificates for herd vdi export, read-only)

A read-only token made before this version has the read-only scope: it no
longer reads VDI data. --data needs cluster feature level 3.`,
		Args: args(1, "NAME [--read-only [--data]] [--out FILE]"),
		RunE: func(cmd *cobra.Command, a []string) error {
			if data && !readOnly {
				return usage(fmt.Errorf("--data goes with --read-only: an admin token reads VDI data already"))
			}
			return call(g, func(c *api.Client, ctx context.Context) (api.CreatedToken, error) {
				created, err := c.CreateToken(ctx, a[0], readOnly, data)
				if err != nil || out == "" {
					return created, err
				}
				if err := pki.WriteSecretFile(out, []byte(created.Secret+"\n")); err != nil {
					return created, err
				}
				created.Secret = ""
				return created, nil
			}, func(w *tabwriter.Writer, created api.CreatedToken) {
				scope := created.Scope()
				if out != "" {
					fmt.Fprintf(w, "token %s (%s, id %s) written to %s\n", created.Name, scope, created.ID, out)
					return
				}
				// The token alone on stdout, so `> FILE` makes a usable
				// token file; the words on stderr.
				fmt.Fprintf(cmd.ErrOrStderr(), "token %s (%s, id %s); it is not shown again:\n", created.Name, scope, created.ID)
				fmt.Fprintf(w, "%s\n", created.Secret)
			})
		},
	}
	cmd.Flags().BoolVar(&readOnly, "read-only", false, "the token may only read the cluster's state (GET), not VDI data")
	cmd.Flags().BoolVar(&data, "data", false, "with --read-only: the token may also read VDI data (vdi export, backups)")
	cmd.Flags().StringVar(&out, "out", "", "write the token to this file (mode 0600) instead of printing it")
	return cmd
}

func tokenListCommand(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "list",
		Short: "every token: id, name, scope, created, revoked",
		Args:  args(0, ""),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return call(g, (*api.Client).Tokens, func(w *tabwriter.Writer, tokens []cluster.Token) {
				fmt.Fprintln(w, "ID\tNAME\tSCOPE\tCREATED\tSTATE")
				for _, t := range tokens {
					scope, state := t.Scope(), "valid"
					if t.Revoked {
						state = "revoked"
					}
					fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", t.ID, t.Name, scope, t.Created.Format("2006-01-02 15:04:05"), state)
				}
			})
		},
	}
}

func tokenRevokeCommand(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "revoke ID|NAME",
		Short: "revoke a token: every node refuses it once it applied the revocation",
		Args:  args(1, "ID|NAME"),
		RunE: func(cmd *cobra.Command, a []string) error {
			return call(g, func(c *api.Client, ctx context.Context) (cluster.Token, error) { return c.RevokeToken(ctx, a[0]) },
				func(w *tabwriter.Writer, t cluster.Token) { fmt.Fprintf(w, "token %s (id %s) revoked\n", t.Name, t.ID) })
		},
	}
}
