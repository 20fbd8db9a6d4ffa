// Package export serves herd's VDIs as NBD exports: it is the adapter
// between the NBD server (internal/nbd, the protocol only) and the data
// path (internal/gateway, which knows nothing of NBD). Export names are
// VDI names: NAME opens the VDI for writing, "ro/NAME" read-only beside
// its writer, NAME@TAG a snapshot (read-only).
//
// It translates, once, the data path's errors into the NBD errors a
// client sees (the text keeps the detail for the server's log): a
// request out of range is EINVAL, a full disk ENOSPC, a write to a
// read-only export EPERM, a server going away ESHUTDOWN, anything else
// (a replica failing, no current copy reachable, the cluster not
// answering in time) EIO. Open errors become the handshake's replies:
// unknown export, busy (naming the holder), not ready, permission denied.
// An open the cluster cannot serve yet (no leader for a few seconds after
// the leader died) waits for it within the handshake's time, then is
// refused as not ready, never as an unknown export: a VDI in this node's
// copy of the log, or one it cannot rule out, exists as far as a client
// can tell.
//
// Authorisation (Backend.Authorize) is by VDI: a client allowed a VDI may
// list and open it, its snapshots (NAME@TAG) and its read-only name
// (ro/NAME). The names it may not open are not listed, and opening one is
// refused exactly as an unknown name is, before the cluster is asked, so
// that neither the reply nor its timing tells whether the VDI exists.
//
// Metadata contexts (nbd.MetaContexter, nbd.MetaStatuser), besides
// base:allocation:
//
//   - qemu:allocation-depth: QEMU's depth in the snapshot chain of the
//     member that defines each object: 0 none (reads as zeros), 1 the
//     export's own VDI, 2 its parent snapshot, and so on
//     (gateway.Layer.Depth);
//   - qemu:dirty-bitmap:TAG, one per ancestor snapshot of the export:
//     NBD_STATE_DIRTY (1) where the object changed since that snapshot
//     was taken (written or zeroed above it in the chain). TAG is the
//     snapshot's tag, NAME@TAG for one whose tag a nearer snapshot of
//     the chain also has (either form selects, as gateway.Ancestor
//     resolves it).
//
// Both are computed from the object maps, without reading data, and
// their granularity is the object (4 MiB by default): a write of one byte
// marks its whole object dirty. A client that may not open an export
// sees no contexts for it, exactly as for an unknown name.
package export

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/exportname"
	"github.com/herd-storage/herd/internal/gateway"
	"github.com/herd-storage/herd/internal/metrics"
	"github.com/herd-storage/herd/internal/nbd"
	"github.com/herd-storage/herd/internal/object"
	"github.com/herd-storage/herd/internal/size"
)

// Backend implements nbd.Backend over a node's gateway.
type Backend struct {
	Gateway *gateway.Gateway
	// Authorize says what the client of a session may do (the session
	// carries its verified certificate name, nbd.Session.Client). It is
	// called for every NBD_OPT_LIST and every open, again when an open
	// completes (it may have waited for a lock), before a writable open
	// takes the VDI's writer lock over, and whenever the NBD server
	// revalidates its connections (Revalidate), so that a revoked client
	// loses access at once; it must be safe for concurrent use. An error refuses the client: the listing or the open fails with
	// nbd.ErrPermission and the error's text. Nil gives every client full
	// access (the node's Unix socket, or --insecure-nbd).
	Authorize func(session nbd.Session) (Access, error)
	// Metrics, if set, counts and times every request per VDI.
	Metrics *metrics.Node
}

// Access is what one client may do.
type Access struct {
	// Match reports whether the client may list and open the VDI of this
	// name. It is asked about VDI names only: NAME@TAG and ro/NAME follow
	// NAME. Nil matches nothing.
	Match func(exportName string) bool
	// ReadOnly opens every export read-only, as if it were named
	// ro/NAME: writes are refused, and no write lock is taken.
	ReadOnly bool
}

var (
	_ nbd.Backend       = Backend{}
	_ nbd.MetaContexter = Backend{}
	_ nbd.MetaStatuser  = (*export)(nil)
)

// The metadata contexts of the "qemu" namespace that herd serves (QEMU's
// docs/interop/nbd.rst).
const (
	qemuNamespace              = "qemu:"
	contextDepth               = "qemu:allocation-depth"
	contextBitmapPrefix        = "qemu:dirty-bitmap:"
	stateDirty          uint32 = 1 // NBD_STATE_DIRTY of qemu:dirty-bitmap
)

// access returns what the session's client may do.
func (b Backend) access(session nbd.Session) (Access, error) {
	if b.Authorize == nil {
		return Access{Match: func(string) bool { return true }}, nil
	}
	access, err := b.Authorize(session)
	if err != nil {
		return Access{}, fmt.Errorf("%w: %v", nbd.ErrPermission, err)
	}
	if access.Match == nil {
		access.Match = func(string) bool { return false }
	}
	return access, nil
}

// Revalidate implements nbd.Revalidator: a client keeps an open export
// only while its rights still allow it (not revoked, the VDI still
// matching its pattern, writable only if it may write). Open asks it too
// once its wait is over, and a writable open before every take-over of
// the VDI's writer lock.
func (b Backend) Revalidate(session nbd.Session, export string, writable bool) error {
	access, err := b.access(session)
	if err != nil {
		return err
	}
	if !access.Match(vdiName(export)) {
		return fmt.Errorf("%w: client may no longer open %q", nbd.ErrPermission, export)
	}
	if writable && access.ReadOnly {
		return fmt.Errorf("%w: client may no longer write to %q", nbd.ErrPermission, export)
	}
	return nil
}

// vdiName is the name of the VDI an export name opens: NAME for NAME,
// ro/NAME and NAME@TAG (gateway.Open's conventions).
func vdiName(exportName string) string {
	return exportname.Parse(exportName).VDI
}

// unknownExport is the refusal of a name that does not exist or that the
// client may not open: the same text for both, so that it does not tell
// which.
func unknownExport(name string) error {
	return fmt.Errorf("%w: no vdi or snapshot named %q", nbd.ErrUnknownExport, name)
}

// List implements nbd.Backend: every writable VDI and every snapshot that
// the session's client may open.
func (b Backend) List(ctx context.Context, session nbd.Session) ([]nbd.ExportSummary, error) {
	access, err := b.access(session)
	if err != nil {
		return nil, err
	}
	var out []nbd.ExportSummary
	for _, v := range b.Gateway.List() {
		if !access.Match(v.Name) {
			continue
		}
		description := fmt.Sprintf("herd vdi %s, %s", v.Name, size.Format(v.Size))
		switch {
		case v.Snapshot:
			description = fmt.Sprintf("herd snapshot %s of %s, %s, read-only", v.Tag, v.Name, size.Format(v.Size))
		case access.ReadOnly:
			description += ", read-only for this client"
		}
		out = append(out, nbd.ExportSummary{Name: v.FullName(), Description: description})
	}
	return out, nil
}

// MetaContexts implements nbd.MetaContexter: qemu:allocation-depth and
// one qemu:dirty-bitmap:TAG per ancestor snapshot of the export named.
// LIST takes "qemu:" (every context) and "qemu:dirty-bitmap:" (every
// bitmap) as wildcards; SET selects exact names only. Like Open, a name
// the client may not open is refused before the cluster is asked, and
// has no contexts, as an unknown one.
func (b Backend) MetaContexts(ctx context.Context, exportName string, session nbd.Session, queries []string, list bool) ([]string, error) {
	access, err := b.access(session)
	if err != nil {
		return nil, err
	}
	if !access.Match(vdiName(exportName)) {
		return nil, nil
	}
	tree, chain, err := b.Gateway.Chain(ctx, exportName)
	if err != nil {
		return nil, nil
	}
	var out []string
	seen := map[string]bool{}
	add := func(name string) {
		if !seen[name] {
			seen[name] = true
			out = append(out, name)
		}
	}
	bitmaps := func() {
		for _, tag := range bitmapNames(tree, chain) {
			add(contextBitmapPrefix + tag)
		}
	}
	if list && len(queries) == 0 {
		add(contextDepth)
		bitmaps()
		return out, nil
	}
	for _, query := range queries {
		switch {
		case list && query == qemuNamespace:
			add(contextDepth)
			bitmaps()
		case list && query == contextBitmapPrefix:
			bitmaps()
		case query == contextDepth:
			add(contextDepth)
		case strings.HasPrefix(query, contextBitmapPrefix) && len(query) > len(contextBitmapPrefix):
			if _, _, err := gateway.Ancestor(tree, chain, strings.TrimPrefix(query, contextBitmapPrefix)); err == nil {
				add(query)
			}
		}
	}
	return out, nil
}

// bitmapNames names every ancestor snapshot of chain, nearest first: its
// tag, or NAME@TAG where a nearer snapshot has the same tag (a clone's
// chain can hold snapshots of several VDIs). A snapshot neither form
// resolves to (shadowed by a nearer one with the same full name) is left
// out.
func bitmapNames(tree []cluster.VDI, chain []uint32) []string {
	byID := make(map[uint32]cluster.VDI, len(tree))
	for _, v := range tree {
		byID[v.ID] = v
	}
	var names []string
	for depth := 2; depth <= len(chain); depth++ {
		v, ok := byID[chain[depth-1]]
		if !ok || !v.Snapshot {
			continue
		}
		for _, name := range []string{v.Tag, v.FullName()} {
			if _, found, err := gateway.Ancestor(tree, chain, name); err == nil && found == depth {
				names = append(names, name)
				break
			}
		}
	}
	return names
}

// Open implements nbd.Backend.
//
// An open for NBD_OPT_INFO (session.InfoOnly) is read-only, so that it
// takes no write lock (no cluster log entry, and no refusal of the node
// that holds the VDI open for writing): the client only reads the export's
// description. That description still says what NBD_OPT_GO would get,
// writable if it would be; if another node holds the write lock, NBD_OPT_INFO
// succeeds and the NBD_OPT_GO that follows is refused as busy.
func (b Backend) Open(ctx context.Context, name string, session nbd.Session) (nbd.Export, error) {
	access, err := b.access(session)
	if err != nil {
		return nil, err
	}
	// Asked before the cluster, on the name alone: a refused name costs
	// the same as an unknown one.
	if !access.Match(vdiName(name)) {
		return nil, unknownExport(name)
	}
	parsed := exportname.Parse(name)
	openName := name
	if (access.ReadOnly || session.InfoOnly) && !parsed.ReadOnly {
		openName = parsed.AsReadOnly().String()
	}
	disk, err := b.openWaiting(gateway.WithClient(ctx, clientName(session)), openName)
	switch {
	case err == nil:
		// The open may have waited (for the writer lock held through
		// another node, for the cluster): asked again, a client revoked
		// meanwhile gets nothing. A writable open asks again whenever
		// it takes the writer lock over.
		writable := !disk.ReadOnly()
		if err := b.Revalidate(session, name, writable); err != nil {
			disk.Close()
			return nil, err
		}
		if writable && b.Authorize != nil {
			disk.SetTakeoverCheck(func() error { return b.Revalidate(session, name, true) })
		}
		e := &export{disk: disk}
		if session.InfoOnly {
			e.advertiseWritable = !access.ReadOnly && !parsed.ReadOnly && !disk.VDI().Snapshot
		} else if b.Metrics != nil {
			e.metricsNode, e.metricsName = b.Metrics, disk.VDI().FullName()
			e.metrics = b.Metrics.OpenVDI(e.metricsName)
		}
		return e, nil
	case errors.Is(err, gateway.ErrUnknownVDI):
		return nil, unknownExport(name)
	case errors.Is(err, gateway.ErrBusy):
		return nil, fmt.Errorf("%w: %v", nbd.ErrExportBusy, err)
	default:
		return nil, fmt.Errorf("%w: %v", nbd.ErrNotReady, err)
	}
}

// Waiting for the cluster in Open.
const (
	// openRetryInterval is the pause between two attempts of an open the
	// cluster could not serve yet.
	openRetryInterval = 200 * time.Millisecond
	// openReplyMargin is the part of the handshake's time an open leaves
	// for its refusal to reach the client: the connection's deadline is
	// the same as ctx's.
	openReplyMargin = time.Second
)

// openWaiting is Gateway.Open, tried again while the cluster cannot serve
// the VDI yet (gateway.ErrNotReady: for a few seconds after the leader
// died this node has none, and a writer lock, a repair or a name this
// node misses needs the log), until ctx's deadline less openReplyMargin.
// An open waits for the cluster within the NBD handshake's time rather
// than fail while an election is under way; a context without a deadline,
// or with too little time left to wait, gets one attempt.
func (b Backend) openWaiting(ctx context.Context, name string) (*gateway.Disk, error) {
	deadline, bounded := ctx.Deadline()
	if !bounded || time.Until(deadline) < 2*openReplyMargin {
		return b.Gateway.Open(ctx, name)
	}
	started := time.Now()
	attemptContext, cancel := context.WithDeadline(ctx, deadline.Add(-openReplyMargin))
	defer cancel()
	for {
		disk, err := b.Gateway.Open(attemptContext, name)
		if err == nil || !errors.Is(err, gateway.ErrNotReady) {
			return disk, err
		}
		if time.Until(deadline) < openReplyMargin+openRetryInterval {
			return nil, fmt.Errorf("%w (waited %v for the cluster)", err, time.Since(started).Round(time.Millisecond))
		}
		timer := time.NewTimer(openRetryInterval)
		select {
		case <-attemptContext.Done():
			timer.Stop()
			return nil, fmt.Errorf("%w (waited %v for the cluster)", err, time.Since(started).Round(time.Millisecond))
		case <-timer.C:
		}
	}
}

// export is one NBD connection's handle on an open VDI. Its methods are
// called concurrently (many requests in flight per connection).
type export struct {
	disk *gateway.Disk
	// advertiseWritable: the disk was opened read-only for NBD_OPT_INFO,
	// and Info describes the writable export NBD_OPT_GO would open. The
	// disk itself still refuses writes.
	advertiseWritable bool
	// metrics counts this VDI's requests (nil: none); metricsNode and
	// metricsName release it on Close.
	metrics     *metrics.VDI
	metricsNode *metrics.Node
	metricsName string
}

// Info implements nbd.Export.
func (e *export) Info() nbd.ExportInfo {
	vdi, readOnly := e.disk.VDI(), e.disk.ReadOnly() && !e.advertiseWritable
	return nbd.ExportInfo{
		Size:               e.disk.Size(),
		Name:               vdi.FullName(),
		Description:        fmt.Sprintf("herd vdi %s (id %d, %d copies)", vdi.FullName(), vdi.ID, vdi.Copies),
		ReadOnly:           readOnly,
		CanFlush:           true,
		CanFUA:             true,
		CanTrim:            !readOnly,
		CanWriteZeroes:     !readOnly,
		CanMultiConn:       true,
		BlockSizeMinimum:   1,
		BlockSizePreferred: 4096,
		PayloadSizeMaximum: 32 << 20,
	}
}

func (e *export) ReadAt(ctx context.Context, p []byte, offset uint64) error {
	started := time.Now()
	err := e.disk.ReadAt(ctx, p, offset)
	e.metrics.Observe(metrics.OpRead, len(p), started, err)
	return toNBD(err)
}

func (e *export) WriteAt(ctx context.Context, p []byte, offset uint64, fua bool) error {
	started := time.Now()
	err := e.disk.WriteAt(ctx, p, offset, fua)
	e.metrics.Observe(metrics.OpWrite, len(p), started, err)
	return toNBD(err)
}

func (e *export) Flush(ctx context.Context) error {
	started := time.Now()
	err := e.disk.Flush(ctx)
	e.metrics.Observe(metrics.OpFlush, 0, started, err)
	return toNBD(err)
}

func (e *export) Trim(ctx context.Context, offset, length uint64, fua bool) error {
	started := time.Now()
	err := e.disk.Trim(ctx, offset, length, fua)
	e.metrics.Observe(metrics.OpTrim, 0, started, err)
	return toNBD(err)
}

func (e *export) WriteZeroes(ctx context.Context, offset, length uint64, noHole, fua bool) error {
	started := time.Now()
	err := e.disk.WriteZeroes(ctx, offset, length, noHole, fua)
	e.metrics.Observe(metrics.OpWriteZeroes, 0, started, err)
	return toNBD(err)
}

// BlockStatus implements nbd.Export (base:allocation).
func (e *export) BlockStatus(ctx context.Context, offset, length uint64) ([]nbd.Extent, error) {
	started := time.Now()
	extents, err := e.disk.Extents(ctx, offset, length)
	e.metrics.Observe(metrics.OpBlockStatus, 0, started, err)
	if err != nil {
		return nil, toNBD(err)
	}
	out := make([]nbd.Extent, len(extents))
	for i, x := range extents {
		out[i] = nbd.Extent{Length: x.Length, Hole: x.Hole, Zero: x.Hole}
	}
	return out, nil
}

// HasMetaContext implements nbd.MetaStatuser: the contexts
// MetaContexts offers for this export.
func (e *export) HasMetaContext(name string) bool {
	if name == contextDepth {
		return true
	}
	tag, ok := strings.CutPrefix(name, contextBitmapPrefix)
	if !ok || tag == "" {
		return false
	}
	_, _, err := e.disk.Ancestor(tag)
	return err == nil
}

// ancestorAttempts bounds the retries of a dirty bitmap whose ancestor
// moved in the chain while its layers were read.
const ancestorAttempts = 3

// MetaStatus implements nbd.MetaStatuser from the chain's object maps
// (gateway.Disk.Layers): the allocation depth, or NBD_STATE_DIRTY where
// the object is defined above the ancestor snapshot (changed since it).
func (e *export) MetaStatus(ctx context.Context, name string, offset, length uint64) ([]nbd.MetaExtent, error) {
	started := time.Now()
	extents, err := e.metaStatus(ctx, name, offset, length)
	e.metrics.Observe(metrics.OpBlockStatus, 0, started, err)
	return extents, err
}

func (e *export) metaStatus(ctx context.Context, name string, offset, length uint64) ([]nbd.MetaExtent, error) {
	if name == contextDepth {
		layers, err := e.disk.Layers(ctx, offset, length)
		if err != nil {
			return nil, toNBD(err)
		}
		out := make([]nbd.MetaExtent, len(layers))
		for i, l := range layers {
			out[i] = nbd.MetaExtent{Length: l.Length, Flags: uint32(l.Depth)}
		}
		return out, nil
	}
	tag, ok := strings.CutPrefix(name, contextBitmapPrefix)
	if !ok {
		return nil, fmt.Errorf("%w: no metadata context %q", nbd.ErrInvalid, name)
	}
	// The ancestor's depth and the layers must come from the same chain:
	// a snapshot of the export taken in between pushes the ancestor one
	// deeper, and the old depth would miss what changed before it. The
	// ancestor is resolved before and after reading the layers, and the
	// read repeated if it moved.
	for range ancestorAttempts {
		before, depth, err := e.disk.Ancestor(tag)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", nbd.ErrIO, err)
		}
		layers, err := e.disk.Layers(ctx, offset, length)
		if err != nil {
			return nil, toNBD(err)
		}
		after, depthAfter, err := e.disk.Ancestor(tag)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", nbd.ErrIO, err)
		}
		if after.ID != before.ID || depthAfter != depth {
			continue
		}
		out := make([]nbd.MetaExtent, 0, len(layers))
		for _, l := range layers {
			flags := uint32(0)
			if l.Owned(depth) {
				flags = stateDirty
			}
			if n := len(out); n > 0 && out[n-1].Flags == flags {
				out[n-1].Length += l.Length
				continue
			}
			out = append(out, nbd.MetaExtent{Length: l.Length, Flags: flags})
		}
		return out, nil
	}
	return nil, fmt.Errorf("%w: the snapshot chain of %s kept changing while %s was read", nbd.ErrIO, e.disk.VDI().FullName(), name)
}

func (e *export) Close() error {
	if e.metrics != nil {
		e.metricsNode.CloseVDI(e.metricsName)
	}
	return e.disk.Close()
}

// toNBD translates the data path's errors to the NBD errors clients see;
// the message keeps the detail for the server log.
func toNBD(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, nbd.ErrPermission):
		return err // the client may no longer write (Disk.SetTakeoverCheck)
	case errors.Is(err, gateway.ErrReadOnly):
		return fmt.Errorf("%w: %v", nbd.ErrReadOnly, err)
	case errors.Is(err, gateway.ErrOutOfRange):
		return fmt.Errorf("%w: %v", nbd.ErrInvalid, err)
	case errors.Is(err, object.ErrNoSpace):
		return fmt.Errorf("%w: %v", nbd.ErrNoSpace, err)
	case errors.Is(err, context.Canceled):
		return fmt.Errorf("%w: %v", nbd.ErrShutdown, err)
	}
	return fmt.Errorf("%w: %v", nbd.ErrIO, err)
}

// clientName is how vdi status names a connection's client: its
// certificate's name and address ("hostA (10.0.0.5:51234)"), or the
// address alone (the local socket, --insecure-nbd).
func clientName(session nbd.Session) string {
	if session.Client == "" {
		return session.RemoteAddress
	}
	return session.Client + " (" + session.RemoteAddress + ")"
}
