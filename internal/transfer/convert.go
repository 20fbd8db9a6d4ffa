package transfer

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"time"
)

// ImageSize returns the virtual size and format of the image file (its
// size for raw, qemu-img's virtual size for the others): what `vdi import`
// creates a missing VDI with, as `rbd import` does.
func ImageSize(ctx context.Context, options Options, file string) (uint64, string, error) {
	t := newCopier(options)
	if file == "-" {
		return 0, "", errors.New("the size of an image on stdin is not known before it is read: create the VDI first (herd vdi create NAME SIZE)")
	}
	source, err := t.openSource(file)
	if err != nil {
		return 0, "", err
	}
	defer source.Close()
	if source.format == "raw" {
		return uint64(source.size), source.format, nil
	}
	qemuImg, err := exec.LookPath("qemu-img")
	if err != nil {
		return 0, "", fmt.Errorf("%s is a %s image: reading its size needs qemu-img (Debian package qemu-utils)", file, source.format)
	}
	size, err := qemuImageSize(ctx, qemuImg, source)
	return size, source.format, err
}

// ExportConverted copies the VDI or snapshot vdi into file in format
// (qcow2, or another format qemu-img writes) through qemu-img, which
// reads the export over NBD (skipping what it reports unallocated).
func ExportConverted(ctx context.Context, options Options, vdi, file, format string) (Summary, error) {
	started := time.Now()
	t := newCopier(options)
	if file == "-" {
		return Summary{}, fmt.Errorf("a %s image cannot be written to stdout: give a FILE", format)
	}
	if _, err := os.Stat(file); err == nil && !t.Force {
		return Summary{}, fmt.Errorf("%s exists: add --force to overwrite it", file)
	}
	qemuImg, err := exec.LookPath("qemu-img")
	if err != nil {
		return Summary{}, fmt.Errorf("exporting as %s needs qemu-img (Debian package qemu-utils)", format)
	}
	exportName := vdi
	if !strings.Contains(vdi, "@") && !strings.HasPrefix(vdi, "ro/") {
		exportName = "ro/" + vdi
	}
	// One connection first, for herd's own messages (no such VDI, not
	// allowed) rather than qemu-img's.
	probe := *t
	probe.Connections = 1
	conns, err := probe.dial(ctx, exportName, vdi, false)
	if err != nil {
		return Summary{}, err
	}
	size := conns[0].Size()
	closeConns(conns)

	host, port, err := net.SplitHostPort(t.Address)
	if err != nil {
		return Summary{}, err
	}
	escape := func(v string) string { return strings.ReplaceAll(v, ",", ",,") }
	source := "driver=raw,file.driver=nbd,file.host=" + host + ",file.port=" + port + ",file.export=" + escape(exportName)
	arguments := []string{"convert"}
	if t.TLSDir != "" {
		arguments = append(arguments, "--object", "tls-creds-x509,id=tls0,endpoint=client,dir="+escape(t.TLSDir))
		source += ",file.tls-creds=tls0"
	}
	arguments = append(arguments, "--image-opts", source, "-O", format)
	if t.Progress != nil {
		arguments = append(arguments, "-p")
	}
	arguments = append(arguments, file)
	command := exec.CommandContext(ctx, qemuImg, arguments...)
	var stderr limitedBuffer
	command.Stderr = &stderr
	if t.Progress != nil {
		command.Stdout = t.Progress
	}
	if err := command.Run(); err != nil {
		os.Remove(file) // a partial image must not be mistaken for a whole one
		if ctx.Err() != nil {
			return Summary{}, ctx.Err()
		}
		return Summary{}, fmt.Errorf("qemu-img convert of %s into %s failed: %s", vdi, file, stderr.lastLine(err))
	}
	if t.Progress != nil {
		fmt.Fprint(t.Progress, "\r\033[K")
	}
	summary := Summary{Operation: "export", VDI: vdi, File: file, Format: format, Bytes: size, Converter: "qemu-img"}
	summary.finish(started)
	return summary, nil
}
