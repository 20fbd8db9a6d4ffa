package cli

// `herd vdi import` and `herd vdi export`: the flags and commands. The copy
// itself is internal/transfer's.

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/exportname"
	"github.com/herd-storage/herd/internal/pki"
	"github.com/herd-storage/herd/internal/size"
	"github.com/herd-storage/herd/internal/transfer"
)

const defaultNBDPort = 10809

// transferFlags are the flags of import and export.
type transferFlags struct {
	nbdPort     int
	connections int
	requests    int
	format      string
	force       bool
	since       string // export: the changes since this snapshot
	diff        string // import: apply this diff file
}

func addTransferFlags(cmd *cobra.Command, f *transferFlags) {
	cmd.Flags().IntVar(&f.nbdPort, "nbd-port", defaultNBDPort, "NBD port of the node given by --addr")
	cmd.Flags().IntVar(&f.connections, "connections", transfer.DefaultConnections, "parallel NBD connections")
	cmd.Flags().IntVar(&f.requests, "requests", transfer.DefaultRequests, "requests in flight on each connection")
}

func vdiImportCommand(g *globals) *cobra.Command {
	var importFlags transferFlags
	cmd := &cobra.Command{
		Use:   "import NAME FILE|- | import NAME --diff FILE",
		Short: "copy a disk image into a VDI over NBD, creating it from the image's size if it does not exist (raw; qcow2, vmdk, ... through qemu-img; - is raw from stdin)",
		Long: `Copy a disk image into the VDI NAME. A VDI that does not exist is created
first with the image's virtual size (as rbd import does); an existing one
must be at least as large as the image. The data goes straight to the NBD port of the node given
by --addr. A raw FILE is read in 4 MiB chunks sent over --connections
connections; chunks of zeroes are not sent (nor zeroed, where the VDI already
reads as zeroes). A qcow2, vmdk, vhdx, vdi, vpc or qed FILE is converted by
qemu-img (Debian package qemu-utils) writing to the node's NBD export. "-"
reads a raw image from stdin. The VDI past the image's end is zeroed, so that
it reads back as the image followed by zeroes. The import ends with a FLUSH:
when it reports success, the data is on the replicas' disks.`,
		Args: func(cmd *cobra.Command, a []string) error {
			if importFlags.diff != "" {
				return args(1, "NAME --diff FILE")(cmd, a)
			}
			return args(2, "NAME FILE|-")(cmd, a)
		},
		RunE: func(cmd *cobra.Command, a []string) error {
			if importFlags.diff != "" {
				if err := checkImportDiff(importFlags.diff); err != nil {
					return err // before the node is asked for a session
				}
			}
			t, err := newTransfer(g, importFlags, cmd)
			if err != nil {
				return err
			}
			defer t.cleanup()
			ctx, cancel := signalContext()
			defer cancel()
			if importFlags.diff != "" {
				return importDiff(ctx, g, t, a[0], importFlags.diff)
			}
			if err := createForImport(ctx, g, t, a[0], a[1]); err != nil {
				return err
			}
			summary, err := transfer.Import(ctx, t.options, a[0], a[1])
			if err != nil {
				if ctx.Err() != nil {
					return fmt.Errorf("interrupted: vdi %s is only partly written", a[0])
				}
				return err
			}
			return t.report(summary)
		},
	}
	addTransferFlags(cmd, &importFlags)
	cmd.Flags().StringVar(&importFlags.format, "format", "auto", "image format: auto (detected from the file's magic), raw, or a qemu-img format such as qcow2")
	cmd.Flags().StringVar(&importFlags.diff, "diff", "", "apply the diff FILE (from vdi export NAME@S2 --since S1) to NAME, whose content must be its snapshot S1's; then snapshot it as S2")
	return cmd
}

func vdiExportCommand(g *globals) *cobra.Command {
	var exportFlags transferFlags
	cmd := &cobra.Command{
		Use:   "export NAME[@TAG] FILE|- [--since S1]",
		Short: "copy a VDI or snapshot into an image file over NBD: raw (sparse; - writes to stdout) or --format qcow2",
		Long: `Copy the VDI NAME (opened read-only, so a VM may keep running on it; the
copy is then not crash-consistent) or its snapshot NAME@TAG into an image
file: raw by default, or the format --format gives. The data comes straight
from the NBD port of the node given by --addr. A raw FILE is sparse:
unallocated areas are not read, and zero areas are left as holes.
--format qcow2 (or vmdk, vhdx, vdi, vpc, qed) has qemu-img (Debian package
qemu-utils) read the node's NBD export and write that format. A FILE named
like an image format (.qcow2, .vmdk, .vhdx, .vdi, .vhd, .qed) without
--format is refused (exit 64) rather than written raw under that name: add
--format qcow2, or --format raw to mean raw. FILE must not exist, unless
--force; "-" writes a raw image to stdout. With --since S1, FILE is a herd
diff of the changes between NAME@S1 and NAME@TAG (docs/DIFF.md).`,
		Args: args(2, "NAME[@TAG] FILE|-"),
		RunE: func(cmd *cobra.Command, a []string) error {
			if a[1] == "-" && g.json {
				return usage(errors.New("--json prints to stdout, which carries the image with FILE -: drop --json or give a FILE"))
			}
			// The command line is checked whole before the node is asked
			// for a session: a mistake in it exits 64 with its hint even
			// when no node answers.
			format := ""
			if exportFlags.since != "" {
				if err := checkExportDiff(a[0]); err != nil {
					return err
				}
			} else {
				var err error
				if format, err = exportFormat(exportFlags.format, cmd.Flags().Changed("format"), a[1]); err != nil {
					return err
				}
			}
			t, err := newTransfer(g, exportFlags, cmd)
			if err != nil {
				return err
			}
			defer t.cleanup()
			ctx, cancel := signalContext()
			defer cancel()
			if exportFlags.since != "" {
				return exportDiff(ctx, g, t, a[0], exportFlags.since, a[1])
			}
			var summary transfer.Summary
			if format == "raw" {
				summary, err = transfer.Export(ctx, t.options, a[0], a[1])
			} else {
				summary, err = transfer.ExportConverted(ctx, t.options, a[0], a[1], format)
			}
			if err != nil {
				if ctx.Err() != nil {
					return fmt.Errorf("interrupted: %s was not exported", a[0])
				}
				return err
			}
			return t.report(summary)
		},
	}
	addTransferFlags(cmd, &exportFlags)
	cmd.Flags().BoolVar(&exportFlags.force, "force", false, "overwrite FILE if it exists")
	cmd.Flags().StringVar(&exportFlags.format, "format", "raw", "image format of FILE: raw, or qcow2 (or another format qemu-img writes, through qemu-img)")
	cmd.Flags().StringVar(&exportFlags.since, "since", "", "write only the changes since the earlier snapshot S1, as a herd diff (docs/DIFF.md), for vdi import --diff")
	return cmd
}

// transferCommand is an import or export as the flags give it.
type transferCommand struct {
	options transfer.Options
	stdout  io.Writer // the JSON summary
	stderr  io.Writer // the summary line
	json    bool
	cleanup func() // removes the session credentials
}

func newTransfer(g *globals, f transferFlags, cmd *cobra.Command) (*transferCommand, error) {
	if f.nbdPort < 1 || f.nbdPort > 65535 {
		return nil, usage(fmt.Errorf("--nbd-port %d: not a TCP port", f.nbdPort))
	}
	if f.connections < 1 || f.connections > 64 {
		return nil, usage(fmt.Errorf("--connections %d: give 1 to 64", f.connections))
	}
	if f.requests < 1 || f.requests > 64 {
		return nil, usage(fmt.Errorf("--requests %d: give 1 to 64", f.requests))
	}
	address, err := nbdAddress(g.addr, f.nbdPort)
	if err != nil {
		return nil, err
	}
	t := &transferCommand{
		options: transfer.Options{
			Address:     address,
			Connections: f.connections,
			Requests:    f.requests,
			ChunkLength: transfer.DefaultChunkLength,
			Format:      f.format,
			Force:       f.force,
			DialTimeout: g.timeout,
			Stdin:       cmd.InOrStdin(),
			Stdout:      g.stdout,
		},
		stdout: g.stdout,
		stderr: cmd.ErrOrStderr(),
		json:   g.json,
	}
	if isTerminal(t.stderr) {
		t.options.Progress = t.stderr
	}
	if t.options.TLSConfig, t.options.TLSDir, t.cleanup, err = nbdCredentials(g); err != nil {
		return nil, err
	}
	return t, nil
}

// nbdCredentials asks the node for a one-hour NBD session certificate
// (the node's NBD port needs TLS with a client certificate) and returns
// it as a TLS configuration and, for qemu-img, as a directory in QEMU's
// tls-creds-x509 layout, removed by cleanup.
func nbdCredentials(g *globals) (*tls.Config, string, func(), error) {
	client := g.client()
	ctx, cancel := g.context()
	defer cancel()
	session, err := client.NBDSession(ctx)
	if err != nil {
		return nil, "", nil, fmt.Errorf("getting NBD credentials from the node: %w", err)
	}
	certificate, err := tls.X509KeyPair([]byte(session.ClientCert), []byte(session.ClientKey))
	if err != nil {
		return nil, "", nil, fmt.Errorf("the node sent unusable NBD credentials: %w", err)
	}
	dir, err := os.MkdirTemp("", "herd-nbd-")
	if err != nil {
		return nil, "", nil, err
	}
	cleanup := func() { os.RemoveAll(dir) }
	for name, contents := range map[string]string{"ca-cert.pem": session.CACert, "client-cert.pem": session.ClientCert, "client-key.pem": session.ClientKey} {
		if err := pki.WriteSecretFile(filepath.Join(dir, name), []byte(contents)); err != nil {
			cleanup()
			return nil, "", nil, err
		}
	}
	fingerprint := client.Fingerprint()
	config := &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{certificate},
		// Verified against the cluster CA the token names, not by host
		// name: nodes are reached by IP.
		InsecureSkipVerify: true,
		ServerName:         pki.CAHint(fingerprint), // during a CA rotation
		VerifyPeerCertificate: func(rawCerts [][]byte, _ [][]*x509.Certificate) error {
			_, err := pki.VerifyServerChain(rawCerts, fingerprint)
			return err
		},
	}
	return config, dir, cleanup, nil
}

// nbdAddress turns the admin address IP[:PORT] into the node's NBD address.
func nbdAddress(admin string, port int) (string, error) {
	host := admin
	if h, _, err := net.SplitHostPort(admin); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if host == "" {
		return "", fmt.Errorf("--addr %q: give the IP of a herd node", admin)
	}
	return net.JoinHostPort(host, strconv.Itoa(port)), nil
}

// isTerminal reports whether w is a terminal (progress lines are for people
// only).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// report prints the summary line on stderr and, with --json, the summary on
// stdout.
func (t *transferCommand) report(s transfer.Summary) error {
	return t.reportAny(s.Line(), s)
}

// createForImport creates vdi with the image's virtual size when it does
// not exist (rbd import's behaviour); an existing VDI is left to the
// import's own size check.
func createForImport(ctx context.Context, g *globals, t *transferCommand, vdi, file string) error {
	if exportname.Parse(vdi).Snapshot() {
		return nil // a snapshot: the import refuses it with its own message
	}
	client := g.client()
	if _, err := client.VDI(ctx, vdi); err == nil || !errors.Is(err, cluster.ErrNotFound) {
		return err
	}
	imageSize, format, err := transfer.ImageSize(ctx, t.options, file)
	if err != nil {
		return fmt.Errorf("vdi %s does not exist, and creating it needs the image's size: %w", vdi, err)
	}
	if imageSize == 0 {
		return fmt.Errorf("vdi %s does not exist and %s is empty: nothing to create it from", vdi, file)
	}
	vdiSize := (imageSize + cluster.SectorSize - 1) / cluster.SectorSize * cluster.SectorSize
	created, err := client.CreateVDI(ctx, vdi, vdiSize)
	if err != nil {
		return fmt.Errorf("creating vdi %s for the import: %w", vdi, err)
	}
	fmt.Fprintf(t.stderr, "created vdi %s of %s (the %s image's virtual size)\n", created.Name, size.Format(created.Size), format)
	return nil
}

// imageExtensions are file name endings that say an image format; an
// export to such a name without --format is refused rather than written
// raw under a misleading name.
var imageExtensions = map[string]string{".qcow2": "qcow2", ".qcow": "qcow2", ".vmdk": "vmdk", ".vhdx": "vhdx", ".vdi": "vdi", ".vhd": "vpc", ".qed": "qed"}

// exportFormat checks --format against FILE's name.
func exportFormat(format string, given bool, file string) (string, error) {
	lower := strings.ToLower(file)
	for extension, implied := range imageExtensions {
		if strings.HasSuffix(lower, extension) && !given {
			return "", usage(fmt.Errorf("%s is named like a %s image, and vdi export writes raw unless told otherwise: add --format %s (or --format raw to write raw under that name)", file, implied, implied))
		}
	}
	switch format {
	case "", "raw":
		return "raw", nil
	case "qcow2", "vmdk", "vhdx", "vdi", "vpc", "qed":
		return format, nil
	}
	return "", usage(fmt.Errorf("--format %q: give raw or qcow2 (or vmdk, vhdx, vdi, vpc, qed)", format))
}
