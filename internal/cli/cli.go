// Package cli is the herd command line: `herd server` and the admin
// commands (`herd cluster|node|vdi ...`), which talk to any node's admin
// API. Tables for people by default, --json for scripts. Errors are
// translated to one line for people here, and nowhere else.
package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/herd-storage/herd/internal/api"
)

// globals holds the flags every admin command shares.
type globals struct {
	addr    string
	token   string
	json    bool
	timeout time.Duration
	stdout  io.Writer
}

func (g *globals) client() *api.Client { return api.NewClient(g.addr, g.token) }

func (g *globals) context() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), g.timeout)
}

// output prints v as JSON with --json, else calls table.
func (g *globals) output(v any, table func(w *tabwriter.Writer)) error {
	if g.json {
		enc := json.NewEncoder(g.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	w := tabwriter.NewWriter(g.stdout, 0, 0, 2, ' ', 0)
	table(w)
	return w.Flush()
}

// Main runs the command line and returns the process exit code.
func Main(args []string, stdout, stderr io.Writer) int {
	g := &globals{stdout: stdout}
	root := &cobra.Command{
		Use:           "herd",
		Short:         "herd: replicated, thin, snapshot-able virtual disks for VMs, served over NBD",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		hint := ""
		if strings.Contains(err.Error(), "shorthand flag") {
			hint = "; to pass a value starting with '-', put -- before the arguments"
		}
		return fmt.Errorf("%v%s (see: %s --help)", err, hint, c.CommandPath())
	})
	defaultAddr := os.Getenv("HERD_ADDR")
	if defaultAddr == "" {
		defaultAddr = "127.0.0.1"
	}
	root.PersistentFlags().StringVar(&g.addr, "addr", defaultAddr, "admin address of any herd node, IP[:PORT] (env HERD_ADDR)")
	root.PersistentFlags().StringVar(&g.token, "token", os.Getenv("HERD_TOKEN"), "the cluster token (env HERD_TOKEN; in the first node's DATA/cluster.token)")
	root.PersistentFlags().BoolVar(&g.json, "json", false, "print JSON instead of tables")
	root.PersistentFlags().DurationVar(&g.timeout, "timeout", 30*time.Second, "how long to wait for the cluster")
	root.AddCommand(serverCommand(), clusterCommand(g), nodeCommand(g), vdiCommand(g), lockCommand(g))
	for _, group := range root.Commands() {
		if group.Name() == "vdi" {
			group.AddCommand(transferCommands(g)...)
		}
	}
	for _, group := range root.Commands() {
		if group.HasSubCommands() {
			requireSubcommand(group)
		}
	}
	if err := root.Execute(); err != nil {
		fmt.Fprintf(stderr, "herd: %s\n", strings.TrimSpace(err.Error()))
		return 1
	}
	return 0
}

// args returns a cobra.PositionalArgs that explains the usage.
func args(n int, usage string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, a []string) error {
		if len(a) != n {
			return fmt.Errorf("usage: %s %s", cmd.CommandPath(), usage)
		}
		return nil
	}
}

// signalContext ends on SIGINT or SIGTERM.
func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}

// requireSubcommand makes a command group fail on a missing or unknown
// subcommand instead of printing help and exiting 0.
func requireSubcommand(group *cobra.Command) {
	group.Args = cobra.ArbitraryArgs
	group.RunE = func(cmd *cobra.Command, a []string) error {
		var names []string
		for _, sub := range cmd.Commands() {
			if sub.IsAvailableCommand() {
				names = append(names, sub.Name())
			}
		}
		if len(a) == 0 {
			return fmt.Errorf("%s needs a command: %s", cmd.CommandPath(), strings.Join(names, ", "))
		}
		return fmt.Errorf("unknown command %q for %s (commands: %s)", a[0], cmd.CommandPath(), strings.Join(names, ", "))
	}
}
