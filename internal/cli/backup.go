package cli

// `herd backup`: backups of VDIs into a deduplicating store in a
// directory (internal/backup).

import (
	"errors"
	"fmt"
	"os"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/herd-storage/herd/internal/backup"
	"github.com/herd-storage/herd/internal/size"
	"github.com/herd-storage/herd/internal/transfer"
)

func backupCommand(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "backup",
		Short: "back VDIs up into a deduplicating store in a directory; list, verify, restore, prune",
		Long: `A backup store is a directory (a local disk or an NFS mount) holding chunks of
VDIs addressed by their SHA-256, shared by every VDI and backup in it, and one
index per backup. The first backup of a VDI reads all its data; later ones
read only what changed since the previous backup's snapshot (herd keeps that
one snapshot per VDI and store). Every backup restores on its own.`,
	}
	cmd.AddCommand(backupCreateCommand(g), backupListCommand(g), backupVerifyCommand(g), backupRestoreCommand(g), backupPruneCommand(g))
	return cmd
}

func backupCreateCommand(g *globals) *cobra.Command {
	var flags transferFlags
	var full bool
	var chunkSize string
	cmd := &cobra.Command{
		Use:   "create NAME[@TAG] DIR",
		Short: "back up a VDI (a snapshot is taken first) or a snapshot into the store DIR",
		Args:  args(2, "NAME[@TAG] DIR"),
		RunE: func(cmd *cobra.Command, a []string) error {
			bytes := uint64(0)
			if chunkSize != "" {
				var err error
				if bytes, err = size.Parse(chunkSize); err != nil {
					return usage(fmt.Errorf("--chunk-size: %w", err))
				}
			}
			store, err := backup.Open(a[1], int(bytes), false)
			if err != nil {
				return err
			}
			defer store.Close()
			t, err := newTransfer(g, flags, cmd)
			if err != nil {
				return err
			}
			defer t.cleanup()
			ctx, cancel := signalContext()
			defer cancel()
			ix, err := backup.Create(ctx, store, g.client(), a[0], backup.CreateOptions{
				Transfer: t.options, Full: full,
				Notes: func(s string) { fmt.Fprintln(t.stderr, "note:", s) },
			})
			if err != nil {
				if ctx.Err() != nil {
					return fmt.Errorf("interrupted: no backup of %s was recorded (what was stored goes at the next prune)", a[0])
				}
				return err
			}
			line := fmt.Sprintf("backup %s (%s) of %s: %s read from the cluster, %s added to the store (%d new chunks, %d already stored, %d unchanged, %d zero) in %.1fs",
				ix.ID, ix.Kind, ix.Snapshot, size.Format(ix.Stats.ReadBytes), size.Format(ix.Stats.NewBytes),
				ix.Stats.NewChunks, ix.Stats.ReusedChunks, ix.Stats.UnchangedChunks, ix.Stats.ZeroChunks, ix.Stats.Seconds)
			summary := *ix
			summary.Chunks = nil
			return t.reportAny(line, summary)
		},
	}
	addTransferFlags(cmd, &flags)
	cmd.Flags().BoolVar(&full, "full", false, "read every allocated byte, even if an earlier backup could make this one incremental")
	cmd.Flags().StringVar(&chunkSize, "chunk-size", "", "chunk size of a new store (default 1MiB; a power of two from 64KiB to 64MiB)")
	return cmd
}

func backupListCommand(g *globals) *cobra.Command {
	var vdi string
	cmd := &cobra.Command{
		Use:   "list DIR",
		Short: "the backups in the store DIR, oldest first",
		Args:  args(1, "DIR"),
		RunE: func(cmd *cobra.Command, a []string) error {
			store, err := openExisting(a[0], false)
			if err != nil {
				return err
			}
			defer store.Close()
			backups, bad, err := store.List()
			if err != nil {
				return err
			}
			type entry struct {
				ID       string       `json:"id"`
				VDI      string       `json:"vdi"`
				Snapshot string       `json:"snapshot"`
				Kind     string       `json:"kind"`
				Created  time.Time    `json:"created"`
				Size     uint64       `json:"size"`
				Parent   string       `json:"parent,omitempty"`
				Stats    backup.Stats `json:"stats"`
			}
			out := []entry{}
			for _, ix := range backups {
				if vdi != "" && ix.VDI != vdi {
					continue
				}
				out = append(out, entry{ix.ID, ix.VDI, ix.Snapshot, ix.Kind, ix.Created, ix.Size, ix.Parent, ix.Stats})
			}
			for _, e := range bad {
				fmt.Fprintln(cmd.ErrOrStderr(), "damaged:", e)
			}
			if err := g.output(out, func(w *tabwriter.Writer) {
				fmt.Fprintln(w, "ID\tVDI\tKIND\tCREATED\tSIZE\tDATA\tADDED")
				for _, e := range out {
					fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", e.ID, e.VDI, e.Kind, e.Created.Local().Format(time.DateTime),
						size.Format(e.Size), size.Format(e.Stats.DataBytes), size.Format(e.Stats.NewBytes))
				}
			}); err != nil {
				return err
			}
			if len(bad) > 0 {
				return fmt.Errorf("%d backup indexes are damaged (run herd backup verify %s)", len(bad), a[0])
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&vdi, "vdi", "", "only the backups of this VDI")
	return cmd
}

func backupVerifyCommand(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "verify DIR",
		Short: "re-hash every chunk in the store DIR and check every backup's chunks are there",
		Args:  args(1, "DIR"),
		RunE: func(cmd *cobra.Command, a []string) error {
			store, err := openExisting(a[0], false)
			if err != nil {
				return err
			}
			defer store.Close()
			total, _ := store.Used()
			options := transfer.Options{}
			if isTerminal(cmd.ErrOrStderr()) {
				options.Progress = cmd.ErrOrStderr()
			}
			progress := transfer.NewProgress(options, "verifying "+a[0], total)
			ctx, cancel := signalContext()
			defer cancel()
			r, err := backup.Verify(ctx, store, progress.Add)
			progress.Finish()
			if err != nil {
				return err
			}
			if err := g.output(r, func(w *tabwriter.Writer) {
				for _, p := range r.Problems {
					fmt.Fprintln(w, p)
				}
				fmt.Fprintf(w, "%d backups, %d chunks (%s) re-hashed: %d damaged, %d missing; %d backups affected\n",
					r.Backups, r.Chunks, size.Format(r.Bytes), len(r.Damaged), len(r.Missing), len(r.Affected))
				for _, id := range r.Affected {
					fmt.Fprintf(w, "affected: %s\n", id)
				}
			}); err != nil {
				return err
			}
			if len(r.Problems) > 0 {
				return fmt.Errorf("the store %s is damaged: %d problems", a[0], len(r.Problems))
			}
			return nil
		},
	}
	return cmd
}

func backupRestoreCommand(g *globals) *cobra.Command {
	var flags transferFlags
	cmd := &cobra.Command{
		Use:   "restore DIR ID NEWNAME",
		Short: "restore backup ID from the store DIR into a new VDI NEWNAME (on the cluster --addr names)",
		Args:  args(3, "DIR ID NEWNAME"),
		RunE: func(cmd *cobra.Command, a []string) error {
			store, err := openExisting(a[0], false)
			if err != nil {
				return err
			}
			defer store.Close()
			t, err := newTransfer(g, flags, cmd)
			if err != nil {
				return err
			}
			defer t.cleanup()
			ctx, cancel := signalContext()
			defer cancel()
			r, err := backup.Restore(ctx, store, g.client(), a[1], a[2], t.options)
			if err != nil {
				return err
			}
			line := fmt.Sprintf("restored %s into %s: %s of data in %.1fs (%s/s)", r.Backup, r.VDI, size.Format(r.DataBytes), r.Seconds, size.Format(uint64(r.BytesPerSecond)))
			return t.reportAny(line, r)
		},
	}
	addTransferFlags(cmd, &flags)
	return cmd
}

func backupPruneCommand(g *globals) *cobra.Command {
	var policy backup.Policy
	var vdi string
	var dryRun bool
	cmd := &cobra.Command{
		Use:   "prune DIR --keep-last N | --keep-daily N | --keep-weekly N",
		Short: "delete the backups the policy does not keep, then every chunk no backup uses",
		Args:  args(1, "DIR --keep-last N | --keep-daily N | --keep-weekly N"),
		RunE: func(cmd *cobra.Command, a []string) error {
			if policy.Last < 0 || policy.Daily < 0 || policy.Weekly < 0 {
				return usage(errors.New("--keep-last, --keep-daily and --keep-weekly take counts of 0 or more"))
			}
			store, err := openExisting(a[0], !dryRun)
			if err != nil {
				return err
			}
			defer store.Close()
			r, err := backup.Prune(store, policy, vdi, dryRun)
			if err != nil {
				return err
			}
			return g.output(r, func(w *tabwriter.Writer) {
				verb := "deleted"
				if dryRun {
					verb = "would delete"
				}
				for _, id := range r.Deleted {
					fmt.Fprintf(w, "%s %s\n", verb, id)
				}
				fmt.Fprintf(w, "kept %d backups, %s %d; freed %d chunks (%s); the store holds %s\n",
					len(r.Kept), verb, len(r.Deleted), r.FreedChunks, size.Format(r.FreedBytes), size.Format(r.StoreBytes))
			})
		},
	}
	cmd.Flags().IntVar(&policy.Last, "keep-last", 0, "keep the newest N backups of each VDI")
	cmd.Flags().IntVar(&policy.Daily, "keep-daily", 0, "keep the newest backup of each of the last N days that have one")
	cmd.Flags().IntVar(&policy.Weekly, "keep-weekly", 0, "keep the newest backup of each of the last N weeks that have one")
	cmd.Flags().StringVar(&vdi, "vdi", "", "prune only the backups of this VDI")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "say what would be deleted, delete nothing")
	return cmd
}

// openExisting opens a store that must exist (list, verify, restore and
// prune never create one).
func openExisting(dir string, exclusive bool) (*backup.Store, error) {
	if _, err := os.Stat(dir + "/herd-backup.json"); err != nil {
		return nil, fmt.Errorf("%s: %w (create one with herd backup create NAME %s)", dir, backup.ErrNotStore, dir)
	}
	return backup.Open(dir, 0, exclusive)
}
