// Package logging makes herd's one log stream: log/slog, as text or JSON,
// with the libraries that log on their own (hashicorp/raft through
// go-hclog, hashicorp/memberlist through the standard log package) routed
// into it with their levels, so that a node writes one format that a log
// shipper can parse. Refusal lines, the ones whoever reaches a port can
// make a node write, are bounded in size and rate (bounded.go).
package logging

import (
	"fmt"
	"io"
	"log/slog"
	"strings"
)

// Formats are the values of --log-format.
var Formats = []string{"text", "json"}

// New returns a logger writing to w in format ("text" or "json") at level
// and above, whose refusal lines are bounded (bounded.go).
func New(w io.Writer, format string, level slog.Level) (*slog.Logger, error) {
	options := &slog.HandlerOptions{Level: level}
	switch format {
	case "text", "":
		return slog.New(Bounded(slog.NewTextHandler(w, options), BoundOptions{})), nil
	case "json":
		return slog.New(Bounded(slog.NewJSONHandler(w, options), BoundOptions{})), nil
	}
	return nil, fmt.Errorf("--log-format %q: use %s", format, strings.Join(Formats, " or "))
}
