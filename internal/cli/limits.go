package cli

// Rates and limits as the flags give them.

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/size"
)

// parseRate reads a bandwidth: a size per second ("100MiB", "100MiB/s",
// "1G/s"), or 0 / "unlimited".
func parseRate(text string) (uint64, error) {
	if text == "0" || text == "unlimited" {
		return 0, nil
	}
	n, err := size.Parse(strings.TrimSuffix(text, "/s"))
	if err != nil {
		return 0, usage(fmt.Errorf("--max-rate %q: %v (a size per second such as 100MiB/s, or 0 for unlimited)", text, err))
	}
	return n, nil
}

// parseIOPSLimit reads a --*-iops-limit: a whole number of requests per
// second ("500" or "500/s"), or 0 / "unlimited".
func parseIOPSLimit(flag, text string) (uint64, error) {
	t := strings.TrimSuffix(strings.TrimSpace(text), "/s")
	if t == "unlimited" {
		return 0, nil
	}
	n, err := strconv.ParseUint(t, 10, 64)
	if err != nil || n > cluster.MaxIOPSLimit {
		return 0, usage(fmt.Errorf("--%s %q: give a whole number of requests per second from 1 to %d, or 0 for unlimited", flag, text, cluster.MaxIOPSLimit))
	}
	return n, nil
}

// parseBPSLimit reads a --*-bps-limit: a size per second ("100MiB",
// "100MiB/s"), or 0 / "unlimited".
func parseBPSLimit(flag, text string) (uint64, error) {
	t := strings.TrimSpace(text)
	if t == "0" || t == "unlimited" {
		return 0, nil
	}
	bad := func(why string) error {
		return usage(fmt.Errorf("--%s %q: %s (give a size per second from %s/s to %s/s such as 100MiB or 100MiB/s, or 0 for unlimited)",
			flag, text, why, size.Format(cluster.MinBPSLimit), size.Format(cluster.MaxBPSLimit)))
	}
	if strings.HasPrefix(t, "-") {
		return 0, bad("negative")
	}
	n, err := size.Parse(strings.TrimSuffix(t, "/s"))
	switch {
	case err != nil:
		return 0, bad(err.Error())
	case n > cluster.MaxBPSLimit:
		return 0, bad("too large")
	case n < cluster.MinBPSLimit && n != 0:
		return 0, bad("too small: one large request would wait for minutes")
	}
	return n, nil
}
