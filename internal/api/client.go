package api

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"time"

	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/gateway"
)

// DefaultPort is the admin API's port.
const DefaultPort = 7080

// Client talks to one node's admin API. Safe for concurrent use.
type Client struct {
	base  string
	token string
	http  *http.Client
}

// NewClient returns a client for address "IP" or "IP:PORT".
func NewClient(address, token string) *Client {
	if _, _, err := net.SplitHostPort(address); err != nil {
		address = net.JoinHostPort(address, fmt.Sprint(DefaultPort))
	}
	transport := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 3 * time.Second}).DialContext,
		MaxIdleConns:        256,
		MaxIdleConnsPerHost: 256,
		IdleConnTimeout:     time.Minute,
	}
	return &Client{base: "http://" + address, token: token, http: &http.Client{Transport: transport, Timeout: 30 * time.Second}}
}

// Do sends a request and decodes the JSON answer into out (if not nil).
// API errors come back as *cluster.RemoteError, matching the sentinels.
func (c *Client) Do(ctx context.Context, method, path string, body, out any) error {
	return c.do(ctx, method, path, body, out, false)
}

func (c *Client) do(ctx context.Context, method, path string, body, out any, forwarded bool) error {
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
	var v cluster.VDI
	return v, c.Do(ctx, http.MethodPost, "/v1/vdis", CreateVDIRequest{Name: name, Size: size}, &v)
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

func (c *Client) Tree(ctx context.Context) ([]TreeEntry, error) {
	var v []TreeEntry
	return v, c.Do(ctx, http.MethodGet, "/v1/tree", nil, &v)
}

// SetRecoveryLimits changes the recovery limits of every alive node.
func (c *Client) SetRecoveryLimits(ctx context.Context, req RecoveryLimitsRequest) ([]RecoveryEntry, error) {
	var v []RecoveryEntry
	return v, c.Do(ctx, http.MethodPut, "/v1/recovery/limits", req, &v)
}

func (c *Client) Recovery(ctx context.Context) ([]RecoveryEntry, error) {
	var v []RecoveryEntry
	return v, c.Do(ctx, http.MethodGet, "/v1/recovery", nil, &v)
}

func (c *Client) Check(ctx context.Context, name string, repair bool) (gateway.CheckReport, error) {
	var v gateway.CheckReport
	return v, c.Do(ctx, http.MethodPost, "/v1/vdis/"+url.PathEscape(name)+"/check", CheckRequest{Repair: repair}, &v)
}
