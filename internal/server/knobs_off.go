//go:build !testknobs

package server

import "log/slog"

// applyTestKnobs does nothing: a production build reads no test knob
// from its environment (knobs_on.go).
func applyTestKnobs(*slog.Logger) {}
