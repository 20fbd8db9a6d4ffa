package cli

// `herd client`: NBD client certificates.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/herd-storage/herd/internal/api"
	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/pki"
	"github.com/herd-storage/herd/internal/reach"
)

func clientCommand(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "client", Short: "NBD client certificates: add, list, revoke"}
	cmd.AddCommand(clientAddCommand(g), clientListCommand(g), clientRevokeCommand(g))
	return cmd
}

func clientAddCommand(g *globals) *cobra.Command {
	var pattern, out, ownerSpec string
	var readOnly, renew bool
	cmd := &cobra.Command{
		Use:   "add NAME --vdi PATTERN [--read-only] --out DIR [--owner USER[:GROUP]]",
		Short: "issue an NBD client certificate into DIR (ca-cert.pem, client-cert.pem, client-key.pem: QEMU's tls-creds-x509 layout)",
		Long: `Issue an NBD client certificate. The client sees and opens only the VDIs
(and their snapshots) whose name matches PATTERN (shell syntax: vm*, db1,
*), read-only with --read-only. DIR receives ca-cert.pem, client-cert.pem
and client-key.pem (mode 0600, DIR 0700), usable unchanged by:

  qemu-img info --object tls-creds-x509,id=tls0,dir=DIR,endpoint=client \
    --image-opts driver=nbd,host=NODE,port=10809,export=NAME,tls-creds=tls0
  nbdinfo 'nbds://NODE/NAME?tls-certificates=DIR'

They belong to the user running the command, unless --owner gives them
(DIR too, if this command made it or it was empty) to the user QEMU runs
as, who alone can then read them: libvirt's QEMU runs as libvirt-qemu on
Debian and Ubuntu, qemu on Fedora and RHEL:

  herd client add kvm1 --vdi 'vm*' --out /etc/pki/herd-nbd --owner libvirt-qemu

Every directory above DIR must let that user in; the command checks before
it issues anything (docs/LIBVIRT.md).

--renew issues a new certificate to a client that exists, same name,
pattern and scope (no --vdi), and replaces the three files in DIR, which
keep the owner and group of the old ca-cert.pem unless --owner gives
others (only root can keep another user's files): after
a CA rotation starts (herd cluster rotate-ca), each client is renewed so
that it works once the rotation finishes; its old certificate is accepted
until then. Outside a rotation the old certificate is refused at once.`,
		Args: args(1, "NAME --vdi PATTERN [--read-only] --out DIR [--owner USER[:GROUP]]"),
		RunE: func(cmd *cobra.Command, a []string) error {
			if renew && (pattern != "" || readOnly) {
				return usage(fmt.Errorf("--renew keeps the client's pattern and scope: give neither --vdi nor --read-only"))
			}
			if pattern == "" && !renew {
				return usage(fmt.Errorf("--vdi PATTERN is required: the VDI names this client may open (for example 'vm*', or '*' for all)"))
			}
			if out == "" {
				return usage(fmt.Errorf("--out DIR is required: the directory to write the client's certificate and key into"))
			}
			var owner *reach.Owner
			if ownerSpec != "" {
				o, err := reach.ParseOwner(ownerSpec)
				if err != nil {
					return usage(fmt.Errorf("--owner %w", err))
				}
				if euid := os.Geteuid(); euid != 0 && euid != o.UID {
					return fmt.Errorf("--owner %s: only root may give files to another user", ownerSpec)
				}
				owner = &o
			}
			if renew && owner == nil {
				// The new files keep the old ones' owner: QEMU's user,
				// when they were given to it.
				kept, err := keptOwner(out)
				if err != nil {
					return err
				}
				owner = kept
			}
			for _, name := range []string{"ca-cert.pem", "client-cert.pem", "client-key.pem"} {
				if _, err := os.Stat(filepath.Join(out, name)); err == nil && !renew {
					return fmt.Errorf("%s already exists: give an empty directory (or renew the client: --renew)", filepath.Join(out, name))
				}
			}
			if err := makeClientDirectory(out, owner); err != nil {
				return err
			}
			return call(g, func(c *api.Client, ctx context.Context) (api.AddedClient, error) {
				var added api.AddedClient
				var err error
				if renew {
					added, err = c.RenewClient(ctx, a[0])
				} else {
					added, err = c.AddClient(ctx, a[0], pattern, readOnly)
				}
				if err != nil {
					return added, err
				}
				files := map[string]string{"ca-cert.pem": added.CACert, "client-cert.pem": added.ClientCert, "client-key.pem": added.ClientKey}
				for name, contents := range files {
					path := filepath.Join(out, name)
					err := pki.WriteSecretFile(path, []byte(contents))
					if err == nil && owner != nil {
						err = os.Chown(path, owner.UID, owner.GID)
					}
					if err != nil {
						return added, fmt.Errorf("client %s was added but its files could not be written (revoke it and add it again): %w", added.Name, err)
					}
				}
				added.ClientKey = ""
				return added, nil
			}, func(w *tabwriter.Writer, added api.AddedClient) {
				scope := "read-write"
				if added.ReadOnly {
					scope = "read-only"
				}
				readable := ""
				if owner != nil {
					readable = ", readable by " + owner.Who.Name
				}
				fmt.Fprintf(w, "client %s: vdis %q, %s; certificate and key in %s%s\n", added.Name, added.Pattern, scope, out, readable)
			})
		},
	}
	cmd.Flags().StringVar(&pattern, "vdi", "", "the VDI names the client may see and open (shell pattern, e.g. 'vm*')")
	cmd.Flags().BoolVar(&readOnly, "read-only", false, "the client may only read")
	cmd.Flags().StringVar(&out, "out", "", "directory for ca-cert.pem, client-cert.pem, client-key.pem")
	cmd.Flags().BoolVar(&renew, "renew", false, "issue a new certificate to an existing client (same pattern and scope), replacing the files in --out")
	cmd.Flags().StringVar(&ownerSpec, "owner", "", "give the files (and DIR, if new or empty) to USER[:GROUP], the user QEMU runs as (libvirt: libvirt-qemu); only that user can read them")
	return cmd
}

func clientListCommand(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "list",
		Short: "every NBD client: name, VDI pattern, scope, serial, state",
		Args:  args(0, ""),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return call(g, (*api.Client).Clients, func(w *tabwriter.Writer, clients []cluster.Client) {
				fmt.Fprintln(w, "NAME\tVDIS\tSCOPE\tSERIAL\tCREATED\tSTATE")
				for _, c := range clients {
					scope, state := "read-write", "valid"
					if c.ReadOnly {
						scope = "read-only"
					}
					if c.Revoked {
						state = "revoked"
					}
					fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", c.Name, c.Pattern, scope, c.Serial, c.Created.Format("2006-01-02 15:04:05"), state)
				}
			})
		},
	}
}

func clientRevokeCommand(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "revoke NAME",
		Short: "revoke an NBD client: its certificate is refused from then on",
		Args:  args(1, "NAME"),
		RunE: func(cmd *cobra.Command, a []string) error {
			return call(g, func(c *api.Client, ctx context.Context) (cluster.Client, error) { return c.RevokeClient(ctx, a[0]) },
				func(w *tabwriter.Writer, c cluster.Client) { fmt.Fprintf(w, "client %s revoked\n", c.Name) })
		},
	}
}

// keptOwner is the owner a renewal keeps: that of DIR/ca-cert.pem when
// it is not the user running the command (files given to QEMU's user
// with --owner stay that user's), else nil. Only root can give the new
// files to another user: anyone else is refused rather than left with
// files QEMU cannot read.
func keptOwner(dir string) (*reach.Owner, error) {
	path := filepath.Join(dir, "ca-cert.pem")
	info, err := os.Stat(path)
	if err != nil {
		return nil, nil // no old files: nothing to keep
	}
	stat, ok := info.Sys().(*syscall.Stat_t)
	if !ok || int(stat.Uid) == os.Geteuid() && int(stat.Gid) == os.Getegid() {
		return nil, nil
	}
	owner, err := reach.ParseOwner(fmt.Sprintf("%d:%d", stat.Uid, stat.Gid))
	if err != nil { // ids no user or group on this host has
		owner = reach.Owner{UID: int(stat.Uid), GID: int(stat.Gid), Who: reach.Who{Name: fmt.Sprintf("uid %d", stat.Uid), UID: int(stat.Uid), GIDs: []int{int(stat.Gid)}}}
	}
	if euid := os.Geteuid(); euid != 0 && euid != owner.UID {
		return nil, fmt.Errorf("%s belongs to %s: renew as root, so that the new files keep that owner (or give --owner)", path, owner.Who.Name)
	}
	return &owner, nil
}

// makeClientDirectory makes DIR for a client's files (mode 0700). With an
// owner it gives DIR to the owner when this made it or it is empty, makes
// missing directories above it 0755 (they hold nothing secret, and the
// owner must pass through them), and checks that the owner can reach DIR,
// before any certificate is issued: a directory QEMU's user cannot enter
// is otherwise seen only when a VM starts ("Unable to access credentials
// ... Permission denied").
func makeClientDirectory(dir string, owner *reach.Owner) error {
	if owner == nil {
		return os.MkdirAll(dir, 0o700)
	}
	parent := filepath.Dir(filepath.Clean(dir))
	var missing []string
	for d := parent; ; d = filepath.Dir(d) {
		if _, err := os.Stat(d); err == nil || d == filepath.Dir(d) {
			break
		}
		missing = append(missing, d)
	}
	for i := len(missing) - 1; i >= 0; i-- {
		if err := os.Mkdir(missing[i], 0o755); err != nil && !os.IsExist(err) {
			return err
		}
		if err := os.Chmod(missing[i], 0o755); err != nil {
			return err
		}
	}
	if err := os.Mkdir(dir, 0o700); err != nil && !os.IsExist(err) {
		return err
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	if len(entries) == 0 {
		if err := os.Chmod(dir, 0o700); err != nil {
			return err
		}
		if err := os.Chown(dir, owner.UID, owner.GID); err != nil {
			return fmt.Errorf("--owner: %w", err)
		}
	}
	if err := reach.Directories(dir, owner.Who); err != nil {
		return fmt.Errorf("--owner: %v: QEMU could not read the files; choose another --out, or let the user in", err)
	}
	return nil
}
