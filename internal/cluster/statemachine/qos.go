package statemachine

import (
	"context"
	"fmt"
	"strings"
)

// Limits are a VDI's QoS limits (`herd vdi set --iops-limit ...`): each
// gateway paces the requests of the VDI's opens through it to them
// (internal/gateway/qos.go). A limit is per node: a VDI open through two
// nodes at once (a live migration) may get twice its limits for as long.
// 0 is unlimited. IOPS counts requests, BPS payload bytes; Read and
// Write limits apply to their kind of request, IOPS and BPS to both
// kinds together. Reads are READ requests; writes are WRITE, TRIM and
// WRITE_ZEROES (the last two count as requests, not as bytes).
//
// Limits belong to the VDI's name: they follow it across snapshots and
// rollbacks (keepSettings) and apply to its writable and read-only
// (ro/NAME) opens, not to its snapshots' (NAME@TAG).
type Limits struct {
	IOPS      uint64 `json:"iops,omitempty"`
	ReadIOPS  uint64 `json:"read_iops,omitempty"`
	WriteIOPS uint64 `json:"write_iops,omitempty"`
	BPS       uint64 `json:"bps,omitempty"`
	ReadBPS   uint64 `json:"read_bps,omitempty"`
	WriteBPS  uint64 `json:"write_bps,omitempty"`
}

// Bounds of a limit other than 0 (unlimited). Beyond the maximums a
// limit would never bind on any hardware herd runs on and is most likely
// a unit mistake; below the minimum bytes per second a single 32 MiB
// request (the NBD maximum) would wait for minutes.
const (
	MaxIOPSLimit = 10_000_000
	MaxBPSLimit  = 1 << 40 // 1 TiB/s
	MinBPSLimit  = 64 << 10
)

// Unlimited says whether no limit is set.
func (l Limits) Unlimited() bool { return l == Limits{} }

// String lists the limits set, as the CLI's flags name them.
func (l Limits) String() string {
	var parts []string
	iops := func(name string, v uint64) {
		if v != 0 {
			parts = append(parts, fmt.Sprintf("%s %d/s", name, v))
		}
	}
	bps := func(name string, v uint64) {
		if v != 0 {
			parts = append(parts, fmt.Sprintf("%s %s/s", name, formatBytes(v)))
		}
	}
	iops("iops", l.IOPS)
	iops("read iops", l.ReadIOPS)
	iops("write iops", l.WriteIOPS)
	bps("bandwidth", l.BPS)
	bps("read bandwidth", l.ReadBPS)
	bps("write bandwidth", l.WriteBPS)
	if len(parts) == 0 {
		return "unlimited"
	}
	return strings.Join(parts, ", ")
}

// formatBytes renders bytes with a binary unit (internal/size.Format's
// rule; cluster does not import size, which is the CLI's).
func formatBytes(b uint64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB"}
	value, i := float64(b), 0
	for value >= 1024 && i < len(units)-1 {
		value /= 1024
		i++
	}
	if value == float64(uint64(value)) {
		return fmt.Sprintf("%.0f %s", value, units[i])
	}
	return fmt.Sprintf("%.1f %s", value, units[i])
}

// LimitSettings change a VDI's limits (VDISettings); nil leaves a limit
// as it is, 0 removes it. The JSON names are the CLI's flags'.
type LimitSettings struct {
	IOPS      *uint64 `json:"iops_limit,omitempty"`
	ReadIOPS  *uint64 `json:"read_iops_limit,omitempty"`
	WriteIOPS *uint64 `json:"write_iops_limit,omitempty"`
	BPS       *uint64 `json:"bps_limit,omitempty"`
	ReadBPS   *uint64 `json:"read_bps_limit,omitempty"`
	WriteBPS  *uint64 `json:"write_bps_limit,omitempty"`
}

// limitField names one limit for messages and pairs a setting with the
// value it changes.
type limitField struct {
	flag  string
	bytes bool
	set   *uint64
	value *uint64
}

func (ls *LimitSettings) fields(l *Limits) []limitField {
	return []limitField{
		{"--iops-limit", false, ls.IOPS, &l.IOPS},
		{"--read-iops-limit", false, ls.ReadIOPS, &l.ReadIOPS},
		{"--write-iops-limit", false, ls.WriteIOPS, &l.WriteIOPS},
		{"--bps-limit", true, ls.BPS, &l.BPS},
		{"--read-bps-limit", true, ls.ReadBPS, &l.ReadBPS},
		{"--write-bps-limit", true, ls.WriteBPS, &l.WriteBPS},
	}
}

// empty says whether no limit is changed.
func (ls LimitSettings) empty() bool { return ls == LimitSettings{} }

// validate refuses a limit out of bounds, naming its flag.
func (ls LimitSettings) validate() error {
	for _, f := range ls.fields(&Limits{}) {
		if f.set == nil || *f.set == 0 {
			continue
		}
		v := *f.set
		switch {
		case !f.bytes && v > MaxIOPSLimit:
			return fmt.Errorf("%w: %s %d: at most %d requests per second (0 = unlimited)", ErrInvalid, f.flag, v, MaxIOPSLimit)
		case f.bytes && v > MaxBPSLimit:
			return fmt.Errorf("%w: %s %s/s: at most %s/s (0 = unlimited)", ErrInvalid, f.flag, formatBytes(v), formatBytes(MaxBPSLimit))
		case f.bytes && v < MinBPSLimit:
			return fmt.Errorf("%w: %s %s/s: at least %s/s (0 = unlimited); a single large request would wait for minutes", ErrInvalid, f.flag, formatBytes(v), formatBytes(MinBPSLimit))
		}
	}
	return nil
}

// apply changes l as ls says.
func (ls LimitSettings) apply(l *Limits) {
	for _, f := range ls.fields(l) {
		if f.set != nil {
			*f.value = *f.set
		}
	}
}

// settingFlags names every flag of `herd vdi set`, for the message that
// asks for one.
const settingFlags = "--exclusive[=false], --iops-limit, --read-iops-limit, --write-iops-limit, --bps-limit, --read-bps-limit or --write-bps-limit"

// WaitVDI waits until done, called with VDI name as this node has applied
// it (or the error looking it up gave), returns true, and returns that
// VDI. done is called at once and then after every applied batch of log
// entries; it must be quick.
func (c *Reads) WaitVDI(ctx context.Context, name string, done func(v VDI, err error) bool) (VDI, error) {
	for {
		changed := c.fsm.Changes()
		v, err := c.VDI(name)
		if done(v, err) {
			return v, err
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return v, ctx.Err()
		}
	}
}
