package api

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/gateway"
	"github.com/herd-storage/herd/internal/maintenance"
	"github.com/herd-storage/herd/internal/pki"
)

// DefaultPort is the admin API's port.
const DefaultPort = 7080

// Client talks to one node's admin API over HTTPS. Safe for concurrent
// use.
type Client struct {
	base  string
	token string
	err   error // a token that does not parse: every call fails with it
	http  *http.Client
}

// NewClient returns a client for address "IP" or "IP:PORT" with an admin
// token ("herd-admin.FINGERPRINT.ID.SECRET"). The server is verified by
// the CA fingerprint the token carries: no other configuration is needed,
// and a server without the cluster CA's key cannot impersonate a node.
func NewClient(address, token string) *Client {
	parsed, err := pki.ParseAdminToken(strings.TrimSpace(token))
	if err != nil {
		c := newClient(address, token, nil)
		c.err = fmt.Errorf("%w: %v (the admin token is in the first node's DATA/admin.token; give it with HERD_TOKEN or --token-file)", cluster.ErrUnauthorized, err)
		return c
	}
	fingerprint := parsed.Fingerprint
	config := &tls.Config{
		MinVersion: tls.VersionTLS13,
		// Verified below against the fingerprint instead of hostnames:
		// nodes are reached by IP and the token pins the cluster CA.
		InsecureSkipVerify: true,
		// During a CA rotation the node shows its certificate from the
		// CA the token names (pki.CAHint).
		ServerName: pki.CAHint(fingerprint),
		VerifyPeerCertificate: func(rawCerts [][]byte, _ [][]*x509.Certificate) error {
			_, err := pki.VerifyServerChain(rawCerts, fingerprint)
			return err
		},
	}
	return newClient(address, strings.TrimSpace(token), config)
}

// FailingClient is a Client every call of which fails with err (for
// example: the token file could not be read).
func FailingClient(err error) *Client { return &Client{err: err} }

func newClient(address, token string, config *tls.Config) *Client {
	if _, _, err := net.SplitHostPort(address); err != nil {
		address = net.JoinHostPort(address, fmt.Sprint(DefaultPort))
	}
	transport := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 3 * time.Second}).DialContext,
		TLSClientConfig:     config,
		TLSHandshakeTimeout: 5 * time.Second,
		MaxIdleConns:        256,
		MaxIdleConnsPerHost: 256,
		IdleConnTimeout:     time.Minute,
	}
	return &Client{base: "https://" + address, token: token, http: &http.Client{Transport: transport}} // calls are bounded by their contexts (the CLI's --timeout)
}

// Do sends a request and decodes the JSON answer into out (if not nil).
// API errors come back as *cluster.RemoteError, matching the sentinels.
func (c *Client) Do(ctx context.Context, method, path string, body, out any) error {
	return c.do(ctx, method, path, body, out, false)
}

func (c *Client) do(ctx context.Context, method, path string, body, out any, forwarded bool) error {
	if c.err != nil {
		return c.err
	}
	var reader io.Reader
	if raw, ok := body.([]byte); ok {
		reader = bytes.NewReader(raw)
	} else if body != nil {
		data, err := json.Marshal(body)
		if err != nil {
			return err
		}
		reader = bytes.NewReader(data)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, reader)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	if forwarded {
		req.Header.Set(forwardedHeader, "1")
	}
	if reader != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("cannot reach herd node at %s: %w", c.base, unwrapURLError(err))
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("reading answer from %s: %w", c.base, err)
	}
	if resp.StatusCode != http.StatusOK {
		var e ErrorResponse
		if json.Unmarshal(data, &e) != nil || e.Error == "" {
			return fmt.Errorf("%s answered %s: not a herd admin API?", c.base, resp.Status)
		}
		return cluster.ErrorFromCode(e.Code, e.Error)
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("%s answered something that is not herd's JSON: %w", c.base, err)
	}
	return nil
}

func unwrapURLError(err error) error {
	if u, ok := err.(*url.Error); ok {
		return u.Err
	}
	return err
}

// Convenience wrappers used by the CLI, tests and benchmarks.

func (c *Client) Info(ctx context.Context) (cluster.Info, error) {
	var v cluster.Info
	return v, c.Do(ctx, http.MethodGet, "/v1/cluster", nil, &v)
}

func (c *Client) Epochs(ctx context.Context) ([]cluster.Epoch, error) {
	var v []cluster.Epoch
	return v, c.Do(ctx, http.MethodGet, "/v1/cluster/epochs", nil, &v)
}

// Events returns the cluster's events after log index after (0: all kept).
func (c *Client) Events(ctx context.Context, after uint64) ([]cluster.Event, error) {
	var v []cluster.Event
	return v, c.Do(ctx, http.MethodGet, fmt.Sprintf("/v1/events?after=%d", after), nil, &v)
}

func (c *Client) Format(ctx context.Context, copies int, objectSize uint64) (cluster.Format, error) {
	var v cluster.Format
	return v, c.Do(ctx, http.MethodPost, "/v1/cluster/format", FormatRequest{Copies: copies, ObjectSize: objectSize}, &v)
}

func (c *Client) Nodes(ctx context.Context) ([]NodeEntry, error) {
	var v []NodeEntry
	return v, c.Do(ctx, http.MethodGet, "/v1/nodes", nil, &v)
}

func (c *Client) VDIs(ctx context.Context) ([]cluster.VDI, error) {
	var v []cluster.VDI
	return v, c.Do(ctx, http.MethodGet, "/v1/vdis", nil, &v)
}

func (c *Client) VDI(ctx context.Context, name string) (cluster.VDI, error) {
	var v cluster.VDI
	return v, c.Do(ctx, http.MethodGet, "/v1/vdis/"+url.PathEscape(name), nil, &v)
}

func (c *Client) CreateVDI(ctx context.Context, name string, size uint64) (cluster.VDI, error) {
	return c.CreateVDIWith(ctx, CreateVDIRequest{Name: name, Size: size})
}

// FinalizeUpgrade raises the cluster's feature level (cluster/features.go).
func (c *Client) FinalizeUpgrade(ctx context.Context) (FinalizeResponse, error) {
	var out FinalizeResponse
	return out, c.Do(ctx, http.MethodPost, "/v1/cluster/finalize-upgrade", nil, &out)
}

func (c *Client) CreateVDIWith(ctx context.Context, req CreateVDIRequest) (cluster.VDI, error) {
	var v cluster.VDI
	return v, c.Do(ctx, http.MethodPost, "/v1/vdis", req, &v)
}

func (c *Client) SetVDI(ctx context.Context, name string, settings cluster.VDISettings) (cluster.VDI, error) {
	var v cluster.VDI
	return v, c.Do(ctx, http.MethodPut, "/v1/vdis/"+url.PathEscape(name)+"/settings", settings, &v)
}

func (c *Client) VDIStatus(ctx context.Context, name string) (VDIStatus, error) {
	var v VDIStatus
	return v, c.Do(ctx, http.MethodGet, "/v1/vdis/"+url.PathEscape(name)+"/status", nil, &v)
}

// UnlockVDI takes a VDI's writer lock away from its holder (force must be
// true); it returns the lock that was broken.
func (c *Client) UnlockVDI(ctx context.Context, name string, force bool) (cluster.Lock, error) {
	var l cluster.Lock
	return l, c.Do(ctx, http.MethodPost, "/v1/vdis/"+url.PathEscape(name)+"/unlock", UnlockRequest{Force: force}, &l)
}

func (c *Client) DeleteVDI(ctx context.Context, name string) error {
	return c.Do(ctx, http.MethodDelete, "/v1/vdis/"+url.PathEscape(name), nil, nil)
}

func (c *Client) ResizeVDI(ctx context.Context, name string, size uint64) (cluster.VDI, error) {
	var v cluster.VDI
	return v, c.Do(ctx, http.MethodPost, "/v1/vdis/"+url.PathEscape(name)+"/resize", ResizeVDIRequest{Size: size}, &v)
}

func (c *Client) Locks(ctx context.Context) ([]cluster.Lock, error) {
	var v []cluster.Lock
	return v, c.Do(ctx, http.MethodGet, "/v1/locks", nil, &v)
}

func (c *Client) AcquireLock(ctx context.Context, key, session string) (cluster.Lock, error) {
	var v cluster.Lock
	return v, c.Do(ctx, http.MethodPost, "/v1/locks/acquire", LockRequest{Key: key, Session: session}, &v)
}

func (c *Client) ReleaseLock(ctx context.Context, key, session string) error {
	return c.Do(ctx, http.MethodPost, "/v1/locks/release", LockRequest{Key: key, Session: session}, nil)
}

func (c *Client) Snapshot(ctx context.Context, name, tag string) (cluster.SnapshotResult, error) {
	var v cluster.SnapshotResult
	return v, c.Do(ctx, http.MethodPost, "/v1/vdis/"+url.PathEscape(name)+"/snapshot", SnapshotRequest{Tag: tag}, &v)
}

func (c *Client) Clone(ctx context.Context, snapshot, name string) (cluster.VDI, error) {
	var v cluster.VDI
	return v, c.Do(ctx, http.MethodPost, "/v1/vdis/"+url.PathEscape(snapshot)+"/clone", CloneRequest{Name: name}, &v)
}

func (c *Client) Rollback(ctx context.Context, name, tag string) (cluster.VDI, error) {
	var v cluster.VDI
	return v, c.Do(ctx, http.MethodPost, "/v1/vdis/"+url.PathEscape(name)+"/rollback", RollbackRequest{Tag: tag}, &v)
}

// Flatten asks for a VDI to copy what it reads from its parents, then
// lose its parent; the copy runs in the background (poll the VDI's
// Parent).
func (c *Client) Flatten(ctx context.Context, name string) (cluster.VDI, error) {
	var v cluster.VDI
	return v, c.Do(ctx, http.MethodPost, "/v1/vdis/"+url.PathEscape(name)+"/flatten", nil, &v)
}

func (c *Client) Tree(ctx context.Context) ([]TreeEntry, error) {
	var v []TreeEntry
	return v, c.Do(ctx, http.MethodGet, "/v1/tree", nil, &v)
}

// SetRecoveryLimits changes the recovery limits of every alive node.
func (c *Client) SetRecoveryLimits(ctx context.Context, req RecoveryLimitsRequest) ([]RecoveryEntry, error) {
	var v []RecoveryEntry
	return v, c.Do(ctx, http.MethodPut, "/v1/recovery/limits", req, &v)
}

func (c *Client) Health(ctx context.Context) (Health, error) {
	var v Health
	return v, c.Do(ctx, http.MethodGet, "/v1/cluster/health", nil, &v)
}

func (c *Client) Recovery(ctx context.Context) ([]RecoveryEntry, error) {
	var v []RecoveryEntry
	return v, c.Do(ctx, http.MethodGet, "/v1/recovery", nil, &v)
}

func (c *Client) Check(ctx context.Context, name string, repair bool) (maintenance.CheckReport, error) {
	var v maintenance.CheckReport
	return v, c.Do(ctx, http.MethodPost, "/v1/vdis/"+url.PathEscape(name)+"/check", CheckRequest{Repair: repair}, &v)
}

// Diff is what changed in the VDI or snapshot name since its ancestor
// snapshot since ("TAG" or "NAME@TAG").
func (c *Client) Diff(ctx context.Context, name, since string) (gateway.Diff, error) {
	var v gateway.Diff
	return v, c.Do(ctx, http.MethodGet, "/v1/vdis/"+url.PathEscape(name)+"/diff?since="+url.QueryEscape(since), nil, &v)
}

func (c *Client) Tokens(ctx context.Context) ([]cluster.Token, error) {
	var v []cluster.Token
	return v, c.Do(ctx, http.MethodGet, "/v1/tokens", nil, &v)
}

// CreateToken creates an admin token: readOnly may only read the
// cluster's state, and with data VDI data too.
func (c *Client) CreateToken(ctx context.Context, name string, readOnly, data bool) (CreatedToken, error) {
	var v CreatedToken
	return v, c.Do(ctx, http.MethodPost, "/v1/tokens", CreateTokenRequest{Name: name, ReadOnly: readOnly, Data: data}, &v)
}

func (c *Client) RevokeToken(ctx context.Context, idOrName string) (cluster.Token, error) {
	var v cluster.Token
	return v, c.Do(ctx, http.MethodDelete, "/v1/tokens/"+url.PathEscape(idOrName), nil, &v)
}

func (c *Client) Clients(ctx context.Context) ([]cluster.Client, error) {
	var v []cluster.Client
	return v, c.Do(ctx, http.MethodGet, "/v1/clients", nil, &v)
}

func (c *Client) AddClient(ctx context.Context, name, pattern string, readOnly bool) (AddedClient, error) {
	var v AddedClient
	return v, c.Do(ctx, http.MethodPost, "/v1/clients", AddClientRequest{Name: name, Pattern: pattern, ReadOnly: readOnly}, &v)
}

func (c *Client) RevokeClient(ctx context.Context, name string) (cluster.Client, error) {
	var v cluster.Client
	return v, c.Do(ctx, http.MethodDelete, "/v1/clients/"+url.PathEscape(name), nil, &v)
}

// SetNode changes node id's capacity or zone.
func (c *Client) SetNode(ctx context.Context, id string, settings cluster.NodeSettings) (cluster.Node, error) {
	var v cluster.Node
	return v, c.Do(ctx, http.MethodPost, "/v1/nodes/"+url.PathEscape(id)+"/settings", settings, &v)
}

// Drain starts node id's drain (cancel: ends it).
func (c *Client) Drain(ctx context.Context, id string, cancel bool) (cluster.Node, error) {
	var v cluster.Node
	return v, c.Do(ctx, http.MethodPost, "/v1/nodes/"+url.PathEscape(id)+"/drain", DrainRequest{Cancel: cancel}, &v)
}

// SetMaintenance opens node id's maintenance window for d (0 ends it).
func (c *Client) SetMaintenance(ctx context.Context, id string, d time.Duration) (cluster.Node, error) {
	var v cluster.Node
	return v, c.Do(ctx, http.MethodPost, "/v1/nodes/"+url.PathEscape(id)+"/maintenance", MaintenanceRequest{Seconds: d.Seconds()}, &v)
}

func (c *Client) RemoveNode(ctx context.Context, id string) error {
	return c.Do(ctx, http.MethodDelete, "/v1/nodes/"+url.PathEscape(id), nil, nil)
}

func (c *Client) RotateJoinToken(ctx context.Context) (JoinTokenResponse, error) {
	var v JoinTokenResponse
	return v, c.Do(ctx, http.MethodPost, "/v1/cluster/join-token", nil, &v)
}

// NBDSession asks for a short-lived NBD client certificate.
func (c *Client) NBDSession(ctx context.Context) (NBDSession, error) {
	var v NBDSession
	return v, c.Do(ctx, http.MethodGet, "/v1/nbd-session", nil, &v)
}

// Fingerprint is the cluster CA fingerprint the client's token names
// ("" if the token does not parse).
func (c *Client) Fingerprint() string {
	token, err := pki.ParseAdminToken(c.token)
	if err != nil {
		return ""
	}
	return token.Fingerprint
}
