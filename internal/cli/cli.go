// Package cli is the herd command line: `herd server` and the admin
// commands (`herd cluster|node|vdi ...`), which talk to any node's admin
// API. Tables for people by default, --json for scripts. Errors are
// translated to one line for people here, and nowhere else.
package cli

import (
	"context"
	"encoding/json"
	"errors"
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
	"github.com/herd-storage/herd/internal/version"
)

// globals holds the flags every admin command shares.
type globals struct {
	addr      string
	tokenFile string
	json      bool
	timeout   time.Duration
	stdout    io.Writer
}

// client talks to the node at --addr with the admin token from
// --token-file, else HERD_TOKEN (never a flag: flags show in ps and in
// --help's defaults).
func (g *globals) client() *api.Client {
	token := os.Getenv("HERD_TOKEN")
	if g.tokenFile != "" {
		var err error
		if token, err = tokenFromFile(g.tokenFile); err != nil {
			return api.FailingClient(fmt.Errorf("--token-file: %w", err))
		}
	}
	return api.NewClient(g.addr, token)
}

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

// call is the body of most admin commands: one exchange with the node
// (do, within --timeout), its answer printed by table, or as JSON with
// --json. do takes the client first, so that a method expression such as
// (*api.Client).Locks is one.
func call[T any](g *globals, do func(*api.Client, context.Context) (T, error), table func(*tabwriter.Writer, T)) error {
	ctx, cancel := g.context()
	defer cancel()
	v, err := do(g.client(), ctx)
	if err != nil {
		return err
	}
	return show(g, v, table)
}

// show prints v by table, or as JSON with --json.
func show[T any](g *globals, v T, table func(*tabwriter.Writer, T)) error {
	return g.output(v, func(w *tabwriter.Writer) { table(w, v) })
}

// Main runs the command line and returns the process exit code.
func Main(args []string, stdout, stderr io.Writer) int {
	g := &globals{stdout: stdout}
	root := &cobra.Command{
		Use:   "herd",
		Short: "herd: replicated, thin, snapshot-able virtual disks for VMs, served over NBD",
		Long: `herd: replicated, thin, snapshot-able virtual disks for VMs, served over NBD.

Exit status: 0 on success; 1 when a command that was understood fails
(a node refused it or could not be reached); 64 (EX_USAGE) for a command
line herd cannot take (a missing command or argument, an unknown flag, a
flag value it cannot read, flags that conflict), before any node is
asked. herd cluster health exits 0 for OK, 1 for WARN and 2 for ERR.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.Version = version.Get().String()
	root.SetVersionTemplate("{{.Version}}\n")
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
	root.PersistentFlags().StringVar(&g.tokenFile, "token-file", "", "file holding an admin token (else env HERD_TOKEN; the first node writes DATA/admin.token)")
	root.PersistentFlags().BoolVar(&g.json, "json", false, "print JSON instead of tables")
	root.PersistentFlags().DurationVar(&g.timeout, "timeout", 30*time.Second, "how long to wait for the cluster")
	root.AddCommand(versionCommand(g), serverCommand(), clusterCommand(g), nodeCommand(g), eventsCommand(g), vdiCommand(g), scrubCommand(g), lockCommand(g), tokenCommand(g), clientCommand(g), backupCommand(g))
	for _, group := range root.Commands() {
		if group.HasSubCommands() {
			requireSubcommand(group)
		}
	}
	if err := root.Execute(); err != nil {
		var code exitCode
		if errors.As(err, &code) {
			return int(code) // the command printed what it had to say
		}
		fmt.Fprintf(stderr, "herd: %s\n", strings.TrimSpace(err.Error()))
		if isUsageError(err) {
			return exUsage
		}
		return 1
	}
	return 0
}

// exitCode ends a command that printed its result with a status other
// than 0 (`herd cluster health`: 1 for WARN, 2 for ERR).
type exitCode int

func (e exitCode) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

// exUsage is the exit status of a command line herd cannot take
// (sysexits.h EX_USAGE): a wrong number of arguments, an unknown command
// or flag, a flag value it cannot read. Failures of a command that was
// understood exit 1; `herd cluster health` keeps 0, 1 and 2.
const exUsage = 64

// usageError marks an error as the command line's fault (exUsage).
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// usage marks err as a usage error.
func usage(err error) error {
	if err == nil {
		return nil
	}
	return usageError{err}
}

// isUsageError: err is marked, or is one of cobra's own about the command
// line (it returns them before any command runs).
func isUsageError(err error) bool {
	var u usageError
	if errors.As(err, &u) {
		return true
	}
	text := err.Error()
	for _, prefix := range []string{"unknown command ", "unknown flag: ", "unknown shorthand flag: ", "flag needs an argument: ", "invalid argument ", "required flag(s) ", "if any flags in the group ", "accepts "} {
		if strings.HasPrefix(text, prefix) {
			return true
		}
	}
	return false
}

// args returns a cobra.PositionalArgs that explains the usage.
func args(n int, usageText string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, a []string) error {
		if len(a) != n {
			return usage(fmt.Errorf("usage: %s %s", cmd.CommandPath(), usageText))
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
			return usage(fmt.Errorf("%s needs a command: %s", cmd.CommandPath(), strings.Join(names, ", ")))
		}
		return usage(fmt.Errorf("unknown command %q for %s (commands: %s)", a[0], cmd.CommandPath(), strings.Join(names, ", ")))
	}
}

func versionCommand(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "print herd's version, commit and Go version (--json for all fields)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			info := version.Get()
			return show(g, info, func(w *tabwriter.Writer, info version.Info) { fmt.Fprintln(w, info.String()) })
		},
	}
}
