package cli

// `herd vdi diff`, `herd vdi export --since` and `herd vdi import --diff`:
// what changed between two snapshots, listed, written to a diff file and
// applied from one (internal/transfer/diff.go has the format).

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/herd-storage/herd/internal/api"
	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/exportname"
	"github.com/herd-storage/herd/internal/gateway"
	"github.com/herd-storage/herd/internal/size"
	"github.com/herd-storage/herd/internal/transfer"
)

func vdiDiffCommand(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "diff NAME@S1 NAME[@S2]",
		Short: "what changed in a VDI or later snapshot since snapshot S1 (no data is read)",
		Long: `List the ranges of NAME (or of its later snapshot NAME@S2, or of a clone made
from NAME@S1 or later) that changed since the snapshot NAME@S1: written,
or trimmed/zeroed (shown as zero). herd answers from its object maps without
reading data. The granularity is the object (4 MiB unless the cluster was
formatted otherwise): a write of one byte marks its whole object changed.`,
		Args: args(2, "NAME@S1 NAME[@S2]"),
		RunE: func(cmd *cobra.Command, a []string) error {
			if !exportname.Parse(a[0]).Snapshot() {
				return usage(fmt.Errorf("%q: give the earlier snapshot as NAME@TAG", a[0]))
			}
			return call(g, func(c *api.Client, ctx context.Context) (gateway.Diff, error) { return c.Diff(ctx, a[1], a[0]) }, printDiff)
		},
	}
}

func printDiff(w *tabwriter.Writer, d gateway.Diff) {
	if len(d.Extents) > 0 {
		fmt.Fprintln(w, "OFFSET\tLENGTH\tCONTENT")
	}
	for _, e := range d.Extents {
		content := "data"
		if e.Zero {
			content = "zero"
		}
		fmt.Fprintf(w, "%d\t%s\t%s\n", e.Offset, size.Format(e.Length), content)
	}
	fmt.Fprintf(w, "%s since %s: %s changed in %d extents (%s of it zeroed), of %s; granularity %s (the object)\n",
		d.VDI, d.Since, size.Format(d.ChangedBytes), len(d.Extents), size.Format(d.ZeroBytes), size.Format(d.Size), size.Format(d.ObjectSize))
}

// checkExportDiff is the command line's check of an export --since: it
// needs a snapshot, NAME@TAG.
func checkExportDiff(vdi string) error {
	if !exportname.Parse(vdi).Snapshot() {
		return usage(fmt.Errorf("--since exports the changes between two snapshots: give NAME@TAG, not %q (take one with herd vdi snapshot %s --tag TAG)", vdi, vdi))
	}
	return nil
}

// checkImportDiff is the command line's check of an import --diff FILE:
// a file, not stdin.
func checkImportDiff(file string) error {
	if file == "-" {
		return usage(fmt.Errorf("--diff needs a file, not stdin: it is checked whole before any of it is applied"))
	}
	return nil
}

// exportDiff is `herd vdi export NAME@S2 --since S1 FILE`.
func exportDiff(ctx context.Context, g *globals, t *transferCommand, vdi, since, file string) error {
	if err := checkExportDiff(vdi); err != nil {
		return err
	}
	d, err := g.client().Diff(ctx, vdi, since)
	if err != nil {
		return err
	}
	header := transfer.DiffHeader{From: d.Since, To: d.VDI, FromSize: d.SinceSize, Size: d.Size, Created: time.Now().UTC(), ObjectSize: d.ObjectSize}
	extents := make([]transfer.DiffExtent, len(d.Extents))
	for i, e := range d.Extents {
		extents[i] = transfer.DiffExtent{Offset: e.Offset, Length: e.Length, Zero: e.Zero}
	}
	summary, err := transfer.ExportDiff(ctx, t.options, vdi, header, extents, file)
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("interrupted: the changes of %s were not exported", vdi)
		}
		return err
	}
	return t.reportAny(summary.Line(), summary)
}

// importDiff is `herd vdi import NAME --diff FILE`: the file is checked
// whole, then the VDI: it must have the diff's starting snapshot (by tag)
// and no change since, so that its content is that snapshot's.
func importDiff(ctx context.Context, g *globals, t *transferCommand, vdi, file string) error {
	if err := checkImportDiff(file); err != nil {
		return err
	}
	header, err := transfer.ReadDiffHeader(file)
	if err != nil {
		return err
	}
	if exportname.Parse(vdi).Snapshot() {
		return fmt.Errorf("%s is a snapshot: apply a diff to a VDI (herd vdi clone %s NEW, then import into NEW)", vdi, vdi)
	}
	client := g.client()
	v, err := client.VDI(ctx, vdi)
	if err != nil {
		return err
	}
	_, fromTag := cluster.SplitName(header.From)
	d, err := client.Diff(ctx, vdi, fromTag)
	if err != nil {
		return fmt.Errorf("refused: the diff applies to the content of %s, and vdi %s has no snapshot %q to show it has that content (%v); import the full image of %s first and snapshot it: herd vdi snapshot %s --tag %s",
			header.From, vdi, fromTag, err, header.From, vdi, fromTag)
	}
	if d.ChangedBytes > 0 {
		return fmt.Errorf("refused: vdi %s changed since its snapshot %s (%s in %d extents), so its content is not %s's; roll it back first (herd vdi rollback %s --to %s) or apply the diff to a clone of %s",
			vdi, d.Since, size.Format(d.ChangedBytes), len(d.Extents), header.From, vdi, fromTag, d.Since)
	}
	if v.Size != header.FromSize || d.SinceSize != header.FromSize {
		return fmt.Errorf("refused: the diff starts from %s of %d bytes; vdi %s is %d bytes (its snapshot %s: %d)", header.From, header.FromSize, vdi, v.Size, d.Since, d.SinceSize)
	}
	to := exportname.Parse(header.To)
	toTag := to.Tag
	if to.Snapshot() {
		if _, err := client.VDI(ctx, vdi+"@"+toTag); err == nil {
			return fmt.Errorf("refused: vdi %s already has a snapshot %s, which the diff's end would be taken as", vdi, toTag)
		}
	}
	if header.Size > v.Size {
		if _, err := client.ResizeVDI(ctx, vdi, header.Size); err != nil {
			return fmt.Errorf("growing vdi %s to %d bytes, as %s is: %w", vdi, header.Size, header.To, err)
		}
	}
	summary, err := transfer.ImportDiff(ctx, t.options, vdi, file)
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("interrupted: vdi %s is only partly changed; roll it back (herd vdi rollback %s --to %s) and apply the diff again", vdi, vdi, fromTag)
		}
		return fmt.Errorf("%w; vdi %s may be partly changed: roll it back (herd vdi rollback %s --to %s) and apply the diff again", err, vdi, vdi, fromTag)
	}
	if to.Snapshot() {
		snapshotContext, cancel := g.context()
		defer cancel()
		if _, err := client.Snapshot(snapshotContext, vdi, toTag); err != nil {
			return fmt.Errorf("the diff was applied, but taking the snapshot %s@%s failed: %w (take it by hand before the next diff)", vdi, toTag, err)
		}
		summary.Snapshot = vdi + "@" + toTag
	}
	return t.reportAny(summary.Line(), summary)
}

// reportAny prints line on stderr and, with --json, v on stdout.
func (t *transferCommand) reportAny(line string, v any) error {
	fmt.Fprintln(t.stderr, line)
	if t.json {
		return writeIndentedJSON(t.stdout, v)
	}
	return nil
}

func writeIndentedJSON(w io.Writer, v any) error {
	encoder := json.NewEncoder(w)
	encoder.SetIndent("", "  ")
	return encoder.Encode(v)
}
